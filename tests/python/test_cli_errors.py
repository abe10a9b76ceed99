"""The CLI as a newcomer meets it.

Every subcommand answers a user's mistake with one line on stderr naming the
problem and exit status 2 (never a traceback); a bad VTINFER_ISA is one line;
``inspect --json`` is strict JSON even when config.json holds NaN; paths that
are not valid UTF-8 work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vtinfer.scales import write_safetensors

CFG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "hidden_size": 64, "torch_dtype": "float16"}


def _run(*argv, env=None, cwd=None):
    e = {**os.environ, "VTINFER_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "vtinfer", *map(os.fsdecode, argv)], capture_output=True,
                          env=e, timeout=120, cwd=cwd)


def _model(d: Path, cfg: dict | None = None, raw: bytes | None = None) -> Path:
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(os.fsencode(d), b"config.json"), "wb") as f:
        f.write(raw if raw is not None else json.dumps(cfg or CFG).encode())
    write_safetensors(os.path.join(os.fsencode(d), b"model.safetensors"), {"x": np.ones(1, np.float32)})
    return d


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return _model(tmp_path_factory.mktemp("cli") / "m")


def _one_line(p, cmd, *words):
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2, (p.returncode, err[-3000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"vtinfer {cmd}: ") and "Traceback" not in err, lines[0]
    for w in words:
        assert w in lines[0], (w, lines[0])


def _cases(tmp: Path, model: Path):
    empty = tmp / "empty"
    empty.mkdir(exist_ok=True)
    afile = tmp / "afile.txt"
    afile.write_text("x")
    missing = tmp / "missing"
    for cmd, pre in (("inspect", []), ("calibrate", []), ("demo", ["--model"])):
        extra = ["--out", str(tmp / "out")] if cmd == "calibrate" else []
        yield cmd, [*pre, str(missing), *extra], ["missing"]
        yield cmd, [*pre, str(empty), *extra], ["config.json"]
        yield cmd, [*pre, str(afile), *extra], ["afile.txt"]
    yield "convert-gguf", [str(missing), "--out", str(tmp / "o")], ["missing"]
    yield "convert-gguf", [str(afile)], ["--out"]
    for bad, word in (("abc", "--block-size"), ("0", "--block-size"), ("-3", "--block-size")):
        yield "inspect", [str(model), "--block-size", bad], [word]
    for bad, word in (("abc", "--num-blocks"), ("0", "--num-blocks"), ("-1", "--num-blocks")):
        yield "inspect", [str(model), "--num-blocks", bad], [word]
    for bad in ("lots", "0", "1 parsec"):
        yield "inspect", [str(model), "--kv-cache-memory", bad], ["--kv-cache-memory"]
    yield "inspect", [str(model), "--kv-cache-memory", "-5GiB"], ["--kv-cache-memory"]
    yield "inspect", [str(model), "--kv-cache-dtype", "int4"], ["int4"]
    yield "inspect", [str(model), "--no-such-flag"], ["--no-such-flag"]
    yield "calibrate", [str(model), "--out", str(tmp / "o2"), "--tokens", "many"], ["--tokens"]
    yield "demo", ["--eval-tokens", "x"], ["--eval-tokens"]


def test_every_subcommand_refuses_in_one_line(tmp_path, model):
    failures = []
    for cmd, args, words in _cases(tmp_path, model):
        p = _run(cmd, *args)
        try:
            _one_line(p, cmd, *words)
        except AssertionError as e:
            failures.append(f"vtinfer {cmd} {' '.join(args)}: {e}")
    assert not failures, "\n".join(failures)
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_bad_isa_is_refused_at_import_with_the_way_out(model):
    # The library refuses a bad VTINFER_ISA where it reads it (the import) with an ImportError whose
    # one line names the variable, the accepted values and the fix; it does not install a process-wide
    # excepthook to shorten the report, so the CLI shows Python's short import traceback.
    for argv in (["info"], ["inspect", str(model)]):
        p = _run(*argv, env={"VTINFER_ISA": "avx9000"})
        err = p.stderr.decode()
        lines = err.strip().splitlines()
        assert p.returncode != 0 and len(lines) <= 8, err
        assert lines[-1].startswith("ImportError: vtinfer: ") and "unset VTINFER_ISA" in lines[-1], err
        assert "VTINFER_ISA must be scalar, avx2 or avx512; got 'avx9000'" in lines[-1], err


def _strict(s: str):
    def no(c):
        raise ValueError(f"not JSON: {c}")

    return json.loads(s, parse_constant=no)


def test_inspect_json_is_strict_json_with_nan_in_the_config(tmp_path):
    raw = json.dumps(CFG)[:-1] + ', "rope_theta": NaN, "sliding_window": null, "quantization_config": ' \
        '{"quant_method": "fp8", "activation_scheme": "static", "weird": [Infinity, -Infinity, NaN]}}'
    d = _model(tmp_path / "nan", raw=raw.encode())
    p = _run("inspect", str(d), "--json")
    assert p.returncode == 0, p.stderr.decode()
    doc = _strict(p.stdout.decode())
    assert doc["quant_config"]["normalized"]["weird"] == ["Infinity", "-Infinity", "NaN"]
    p = _run("info", "--json")
    _strict(p.stdout.decode())


def test_every_json_vtinfer_prints_is_strict(tmp_path):
    """The JSON inspect's text mode prints (its normalized line) and NumPy values in any --json document
    (calibrate's scales are NumPy) are strict too."""
    from vtinfer.cli import dumps

    raw = json.dumps(CFG)[:-1] + ', "quantization_config": {"quant_method": "fp8", "activation_scheme": ' \
        '"static", "weird": [Infinity, NaN]}}'
    p = _run("inspect", str(_model(tmp_path / "nan", raw=raw.encode())))
    assert p.returncode == 0, p.stderr.decode()
    line = next(x for x in p.stdout.decode().splitlines() if x.strip().startswith("normalized"))
    assert _strict(line.split(None, 1)[1])["weird"] == ["Infinity", "NaN"]
    doc = _strict(dumps({"k": np.float32("nan"), "v": np.array([np.inf, 1.0], np.float32), "n": np.int64(3)}))
    assert doc == {"k": "NaN", "v": ["Infinity", 1.0], "n": 3}


def test_paths_that_are_not_utf8_work(tmp_path):
    d = os.path.join(os.fsencode(tmp_path), b"m\xff\xfe-\xe9")
    _model(d)
    p = _run("inspect", d)
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")
    assert d in p.stdout  # printed as its own bytes
    p = _run("inspect", d, "--json")
    assert p.returncode == 0, p.stderr.decode("utf-8", "replace")
    doc = _strict(p.stdout.decode("ascii"))
    assert os.fsencode(doc["model"]) == d  # surrogate escapes round-trip to the bytes
    bad = os.path.join(os.fsencode(tmp_path), b"nope\xff")
    _one_line(_run("inspect", bad), "inspect", "nope")
