"""vtinfer's TurboQuant store and read against the independent NumPy
twin tests/numerics/tq_twin.py (itself shown equal to vLLM's Triton kernels run in
Triton's interpreter: test_kv_formats_tq.py), and the slot / page sizes against
vLLM's own ``TurboQuantConfig`` from the pinned wheel.

The comparison is the **whole cache** filled with 0x5A: the bytes vLLM's kernels
write (key part, the value codes of full groups, fp16 scale and zero) equal the
twin's; the bytes they do not write (the pad that rounds a slot to even, a 3-bit
tail of D % 8 elements, every slot not stored) keep the fill.

Tolerance rule (MSE presets only): vtinfer rotates in double (the products of
float32 values are exact, one rounding to float32 at the end) and sums the norm's
float32 squares in double in element order; the twin rotates with a float64
matmul and a pairwise float64 sum. The two float32 results can differ by one
float32 step where the double value lies next to a float32 rounding boundary,
and by the double sums' rounding (absolute, ~D * 2^-53 on a unit row) where the
sum cancels to near 0 (the middle midpoint is exactly 0). So an index may differ,
by one, only for an element whose rotated value is within two float32 steps or
1e-12 of a codebook midpoint; every other byte is equal.
The read's norm correction sums ``c^2`` in float32 in element order (the twin: in
NumPy's order, pairwise over a contiguous row, in sequence over ``c[idx]``'s strides),
so an MSE K agrees to 1e-6 relative; V and k8v4 K are exact.
"""

from __future__ import annotations

import functools
import math
import sys
import types

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import tq_twin
from tests.numerics.test_kv_formats_tq import _cases, adversarial_rows, division_probe_row
from vtinfer.hf_config import ModelGeometry
from vtinfer.testing import upstream

NB, BS, H = 4, 16, 3
FILL = 0x5A


@functools.lru_cache(maxsize=None)
def twin_codebook(D: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The twin's (centroids, midpoints), once per geometry (its Lloyd-Max runs in Python)."""
    c = tq_twin.lloyd_max(D, bits)
    return c, tq_twin.midpoints(c)


@functools.lru_cache(maxsize=None)
def vllm_cases() -> tuple[dict, ...]:
    return tuple(_cases())


def twin_store(fmt, k, v):
    kb = tq_twin.PRESETS[fmt][0]
    mids = None if kb == 8 else twin_codebook(k.shape[-1], kb)[1]
    return tq_twin.store(fmt, k.astype(np.float32), v.astype(np.float32), mids=mids)


def written_mask(fmt: str, D: int) -> np.ndarray:
    """The slot bytes vLLM's store kernels write (from the rules: full 3-bit groups only, no pad)."""
    lay = tq_twin.layout(fmt, D)
    m = np.zeros(lay["slot_aligned"], bool)

    def codes(off: int, bits: int) -> None:
        m[off: off + (D // 2 if bits == 4 else 3 * (D // 8))] = True

    if lay["key_bits"] == 8:
        m[:D] = True
    else:
        codes(0, lay["key_bits"])
        m[lay["mse_bytes"]: lay["mse_bytes"] + 2] = True
    codes(lay["kps"], lay["value_bits"])
    m[lay["kps"] + lay["vdb"]: lay["slot"]] = True
    return m


def expected_cache(fmt, k, v, slots, shape):
    """The 0x5A cache after the twin's store of every token (the last duplicate slot wins)."""
    D = k.shape[-1]
    want = twin_store(fmt, k, v)
    cache = np.full(shape, FILL, np.uint8).reshape(-1, H, shape[-1])
    m = written_mask(fmt, D)
    for t, s in enumerate(slots):
        if s >= 0:
            cache[s][:, m] = want[t][:, m]
    return cache.reshape(shape)


def near_midpoint(fmt: str, k: np.ndarray) -> np.ndarray:
    """[..., D] True where the twin's rotated key lies within two float32 steps, or 1e-12 (the double sums'
    rounding on a unit row, whose terms are up to 1 / sqrt(D): a cancelling sum near the midpoint 0), of a
    midpoint."""
    D = k.shape[-1]
    y, _ = tq_twin.rotate(k.astype(np.float32), tq_twin.hadamard(D))
    mids = twin_codebook(D, tq_twin.PRESETS[fmt][0])[1]
    gap = np.min(np.abs(y[..., None].astype(np.float64) - mids.astype(np.float64)), axis=-1)
    return gap <= 2 * np.spacing(np.abs(y).astype(np.float32)).astype(np.float64) + 1e-12


def assert_cache_equal(fmt, got, want, k, slots):
    """Whole cache byte for byte, with the MSE index tolerance rule above. Returns the tolerated count."""
    D = k.shape[-1]
    lay = tq_twin.layout(fmt, D)
    S = lay["slot_aligned"]
    g, w = got.reshape(-1, H, S), want.reshape(-1, H, S)
    if np.array_equal(g, w):
        return 0
    assert lay["key_bits"] != 8, f"{fmt} D={D}: cache bytes differ at {np.argwhere(g != w)[:5].tolist()}"
    kb, mse = lay["key_bits"], lay["mse_bytes"]
    rest = np.ones(S, bool)
    rest[:mse] = False
    np.testing.assert_array_equal(g[..., rest], w[..., rest], err_msg=f"{fmt} D={D}: non-index bytes")
    gi, wi = tq_twin._unpack(g[..., :mse], kb, D), tq_twin._unpack(w[..., :mse], kb, D)
    diff = gi != wi
    last = {int(s): t for t, s in enumerate(slots) if s >= 0}
    near = np.zeros(gi.shape, bool)
    for s, t in last.items():
        near[s] = near_midpoint(fmt, k[t])
    assert np.all(near[diff]), f"{fmt} D={D}: an index differs away from a midpoint"
    assert np.all(np.abs(gi.astype(np.int64) - wi)[diff] == 1)
    return int(diff.sum())


def make_cache(fmt, D, strided=False):
    S = vt.turboquant_slot_bytes(fmt, D)
    if not strided:
        return np.full((NB, BS, H, S), FILL, np.uint8)
    raw = np.full((NB, H, BS, S), FILL, np.uint8)  # physical [blocks, heads, positions, slot]: a strided view
    return raw.transpose(0, 2, 1, 3)


def cast(x, src):
    return x.astype(np.float32) if src == "float32" else x.astype(getattr(ml_dtypes, src, src))


# the cases vLLM's kernels were run on (test_kv_formats_tq.py: random rows of magnitudes 2^-8..2^8, the
# adversarial rows, a division probe, a skipped slot), plus a duplicate slot and small / odd geometries
CASES = [(c["fmt"], c["key"].shape[-1]) for c in vllm_cases()]
EXTRA = [("turboquant_k8v4", 6), ("turboquant_k3v4_nc", 4), ("turboquant_3bit_nc", 4), ("turboquant_3bit_nc", 16),
         ("turboquant_4bit_nc", 256)]


@pytest.mark.parametrize("strided", [False, True], ids=["NBHS", "strided"])
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{f}-{d}" for f, d in CASES])
def test_store_whole_cache_equals_twin_on_vllms_cases(i, strided):
    c = vllm_cases()[i]
    fmt, k, v, slots = c["fmt"], c["key"], c["value"], c["slots"].copy()
    slots[5] = slots[6]  # a duplicate: token 6 wins
    D = k.shape[-1]
    cache = make_cache(fmt, D, strided)
    vt.turboquant_store(k, v, cache, slots, fmt)
    assert_cache_equal(fmt, cache, expected_cache(fmt, k, v, slots, cache.shape), k, slots)


@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt,D", EXTRA + [("turboquant_k8v4", 80), ("turboquant_k3v4_nc", 64)])
def test_store_equals_twin_sources_and_small_heads(fmt, D, src):
    rng = np.random.default_rng(D)
    T = 30
    k = cast(rng.standard_normal((T, H, D)) * 2.0 ** rng.integers(-4, 4, (T, H, 1)), src)
    v = cast(rng.standard_normal((T, H, D)) + rng.standard_normal((T, H, 1)), src)
    if D >= 32:
        adv = adversarial_rows(D)
        kf, vf = k.astype(np.float32), v.astype(np.float32)
        kf[: len(adv), 0], vf[: len(adv), 1] = adv, adv[::-1]
        if src == "float16":  # an infinite source element: vLLM's rule for it is not established, so none is asserted
            kf, vf = np.clip(kf, -6e4, 6e4), np.clip(vf, -6e4, 6e4)
        k, v = cast(kf, src), cast(vf, src)
    slots = rng.permutation(NB * BS)[:T].astype(np.int64)
    slots[2] = -1
    cache = make_cache(fmt, D)
    vt.turboquant_store(k, v, cache, slots, fmt)
    assert_cache_equal(fmt, cache, expected_cache(fmt, k.astype(np.float32), v.astype(np.float32), slots,
                                                  cache.shape), k.astype(np.float32), slots)


def test_store_by_hand():
    """Slot bytes computed by hand from the rules (independent of the twin)."""
    D = 16
    v = np.arange(16, dtype=np.float32)[None, None] * 2 - 4  # min -4, scale 2: codes 0..15
    k = np.zeros((1, 1, D), np.float32)
    k[0, 0, :4] = [1000.0, -1000.0, 17.0, 0.25]  # e4m3: saturate +-448, 17 -> 16 (tie to even), 0.25 exact
    cache = np.full((1, BS, 1, 28), FILL, np.uint8)
    vt.turboquant_store(k, v, cache, np.array([3], np.int64), "turboquant_k8v4")
    s = cache[0, 3, 0]
    assert list(s[:4]) == [0x7E, 0xFE, 0x58, 0x28] and not s[4:16].any()
    assert list(s[16:24]) == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]  # element 2j in the low nibble
    assert s[24:26].view(np.float16)[0] == 2.0 and s[26:28].view(np.float16)[0] == -4.0
    assert (np.delete(cache, 3, axis=1) == FILL).all()
    # 3-bit values: D = 8, codes 0..7 (scale 1) -> one 24-bit word sum(c_i << 3i), little endian; key 3-bit likewise
    cache = np.full((1, BS, 1, vt.turboquant_slot_bytes("turboquant_3bit_nc", 8)), FILL, np.uint8)
    kk = np.zeros((1, 1, 8), np.float32)
    vt.turboquant_store(kk, np.arange(8, dtype=np.float32)[None, None], cache, np.array([0], np.int64),
                        "turboquant_3bit_nc")
    word = sum(i << (3 * i) for i in range(8))
    s = cache[0, 0, 0]
    assert list(s[5:8]) == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    assert s[3:5].view(np.float16)[0] == 0.0  # zero key: norm 0, y = 0
    assert s[8:10].view(np.float16)[0] == 1.0 and s[10:12].view(np.float16)[0] == 0.0


def test_store_divides_not_multiplies_by_the_reciprocal():
    """The division probe row: ``(v - min) / scale`` and ``* (1 / scale)`` differ in two or more codes."""
    D = 64
    row = division_probe_row(D)
    v = np.tile(row, (1, 1, 1)).astype(np.float32)
    cache = np.full((1, BS, 1, vt.turboquant_slot_bytes("turboquant_k8v4", D)), FILL, np.uint8)
    vt.turboquant_store(np.zeros_like(v), v, cache, np.array([0], np.int64), "turboquant_k8v4")
    np.testing.assert_array_equal(cache[0, 0, 0, 64:100], tq_twin.quantize_values(row[None], 4, 32)[0])


@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{f}-{d}" for f, d in CASES])
def test_gather_equals_twin_read(i):
    c = vllm_cases()[i]
    fmt, k, v, slots = c["fmt"], c["key"], c["value"], c["slots"]
    D = k.shape[-1]
    cache = make_cache(fmt, D, strided=True)
    vt.turboquant_store(k, v, cache, slots, fmt)
    s = slots[slots >= 0]
    K, V = vt.turboquant_gather(cache, s, fmt, D)
    raw = np.ascontiguousarray(cache).reshape(-1, H, cache.shape[-1])[s]
    kb = tq_twin.PRESETS[fmt][0]
    k2, v2 = tq_twin.dequantize(fmt, raw, D, None if kb == 8 else twin_codebook(D, kb)[0])
    assert K.shape == V.shape == (len(s), H, D) and K.dtype == V.dtype == np.float32
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(V, v2, err_msg=f"V, {fmt} D={D}")
        if tq_twin.PRESETS[fmt][0] == 8:
            np.testing.assert_array_equal(K, k2, err_msg=f"K, {fmt} D={D}")
        else:
            fin = np.isfinite(k2)
            np.testing.assert_array_equal(np.isfinite(K), fin)
            np.testing.assert_allclose(K[fin], k2[fin], rtol=1e-6, atol=1e-30, err_msg=f"K, {fmt} D={D}")


@pytest.mark.parametrize("D", [4, 64, 128])  # 4: a 3-bit row shorter than one 8-code group
@pytest.mark.parametrize("fmt", ["turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"])
def test_gather_of_any_bytes_equals_twin_read(fmt, D, isa):
    """Slots of random bytes: every code, and fp16 norms, scales and zeros of every kind (inf, NaN,
    subnormal), read by turboquant_gather (the attention's slot read) as the twin reads them, on every
    ISA this CPU runs (each has its own 3- and 4-bit code lookups)."""
    rng = np.random.default_rng([D, len(fmt)])
    n = 64
    raw = rng.integers(0, 256, (n, 1, 1, vt.turboquant_slot_bytes(fmt, D)), dtype=np.uint8)
    s = np.arange(n, dtype=np.int64)
    K, V = vt.turboquant_gather(raw, s, fmt, D)
    kb = tq_twin.PRESETS[fmt][0]
    with np.errstate(over="ignore", invalid="ignore"):
        k2, v2 = tq_twin.dequantize(fmt, raw.reshape(n, 1, -1), D, None if kb == 8 else vt.turboquant_codebook(fmt, D)[0])
    np.testing.assert_array_equal(V, v2, err_msg=f"V, {fmt} D={D}")
    if kb == 8:
        np.testing.assert_array_equal(K, k2, err_msg=f"K, {fmt} D={D}")
    else:  # the norm correction's float32 sum: the twin's is in NumPy's order
        fin = np.isfinite(k2)
        np.testing.assert_array_equal(np.isfinite(K), fin)
        np.testing.assert_allclose(K[fin], k2[fin], rtol=1e-6, atol=1e-30, err_msg=f"K, {fmt} D={D}")


@pytest.mark.parametrize("fmt", ["turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"])
def test_codebook_equals_twins(fmt):
    """vtinfer's Lloyd-Max (the C core's vt_tq_codebook, which the paged cache holds too) bit for bit equal to
    the twin's (itself equal to vLLM's solve_lloyd_max: test_kv_formats_tq.py) at every power-of-two head size
    the MSE presets take and at head sizes they refuse (the solve itself takes any D > 0)."""
    for D in [2**e for e in range(1, 13)] + [3, 96, 100, 1000]:
        c, m = vt.turboquant_codebook(fmt, D)
        tc, tm = twin_codebook(D, tq_twin.PRESETS[fmt][0])
        np.testing.assert_array_equal(c.view(np.uint32), tc.view(np.uint32), err_msg=f"D={D}")
        np.testing.assert_array_equal(m.view(np.uint32), tm.view(np.uint32), err_msg=f"D={D}")
        assert not c.flags.writeable and not m.flags.writeable


def test_codebook_refusals():
    assert vt.turboquant_codebook("turboquant_k8v4", 64) == (None, None)
    assert vt._C.turboquant_codebook("ultraquant_4bit", 64) is None
    with pytest.raises(ValueError, match="head_size must be > 0; got 0"):
        vt._C.turboquant_codebook("turboquant_4bit_nc", 0)
    with pytest.raises(TypeError, match="head_size"):
        vt._C.turboquant_codebook("turboquant_4bit_nc", 64.0)
    with pytest.raises(ValueError, match="kv_cache_dtype must be a slot format"):
        vt._C.turboquant_codebook("bfloat16", 64)


@pytest.fixture(scope="module")
def vllm_tq_config():
    src = upstream.locate_or_skip()
    sys.modules.setdefault("vtinfer_upstream", types.ModuleType("vtinfer_upstream"))
    ns = upstream.extract(src.read(upstream.F_TQ_CONFIG), ["TQ_PRESETS", "TurboQuantConfig"],
                          {"dataclass": __import__("dataclasses").dataclass, "math": math, "ModelConfig": object,
                           "TurboQuantConfig": object, "logger": None})
    return ns["TurboQuantConfig"]


def test_slot_bytes_and_pages_equal_vllms(vllm_tq_config):
    for fmt in vt.TURBOQUANT_DTYPES:
        for D in (4, 6, 16, 64, 80, 96, 128, 256, 576):
            want = vllm_tq_config.from_cache_dtype(fmt, D).slot_size_aligned
            assert vt.turboquant_slot_bytes(fmt, D) == want == tq_twin.layout(fmt, D)["slot_aligned"], (fmt, D)
    geo = ModelGeometry.from_dict({"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2,
                                   "head_dim": 128, "torch_dtype": "bfloat16"})
    for fmt in vt.TURBOQUANT_DTYPES:
        p = vt.plan_kv_cache(geo, fmt, 16, num_blocks=4)
        slot = vllm_tq_config.from_cache_dtype(fmt, 128).slot_size_aligned
        # vLLM's boundary rule: layers 0, 1, 4, 5 stay bfloat16 (get_boundary_skip_layers), 2 and 3 are TurboQuant
        assert p.skipped_layers == (0, 1, 4, 5)
        assert p.layer_dtypes == ("bfloat16",) * 2 + (fmt,) * 2 + ("bfloat16",) * 2
        bf16 = 2 * 2 * 128 * 2 * 16
        assert p.layer_page_bytes == (bf16,) * 2 + (2 * 16 * slot,) * 2 + (bf16,) * 2
        # heterogeneous pages: vLLM's alignment (FlashAttention's 16-token kernel block) raises the block size
        # until the TurboQuant page covers a bf16 page of 16 tokens
        assert p.skip_page_size_padded == p.vllm_block_size * 2 * slot >= 16 * 2 * 128 * 2 * 2
    p = vt.plan_kv_cache(geo, "turboquant_k8v4", 16, num_blocks=4, kv_cache_dtype_skip_layers=["3"])
    assert p.skipped_layers == (0, 1, 3, 4, 5)


def test_boundary_skip_layers_equal_vllms(vllm_tq_config):
    from vtinfer._turboquant import boundary_skip_layers

    for n in (1, 2, 3, 4, 5, 30):
        mc = types.SimpleNamespace(is_hybrid=False, hf_text_config=types.SimpleNamespace(num_hidden_layers=n))
        assert boundary_skip_layers(n) == vllm_tq_config.get_boundary_skip_layers(mc), n


def test_table_rows_and_resolution(tmp_path):
    import json

    rows = {d: vt.dtype_info(d) for d in vt.TURBOQUANT_DTYPES}
    assert set(rows) == set(tq_twin.PRESETS)
    for name, r in rows.items():
        assert (r.key_bits, r.value_bits, r.norm_correction) == tq_twin.PRESETS[name]
        assert (r.page_layout, r.scale_kind, r.numpy_name, r.elem_bits) == ("slots", "slot", "uint8", 8)
        assert name in vt.KV_CACHE_DTYPES and name not in vt.PER_TOKEN_HEAD_DTYPES
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "hidden_size": 256,
                                                      "torch_dtype": "bfloat16"}))
    for name in rows:
        assert vt.resolve_kv_cache_dtype(name, tmp_path).dtype == name
        p = vt.plan_kv_cache(tmp_path, name, 16, num_blocks=2)
        assert p.layer_dtypes == ("bfloat16",) * 4  # four layers: all are boundary layers


def test_store_index_counts_midpoints_at_or_below():
    """An element equal to a midpoint takes the upper cell (vLLM's ``y >= mid``). vLLM's codebook has no
    midpoint a simple key hits exactly, so the C store gets a codebook with the midpoints next to +-1/8
    moved onto +-1/8: a one-hot key at D = 64 rotates to exactly +-1/8 everywhere."""
    from vtinfer import _C

    fmt, D = "turboquant_4bit_nc", 64
    mids = twin_codebook(D, 4)[1].copy()
    for t in (0.125, -0.125):
        mids[np.argmin(np.abs(mids - t))] = t
    assert np.all(np.diff(mids) > 0)
    k = np.zeros((2, 1, D), np.float32)
    k[0, 0, 0], k[1, 0, 0] = 1.0, -1.0
    v = np.ones((2, 1, D), np.float32)
    cache = np.full((1, BS, 1, vt.turboquant_slot_bytes(fmt, D)), FILL, np.uint8)
    _C.turboquant_store(k, v, cache, np.array([0, 1], np.int64), fmt, mids)
    want = tq_twin.store(fmt, k, v, mids=mids)
    m = written_mask(fmt, D)
    np.testing.assert_array_equal(cache[0, :2, 0][:, m], want[:, 0][:, m])
    idx = tq_twin._unpack(cache[0, :2, 0, :32], 4, D)
    assert (idx[0] == np.searchsorted(mids, 0.125, side="right")).all()
    assert (idx[1] == np.searchsorted(mids, -0.125, side="right")).all()


def test_store_from_torch_tensors_into_vllms_page_view():
    """CPU torch tensors through DLPack: bfloat16 key / value, and the cache as vLLM holds it (a
    ``[num_blocks, H_kv, block_size, slot]`` page seen through ``transpose(1, 2)``)."""
    torch = pytest.importorskip("torch")
    fmt, D = "turboquant_k3v4_nc", 64
    rng = np.random.default_rng(11)
    k = torch.from_numpy(rng.standard_normal((20, H, D)).astype(np.float32)).to(torch.bfloat16)
    v = torch.from_numpy(rng.standard_normal((20, H, D)).astype(np.float32)).to(torch.bfloat16)
    slots = torch.from_numpy(rng.permutation(NB * BS)[:20].astype(np.int64))
    page = torch.full((NB, H, BS, vt.turboquant_slot_bytes(fmt, D)), FILL, dtype=torch.uint8)
    vt.turboquant_store(k, v, page.transpose(1, 2), slots, fmt)
    want = make_cache(fmt, D)
    vt.turboquant_store(k.float().numpy(), v.float().numpy(), want, slots.numpy(), fmt)
    np.testing.assert_array_equal(page.transpose(1, 2).numpy(), want)


def test_inspect_names_the_in_slot_scales_and_the_boundary_layers(tmp_path, capsys):
    import json

    from vtinfer.cli import main

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "head_dim": 64,
                                                      "torch_dtype": "bfloat16"}))
    assert main(["inspect", str(tmp_path), "--kv-cache-dtype", "turboquant_k3v4_nc", "--num-blocks", "4"]) == 0
    out = capsys.readouterr().out
    assert "scales           inside each (token, KV head) slot of turboquant_k3v4_nc" in out
    assert "[0, 1, 4, 5] keep the model dtype" in out
    assert f"2:turboquant_k3v4_nc:{2 * 16 * vt.turboquant_slot_bytes('turboquant_k3v4_nc', 64)}B" in out
