"""flash_attn_varlen_func against the float64 oracle, on every ISA (the
`isa` fixture forces each), with FlashAttention's 2x rule."""

from __future__ import annotations

import numpy as np
import pytest

import vtinfer as vt
from tests.numerics.test_attention_oracle import check_close, make_case

GQA = [(4, 4), (8, 2), (8, 1)]  # group sizes 1, 4, 8


def run(args, kw, **extra):
    q, k, v, cu, sk, bt = args
    return vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, return_lse=True,
                                     **kw, **extra)


@pytest.mark.parametrize("block_size", [1, 16, 32])
@pytest.mark.parametrize("D", [64, 80, 128, 256])
@pytest.mark.parametrize("heads", GQA, ids=lambda x: f"H{x[0]}kv{x[1]}")
def test_shape_grid_mixed_batch(isa, block_size, D, heads):
    """Decode + prefill in one call; key counts at page boundary -1/0/+1."""
    rng = np.random.default_rng(1000 * block_size + D + heads[1])
    bs = block_size
    k_lens = [1, max(bs - 1, 1), bs, bs + 1, 3 * bs + 1]
    q_lens = [1, 1, min(bs, 5), 1, 4]
    args = make_case(rng, q_lens=q_lens, k_lens=k_lens, H=heads[0], Hkv=heads[1], D=D, block_size=bs)
    out, lse = run(args, {})
    check_close(out, lse, args, {}, what=f"{isa} bs={bs} D={D} {heads}")


@pytest.mark.parametrize("k_len", [1, 15, 16, 17, 255, 256, 257, 3001])
@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("H", [8, 16])
def test_decode_lengths_and_splits(isa, k_len, threads, H):
    """One query per sequence; long ones are split across threads (LSE merge). GQA 16: the AVX2 lanes form."""
    rng = np.random.default_rng(k_len * 7 + threads + H)
    args = make_case(rng, q_lens=[1], k_lens=[k_len], H=H, Hkv=1, D=128, block_size=16)
    out, lse = run(args, {}, num_threads=threads)
    check_close(out, lse, args, {}, what=f"{isa} k_len={k_len} nth={threads} H={H}")


OPTIONS = {
    "plain": {},
    "noncausal": {"causal": False},
    "scale": {"softmax_scale": 0.3},
    "window": {"window_size": (5, 0)},
    "window_lr": {"causal": False, "window_size": (3, 2)},
    "softcap": {"softcap": 2.5},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625, 0.03, 0.02, 0.01, 0.005], np.float32)},
    "sinks": {"s_aux": np.array([0.0, 1.0, -2.0, 3.0, 0.5, -0.5, 2.0, 4.0], np.float32)},
    "descale_tensor": {"k_descale": np.float32(0.5), "v_descale": np.float32(2.0)},
    "descale_head": {"k_descale": np.array([0.5, 2.0], np.float32), "v_descale": np.array([4.0, 0.25], np.float32)},
    "descale_batch": {"k_descale": np.array([[0.5, 2.0], [1.5, 0.75], [1, 3]], np.float32),
                      "v_descale": np.array([[4.0, 0.25], [1, 2], [0.5, 0.125]], np.float32)},
}
OPTIONS["combined"] = {**OPTIONS["softcap"], **OPTIONS["alibi"], **OPTIONS["sinks"], **OPTIONS["window"],
                       **OPTIONS["descale_batch"], "softmax_scale": 0.2}


# (q_lens, k_lens, seed factor): a mixed batch, and one whose sequences have a multiple of 8 rows per KV head
# (queries x 4 heads: the AVX2 tile's lanes form from 16), with windows starting inside a block of keys
OPTION_SHAPES = {"mixed": ([1, 7, 3], [40, 7, 300], 31), "rows8k": ([2, 8, 4], [43, 8, 301], 17)}


@pytest.mark.parametrize("shape", list(OPTION_SHAPES))
@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3", "fp8_e5m2"])
def test_options(isa, name, kv, shape):
    q_lens, k_lens, f = OPTION_SHAPES[shape]
    rng = np.random.default_rng(len(name) * f + len(kv))
    args = make_case(rng, q_lens=q_lens, k_lens=k_lens, H=8, Hkv=2, D=64, block_size=16, kv_cache_dtype=kv)
    kw = dict(OPTIONS[name], kv_cache_dtype=kv)
    out, lse = run(args, kw)
    check_close(out, lse, args, kw, what=f"{isa} {name} {kv} {shape}")


@pytest.mark.parametrize("q_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kv", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "fp8"])
def test_every_dtype(isa, q_dtype, kv):
    rng = np.random.default_rng(hash((q_dtype, kv)) % 2**32)
    fp8 = kv.startswith("fp8")
    kvd = {"fp8": "fp8_e4m3"}.get(kv, kv)
    args = make_case(rng, q_lens=[1, 9], k_lens=[70, 33], H=8, Hkv=2, D=128, block_size=16, q_dtype=q_dtype,
                     kv_cache_dtype=kvd if fp8 else "auto", kv_float=kv if not fp8 else "float32")
    kw = {"kv_cache_dtype": kv if fp8 else "auto", "k_descale": np.float32(0.75), "v_descale": np.float32(1.5)}
    out, lse = run(args, kw)
    assert out.dtype == args[0].dtype
    check_close(out, lse, args, dict(kw, kv_cache_dtype=kvd if fp8 else "auto"), what=f"{isa} {q_dtype} {kv}")


@pytest.mark.parametrize("D", [64, 72, 128, 256])
@pytest.mark.parametrize("kv", ["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"])
def test_every_dtype_every_head_size(isa, kv, D):
    """Each format at the head sizes the SIMD tiles compile as constants (64, 128, 256) and at one they take at
    run time (72: a padded last chunk)."""
    rng = np.random.default_rng(hash((kv, D)) % 2**32)
    fp8 = kv.startswith("fp8")
    args = make_case(rng, q_lens=[1, 3], k_lens=[40, 19], H=4, Hkv=2, D=D, block_size=16, q_dtype="bfloat16",
                     kv_cache_dtype=kv if fp8 else "auto", kv_float=kv if not fp8 else "float32")
    kw = {"kv_cache_dtype": kv if fp8 else "auto", "k_descale": np.float32(0.5), "v_descale": np.float32(2.0)}
    out, lse = run(args, kw)
    check_close(out, lse, args, kw, what=f"{isa} {kv} D={D}")


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_hnd_layout_and_typed_codes(isa, kv):
    """HND caches passed as permuted views; fp8 codes as ml_dtypes float8."""
    rng = np.random.default_rng(5)
    args = make_case(rng, q_lens=[2, 1], k_lens=[50, 17], H=8, Hkv=2, D=80, block_size=16, kv_cache_dtype=kv,
                     layout="HND")
    assert not args[1].flags.c_contiguous
    out, lse = run(args, {"kv_cache_dtype": kv})
    check_close(out, lse, args, {"kv_cache_dtype": kv}, what=f"{isa} HND {kv}")
    if kv != "auto":
        import ml_dtypes

        typed = (args[0], args[1].view(ml_dtypes.float8_e4m3fn), args[2].view(ml_dtypes.float8_e4m3fn)) + args[3:]
        out2, _ = run(typed, {"kv_cache_dtype": kv})
        np.testing.assert_array_equal(out2, out)


def test_out_argument_and_untouched_rows(isa):
    rng = np.random.default_rng(9)
    q, k, v, cu, sk, bt = make_case(rng, q_lens=[2, 3], k_lens=[20, 30], H=4, Hkv=4, D=64, block_size=16)
    q = np.concatenate([q, np.ones((2, 4, 64), np.float32)])  # two rows past cu_seqlens_q[-1]
    out = np.full(q.shape, 7.0, np.float32)
    res = vt.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, seqused_k=sk, block_table=bt, out=out)
    assert res is out
    assert (out[5:] == 7.0).all()
    check_close(out[:5], None, (q[:5], k, v, cu, sk, bt), {}, what="out=")


def test_empty_rows_non_causal(isa):
    """Window excluding every key of a row: out 0, lse -inf (no sink)."""
    rng = np.random.default_rng(3)
    args = make_case(rng, q_lens=[4], k_lens=[2], H=2, Hkv=1, D=64, block_size=16)
    kw = {"causal": False, "window_size": (0, 0)}
    out, lse = run(args, kw)
    assert (out[:2] == 0).all() and np.isneginf(lse[:, :2]).all()
    check_close(out, lse, args, kw, what="empty rows")


@pytest.mark.parametrize("kv", ["bfloat16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("heads", GQA, ids=lambda x: f"H{x[0]}kv{x[1]}")
def test_simd_equals_scalar_twin(kv, heads):
    """Each SIMD variant against the scalar twin, by the same 2x rule."""
    from tests.conftest import available_isas, forced_isa
    from tests.numerics.test_attention_oracle import attention_ref

    fp8 = kv.startswith("fp8")
    args = make_case(np.random.default_rng(77), q_lens=[1, 20, 1], k_lens=[600, 40, 33], H=heads[0], Hkv=heads[1],
                     D=128, block_size=16, q_dtype="bfloat16", kv_cache_dtype=kv if fp8 else "auto",
                     kv_float="float32" if fp8 else kv)
    kw = {"kv_cache_dtype": kv if fp8 else "auto", "softcap": 5.0}
    with forced_isa("scalar"):
        twin, _ = run(args, kw)
    ref, _ = attention_ref(*args, **kw)
    naive, _ = attention_ref(*args, **kw, dt=np.float32)
    bound = 2 * np.abs(naive.astype(np.float64) - ref).max() + 16 * 2.0**-24 * np.abs(ref).max()
    for name in available_isas()[1:]:
        with forced_isa(name):
            fast, _ = run(args, kw)
        assert np.abs(fast.astype(np.float64) - twin.astype(np.float64)).max() <= 2 * bound, name


def test_keys_of_per_token_magnitudes(isa):
    """Keys and values scaled by 2^-4 .. 2^4 per (token, KV head), as the rotated slot formats' rows are: logits up
    to ~|q| |k| 16 / sqrt(D). A logit summed over D in one float32 chain (the scalar tile's first form) erred 1.9x
    the 2x rule's bound here (the SIMD tiles' lane sums 0.3x); it is summed in double now (0.3x)."""
    rng = np.random.default_rng(2)
    args = make_case(rng, q_lens=[1, 7, 3], k_lens=[700, 300, 1100], H=8, Hkv=2, D=128, block_size=16)
    q, k, v, cu, sk, bt = args
    k *= np.exp2(rng.integers(-4, 5, k.shape[:3] + (1,))).astype(np.float32)
    v *= np.exp2(rng.integers(-4, 5, v.shape[:3] + (1,))).astype(np.float32)
    kw = {"softmax_scale": 128 ** -0.5}
    out, lse = run(args, kw)
    check_close(out, lse, args, kw, what=f"{isa} GQA 4, per-token magnitudes")
