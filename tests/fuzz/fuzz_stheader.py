"""Differential fuzzer: vtinfer's safetensors header reader against the
``safetensors`` library, on structured headers and byte mutations of them.

    python tests/fuzz/fuzz_stheader.py [N] [SEED]

Each input: ``parse_header`` must return or raise ``vtinfer.ConfigError``
(anything else is a crash of the reader) and must accept exactly when
``safetensors.deserialize`` accepts. Prints the counts; exit 1 on the first
disagreement or crash (the input is written to ``stheader-failure.bin``).
Stdlib ``random`` instead of Hypothesis so that 10^6 inputs take minutes.
"""

from __future__ import annotations

import io
import json
import random
import struct
import sys
import time

import safetensors

import vtinfer as vt
from vtinfer._stheader import DTYPE_BITS, parse_header

DTYPES = sorted(DTYPE_BITS) + ["C128", "f32", "", "F8_E4M3FN"]
BIG = [2 ** 32, 2 ** 62, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -1]


def _int(r: random.Random) -> int:
    return r.randint(0, 12) if r.random() < 0.85 else r.choice(BIG)


def structured(r: random.Random) -> bytes:
    hdr: dict = {}
    off = 0
    for i in range(r.randint(0, 5)):
        dt = r.choice(DTYPES)
        shape = [_int(r) for _ in range(r.randint(0, 3))]
        count = 1
        for d in shape:
            count *= d
        size = count * DTYPE_BITS.get(dt, 8) // 8 if 0 <= count < 64 else _int(r)
        b = off + r.choice([0, 0, 0, 1, -1, -2])
        e = b + size + r.choice([0, 0, 0, 1, -1])
        off = max(off, e) if r.random() < 0.5 else e
        t: dict = {"dtype": dt, "shape": shape, "data_offsets": [b, e]}
        if r.random() < 0.1:
            t[r.choice(["shape", "data_offsets", "dtype"])] = r.choice([None, 1.0, "x", [0], [0, 1, 2], {}, True])
        if r.random() < 0.1:
            t["extra"] = r.choice([None, [1, [2, {}]], "s", 1e300, {"k": []}])
        hdr[r.choice(["a", "b", "c", "model.layers.0.self_attn.k_scale", f"t{i}", "\u00e9", "\U0001f600"])] = t
    if r.random() < 0.5:
        hdr["__metadata__"] = r.choice([None, {}, {"format": "pt"}, {"x": 1}, [], "s"])
    data_len = min(1 << 12, max(0, off + r.choice([0, 0, 0, 1, -1])))
    text = json.dumps(hdr, ensure_ascii=r.random() < 0.5).encode()
    if r.random() < 0.1:
        text += r.choice([b" ", b"\n\t", b"\0", b"\x0c", b"}"]) * r.randint(1, 4)
    if r.random() < 0.05:
        text = r.choice([b" ", b"\r\n", b"\xef\xbb\xbf", b"\x0b"]) + text
    hlen = len(text) + r.choice([0] * 12 + [1, -1, 8, 10 ** 8, 2 ** 63])
    return struct.pack("<Q", max(0, min(hlen, 2 ** 64 - 1))) + text + b"\0" * data_len


SPLICE = [b'"\\ud800"', b"NaN", b"1e2", b"-0", b"1.0", b"[", b"]", b"{", b"}", b",", b'"', b"\\", b"\xff",
          b"\xc3", b"18446744073709551616", b"null", b"true", b"[[[[[[[[", b'"__metadata__"']


def mutate(r: random.Random, blob: bytes) -> bytes:
    b = bytearray(blob)
    for _ in range(r.randint(1, 4)):
        if not b:
            b += bytes([r.randint(0, 255)])
            continue
        k = r.randint(0, 4)
        i = r.randint(0, len(b) - 1)
        if k == 0:
            b[i] ^= 1 << r.randint(0, 7)
        elif k == 1:
            b[i] = r.randint(0, 255)
        elif k == 2:
            del b[i:i + r.randint(1, 8)]
        elif k == 3:
            b[i:i] = r.choice(SPLICE)
        else:
            j = r.randint(0, len(b) - 1)
            b[i:i] = b[j:j + r.randint(1, 16)]
    if len(b) >= 8 and r.random() < 0.5:  # keep the length field honest half the time
        b[0:8] = struct.pack("<Q", len(b) - 8 - r.choice([0, 0, 0, 4, 8, 16]) if len(b) > 24 else len(b) - 8)
    return bytes(b)


def lib_ok(blob: bytes) -> bool:
    try:
        safetensors.deserialize(blob)
        return True
    except Exception:
        return False


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    r = random.Random(seed)
    t0 = time.time()
    accepted = 0
    pool: list[bytes] = []
    for i in range(n):
        blob = structured(r) if (not pool or r.random() < 0.5) else mutate(r, r.choice(pool))
        if len(pool) < 4096:
            pool.append(blob)
        else:
            pool[r.randrange(4096)] = blob
        try:
            parse_header(io.BytesIO(blob), "<fuzz>", size=len(blob))
            ours = True
        except vt.ConfigError:
            ours = False
        except BaseException as e:  # a crash of the reader
            open("stheader-failure.bin", "wb").write(blob)
            print(f"CRASH at input {i}: {type(e).__name__}: {e}")
            return 1
        if ours != lib_ok(blob):
            open("stheader-failure.bin", "wb").write(blob)
            print(f"DISAGREE at input {i}: vtinfer {'accepts' if ours else 'refuses'}: {blob[:200]!r}")
            return 1
        accepted += ours
    dt = time.time() - t0
    print(f"fuzz_stheader: {n} inputs, seed {seed}, {accepted} accepted by both, 0 crashes, 0 disagreements, "
          f"{dt:.0f} s ({n / dt:.0f}/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
