"""``.ci/run`` runs the README's test command, in a venv of its own."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI = ROOT / ".ci" / "run"

pytestmark = pytest.mark.skipif(not CI.is_file() or shutil.which("bash") is None,
                                reason="runs from a checkout with bash")


def test_ci_runs_the_readme_command_in_its_own_venv() -> None:
    """It must never delete or reuse the .venv the README's set-up commands made."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    marker = readme.index("<!-- test-command -->")
    readme_command = readme[marker + 2]
    script = CI.read_text(encoding="utf-8")
    # Checked first: an older script without the option would start the real CI run.
    assert "--print-command" in script
    proc = subprocess.run(["bash", str(CI), "--print-command"], capture_output=True, text=True,
                          timeout=60, check=True)
    command = proc.stdout.strip()
    assert command == readme_command.replace(".venv", ".venv-ci")
    assert not re.search(r"\.venv(?!-ci)", command)
    assert not re.search(r"\.venv(?!-ci)\b/", script)
    assert not re.search(r"rm -rf \.venv(\s|$)", script)


CIBW_TEST = ROOT / "tools" / "cibw_test.py"


@pytest.mark.skipif(not CIBW_TEST.is_file(), reason="runs from a checkout (tools/cibw_test.py)")
def test_the_example_test_passes_in_cibuildwheels_test_layout(tmp_path: pathlib.Path) -> None:
    """cibuildwheel tests each release wheel from a directory holding only the `test-sources`;
    the serving-loop example's test read examples/ from outside them and failed every wheel
    build (FileNotFoundError). tools/check_dist.sh runs the whole suite this way."""
    import importlib.util
    import os
    import sys

    spec = importlib.util.spec_from_file_location("cibw_test", CIBW_TEST)
    assert spec is not None and spec.loader is not None
    cibw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cibw)
    cfg = cibw.config(ROOT)
    run = tmp_path / "run"
    cibw.stage(ROOT, run, cfg["test-sources"])
    assert sorted(p.name for p in run.iterdir()) == sorted(cfg["test-sources"])
    env = dict(os.environ, **cibw.environment(cfg))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_serving_loop_example.py"], cwd=run, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
