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
