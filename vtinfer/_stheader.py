"""The safetensors header, accepted exactly when the ``safetensors`` library
(vLLM's loader, version 0.8) accepts it.

The rules, as that library applies them (read off its behaviour on the
malformed files of ``tests/python/test_safetensors_parity.py``, which runs
both readers on each):

* 8 bytes little-endian ``N``; ``N <= 100_000_000`` (decimal: not 100 MiB);
  ``8 + N <= file size``;
* the ``N`` header bytes are strict UTF-8 and one JSON object (whitespace
  around it allowed, nothing else; a lone surrogate escape is refused;
  a repeated key: the last one wins);
* ``__metadata__`` is null or an object of strings;
* every other key is a tensor: an object with ``dtype`` (one of
  :data:`DTYPE_BITS`), ``shape`` (integers in ``[0, 2**64)``) and
  ``data_offsets`` (exactly two such integers); other fields are ignored;
* sorted by ``data_offsets``, the tensors tile the data area from 0 with no
  gap, overlap or duplicate (zero-sized tensors may share an offset), each
  spanning ``prod(shape) * bits / 8`` bytes (the product checked for 64-bit
  overflow factor by factor, in order; sub-byte dtypes must fill whole
  bytes), and the last ends exactly at the end of the file.
"""

from __future__ import annotations

import os
import struct
from typing import Any, BinaryIO

__all__ = ["MAX_HEADER", "DTYPE_BITS", "parse_header"]

MAX_HEADER = 100_000_000
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
_U64 = 1 << 64
_JSON_WS = b" \t\r\n"
_C_JSON_MAX = 64 << 20  # csrc/core/json.c's document limit


def _err(msg: str) -> Exception:
    from vtinfer._C import ConfigError

    return ConfigError(msg)


def _u64(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _U64


def _strict_str(s: Any) -> bool:
    if not isinstance(s, str):
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \\ud800 escape
        return False
    return True


def _depth_ok(v: Any, depth: int) -> bool:
    # serde_json's recursion limit: 127 nested arrays/objects pass, 128 do not
    # (``depth`` counts the containers around ``v``)
    if isinstance(v, (dict, list)) and depth >= 127:
        return False
    if isinstance(v, dict):
        return all(_strict_str(k) and _depth_ok(x, depth + 1) for k, x in v.items())
    if isinstance(v, list):
        return all(_depth_ok(x, depth + 1) for x in v)
    if isinstance(v, str):
        return _strict_str(v)
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    return True


def parse_header(f: BinaryIO, label: str, size: int | None = None) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """``{name: (dtype, shape, begin, end)}`` of the safetensors file open as ``f``
    (``size``: the file's size, default its ``fstat``).

    Raises
    ------
    vtinfer.ConfigError
        Whatever the ``safetensors`` library refuses, naming ``label`` and
        the rule (and the tensor, where one is at fault).
    """
    from vtinfer import _C
    from vtinfer._fileio import display

    if size is None:
        size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) != 8:
        raise _err(f"{label}: safetensors header length must be 8 bytes; got {len(head)}")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER:
        raise _err(f"{label}: safetensors header length must be at most {MAX_HEADER} (the safetensors "
                   f"library's limit); got {n}")
    if n > size - 8:
        raise _err(f"{label}: safetensors header length must be at most {size - 8} (the file's size - 8); got {n}")
    raw = f.read(n)
    try:
        raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise _err(f"{label}: safetensors header must be UTF-8; got {e.reason} at byte {e.start}") from None
    stripped = raw.strip(_JSON_WS)
    if not stripped.startswith(b"{"):
        raise _err(f"{label}: safetensors header must be a JSON object; got {stripped[:20]!r}")
    if len(stripped) <= _C_JSON_MAX:
        hdr = _C.json_loads(stripped, display(label))
    else:  # beyond the C reader's 64 MiB document limit; NaN/Infinity/surrogates are refused below
        import json

        try:
            hdr = json.loads(stripped.decode("utf-8"))
        except (ValueError, RecursionError) as e:
            raise _err(f"{label}: safetensors header must be JSON; got {str(e)[:80]}") from None
    if not isinstance(hdr, dict):
        raise _err(f"{label}: safetensors header must be a JSON object; got {type(hdr).__name__}")
    if not _depth_ok(hdr, 0):
        raise _err(f"{label}: safetensors header must be JSON that serde_json reads: strict UTF-8 strings "
                   f"(no lone surrogate), finite numbers, at most 127 nested arrays/objects")
    meta = hdr.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise _err(f"{label}: safetensors __metadata__ must be null or an object of strings; got {meta!r:.80}")
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or not isinstance(t.get("dtype"), str) or t["dtype"] not in DTYPE_BITS:
            raise _err(f"{label}: tensor {name} must have a known dtype of the safetensors format "
                       f"({', '.join(DTYPE_BITS)}); got {t!r:.80}")
        shape, offs = t.get("shape"), t.get("data_offsets")
        if (not isinstance(shape, list) or not all(_u64(d) for d in shape) or not isinstance(offs, list)
                or len(offs) != 2 or not all(_u64(o) for o in offs)):
            raise _err(f"{label}: tensor {name} must have a shape and data_offsets [begin, end] of integers in "
                       f"[0, 2**64); got shape {shape!r:.60}, data_offsets {offs!r:.60}")
        out[name] = (t["dtype"], tuple(shape), offs[0], offs[1])
    start = 0
    for name, (dt, shape, b, e) in sorted(out.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b < start:
            raise _err(f"{label}: tensor {name} data_offsets must not overlap the previous tensor's (which end at "
                       f"{start}); got [{b}, {e}]")
        if b > start:
            raise _err(f"{label}: tensor {name} data_offsets must begin where the previous tensor's end ({start}): "
                       f"no gap; got [{b}, {e}]")
        if e < b:
            raise _err(f"{label}: tensor {name} data_offsets must be [begin, end] with begin <= end; got [{b}, {e}]")
        if e > size - 8 - n:
            raise _err(f"{label}: tensor {name} data_offsets must lie in [0, {size - 8 - n}]; got [{b}, {e}]")
        start = e
        count = 1
        for d in shape:
            count *= d
            if count >= _U64:
                raise _err(f"{label}: tensor {name} shape must have fewer than 2**64 elements; got {list(shape)}")
        bits = count * DTYPE_BITS[dt]
        if bits >= _U64:
            raise _err(f"{label}: tensor {name} must have fewer than 2**64 bits; got shape {list(shape)} of {dt}")
        if bits % 8:
            raise _err(f"{label}: tensor {name} of sub-byte dtype {dt} must fill whole bytes; got {bits} bits")
        if e - b != bits // 8:
            raise _err(f"{label}: tensor {name} data_offsets must span {bits // 8} bytes for shape {list(shape)} of {dt}; "
                       f"got {e - b}")
    if start + 8 + n != size:
        raise _err(f"{label}: safetensors data must end where the last tensor ends (8 + {n} + {start} bytes); "
                   f"got a file of {size} bytes")
    return out
