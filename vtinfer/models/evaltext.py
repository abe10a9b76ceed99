"""Evaluation and calibration text taken from what the machine already has:
the docstrings of Python standard-library modules (``inspect.getdoc``), in a
fixed order, so the text is deterministic for a given Python version and
nothing is pasted into the repository.

The calibration and evaluation sets use disjoint modules, so calibrated
scales are never judged on the text they were fitted to.
"""

from __future__ import annotations

import importlib
import inspect

__all__ = ["EVAL_MODULES", "CALIB_MODULES", "stdlib_text", "eval_text", "calibration_text"]

EVAL_MODULES = ("json", "argparse", "collections", "functools", "itertools", "textwrap", "pathlib", "heapq",
                "bisect", "difflib", "fractions", "decimal", "statistics", "string", "shlex", "csv")
CALIB_MODULES = ("re", "os", "pickle", "logging", "random", "datetime", "unittest", "subprocess", "threading",
                 "typing", "enum", "dataclasses")


def stdlib_text(modules: tuple[str, ...], *, members: bool = True) -> str:
    """Module docstrings, then (with ``members``) the public functions' and
    classes' docstrings in name order, joined by blank lines."""
    parts: list[str] = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        doc = inspect.getdoc(mod)
        if doc:
            parts.append(doc)
        if not members:
            continue
        for attr in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and getattr(obj, "__module__", "") == name:
                d = inspect.getdoc(obj)
                if d and len(d) > 80:
                    parts.append(f"{name}.{attr}: {d}")
    return "\n\n".join(parts)


def eval_text() -> str:
    """The evaluation text."""
    return stdlib_text(EVAL_MODULES)


def calibration_text() -> str:
    """The calibration text (disjoint modules from :func:`eval_text`)."""
    return stdlib_text(CALIB_MODULES)
