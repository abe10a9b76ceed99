"""The ``vtinfer`` command line."""

from __future__ import annotations

import argparse
import json
import sys


def _cmd_info(args: argparse.Namespace) -> int:
    import vtinfer as vt

    info = vt.build_info()
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
        return 0
    feats = ", ".join(k for k, v in info["cpu_features"].items() if v) or "none"
    print(f"vtinfer {info['version']}")
    print(f"  kernels   : {info['isa']} (best on this CPU: {info['isa_best']})")
    print(f"  CPU       : {feats}")
    print(f"  compiler  : {info['compiler']}")
    print(f"  CUDA      : {info['cuda']}")
    print(f"  KV dtypes : {', '.join(vt.KV_CACHE_DTYPES)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vtinfer",
        description="vLLM-compatible paged KV cache, fp8 KV-cache dtype resolver and paged attention on the CPU.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="show the build, the CPU kernels chosen and the KV-cache dtypes")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)
    from vtinfer.inspect_cmd import add_parser as _add_inspect

    _add_inspect(sub)
    from vtinfer.models.commands import add_parsers as _add_model_cmds

    _add_model_cmds(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
