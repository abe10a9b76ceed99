"""The resolver / JSON binding on bad input: clear exceptions, never a crash."""

from __future__ import annotations

import pytest

from vtinfer import ConfigError, _C


@pytest.mark.parametrize("text,match", [
    (b"", "expecting value"), (b'{"a": tru', "expecting value"), (b"[" * 100000, "nesting"),
    (b'"\xc3"', "UTF-8"), (b"\xef\xbb\xbf{}", "BOM"), (b"{} {}", "extra data"),
])
def test_json_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        _C.json_loads(text, "x.json")


def test_limits_and_types():
    with pytest.raises(ConfigError, match="at most 4 bytes"):
        _C.json_loads(b"[1, 2]", max_bytes=4)
    with pytest.raises(TypeError, match="text must be bytes"):
        _C.json_loads("{}")
    with pytest.raises(TypeError, match="kv_cache_dtype must be a str"):
        _C.resolve_kv_cache_dtype(8, b"{}")
    with pytest.raises(TypeError, match="config must be bytes"):
        _C.resolve_kv_cache_dtype("auto", 3.5)
    with pytest.raises(OSError):
        _C.resolve_kv_cache_dtype("auto", "/nonexistent/config.json")
    with pytest.raises(ConfigError, match="config.json must hold a JSON object"):
        _C.resolve_kv_cache_dtype("auto", b"[]")
    with pytest.raises(ValueError, match="Unknown ModelOpt quant algo: int4"):
        _C.resolve_kv_cache_dtype("auto", b'{"quantization_config": {"producer": {"name": "modelopt"}, '
                                  b'"quantization": {"quant_algo": "int4"}}}')
    with pytest.raises(NotImplementedError, match="num_bits=8, type=float"):
        _C.resolve_kv_cache_dtype("auto", b'{"quantization_config": {"quant_method": "compressed-tensors", '
                                  b'"kv_cache_scheme": {"num_bits": 4, "type": "float"}}}')


def test_json_loads_integers_are_range_checked_by_name():
    """max_depth / max_bytes go through the common integer argument (no bare OverflowError past C's int)."""
    for kw, frag in ((dict(max_depth=-1), "max_depth"), (dict(max_depth=2**40), "max_depth"),
                     (dict(max_bytes=-3), "max_bytes"), (dict(max_depth=True), "max_depth")):
        with pytest.raises((ValueError, TypeError), match=f"json_loads: {frag}"):
            _C.json_loads(b"[1]", **kw)
    with pytest.raises(TypeError, match="json_loads: name must be a str or None; got int"):
        _C.json_loads(b"[1]", 5)
    assert _C.json_loads(b"[[1]]", max_depth=2) == [[1]]


def test_codec_short_names_come_from_the_table():
    import numpy as np

    import vtinfer as vt

    x = np.array([1.0, -2.0], np.float32)
    for name, want in (("e4m3", [0x38, 0xC0]), ("e4m3fn", [0x38, 0xC0]), ("e5m2", [0x3C, 0xC0])):
        assert vt.fp8_quantize(x, 1.0, name).tolist() == want, name
    with pytest.raises(ValueError, match=r"fmt must be 'e4m3' or 'e5m2' \(or fp8_e4m3, fp8, float8_e4m3fn, "
                                         r"fp8_e5m2, float8_e5m2\); got 'e3m4'"):
        vt.fp8_quantize(x, 1.0, "e3m4")


def test_private_dlpack_which_is_range_checked():
    import vtinfer as vt

    c = vt.PagedKVCache(num_layers=1, num_blocks=1, block_size=16, num_kv_heads=1, head_size=8, dtype="float32")
    with pytest.raises(ValueError, match="PagedKVCache._dlpack: which must be"):
        c._dlpack(0, 2)
    assert c._dlpack(0, 1) is not None
