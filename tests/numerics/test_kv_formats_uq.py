"""ultraquant_4bit (vLLM 0.33's UltraQuant KV format) on the slot cache.

Judges, each independent of vtinfer's C codec:
- vLLM's own store, ``ultraquant_store`` of the pinned wheel's ultraquant/triton_store.py, run in
  Triton's CPU interpreter (tests/numerics/uq_triton_child.py): byte for byte;
- the NumPy twin written from the wheel's format and store (tests/numerics/uq_twin.py): byte for byte,
  with torch and triton absent too, non-finite groups included;
- vLLM's PyTorch reference (ultraquant/reference.py, compiled from the wheel's text): its encoder on
  the same rotated rows, its decoder, and its reference attention;
- the float64 attention oracle of test_attention_oracle.py over the twin's dequantized cache, with
  FlashAttention's 2x rule.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.numerics import uq_twin
from tests.numerics.test_attention_oracle import check_close, shuffled_block_table
from tests.numerics.test_kv_formats_triton import _require_triton
from vtinfer.testing import upstream

FMT = "ultraquant_4bit"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = os.path.join(ROOT, "tests", "numerics", "uq_triton_child.py")
SRC = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


@pytest.fixture(scope="module")
def vllm_source() -> upstream.Source:
    return upstream.locate_or_skip()


def rows(rng, T, H, D, src, adversarial=True):
    """[T, H, D] rows: N(0, s^2) with s per row over 2^-20 .. 2^20, and (adversarial) zero, constant,
    one-hot, midpoint-tie and power-of-two rows."""
    x = rng.standard_normal((T, H, D)) * np.exp2(rng.integers(-20, 21, (T, H, 1)))
    if src == "float16":
        x = np.clip(x * 2.0**-6, -6e4, 6e4)
    if adversarial and T >= 8:
        x[0] = 0.0
        x[1] = 3.0
        x[2] = 0.0
        x[2, :, 5] = -7.5
        # x / s on a midpoint exactly: a group whose absmax gives s = 2^0 (6.41 * 0.156 = 1.0) holding 0.25, 1.75
        x[3] = 0.25
        x[3, :, ::8] = 1.75
        x[3, :, 0::32] = 6.41
        x[4] = np.exp2(rng.integers(-8, 8, (H, D)).astype(np.float64))
        x[5] = -x[4]
    return x.astype(SRC[src])


def store_both(key, value, slots, nb=4, bs=16):
    H, D = key.shape[1], key.shape[2]
    ours = np.zeros((nb, bs, H, vt.turboquant_slot_bytes(FMT, D)), np.uint8)
    twin = np.zeros_like(ours)
    vt.turboquant_store(key, value, ours, slots, FMT)
    uq_twin.store(key, value, twin, slots)
    return ours, twin


def slots_for(rng, T, nb=4, bs=16):
    s = rng.permutation(nb * bs)[:T].astype(np.int64)
    s[rng.random(T) < 0.1] = -1
    return s


@pytest.mark.parametrize("src", sorted(SRC))
@pytest.mark.parametrize("D", [32, 64, 128, 256])
def test_store_matches_the_numpy_twin(D, src):
    rng = np.random.default_rng(D)
    T, H = 40, 2
    k, v = rows(rng, T, H, D, src), rows(rng, T, H, D, src)
    ours, twin = store_both(k, v, slots_for(rng, T))
    assert np.array_equal(ours, twin)
    assert vt.turboquant_slot_bytes(FMT, D) == D + D // 16  # vLLM's slot_size: 136 at D = 128, 272 at 256


def test_non_finite_groups_store_the_zero_sentinel():
    """A group holding inf or NaN stores scale byte 0 and +0 codes; the row's other groups are untouched by it."""
    rng = np.random.default_rng(1)
    v = rng.standard_normal((2, 1, 64)).astype(np.float32)
    v[0, 0, 3] = np.inf
    v[1, 0, 40] = np.nan
    tiny = np.full((1, 1, 64), 1e-45, np.float32)  # 0.156 * 1.4e-45 underflows: the zero sentinel, no UB
    ours_t, twin_t = store_both(tiny, tiny, np.array([0], np.int64))
    assert np.array_equal(ours_t, twin_t) and not ours_t.reshape(-1, 1, 68)[0, 0, 34:].any()
    k = np.ones_like(v)
    ours, twin = store_both(k, v, np.array([0, 1], np.int64))
    assert np.array_equal(ours, twin)
    vpart = ours.reshape(-1, 1, 68)[:2, 0, 34:]  # V codes (2 groups of 16 bytes), then its 2 scale bytes
    assert not vpart[0, :16].any() and vpart[0, 32] == 0 and vpart[0, 33] != 0  # group 0 zeroed, group 1 kept
    assert not vpart[1, 16:32].any() and vpart[1, 33] == 0 and vpart[1, 32] != 0
    _, V = vt.turboquant_gather(ours, np.array([0, 1], np.int64), FMT, 64)
    assert np.all(np.isfinite(V)) and not V[0, 0, :32].any() and not V[1, 0, 32:].any()


def test_gather_matches_the_twin_and_keys_rotate_back():
    rng = np.random.default_rng(2)
    k, v = rows(rng, 24, 2, 128, "bfloat16", adversarial=False), rows(rng, 24, 2, 128, "bfloat16", adversarial=False)
    slots = np.arange(24, dtype=np.int64)
    ours, _ = store_both(k, v, slots)
    K, V = vt.turboquant_gather(ours, slots, FMT, 128)
    tk, tv = uq_twin.gather(ours, slots, 128)
    assert np.array_equal(K, tk) and np.array_equal(V, tv)
    # in the model's basis K_rot H approximates k: 4-bit codes, a power-of-two scale per 32
    kb = K @ vt._turboquant.hadamard(128)
    rel = np.linalg.norm(kb - k.astype(np.float32), axis=-1) / np.linalg.norm(k.astype(np.float32), axis=-1)
    assert 0.02 < float(np.median(rel)) < 0.2

def test_gather_of_any_bytes_equals_the_twin():
    """Slots of random bytes (every code, every scale byte 0-255: 0 reads 0, 255 is 2^128 = inf) read by
    turboquant_gather (the attention's slot read) as the twin reads them, bit for bit."""
    rng = np.random.default_rng(3)
    D = 128
    raw = rng.integers(0, 256, (40, 16, 1, D + 2 * D // 32), dtype=np.uint8)
    raw[0, 0, 0, D // 2: D // 2 + 4] = [0, 1, 254, 255]
    s = np.arange(40 * 16, dtype=np.int64)
    K, V = vt.turboquant_gather(raw, s, FMT, D)
    with np.errstate(over="ignore", invalid="ignore"):
        tk, tv = uq_twin.gather(raw, s, D)
    np.testing.assert_array_equal(K, tk)
    np.testing.assert_array_equal(V, tv)
    assert np.isinf(K).any() and np.isnan(K).any()



def test_store_matches_vllms_triton_store(vllm_source, tmp_path):
    """vLLM's store takes bfloat16 / float16 (its _SUPPORTED_DTYPES); every finite row, adversarial ones
    included, is compared byte for byte over the whole cache (skipped slots stay zero in both)."""
    pytest.importorskip("torch")
    _require_triton()
    cases = []
    for i, (src, D) in enumerate([(s, d) for s in ("bfloat16", "float16") for d in (32, 64, 128, 256)]):
        rng = np.random.default_rng(100 + i)
        T, H = 40, 2
        k, v = rows(rng, T, H, D, src), rows(rng, T, H, D, src)
        slots = slots_for(rng, T)
        case = dict(key=k.view(np.uint16), value=v.view(np.uint16), src=src, slots=slots, nb=4, bs=16)
        np.savez(tmp_path / f"case_{i:03d}.npz", **case)
        cases.append((k, v, slots))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"the Triton child failed:\n{proc.stderr[-3000:]}"
    for i, (k, v, slots) in enumerate(cases):
        theirs = np.load(tmp_path / f"out_{i:03d}.npz")["cache"]
        ours, _ = store_both(k, v, slots)
        assert np.array_equal(ours, theirs), f"case {i}: {int((ours != theirs).sum())} bytes differ"


@pytest.fixture(scope="module")
def vllm_reference(vllm_source):
    torch = pytest.importorskip("torch")
    fmt = upstream.extract(vllm_source.read(upstream.F_UQ_FORMAT), [
        "FP4_LEVELS_SORTED", "MIDPOINTS_SORTED", "SORTED_TO_BITS", "GROUP_SIZE", "DEFAULT_CONSTANT_C",
        "get_constant_c", "UE8M0_BIAS"], {"math": math})
    names = ["_LEVELS_CACHE", "_MIDPOINTS_CACHE", "_SORTED_TO_BITS_CACHE", "_get_levels", "_get_midpoints",
             "_get_sorted_to_bits", "_HADAMARD_CACHE", "hadamard_matrix", "_snap_to_sorted_idx",
             "_pack_nibbles_last_dim", "_unpack_nibbles_last_dim", "_ue8m0_snap_tensor", "UltraQuantEncoded",
             "ultraquant_encode", "ultraquant_dequant", "ultraquant_encode_decode",
             "reference_ultraquant_attention"]
    consts = {n: fmt[n] for n in ("FP4_LEVELS_SORTED", "MIDPOINTS_SORTED", "SORTED_TO_BITS", "GROUP_SIZE",
                                  "UE8M0_BIAS", "get_constant_c")}
    return torch, upstream.extract(vllm_source.read(upstream.F_UQ_REFERENCE), names,
                                   {**consts, "torch": torch, "dataclass": dataclass})


def test_codes_and_read_match_vllms_torch_reference(vllm_reference):
    """vLLM's ultraquant_encode (rotate=False) on V and on the store kernel's rotated K gives vtinfer's codes
    and scale bytes; its ultraquant_dequant gives vtinfer's read, bit for bit."""
    torch, ref = vllm_reference
    rng = np.random.default_rng(3)
    D = 128
    k, v = rows(rng, 32, 2, D, "bfloat16"), rows(rng, 32, 2, D, "bfloat16")
    slots = np.arange(32, dtype=np.int64)
    ours, _ = store_both(k, v, slots, nb=2)
    o = ours.reshape(-1, 2, 136)[:32]
    for part, x in ((0, uq_twin.rotate(k.astype(np.float32))), (68, v.astype(np.float32))):
        enc = ref["ultraquant_encode"](torch.from_numpy(np.ascontiguousarray(x)), rotate=False)
        assert np.array_equal(enc.codes_packed.numpy(), o[..., part:part + 64])
        assert np.array_equal(enc.scale_bytes.numpy(), o[..., part + 64:part + 68])
        dec = ref["ultraquant_dequant"](enc, D).numpy()
        K, V = vt.turboquant_gather(ours, slots, FMT, D)
        assert np.array_equal(dec, K if part == 0 else V)


def test_attention_matches_vllms_reference_attention(vllm_reference):
    """vLLM's reference_ultraquant_attention (its own encode with a matmul rotation, q rotated and rounded
    to e4m3fn, float32 softmax) against vt.turboquant_attention decoding the same K/V from the slot cache:
    the same read up to the rotation's last-bit differences (a code flip now and then)."""
    torch, ref = vllm_reference
    rng = np.random.default_rng(4)
    B, N, Hk, Hq, D, bs = 3, 96, 2, 8, 128, 16
    k = rng.standard_normal((B, N, Hk, D)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((B, N, Hk, D)).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((B, Hq, D)).astype(ml_dtypes.bfloat16)
    tq = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    want = ref["reference_ultraquant_attention"](tq(q), tq(k), tq(v), scale=D ** -0.5).float().numpy()
    nbp = N // bs
    table = rng.permutation(B * nbp).reshape(B, nbp).astype(np.int32)
    cache = np.zeros((B * nbp, bs, Hk, vt.turboquant_slot_bytes(FMT, D)), np.uint8)
    for b in range(B):
        j = np.arange(N)
        vt.turboquant_store(k[b], v[b], cache, table[b, j // bs].astype(np.int64) * bs + j % bs, FMT)
    got = vt.turboquant_attention(q, cache, cu_seqlens_q=np.arange(B + 1, dtype=np.int32),
                                  seqused_k=np.full(B, N, np.int32), block_table=table, kv_cache_dtype=FMT,
                                  softmax_scale=D ** -0.5).astype(np.float32)
    err = np.abs(got - want)
    assert float(err.max()) < 0.02 and float(err.mean()) < 2e-3, (float(err.max()), float(err.mean()))


ORACLE_Q_LENS, ORACLE_K_LENS, ORACLE_BS = [1, 7, 1, 12], [1, 33, 70, 41], 16


def store_oracle_sequences(rng, fmt, Hkv, D, draw):
    """The slot cache of the oracle tests: ORACLE_K_LENS keys per sequence in blocks of ORACLE_BS, over a
    shuffled block table with 2 spare blocks, its untouched bytes 0x5A. draw(T) gives a sequence's key and
    value rows (float32 [T, Hkv, D]), stored through turboquant_store. Returns the cache
    [NB, bs, Hkv, slot bytes], the block table and which of the NB * bs slots hold a key."""
    bs = ORACLE_BS
    NB, bt = shuffled_block_table(rng, ORACLE_K_LENS, bs, extra_blocks=2)
    cache = np.full((NB, bs, Hkv, vt.turboquant_slot_bytes(fmt, D)), 0x5A, np.uint8)
    used = np.zeros(NB * bs, bool)
    for b, k_len in enumerate(ORACLE_K_LENS):
        j = np.arange(k_len)
        slots = bt[b, j // bs].astype(np.int64) * bs + j % bs
        key, value = draw(k_len)
        vt.turboquant_store(key, value, cache, slots, fmt)
        used[slots] = True
    return cache, bt, used


def check_attention_against_oracle(fmt, q, q_oracle, cache, bt, used, K, V, what):
    """turboquant_attention over cache (ORACLE_Q_LENS queries q [T, H, D]) against the float64 oracle of
    test_attention_oracle.py reading q_oracle and the twin's K, V [NB * bs, Hkv, D] (NaN where no key was
    stored), with FlashAttention's 2x rule."""
    NB, bs, Hkv = cache.shape[:3]
    D = q.shape[-1]
    K, V = K.astype(np.float64), V.astype(np.float64)
    K[~used], V[~used] = np.nan, np.nan
    cu = np.concatenate([[0], np.cumsum(ORACLE_Q_LENS)]).astype(np.int32)
    sk = np.asarray(ORACLE_K_LENS, np.int32)
    out, lse = vt.turboquant_attention(q, cache, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, kv_cache_dtype=fmt,
                                       return_lse=True, softmax_scale=D ** -0.5, num_threads=2)
    check_close(out, lse, (q_oracle, K.reshape(NB, bs, Hkv, D), V.reshape(NB, bs, Hkv, D), cu, sk, bt),
                {"softmax_scale": D ** -0.5}, what=what)


@pytest.mark.parametrize("Hkv,H", [(2, 2), (2, 8)])
@pytest.mark.parametrize("D", [64, 256])
def test_attention_matches_oracle_over_dequantized_cache(D, Hkv, H):
    """The oracle reads the twin's cache in the rotated basis with the query as the read rounds it:
    q_rot = e4m3fn(q H). The queries are dyadic (k / 8, |k| <= 8) and at D = 64 / 256 H's entries are
    +-1/8 / +-1/16, so q H is exact in float32 and its e4m3 rounding is the same wherever computed."""
    rng = np.random.default_rng(D + H)
    cache, bt, used = store_oracle_sequences(
        rng, FMT, Hkv, D, lambda T: (rows(rng, T, Hkv, D, "float32", adversarial=False),
                                     rng.standard_normal((T, Hkv, D)).astype(np.float32)))
    K, V = uq_twin.gather(cache, np.arange(cache.shape[0] * cache.shape[1]), D)
    q = (rng.integers(-8, 9, (sum(ORACLE_Q_LENS), H, D)) / 8).astype(np.float32)
    sylvester = np.ones((1, 1))
    while sylvester.shape[0] < D:
        sylvester = np.block([[sylvester, sylvester], [sylvester, -sylvester]])
    q_read = (q.astype(np.float64) @ (sylvester / math.sqrt(D))).astype(np.float32)
    q_read = q_read.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    check_attention_against_oracle(FMT, q, q_read, cache, bt, used, K, V, what=f"{FMT} D={D} GQA {H // Hkv}")


@pytest.mark.parametrize("fmt", [FMT, "octave_k3v3"])
def test_functional_forms_and_torch_op_take_it(fmt):
    """reshape_and_cache_flash / flash_attn_varlen_func with kv_cache_dtype='ultraquant_4bit' (or an Octave
    format) are turboquant_store / turboquant_attention on the one slot cache (and so are the torch ops)."""
    rng = np.random.default_rng(6)
    D, T = 128, 20
    S = vt.turboquant_slot_bytes(fmt, D)
    k, v = rows(rng, T, 2, D, "bfloat16", adversarial=False), rows(rng, T, 2, D, "bfloat16", adversarial=False)
    slots = np.arange(T, dtype=np.int64)
    a = np.zeros((2, 16, 2, S), np.uint8)
    b = np.zeros_like(a)
    vt.reshape_and_cache_flash(k, v, a, a, slots, fmt, 1.0, 1.0)
    vt.turboquant_store(k, v, b, slots, fmt)
    assert np.array_equal(a, b)
    q = rng.standard_normal((2, 4, D)).astype(ml_dtypes.bfloat16)
    kw = dict(cu_seqlens_q=np.array([0, 1, 2], np.int32), seqused_k=np.array([20, 9], np.int32),
              block_table=np.array([[0, 1], [1, 0]], np.int32))
    o1 = vt.flash_attn_varlen_func(q, a, a, kv_cache_dtype=fmt, **kw)
    o2 = vt.turboquant_attention(q, a, kv_cache_dtype=fmt, **kw)
    assert np.array_equal(np.asarray(o1).view(np.uint16), o2.view(np.uint16))
    torch = pytest.importorskip("torch")
    import vtinfer.torch  # noqa: F401

    tk = lambda x: torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    c = torch.zeros(2, 16, 2, S, dtype=torch.uint8)
    torch.ops.vtinfer.reshape_and_cache_flash(tk(k), tk(v), c, c, torch.from_numpy(slots), fmt, torch.tensor(1.0),
                                              torch.tensor(1.0))
    assert np.array_equal(c.numpy(), a)


def test_bad_geometry_gets_the_formats_one_message():
    for D in (16, 48, 96, 8192):
        k = np.zeros((1, 1, D), np.float32)
        cache = np.zeros((1, 16, 1, max(D + D // 16, 1)), np.uint8)
        with pytest.raises(ValueError, match=r"a power of two from 32 to 4096 \(one Hadamard rotation of the whole "
                                             r"row, groups of 32\) for kv_cache_dtype 'ultraquant_4bit'; got "
                                             + str(D)):
            vt.turboquant_store(k, k, cache, np.zeros(1, np.int64), FMT)
        assert not cache.any()
    with pytest.raises(ValueError, match=r"PagedKVCache: head_size must be a power of two from 32 to 4096 .* for dtype "
                                         r"'ultraquant_4bit'; got 48"):
        vt.PagedKVCache(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_size=48, dtype=FMT)


def test_slot_bytes_pages_boundary_layers_and_resolution_equal_vllms(vllm_source, tmp_path):
    """Slot bytes equal the wheel's format.slot_size; plan_kv_cache keeps vLLM's boundary layers (EngineArgs
    applies TurboQuant's get_boundary_skip_layers to ultraquant_4bit too) at the model dtype and gives the
    rest one slot per (token, KV head); the flag resolves to the format."""
    import json

    from vtinfer.hf_config import ModelGeometry

    fmt = upstream.extract(vllm_source.read(upstream.F_UQ_FORMAT), [
        "GROUP_SIZE", "get_group_size", "k_codes_bytes", "n_groups", "k_scales_bytes", "v_codes_bytes",
        "v_scales_bytes", "slot_size"], {"math": math})
    for D in (32, 64, 128, 256, 512, 4096):
        assert vt.turboquant_slot_bytes(FMT, D) == fmt["slot_size"](D) == uq_twin.slot_bytes(D), D
    packed = vllm_source.read("vllm/engine/arg_utils.py").split("uses_packed_kv_backend = (", 1)[1]
    assert 'or resolved_cache_dtype == "ultraquant_4bit"' in packed.split("if uses_packed_kv_backend:", 1)[0]
    geo = ModelGeometry.from_dict({"num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2,
                                   "head_dim": 128, "torch_dtype": "bfloat16"})
    p = vt.plan_kv_cache(geo, FMT, 16, num_blocks=4)
    assert p.skipped_layers == (0, 1, 4, 5)
    assert p.layer_dtypes == ("bfloat16",) * 2 + (FMT,) * 2 + ("bfloat16",) * 2
    assert p.layer_page_bytes[2] == 2 * 16 * fmt["slot_size"](128)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4,
                                                      "num_key_value_heads": 2, "hidden_size": 256,
                                                      "torch_dtype": "bfloat16"}))
    assert vt.resolve_kv_cache_dtype(FMT, tmp_path).dtype == FMT
    info = vt.dtype_info(FMT)
    assert (info.family, info.page_layout, info.scale_kind, info.key_bits, info.value_bits) == (
        "ultraquant", "slots", "slot", 4, 4)
    assert FMT in vt.SLOT_DTYPES and FMT not in vt.TURBOQUANT_DTYPES and FMT not in vt.KV_CACHE_DTYPES_NOT_STORED


@pytest.mark.parametrize("fmt", ["ultraquant_4bit", "turboquant_k8v4", "octave_k3v4"])
def test_gather_on_the_pool_equals_one_thread(fmt):
    rng = np.random.default_rng(7)
    T, H, D = 600, 4, 128
    k, v = rows(rng, T, H, D, "bfloat16", adversarial=False), rows(rng, T, H, D, "bfloat16", adversarial=False)
    cache = np.zeros((T // 16 + 1, 16, H, vt.turboquant_slot_bytes(fmt, D)), np.uint8)
    slots = rng.permutation(cache.shape[0] * 16)[:T].astype(np.int64)
    vt.turboquant_store(k, v, cache, slots, fmt)
    one = vt.turboquant_gather(cache, slots, fmt, D, num_threads=1)
    two = vt.turboquant_gather(cache, slots, fmt, D, num_threads=2)
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(one, two))
