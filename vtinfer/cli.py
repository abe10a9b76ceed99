"""The ``vtinfer`` command line."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any

from vtinfer._optional import explain_import_error


def _cmd_info(args: argparse.Namespace) -> int:
    import vtinfer as vt

    info = vt.build_info()
    if args.json:
        print(dumps(info, indent=2, sort_keys=True))
        return 0
    feats = ", ".join(k for k, v in info["cpu_features"].items() if v) or "none"
    print(f"vtinfer {info['version']}")
    print(f"  kernels   : {info['isa']} (best on this CPU: {info['isa_best']})")
    print(f"  CPU       : {feats}")
    print(f"  compiler  : {info['compiler']}")
    print(f"  CUDA      : {info['cuda']}")
    print(f"  KV dtypes : {', '.join(vt.KV_CACHE_DTYPES)}")
    return 0


# What a user can get wrong (paths, arguments, files): one line on stderr and
# exit status 2, for every subcommand. ConfigError/VtinferError
# are ValueErrors; OSError covers missing files, permissions, FIFOs refused.
USER_ERRORS = (OSError, ValueError, NotImplementedError, TypeError, ImportError, IndexError, OverflowError,
               UnicodeError)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (``vtinfer inspect: argument ...``)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def int_option(lo: int, hi: int = 2**31 - 1) -> Any:
    """An argparse ``type`` for an integer option in [lo, hi]: anything else is
    argparse's one-line error, exit status 2, before any work starts."""
    def parse(text: str) -> int:
        try:
            v = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}]; got {v}" if hi < 2**31 - 1 else
                                             f"must be an integer >= {lo}; got {v}")
        return v

    parse.__name__ = "integer"  # argparse's "invalid integer value" wording, should it ever show
    return parse


def remember_options(parser: argparse.ArgumentParser) -> None:
    """Record the subcommand's ``--option`` spellings (by Python name) for :func:`user_words`."""
    opts = {a.dest: a.option_strings[-1] for a in parser._actions
            if a.option_strings and a.option_strings[-1].startswith("--") and a.nargs != 0 and a.dest != "help"}
    parser.set_defaults(_cli_options=opts)


# A leading "name: " that is vtinfer's own function or class (plan_kv_cache, DecoderConfig, inspect, ...), not a
# file (config.json: ...): a user of the command line did not call it.
_INTERNAL_PREFIX = re.compile(r"^(?:(?![\w.]+\.(?:json|safetensors|gguf|txt|md|bin|py|png)\b)[A-Za-z_][\w.]*: )+")


def user_words(msg: str, options: dict[str, str]) -> str:
    """An error message in the command line's words: vtinfer's internal function names dropped and the
    Python argument names of the subcommand's options spelled as options (block_size -> --block-size)."""
    msg = _INTERNAL_PREFIX.sub("", msg, count=1)
    for dest in sorted(options, key=len, reverse=True):
        msg = re.sub(rf"(?<![\w.-]){re.escape(dest)}(?![\w-])", options[dest], msg)
    return msg


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by the string ``"NaN"``,
    ``"Infinity"`` or ``"-Infinity"``, so that ``json.dumps`` prints valid JSON
    (config.json files may hold NaN, which Python's and vtinfer's readers accept)."""
    if hasattr(obj, "dtype") and hasattr(obj, "tolist"):  # NumPy scalars and arrays: their Python values
        obj = obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """Strict JSON (never ``NaN``), ASCII-only so any path prints."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="vtinfer",
        description="vLLM-compatible paged KV cache, fp8 KV-cache dtype resolver and paged attention on the CPU.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="show the build, the CPU kernels chosen and the KV-cache dtypes")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)
    remember_options(info)
    from vtinfer.inspect_cmd import add_parser as _add_inspect

    _add_inspect(sub)
    from vtinfer.models.commands import add_parsers as _add_model_cmds

    _add_model_cmds(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    # a path that is not valid UTF-8 arrives surrogate-escaped; print it back as its bytes
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        where = f"vtinfer {args.command}" if getattr(args, "command", None) else "vtinfer"
        parser.exit(2, f"{where}: unrecognized arguments: {' '.join(extra)} (see {where} --help)\n")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `vtinfer inspect M | head`: the reader left; say nothing
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except USER_ERRORS as e:
        msg = explain_import_error(e) or " ".join(str(e).split()) or type(e).__name__
        msg = user_words(msg, getattr(args, "_cli_options", {}))
        print(f"vtinfer {args.command}: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vtinfer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
