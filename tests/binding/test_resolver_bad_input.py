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
