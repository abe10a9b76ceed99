""".ci/run's shape: the README's test command, exactly, in a venv holding only what it installs;
then the optional references and exactly the tests that skipped, with VTINFER_REQUIRE_<NAME>
for each package installed; the vLLM leg's hook. (The run itself takes ~30-60 min: not run by the test suite.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
README = (ROOT / "README.md").read_text()
README_TEST = "pip install -e '.[test]' && pytest"


def _lines() -> list[str]:
    return [ln.split(" #")[0].strip() for ln in CI.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_readme_test_command_is_the_one_ci_runs():
    assert f"```bash\n{README_TEST}\n```" in README
    runs = [i for i, ln in enumerate(_lines()) if ln.startswith(README_TEST)]
    assert len(runs) == 1, runs


def test_nothing_optional_is_installed_before_the_readme_command():
    lines = _lines()
    readme = next(i for i, ln in enumerate(lines) if ln.startswith(README_TEST))
    venv = next(i for i, ln in enumerate(lines) if "-m venv" in ln)
    assert venv < readme
    between = [ln for ln in lines[venv:readme] if re.search(r"\bpip\b.*\binstall\b", ln) and not ln.startswith("step ")]
    assert between == [], between
    assert "rm -rf \"$root/.ci-venv\"" in lines[venv - 1], "the venv must be new, not a reused one"


def test_the_second_pass_runs_only_what_skipped_and_requires_each_installed_package():
    lines = _lines()
    readme = next(i for i, ln in enumerate(lines) if ln.startswith(README_TEST))
    assert 'export VTINFER_SKIPPED_OUT="$skipped"' in lines[:readme]
    after = "\n".join(lines[readme + 1:])
    second = re.search(r'pytest -rs "@\$skipped"', after)
    assert second, "the second pass must run exactly the skipped ids (pytest @FILE)"
    assert '"$rc" -ne 5' in after  # pytest's "no tests collected"
    installed = set()
    for ln in lines[readme + 1:]:
        m = re.match(r"python -m pip install -q (?!--upgrade)(?!--no-deps)(.*)", ln)
        if m:
            installed |= {re.split(r"[=<>\"']", w.strip("\"'"))[0] for w in m.group(1).split() if w.strip("\"'")}
    assert {"torch", "transformers", "gguf", "tokenizers", "llmcompressor", "triton"} <= installed, installed
    loop = re.search(r"for pkg in ([a-z_ ]+); do", after)
    assert loop, "VTINFER_REQUIRE_<NAME> must be set for each installed package"
    required = set(loop.group(1).split())
    imports = {"llmcompressor", "compressed_tensors"}  # import names of llm-compressor and its dependency
    assert installed - {"llmcompressor"} <= required and imports <= required, (installed, required)
    assert after.index("for pkg in") < second.start()


def test_the_vllm_leg_hook_is_there_once():
    hook = 'if [ -x .ci/vllm_leg ]; then step "vLLM engine tests"; .ci/vllm_leg; fi'
    assert CI.count(hook) == 1


def test_the_sanitizer_leg_starts_after_the_demo_and_before_the_long_steps():
    """Every model and checkpoint the suite reads is fetched and converted before the background leg
    starts (no two processes write one cache file); it then overlaps the vLLM leg and the C steps."""
    lines = _lines()
    at = {key: next(i for i, ln in enumerate(lines) if key in ln)
          for key in ('pytest -rs "@$skipped"', "vtinfer demo --json", "setsid .ci/sanitize_python", ".ci/vllm_leg",
                      "make -j\"$(nproc)\" -C tests/c full", "tests/mutation/run.py --fast", 'wait "$san_pid"')}
    order = sorted(at, key=at.get)
    assert order == ['pytest -rs "@$skipped"', "vtinfer demo --json", "setsid .ci/sanitize_python", ".ci/vllm_leg",
                     "make -j\"$(nproc)\" -C tests/c full", "tests/mutation/run.py --fast", 'wait "$san_pid"'], order
