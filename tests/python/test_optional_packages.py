"""Optional packages (torch, gguf, tokenizers, triton, ...): `pip install -e '.[test]' && pytest`
passes with none of them.

- A subcommand whose package is missing says so in one line naming the package
  and the pip command, exit status 2, before downloading anything.
- ``pytest.importorskip`` (wrapped by tests/conftest.py) skips with the
  package's name and pip command; ``VTINFER_REQUIRE_<NAME>=1`` makes it fail.
- With ``VTINFER_SKIPPED_OUT=FILE`` the skipped node ids are written to FILE
  (CI reruns exactly those once it has installed the optional packages).

The missing package is simulated with ``sys.modules[name] = None`` in a child
process (``import name`` then raises ModuleNotFoundError, as in a venv without it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vtinfer import _optional

ROOT = Path(__file__).resolve().parents[2]


def _cli_without(hidden: list[str], *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            f"for name in {hidden!r}: sys.modules[name] = None\n"
            "from vtinfer.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    e = {**os.environ, "VTINFER_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                          env=e, cwd=ROOT)


def _one_line(p: subprocess.CompletedProcess, cmd: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vtinfer {cmd}: ") and "Traceback" not in p.stderr, p.stderr
    return lines[0]


def test_convert_gguf_without_gguf_names_the_package_and_the_pip_command(tmp_path):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    line = _one_line(_cli_without(["gguf"], "convert-gguf", str(gguf_file), "--out", str(tmp_path / "o")),
                     "convert-gguf")
    assert "'gguf'" in line and "pip install gguf" in line, line
    assert not (tmp_path / "o").exists()


def test_a_missing_file_is_said_before_the_missing_package(tmp_path):
    line = _one_line(_cli_without(["gguf"], "convert-gguf", str(tmp_path / "missing"), "--out",
                                  str(tmp_path / "o")), "convert-gguf")
    assert "missing" in line and "optional package" not in line, line


@pytest.mark.parametrize("hidden", [["gguf"], ["tokenizers"]])
def test_the_default_conversion_checks_its_packages_before_downloading(tmp_path, hidden):
    # an empty cache and pip told not to reach an index: a download attempt would say something else
    if hidden == ["tokenizers"]:
        pytest.importorskip("gguf")  # else gguf is named first
    env = {"VTINFER_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path)}
    line = _one_line(_cli_without(hidden, "convert-gguf", env=env), "convert-gguf")
    assert f"'{hidden[0]}'" in line and f"pip install {hidden[0]}" in line, line
    assert not (tmp_path / "cache").exists(), "nothing may be fetched or written without the converter's packages"


def test_every_optional_package_has_a_pip_command():
    assert "--index-url https://download.pytorch.org/whl/cpu" in _optional.install_hint("torch")
    for name, (what, pip) in _optional.OPTIONAL.items():
        assert what and pip.startswith("pip install "), name
        msg = _optional.missing_message(name + ".sub")
        assert f"'{name}'" in msg and pip in msg, msg
    err = ModuleNotFoundError("No module named 'gguf'", name="gguf")
    assert _optional.explain_import_error(err) == _optional.missing_message("gguf")
    assert _optional.explain_import_error(ImportError("libfoo.so: cannot open")) is None
    assert _optional.explain_import_error(ModuleNotFoundError("x", name="vtinfer._C")) is None


def test_importorskip_names_the_package_and_the_pip_command(monkeypatch):
    monkeypatch.delenv("VTINFER_REQUIRE_VT_NO_SUCH_PACKAGE", raising=False)
    monkeypatch.delenv("VTINFER_REQUIRE_GGUF", raising=False)
    with pytest.raises(pytest.skip.Exception) as e:
        pytest.importorskip("vt_no_such_package.sub")
    assert "'vt_no_such_package'" in str(e.value) and "pip install vt_no_such_package" in str(e.value)
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(pytest.skip.Exception) as e:
        pytest.importorskip("gguf")
    assert "pip install gguf" in str(e.value), e.value
    with pytest.raises(pytest.skip.Exception) as e:  # vtinfer's own parts keep the caller's reason
        pytest.importorskip("vtinfer._no_such_arm", reason="vtinfer._no_such_arm not built")
    assert str(e.value) == "vtinfer._no_such_arm not built"


def test_importorskip_fails_when_the_package_is_required(monkeypatch):
    monkeypatch.setenv("VTINFER_REQUIRE_VT_NO_SUCH_PACKAGE", "1")
    with pytest.raises(pytest.fail.Exception, match="VTINFER_REQUIRE_VT_NO_SUCH_PACKAGE=1"):
        pytest.importorskip("vt_no_such_package")
    monkeypatch.setenv("VTINFER_REQUIRE_VT_NO_SUCH_PACKAGE", "0")
    with pytest.raises(pytest.skip.Exception):
        pytest.importorskip("vt_no_such_package")
    assert pytest.importorskip("numpy") is sys.modules["numpy"]


def test_skipped_node_ids_are_written_for_the_second_pass(tmp_path):
    (tmp_path / "test_mix.py").write_text(textwrap.dedent("""
        import pytest

        def test_runs():
            pass

        @pytest.mark.parametrize("x", ["a b", "c"])
        def test_skips(x):
            pytest.importorskip("vt_no_such_package")
    """))
    (tmp_path / "test_module_skip.py").write_text("import pytest\npytest.importorskip('vt_no_such_package')\n"
                                                  "def test_never():\n    pass\n")
    out = tmp_path / "skipped.txt"
    env = {**os.environ, "VTINFER_SKIPPED_OUT": str(out), "PYTHONPATH": str(ROOT)}
    env.pop("VTINFER_REQUIRE_VT_NO_SUCH_PACKAGE", None)
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    ids = out.read_text().splitlines()
    assert ids == ["test_mix.py::test_skips[a b]", "test_mix.py::test_skips[c]", "test_module_skip.py"], ids
    # the second pass: exactly those, read back with pytest's @FILE
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider",
                        f"@{out}"], cwd=tmp_path, env={**env, "VTINFER_SKIPPED_OUT": ""}, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "3 skipped" in p.stdout and "passed" not in p.stdout, p.stdout + p.stderr
