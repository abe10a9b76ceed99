"""fp8 / bf16 / f16 codecs against independent references.

References: ml_dtypes' casts (after clamping to +-max finite, since
ml_dtypes does not saturate), NumPy's float16 cast, and an exhaustive
nearest-value search over the 256-code table written here in NumPy.
Every test runs on every ISA the CPU has (the `isa` fixture)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt

FMTS = {
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}


def ref_quantize(x: np.ndarray, scale: float, fmt: str) -> np.ndarray:
    """Independent reference: float32 division, clamp, ml_dtypes RNE cast;
    NaN -> 0x7F (CUDA's canonical NaN)."""
    dt, mx = FMTS[fmt]
    with np.errstate(invalid="ignore", over="ignore"):
        v = (x.astype(np.float32) / np.float32(scale)).astype(np.float32)
        nan = np.isnan(v)
        v = np.clip(v, -mx, mx)
        codes = v.astype(dt).view(np.uint8).copy()
    codes[nan] = 0x7F
    return codes


def nearest_code_search(x: np.ndarray, fmt: str) -> np.ndarray:
    """A second reference that uses no cast at all: nearest value among the
    finite codes, ties to the even code, saturating, sign kept."""
    dt, mx = FMTS[fmt]
    table = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
    pos = np.arange(128)
    finite = pos[np.isfinite(table[:128]) & (table[:128] <= mx)]
    vals = table[finite]
    with np.errstate(invalid="ignore"):
        return _nearest(x, table, finite, mx)


def _nearest(x, table, finite, mx):
    vals = table[finite]
    a = np.abs(x.astype(np.float64))
    idx = np.clip(np.searchsorted(vals, a, side="right") - 1, 0, len(vals) - 1)
    hi = np.clip(idx + 1, 0, len(vals) - 1)
    dlo, dhi = a - vals[idx], vals[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (finite[idx] % 2 == 1))
    code = np.where(pick_hi, finite[hi], finite[idx]).astype(np.uint8)
    code = np.where(a >= mx, finite[-1], code).astype(np.uint8)
    code |= (np.signbit(x).astype(np.uint8) << 7)
    code[np.isnan(x)] = 0x7F
    return code


def random_bits(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_all_256_codes_decode_like_ml_dtypes(isa, fmt):
    dt, _ = FMTS[fmt]
    codes = np.arange(256, dtype=np.uint8)
    got = vt.fp8_dequantize(codes, fmt=fmt)
    want = codes.view(dt).astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    fin = ~np.isnan(want)
    assert np.array_equal(got[fin].view(np.uint32), want[fin].view(np.uint32))  # -0.0 included
    # ml_dtypes arrays are accepted as codes and imply the format
    assert np.array_equal(vt.fp8_dequantize(codes.view(dt))[fin], want[fin])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("scale", [1.0, 0.0625, 3.0, 0.37, 1e-3])
def test_random_float32_bits_match_references(isa, fmt, scale):
    x = random_bits(1 << 18, seed=7)
    got = vt.fp8_quantize(x, scale=scale, fmt=fmt)
    want = ref_quantize(x, scale, fmt)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (fmt, scale, x[bad[:5]], got[bad[:5]], want[bad[:5]])
    with np.errstate(invalid="ignore", over="ignore"):
        v = (x / np.float32(scale)).astype(np.float32)
    assert np.array_equal(got, nearest_code_search(v, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_midpoint_ties_to_even_and_neighbours_round_away(isa, fmt):
    dt, mx = FMTS[fmt]
    vals = np.arange(128, dtype=np.uint8).view(dt).astype(np.float64)
    vals = vals[np.isfinite(vals) & (vals <= mx)]
    mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (vals[:-1] + vals[1:]) / 2)  # exact in float32
    x = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)])
    x = np.concatenate([x, -x])
    got = vt.fp8_quantize(x, fmt=fmt)
    assert np.array_equal(got, nearest_code_search(x, fmt))
    lo = np.arange(len(mids))
    tie_codes = got[: len(mids)]
    assert np.all(tie_codes % 2 == 0), "ties go to the even code"
    assert np.all((tie_codes == lo) | (tie_codes == lo + 1))


@pytest.mark.parametrize("fmt,code_max", [("e4m3", 0x7E), ("e5m2", 0x7B)])
def test_saturation_nan_and_signed_zero(isa, fmt, code_max):
    mx = FMTS[fmt][1]
    x = np.array([mx, np.nextafter(np.float32(mx), np.inf), mx * 1.0625, 1e30, np.inf, -np.inf, -1e30,
                  np.nan, -np.nan, 0.0, -0.0, -1e-30], np.float32)
    got = vt.fp8_quantize(x, fmt=fmt)
    assert list(got[:5]) == [code_max] * 5
    assert list(got[5:7]) == [0x80 | code_max] * 2
    assert list(got[7:9]) == [0x7F, 0x7F]  # canonical NaN, sign dropped as CUDA does
    assert list(got[9:]) == [0x00, 0x80, 0x80]  # -0 and tiny negatives keep the sign
    back = vt.fp8_dequantize(got, fmt=fmt)
    assert np.isnan(back[7]) and np.signbit(back[10]) and back[0] == mx


def test_e4m3_subnormal_grid_is_exact(isa):
    k = np.arange(8, dtype=np.float32)
    x = k * np.float32(2.0**-9)
    assert list(vt.fp8_quantize(x)) == list(range(8))
    half = (k[:-1] + 0.5) * np.float32(2.0**-9)  # ties between subnormals
    assert list(vt.fp8_quantize(half)) == [0, 2, 2, 4, 4, 6, 6]
    assert np.array_equal(vt.fp8_dequantize(np.arange(8, dtype=np.uint8)), x)


def find_division_cases(n: int) -> list[tuple[np.float32, np.float32]]:
    """(x, s) pairs where fl(x/s) and fl(x * fl(1/s)) give different e4m3
    codes: x/s lands exactly on a midpoint, x*(1/s) one ulp away."""
    vals = np.arange(0x08, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)
    found = []
    s = np.float32(0.3)
    for _ in range(20000):
        s = np.nextafter(s, np.float32(1))
        x = (mids * s).astype(np.float32)
        div = ref_quantize(x, s, "e4m3")
        mul = ref_quantize((x * (np.float32(1) / s)).astype(np.float32), 1.0, "e4m3")
        for i in np.flatnonzero(div != mul)[:1]:
            found.append((x[i], s))
        if len(found) >= n:
            break
    return found


def test_scale_is_a_true_division_not_a_reciprocal_multiply(isa):
    cases = find_division_cases(4)
    assert len(cases) == 4, "the search must find cases where the two differ"
    for x, s in cases:
        got = vt.fp8_quantize(np.array([x], np.float32), scale=float(s))[0]
        div = ref_quantize(np.array([x]), s, "e4m3")[0]
        mul = ref_quantize(np.array([x * (np.float32(1) / s)], np.float32), 1.0, "e4m3")[0]
        assert got == div and got != mul


@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_half_bit_pattern_as_input(isa, src, fmt):
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(src)
    for scale in (1.0, 0.75):
        got = vt.fp8_quantize(x, scale=scale, fmt=fmt)
        assert np.array_equal(got, ref_quantize(x.astype(np.float32), scale, fmt))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_dequantize_times_scale_in_each_output_dtype(isa, fmt, dtype):
    dt, _ = FMTS[fmt]
    codes = np.arange(256, dtype=np.uint8)
    scale = np.float32(0.3)
    got = vt.fp8_dequantize(codes, scale=float(scale), fmt=fmt, dtype=dtype)
    assert got.dtype == np.dtype(dtype)
    want = (codes.view(dt).astype(np.float32) * scale).astype(dtype)
    g, w = got.astype(np.float32), want.astype(np.float32)
    assert np.array_equal(np.isnan(g), np.isnan(w))
    assert np.array_equal(g[~np.isnan(w)], w[~np.isnan(w)])


def test_convert_matches_numpy_and_ml_dtypes(isa):
    x = random_bits(1 << 18, seed=11)
    bf = vt.convert(x, ml_dtypes.bfloat16)
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    assert np.array_equal(bf.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    with np.errstate(invalid="ignore"):
        assert np.all(np.isnan(bf[nan].astype(np.float32)))
    h = vt.convert(x, np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        wh = x.astype(np.float16)
    assert np.array_equal(h.view(np.uint16)[~nan], wh.view(np.uint16)[~nan])
    halves = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    for src in (np.float16, ml_dtypes.bfloat16):
        f = vt.convert(halves.view(src), np.float32)
        with np.errstate(invalid="ignore"):
            w = halves.view(src).astype(np.float32)
        fin = ~np.isnan(w)
        assert np.array_equal(f.view(np.uint32)[fin], w.view(np.uint32)[fin])


def test_multithreaded_result_equals_single_thread(isa):
    x = random_bits(3 << 18, seed=5)
    one = vt.fp8_quantize(x, scale=0.5, num_threads=1)
    many = vt.fp8_quantize(x, scale=0.5, num_threads=4)
    assert np.array_equal(one, many)
    assert np.array_equal(one, ref_quantize(x, 0.5, "e4m3"))


def test_torch_cast_agrees_after_clamping(isa):
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch cast comparison needs it")
    x = random_bits(1 << 16, seed=3)
    x = x[np.isfinite(x)]
    for fmt, tdt, mx in (("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)):
        t = torch.from_numpy(x.copy()).clamp(-mx, mx).to(tdt).view(torch.uint8).numpy()
        assert np.array_equal(vt.fp8_quantize(x, fmt=fmt), t)
        # torch tensors (bf16 included) go in through DLPack
        tb = torch.from_numpy(x.copy()).to(torch.bfloat16)
        want = ref_quantize(tb.float().numpy(), 1.0, fmt)
        got = vt.fp8_quantize(tb, fmt=fmt)  # torch in, torch float8 codes out
        assert got.dtype == tdt
        assert np.array_equal(got.view(torch.uint8).numpy(), want)
