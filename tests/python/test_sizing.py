"""plan_kv_cache: bytes per block, blocks, tokens; fp8 holds exactly twice bf16."""

from __future__ import annotations

import pytest

import vtinfer as vt

GEO = vt.ModelGeometry.from_dict({"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                                  "head_dim": 64, "torch_dtype": "bfloat16"})


@pytest.mark.parametrize("mem", [1 << 20, "8GiB", "3MB", 123457])
def test_fp8_twice_bf16(mem):
    a = vt.plan_kv_cache(GEO, "bfloat16", kv_cache_memory=mem)
    b = vt.plan_kv_cache(GEO, "fp8", kv_cache_memory=mem)
    assert a.bytes_per_block == 3 * 2 * 16 * 2 * 64 * 2  # layers * K,V * block * H_kv * D * elem
    assert b.bytes_per_block * 2 == a.bytes_per_block
    assert b.num_blocks in (2 * a.num_blocks, 2 * a.num_blocks + 1)  # floor(2x/y) vs 2 floor(x/y)
    if isinstance(mem, int) and mem % a.bytes_per_block == 0:
        assert b.num_blocks == 2 * a.num_blocks


def test_precedence_and_fallback():
    p = vt.plan_kv_cache(GEO, num_blocks=7, kv_cache_memory="1GiB")
    assert (p.num_blocks, p.blocks_from, p.tokens, p.dtype) == (7, "num_blocks", 112, "bfloat16")
    p = vt.plan_kv_cache(GEO)
    assert p.num_blocks == 256 and p.warnings
    with pytest.raises(ValueError, match="kv_cache_memory"):
        vt.plan_kv_cache(GEO, kv_cache_memory="lots")
    with pytest.raises(ValueError, match="num_blocks"):
        vt.plan_kv_cache(GEO, num_blocks=0)
