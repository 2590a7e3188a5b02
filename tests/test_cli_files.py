"""The one rule of every command that writes files (``cli.files.check_files``): before anything
runs, no output is one of the command's inputs and no two outputs are one file, compared by what
the paths name (a symlink, ``./x`` for ``x``), so no input file is ever overwritten and no output
overwrites another. Tested once per command that writes files: ``compare``, ``explain``,
``replay`` and ``bench`` write none."""

from __future__ import annotations

import os
import pathlib

import pytest

from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.workloads import synthetic

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402
from stepplanner.cli.errors import InputError  # noqa: E402
from stepplanner.cli.files import check_files  # noqa: E402

LIMITS = StepPlannerLimits(
    max_batch_size=8, max_input_length=400, kv_page_size=16, max_step_tokens=256
)
OPTIONS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=256)
MODEL = LatencyModel(a=3e-4, b=2e-4, c=6e-6, name="cpu")


@pytest.fixture()
def files(tmp_path: pathlib.Path, write_run_files) -> dict[str, pathlib.Path]:
    """A trace, a latency model, the results of a run of the trace and its step timings."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    workload = synthetic(requests=12, rate=6.0, seed=3, max_prompt=300, max_output=20)
    return write_run_files(folder, workload, LIMITS, OPTIONS, MODEL)


def _refused(args: list[str], kept: list[pathlib.Path], message: str) -> None:
    before = {path: path.read_bytes() for path in kept}
    out = CliRunner().invoke(main, args, catch_exceptions=False)
    assert out.exit_code == 2, out.output
    assert message in out.output, out.output
    assert len(out.output.strip().splitlines()) == 1, out.output
    for path, content in before.items():
        assert path.read_bytes() == content, f"{path} was written"


def _link(tmp_path: pathlib.Path, target: pathlib.Path, name: str = "link") -> str:
    link = tmp_path / name
    link.symlink_to(target)
    return str(link)


# --- the rule --------------------------------------------------------------------------------


def test_one_file_under_two_names_is_one_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = tmp_path / "a.json"
    real.write_text("{}")
    monkeypatch.chdir(tmp_path)
    hard = tmp_path / "hard.json"
    os.link(real, hard)
    for alias in (
        "a.json",
        "./a.json",
        str(real),
        _link(tmp_path, real),
        str(hard),
        f"{tmp_path}/sub/../a.json",
    ):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(InputError, match=r"^--out .*: is an input of this command \(IN "):
            check_files({"--out": alias}, {"IN": str(real)})
    # two outputs that do not exist yet are compared by where they would be written
    with pytest.raises(
        InputError,
        match=r"^--csv ./new.csv: is also the file of --save-result "
        r"new.csv; allowed: a file of its own for each output",
    ):
        check_files({"--save-result": "new.csv", "--csv": "./new.csv"})
    dangling = _link(tmp_path, tmp_path / "later.json", "dangling")
    with pytest.raises(InputError, match="is also the file of"):
        check_files({"--json": dangling, "--plot": str(tmp_path / "later.json")})
    check_files({"--out": "b.json", "--csv": "-", "--json": "-"}, {"IN": "a.json", "T": None})


# --- once per command ------------------------------------------------------------------------


def test_simulate(files, tmp_path: pathlib.Path) -> None:
    _refused(
        [
            "simulate",
            "--trace",
            str(files["trace"]),
            "--no-progress",
            "--latency-model",
            str(files["model"]),
            "--save-result",
            str(files["model"]),
        ],
        [files["model"]],
        f"--save-result {files['model']}: is an input of this command "
        f"(--latency-model {files['model']})",
    )
    pytest.importorskip("matplotlib")
    plot = _link(tmp_path, files["trace"], "trace.png")
    _refused(
        ["simulate", "--trace", str(files["trace"]), "--no-progress", "--plot", plot],
        [files["trace"]],
        f"--plot {plot}: is an input of this command (--trace {files['trace']})",
    )


def test_sweep(files, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out.json"
    _refused(
        [
            "sweep",
            "--trace",
            str(files["trace"]),
            "--no-progress",
            "--backend",
            "serial",
            "--save-result",
            str(out),
            "--csv",
            _link(tmp_path, out),
        ],
        [],
        f"--csv {tmp_path / 'link'}: is also the file of --save-result {out}",
    )
    assert not out.exists()


def test_capacity(files) -> None:
    _refused(
        [
            "capacity",
            "--trace",
            str(files["trace"]),
            "--no-progress",
            "--slo",
            "ttft_p99=1s",
            "--csv",
            str(files["trace"]),
        ],
        [files["trace"]],
        f"--csv {files['trace']}: is an input of this command",
    )


def test_record(files, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(files["trace"].parent)
    _refused(
        ["record", "--trace", "trace.csv", "./trace.csv", "--no-progress"],
        [files["trace"]],
        "OUT ./trace.csv: is an input of this command (--trace trace.csv)",
    )


@pytest.mark.parametrize("given", ["model", "timings"])
def test_fidelity(files, given: str) -> None:
    # --json was refused as RESULTS or the trace before; --latency-model and --pace-from were not
    _refused(
        [
            "fidelity",
            str(files["results"]),
            "--latency-model",
            str(files["model"]),
            "--pace-from",
            str(files["timings"]),
            "--no-progress",
            "--json",
            str(files[given]),
        ],
        [files[given]],
        f"--json {files[given]}: is an input of this command",
    )


def test_calibrate(files, tmp_path: pathlib.Path) -> None:
    _refused(
        ["calibrate", str(files["timings"]), "--out", str(files["timings"])],
        [files["timings"]],
        f"--out {files['timings']}: is an input of this command (TIMINGS {files['timings']})",
    )
    link = _link(tmp_path, files["timings"])
    _refused(
        ["calibrate", str(files["timings"]), "--out", link],
        [files["timings"]],
        f"--out {link}: is an input of this command",
    )


@pytest.mark.parametrize(
    "case", ["results is the trace", "timings is the trace", "results is the timings"]
)
def test_serve_trace(files, tmp_path: pathlib.Path, case: str) -> None:
    """Refused before serving, so without torch and transformers too."""
    trace, other = str(files["trace"]), str(tmp_path / "other")
    results, timings = {
        "results is the trace": (trace, other),
        "timings is the trace": (other, trace),
        "results is the timings": (other, other),
    }[case]
    message = (
        f"--timings {timings}: is also the file of --results {results}"
        if case == "results is the timings"
        else f"{'--results' if results == trace else '--timings'} {trace}: is an input "
        f"of this command (TRACE {trace})"
    )
    _refused(
        ["serve-trace", trace, "--results", results, "--timings", timings],
        [files["trace"]],
        message,
    )
    assert not pathlib.Path(other).exists()
