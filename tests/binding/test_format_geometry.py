"""One geometry rule per KV format, stated in one message by every entry point.

The dtype table holds each format's head-size rule (vt_dtype_check_head_size); the paged cache, the store
and the read all refuse a head size the format cannot take with that message, differing only in the
function and in how the head size is named (``head_size``, ``key's head size``, ``q's head size``).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import vtinfer as vt

I4 = "int4_per_token_head"
NB, BS, H = 2, 16, 1


def _rule(msg: str) -> str:
    """The message after '<fn>: <what> must be ': the rule, the dtype and the value."""
    m = re.match(r"^[\w.]+: (head_size|key's head size|q's head size) must be (.*)$", msg)
    assert m, msg
    return re.sub(r"for (dtype|kv_cache_dtype) '", "for '", m.group(2))


def _cache_msg(d: int) -> str:
    with pytest.raises(ValueError) as e:
        vt.PagedKVCache(1, NB, BS, H, d, I4)
    return str(e.value)


def _int4_caches(d: int, scale: float) -> tuple[np.ndarray, ...]:
    """An int4 cache pair [NB, BS, H, d // 2] of zero codes and its scale caches [NB, BS, H] of `scale`."""
    kc, vc = (np.zeros((NB, BS, H, d // 2), np.uint8) for _ in range(2))
    ks, vs = (np.full((NB, BS, H), scale, np.float32) for _ in range(2))
    return kc, vc, ks, vs


def _store_msg(d: int) -> str:
    k = np.ones((2, H, d), np.float32)
    kc, vc, ks, vs = _int4_caches(d, 0.0)
    before = kc.copy()
    with pytest.raises(ValueError) as e:
        vt.reshape_and_cache_flash(k, k, kc, vc, np.arange(2), I4, 1.0, 1.0, k_scale_cache=ks, v_scale_cache=vs)
    np.testing.assert_array_equal(kc, before)
    return str(e.value)


def _attn_msg(d: int) -> str:
    q = np.ones((1, H, d), np.float32)
    kc, vc, ks, vs = _int4_caches(d, 1.0)
    with pytest.raises(ValueError) as e:
        vt.flash_attn_varlen_func(q, kc, vc, cu_seqlens_q=np.array([0, 1], np.int32),
                                  seqused_k=np.array([1], np.int32), block_table=np.zeros((1, 1), np.int32),
                                  kv_cache_dtype=I4, k_scale_cache=ks, v_scale_cache=vs)
    return str(e.value)


@pytest.mark.parametrize("d", [63, 2048, 6144])
def test_int4_head_size_rule_is_one_message_everywhere(d):
    msgs = [_cache_msg(d), _store_msg(d), _attn_msg(d)]
    rules = {_rule(m) for m in msgs}
    assert len(rules) == 1, msgs
    (rule,) = rules
    assert rule.startswith("even and at most 4096, with a largest power-of-two divisor of at most 1024")
    assert rule.endswith(f"for '{I4}'; got {d}"), rule


@pytest.mark.parametrize("fmt,d,rule", [
    ("turboquant_k8v4", 5, "even and at most 4096"),
    ("turboquant_k8v4", 4098, "even and at most 4096"),
    ("turboquant_4bit_nc", 48, "a power of two, at most 4096"),
    ("turboquant_3bit_nc", 8192, "a power of two, at most 4096"),
])
def test_turboquant_head_size_rule_from_the_table(fmt, d, rule):
    slot = vt.turboquant_slot_bytes(fmt, d)
    kv = np.zeros((NB, BS, H, slot), np.uint8)
    k = np.ones((1, H, d), np.float32)
    with pytest.raises(ValueError) as e:
        vt.turboquant_store(k, k, kv, np.arange(1), fmt)
    assert not kv.any()
    assert _rule(str(e.value)).startswith(rule) and str(e.value).endswith(f"for kv_cache_dtype '{fmt}'; got {d}")


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head"])
def test_formats_without_a_rule_take_odd_head_sizes(fmt):
    c = vt.PagedKVCache(1, NB, BS, H, 63, fmt)
    assert c.key_cache(0).shape[-1] == 63
