"""Bad input to the codec entry points: a clear exception that names the
argument, nothing written, the process alive."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import vtinfer as vt
from tests.binding.dlpack_fake import FakeTensor

X = np.linspace(-3, 3, 37, dtype=np.float32)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e-50, 1e300])
@pytest.mark.parametrize("fn", ["fp8_quantize", "fp8_dequantize"])
def test_bad_scale_is_value_error_naming_scale(fn, scale):
    arg = X if fn == "fp8_quantize" else np.zeros(4, np.uint8)
    out = np.full(arg.shape, 0xAB, np.uint8) if fn == "fp8_quantize" else np.full(4, 7.0, np.float32)
    with pytest.raises(ValueError, match=rf"{fn}: scale must be finite and > 0"):
        getattr(vt, fn)(arg, scale=scale, out=out)
    assert np.all(out == (0xAB if fn == "fp8_quantize" else 7.0)), "nothing written"


@pytest.mark.parametrize("scale", ["1.0", None, [1.0], True])
def test_scale_of_wrong_type_is_type_error(scale):
    with pytest.raises(TypeError, match="fp8_quantize: scale must be a real number"):
        vt.fp8_quantize(X, scale=scale)


@pytest.mark.parametrize("fmt", ["e4m4", "fp8_e4m3fnuz", "float16", "", 3])
def test_unknown_fmt_is_value_error_naming_fmt(fmt):
    with pytest.raises(ValueError, match="fmt must be 'e4m3' or 'e5m2'"):
        vt.fp8_quantize(X, fmt=fmt)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float64, object, np.complex64, bool])
def test_non_float_input_is_type_error_naming_x(dtype):
    with pytest.raises(TypeError, match=r"fp8_quantize: x must have dtype float32, float16, or bfloat16; got"):
        vt.fp8_quantize(np.zeros(5, dtype=dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.float16])
def test_codes_of_wrong_dtype_is_type_error_naming_codes(dtype):
    with pytest.raises(TypeError, match=r"fp8_dequantize: codes must have dtype"):
        vt.fp8_dequantize(np.zeros(5, dtype=dtype))


def test_codes_dtype_contradicting_fmt_is_type_error():
    with pytest.raises(TypeError, match="must be read with fmt='e5m2'"):
        vt.fp8_dequantize(np.zeros(5, np.uint8).view(ml_dtypes.float8_e5m2), fmt="e4m3")


def test_non_contiguous_numpy_input_is_handled_as_documented():
    base = np.linspace(-500, 500, 200, dtype=np.float32).reshape(20, 10)
    view = base[::2, ::3]
    assert not view.flags.c_contiguous
    assert np.array_equal(vt.fp8_quantize(view, scale=2.0), vt.fp8_quantize(np.ascontiguousarray(view), scale=2.0))


def test_non_contiguous_dlpack_input_is_refused():
    fake = FakeTensor([4, 2], strides=[1, 4])
    with pytest.raises(ValueError, match="x must be C-contiguous when passed through DLPack"):
        vt.fp8_quantize(fake)
    assert fake.deleted == 1, "the producer's deleter ran exactly once"


@pytest.mark.parametrize("shape", [[0], [0, 5], [3, 0, 2]])
def test_empty_arrays_are_fine(shape):
    x = np.zeros(shape, np.float32)
    c = vt.fp8_quantize(x)
    assert c.shape == x.shape and c.dtype == np.uint8
    assert vt.fp8_dequantize(c).shape == x.shape


@pytest.mark.parametrize("shape", [[2**40, 2**40], [2**62, 4], [2**31, 2**31, 2**31]])
def test_byte_size_overflowing_64_bits_is_value_error(shape):
    fake = FakeTensor(shape)
    with pytest.raises(ValueError, match="fp8_quantize: x must have .*fit in 64 bits"):
        vt.fp8_quantize(fake)
    assert fake.deleted == 1


def test_dlpack_of_unsupported_dtype_or_device():
    with pytest.raises(TypeError, match=r"x must have dtype .*; got float64"):
        vt.fp8_quantize(FakeTensor([2], code=2, bits=64))
    with pytest.raises(TypeError, match=r"x must have dtype .*; got DLPack\(code=5, bits=64"):
        vt.fp8_quantize(FakeTensor([2], code=5, bits=64))
    with pytest.raises(ValueError, match="x must be in CPU memory; got DLPack device type 2"):
        vt.fp8_quantize(FakeTensor([2], device_type=2))


@pytest.mark.parametrize(
    "out,match,exc",
    [
        (np.zeros(36, np.uint8), "out must have the input's shape", ValueError),
        (np.zeros(37, np.int8), "out must have dtype", TypeError),
        (np.zeros((37, 1), np.uint8), "out must have 1 dimensions", ValueError),
        (np.zeros(74, np.uint8)[::2], "out must be C-contiguous", ValueError),
        ([0] * 37, "out must be a NumPy array or support __dlpack__", TypeError),
    ],
)
def test_bad_out(out, match, exc):
    with pytest.raises(exc, match=match):
        vt.fp8_quantize(X, out=out)


def test_read_only_out_is_refused_and_unchanged():
    out = np.zeros(37, np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable"):
        vt.fp8_quantize(X, out=out)
    assert not out.any()


def test_out_overlapping_input_is_refused():
    buf = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="out must not overlap the input"):
        vt.fp8_quantize(buf[:16], out=buf.view(np.uint8)[:16])


def test_out_between_the_inputs_elements_is_not_overlap():
    # x's elements at bytes 0-3, 16-19, 32-35; out's 3 bytes at 8-10 lie inside x's extent, in the
    # gap between its elements: disjoint, so the quantize runs and gives the bytes of a copy of x.
    buf = np.zeros(16, np.float32)
    buf[[0, 4, 8]] = [1.5, -2.0, 448.0]
    x, out = buf[0:12:4], buf.view(np.uint8)[8:11]
    want = vt.fp8_quantize(x.copy())
    assert vt.fp8_quantize(x, out=out) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("n", [0, -1, True, 2.0, "4"])
def test_bad_num_threads(n):
    with pytest.raises((ValueError, TypeError), match="num_threads must be"):
        vt.fp8_quantize(X, num_threads=n)


def test_out_is_filled_and_returned():
    out = np.zeros(37, np.uint8).view(ml_dtypes.float8_e4m3fn)
    r = vt.fp8_quantize(X, out=out)
    assert r is out
    assert np.array_equal(out.view(np.uint8), vt.fp8_quantize(X))
