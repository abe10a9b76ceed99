"""The hand-written stub vtinfer/_C.pyi matches the extension: the same
public names, and the dtype names it records equal the C dtype table."""

from __future__ import annotations

import ast
import inspect
import pathlib

import vtinfer as vt
from vtinfer import _C

STUB = pathlib.Path(vt.__file__).with_name("_C.pyi")


def stub_names() -> dict[str, ast.AST]:
    tree = ast.parse(STUB.read_text())
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def test_every_public_name_of_the_module_is_in_the_stub_and_back():
    public = {n for n in dir(_C) if not n.startswith("_")}
    names = set(stub_names()) - {"DTYPE_TABLE_NAMES"}
    assert public - names == set(), "missing from _C.pyi"
    assert names - public == set(), "in _C.pyi but not in the module"


def test_stub_signatures_match_the_docstring_signatures():
    for name, node in stub_names().items():
        if not isinstance(node, ast.FunctionDef):
            continue
        sig = inspect.signature(getattr(_C, name))
        stub_params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        assert list(sig.parameters) == stub_params, name


def test_stub_dtype_names_equal_the_c_table():
    line = next(ln for ln in STUB.read_text().splitlines() if ln.startswith("DTYPE_TABLE_NAMES"))
    recorded = ast.literal_eval(line.split("# =", 1)[1].strip())
    assert recorded == tuple(row["name"] for row in _C.dtype_table())
    assert vt.KV_CACHE_DTYPES[0] == "auto"
    assert set(vt.KV_CACHE_DTYPES[1:]) == {f for row in _C.dtype_table() for f in row["flags"]}
