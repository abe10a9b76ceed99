"""Child process of tests/numerics/test_kv_formats_uq.py: runs vLLM 0.33's own UltraQuant store,
``ultraquant_store`` of the pinned wheel's ultraquant/triton_store.py (its ``_ultraquant_store_kernel``
and its format.py constants), in Triton's CPU interpreter.

    python tests/numerics/uq_triton_child.py DIR

For every ``DIR/case_*.npz`` (key, value: bfloat16 / float16 bits as uint16 with ``src`` naming which;
slots; nb, bs) it writes ``DIR/out_*.npz`` holding the cache's bytes. A child process, so that
TRITON_INTERPRET is set before triton is imported.
"""

from __future__ import annotations

import math
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from vtinfer.testing import upstream  # noqa: E402

FORMAT_NAMES = ["FP4_LEVELS_SORTED", "MIDPOINTS_SORTED", "SORTED_TO_BITS", "GROUP_SIZE", "DEFAULT_CONSTANT_C",
                "get_constant_c", "get_group_size", "UE8M0_BIAS", "k_codes_bytes", "n_groups", "k_scales_bytes",
                "v_codes_bytes", "v_scales_bytes", "slot_size", "k_codes_offset", "k_scales_offset",
                "v_codes_offset", "v_scales_offset"]
STORE_NAMES = ["_kv_cache_flat", "_SUPPORTED_DTYPES", "_MIDPOINTS_C", "_MIDPOINTS_CACHE", "_SORTED_TO_BITS_CACHE",
               "_get_midpoints_tensor", "_get_sorted_to_bits_tensor", "_ensure_const_tables", "ultraquant_store"]


def ultraquant_store(src):
    fmt = upstream.extract(src.read(upstream.F_UQ_FORMAT), FORMAT_NAMES, {"math": math})
    consts = {n: fmt[n] for n in FORMAT_NAMES}
    # the kernel reads the module global _MIDPOINTS_C that _ensure_const_tables sets: set it in the
    # kernel's own namespace (the same value)
    kns = upstream.triton_kernels(src, upstream.F_UQ_STORE, ["_ultraquant_store_kernel"],
                                  {**consts, "_MIDPOINTS_C": tl.constexpr(tuple(float(m) for m in
                                                                                fmt["MIDPOINTS_SORTED"]))})
    ns = upstream.extract(src.read(upstream.F_UQ_STORE), STORE_NAMES,
                          {**consts, "torch": torch, "tl": tl, "triton": triton,
                           "_ultraquant_store_kernel": kns["_ultraquant_store_kernel"]})
    return ns["ultraquant_store"], fmt["slot_size"]


def main(d: str) -> None:
    store, slot_size = ultraquant_store(upstream.locate())
    for name in sorted(os.listdir(d)):
        if not (name.startswith("case_") and name.endswith(".npz")):
            continue
        with np.load(os.path.join(d, name)) as z:
            case = dict(z)
        dt = torch.bfloat16 if str(case["src"]) == "bfloat16" else torch.float16
        key = torch.from_numpy(case["key"].astype(np.int16)).view(dt)
        value = torch.from_numpy(case["value"].astype(np.int16)).view(dt)
        nb, bs = int(case["nb"]), int(case["bs"])
        T, H, D = key.shape
        cache = torch.zeros(nb, bs, H, slot_size(D), dtype=torch.uint8)
        store(key, value, cache, torch.from_numpy(case["slots"]))
        np.savez(os.path.join(d, name.replace("case_", "out_")), cache=cache.numpy())


if __name__ == "__main__":
    main(sys.argv[1])
