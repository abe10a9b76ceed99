"""fp8 quantize / dequantize throughput at DRAM scale.

Same-run references: a threaded memcpy of the same bytes (vtinfer's
_bench_copy over the same thread count), ml_dtypes' astype (clamped first,
since it does not saturate) and torch's cast (clamped) when installed.

The headline ratio is input bytes per second: the 4N float32 bytes that
quantize consumes against a memcpy of those same 4N bytes (i.e. memcpy time
/ quantize time). The touched-bytes ratio (read + written: memcpy moves
2 x 4N, quantize 4N + N) is reported as well.

    python benchmarks/bench_fp8.py [--mib 256] [--repeats 7] [--out benchmarks/results/fp8.json]
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import vtinfer as vt
from vtinfer import _C

from _common import interleaved, machine, write_json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the float32 input in MiB (>= 256 is DRAM scale)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip-slow", action="store_true", help="skip ml_dtypes (slow) and torch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    n = args.mib * (1 << 20) // 4
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(n, dtype=np.float32) * 100).astype(np.float32)
    codes = np.empty(n, np.uint8)
    back = np.empty(n, np.float32)
    copy_dst = np.empty_like(x)
    codes_copy = np.empty(n, np.uint8)
    codes2 = np.empty(n, np.uint8)
    nt = args.threads
    scale = 0.5  # a power of two: the multiply path

    ops = {
        "memcpy_f32": lambda: _C._bench_copy(copy_dst, x, nt),
        "memcpy_u8": lambda: _C._bench_copy(codes_copy, codes, nt),
        "quantize_e4m3": lambda: vt.fp8_quantize(x, scale, "e4m3", out=codes, num_threads=nt),
        # a calibrated (non-power-of-two) scale takes the checked-division path
        "quantize_e4m3_scale_0.37": lambda: vt.fp8_quantize(x, 0.37, "e4m3", out=codes2, num_threads=nt),
        "dequantize_e4m3": lambda: vt.fp8_dequantize(codes, scale, "e4m3", out=back, num_threads=nt),
    }
    slow: dict = {}
    if not args.skip_slow:
        def ml_cast():
            return np.clip(x / np.float32(scale), -448, 448).astype(ml_dtypes.float8_e4m3fn)

        slow["ml_dtypes_quantize"] = ml_cast
        try:
            import torch

            xt = torch.from_numpy(x)

            def torch_cast():
                return (xt / scale).clamp(-448, 448).to(torch.float8_e4m3fn)

            slow["torch_quantize"] = torch_cast
        except ImportError:
            pass

    r = interleaved(ops, args.repeats)
    rs = interleaved(slow, max(2, args.repeats // 3)) if slow else {}
    r.update(rs)
    # correctness spot check of what was timed (never an assertion)
    ok = bool(np.array_equal(vt.fp8_quantize(x[:4096], scale), codes[:4096])) and bool(
        np.array_equal(vt.fp8_quantize(x[-4096:], 0.37), codes2[-4096:]))

    moved = {
        "memcpy_f32": 8 * n,
        "memcpy_u8": 2 * n,
        "quantize_e4m3": 5 * n,
        "quantize_e4m3_scale_0.37": 5 * n,
        "dequantize_e4m3": 5 * n,
        "ml_dtypes_quantize": 5 * n,
        "torch_quantize": 5 * n,
    }
    res = {}
    for k, v in r.items():
        res[k] = {"best_s": v["best"], "median_s": v["median"], "GBps_best": moved[k] / v["best"] / 1e9,
                  "GBps_median": moved[k] / v["median"] / 1e9}
    ratios = {
        "quantize_input_bytes_per_s_vs_memcpy_best": res["memcpy_f32"]["best_s"] / res["quantize_e4m3"]["best_s"],
        "quantize_input_bytes_per_s_vs_memcpy_median": res["memcpy_f32"]["median_s"]
        / res["quantize_e4m3"]["median_s"],
        "quantize_scale_0.37_input_bytes_per_s_vs_memcpy_best": res["memcpy_f32"]["best_s"]
        / res["quantize_e4m3_scale_0.37"]["best_s"],
        "quantize_touched_bytes_per_s_vs_memcpy_best": res["quantize_e4m3"]["GBps_best"]
        / res["memcpy_f32"]["GBps_best"],
        "dequantize_output_bytes_per_s_vs_memcpy_best": res["memcpy_f32"]["best_s"] / res["dequantize_e4m3"]["best_s"],
    }
    if "ml_dtypes_quantize" in res:
        ratios["quantize_speedup_vs_ml_dtypes_best"] = res["ml_dtypes_quantize"]["best_s"] / res["quantize_e4m3"]["best_s"]
    if "torch_quantize" in res:
        ratios["quantize_speedup_vs_torch_best"] = res["torch_quantize"]["best_s"] / res["quantize_e4m3"]["best_s"]

    print(f"fp8 codec benchmark: {n:,} float32 ({args.mib} MiB), threads={nt or 'default'}, isa={_C.isa()}")
    for k, v in res.items():
        print(f"  {k:22s} best {v['best_s']*1e3:8.1f} ms  median {v['median_s']*1e3:8.1f} ms  "
              f"{v['GBps_best']:6.2f} GB/s (read+write, best)")
    for k, v in ratios.items():
        print(f"  {k:42s} {v:6.2f}")
    print(f"  spot check of timed output: {'ok' if ok else 'MISMATCH'}")
    write_json(args.out, {"benchmark": "fp8", "n": n, "machine": machine(), "results": res, "ratios": ratios,
                          "spot_check_ok": ok})


if __name__ == "__main__":
    main()
