"""Hostile files for the offline tools, generated: ``calibrate`` on timings, ``fidelity`` on
results and its ``--pace-from`` timings, and ``serve-trace``'s argument checks, with extreme
magnitudes (subnormal to 1.8e308), values whose sums overflow, mismatched and scalar lists, bad
text and output paths that alias an input (the same name, ``./``, a symlink).

The contract (docs/reliability.md, "What the tools refuse"): a command ends with exit status 0
and prints only numbers that are numbers, or with a one-line error and exit status 2 (the
library: a ``StepPlannerError`` naming the field); never a traceback, and no input file is
changed. Each test draws tens to a hundred and fifty small cases: seconds in all.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import pathlib
import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepplanner._errors import StepPlannerError
from stepplanner.fidelity.compare import check_fidelity
from stepplanner.fidelity.results import read_results, served_workload
from stepplanner.planner._policy import SchedulingOptions, StepPlannerLimits
from stepplanner.planner._types import IfbSchedulingMode
from stepplanner.sim.latency import LatencyModel
from stepplanner.sim.latency_models import fit_step_latency, measured_pace, read_step_timings

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402

LIMITS = StepPlannerLimits(
    max_batch_size=4, max_input_length=64, kv_page_size=16, max_step_tokens=128
)
OPTIONS = SchedulingOptions(ifb_scheduling_mode=IfbSchedulingMode.MIXED, max_num_tokens=128)
MODEL = LatencyModel(a=3e-4, b=2e-4, c=6e-6, name="cpu")
NOT_A_NUMBER = re.compile(r"\b(nan|inf|infinity)\b", re.IGNORECASE)
# Seconds and counts where float64 misbehaves: 0, subnormals, the fit's and the results'
# limits, squares and products that overflow, the largest finite double.
EXTREME = [
    0.0,
    5e-324,
    1e-320,
    1e-300,
    1e-9,
    0.5,
    1.0,
    3.0,
    1e12,
    1.0000001e12,
    1e150,
    1e155,
    1e300,
    1.7976931348623157e308,
]


def hostile(**kw: Any) -> settings:
    """The loaded profile's settings (``ci``: derandomized), with fewer examples where one is a
    whole simulation or CLI run, and large draws allowed (the files are meant to be odd)."""
    return settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], **kw)


def magnitudes(low: float = 0.0) -> st.SearchStrategy[float]:
    """A number from the extremes or anywhere in [low, 1.8e308]."""
    return st.one_of(
        st.sampled_from([v for v in EXTREME if v >= low]),
        st.floats(min_value=low, allow_nan=False, allow_infinity=False),
    )


CELLS = st.one_of(
    st.sampled_from([repr(v) for v in EXTREME]),
    st.sampled_from(["nan", "inf", "-1", "", "x", "1e400", str(2**70), "7"]),
    st.floats(min_value=0, max_value=1e308).map(repr),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # One folder per test, emptied per example: a function-scoped tmp_path would be shared by
    # every example anyway, and a new temporary folder per example costs more than the case.
    return tmp_path_factory.mktemp("hostile")


@contextlib.contextmanager
def folder(scratch: pathlib.Path) -> Iterator[pathlib.Path]:
    for entry in scratch.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    yield scratch


def alias(where: pathlib.Path, target: pathlib.Path, how: str) -> str:
    """An output path: a new file, or the input ``target`` under some name."""
    if how == "new":
        return str(where / "out.json")
    if how == "same":
        return str(target)
    if how == "dot":
        return f"{target.parent}/./{target.name}"
    link = where / f"link-{target.name}"
    if not link.exists():
        link.symlink_to(target)
    return str(link)


def assert_the_contract(out: Any, inputs: dict[pathlib.Path, bytes]) -> None:
    """Exit 0 printing only numbers, or exit 2 with one line; the inputs untouched."""
    assert out.exit_code in (0, 2), out.output
    if out.exit_code == 2:
        assert_one_error_line(out.output)
    else:
        assert not NOT_A_NUMBER.search(out.stdout), out.stdout
    for path, content in inputs.items():
        assert path.read_bytes() == content, f"{path} was written"


def assert_one_error_line(output: str) -> None:
    """One line ``Error: ...``; after click's usage lines when click's own check refused (a path
    that is not a directory), as for every command."""
    lines = output.strip().splitlines()
    assert lines[-1].startswith("Error: "), output
    assert len(lines) == 1 or lines[0].startswith("Usage: "), output
    assert sum(line.startswith("Error") for line in lines) == 1, output


def refused_cleanly(exc: BaseException) -> bool:
    return isinstance(exc, StepPlannerError) and "\n" not in str(exc)


# --- calibrate ---------------------------------------------------------------------------------

TIMING_COLUMNS = ("seconds", "tokens", "context", "rows", "attention", "start")


COUNTS = st.one_of(st.sampled_from(EXTREME), st.floats(min_value=0, max_value=1e308))


@st.composite
def timings_files(draw: st.DrawFn) -> str:
    """Mostly rows a runtime could have counted (tokens <= context <= attention) at any
    magnitude, some rows of bad text; seconds that do not vary half the time."""
    columns = [
        "seconds",
        "tokens",
        "context",
        *draw(st.lists(st.sampled_from(TIMING_COLUMNS[3:]), unique=True, max_size=3)),
    ]
    constant = draw(st.booleans())  # R²'s total of 0
    seconds = repr(draw(COUNTS))
    body = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 9)) == 0:
            body.append(",".join(draw(CELLS) for _ in columns))
            continue
        tokens, context, attention = sorted(draw(COUNTS) for _ in range(3))
        values = {
            "seconds": seconds if constant else repr(draw(COUNTS)),
            "tokens": repr(tokens),
            "context": repr(context),
            "attention": repr(attention),
            "rows": repr(draw(COUNTS)),
            "start": repr(draw(COUNTS)),
        }
        body.append(",".join(values[c] for c in columns))
    return "\n".join([",".join(columns), *body]) + "\n"


TERMS = st.one_of(
    st.none(),
    st.sampled_from(["a", "b", "bd", "cd", "bcd", "d", "ad", "abc", "e", "f", "abcdef", "z"]),
)


@hostile(max_examples=150)
@given(text=timings_files(), terms=TERMS)
def test_calibration_fits_numbers_or_refuses(
    scratch: pathlib.Path, text: str, terms: str | None
) -> None:
    with folder(scratch) as where:
        path = where / "timings.csv"
        path.write_text(text)
        try:
            timings = read_step_timings(path)
            fit = fit_step_latency(timings, "t", terms)
        except StepPlannerError as exc:
            assert refused_cleanly(exc), exc
            return
        figures = (fit.r2, fit.median_relative_error, fit.worst_relative_error)
        assert all(math.isfinite(v) for v in figures) and fit.r2 <= 1.0
        assert all(math.isfinite(v) for v in fit.model.coefficients().values())
        if timings.seconds.min() == timings.seconds.max():  # no variance: 1 only when exact
            assert (fit.r2 == 1.0) == (fit.worst_relative_error <= 1e-12), fit


@hostile(max_examples=40)
@given(text=timings_files(), terms=TERMS, out=st.sampled_from(["new", "same", "dot", "link"]))
def test_calibrate_ends_in_numbers_or_one_line(
    scratch: pathlib.Path, text: str, terms: str | None, out: str
) -> None:
    with folder(scratch) as where:
        timings = where / "timings.csv"
        timings.write_text(text)
        args = ["calibrate", str(timings), "--out", alias(where, timings, out)]
        result = CliRunner().invoke(
            main, args + (["--terms", terms] if terms else []), catch_exceptions=False
        )
        assert_the_contract(result, {timings: text.encode()})
        if out != "new":
            assert result.exit_code == 2 and "is an input of this command" in result.output


# --- fidelity: results files -----------------------------------------------------------------


@st.composite
def lists(draw: st.DrawFn, n: int, element: st.SearchStrategy[Any]) -> Any:
    """Mostly ``n`` entries (so that most files get past the counting); sometimes one short
    or long, or a scalar."""
    kind = draw(st.sampled_from(["n"] * 12 + ["short", "long", "scalar"]))
    if kind == "scalar":
        return draw(element)
    size = {"n": n, "short": n - 1, "long": n + 1}[kind]
    return draw(st.lists(element, min_size=size, max_size=size))


@st.composite
def results_docs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    prompts = st.integers(1, LIMITS.max_input_length)
    doc: dict[str, Any] = {
        "input_lens": draw(lists(n, prompts)),
        "output_lens": draw(lists(n, st.integers(1, 6))),
        "ttfts": draw(lists(n, magnitudes())),
        "itls": draw(lists(n, st.lists(magnitudes(), max_size=5))),
    }
    for key, element in (
        ("latencies", magnitudes()),
        ("start_times", magnitudes(-1e308)),
        ("arrival_times", magnitudes()),
        ("priorities", st.integers(-2, 2)),
        ("duration", magnitudes()),
    ):
        if draw(st.booleans()):
            doc[key] = draw(element if key == "duration" else lists(n, element))
    if draw(st.booleans()):
        doc["stepplanner"] = {"format": "stepplanner-results/1"}
        doc.setdefault("arrival_times", draw(lists(n, magnitudes())))
        doc.setdefault("priorities", draw(lists(n, st.integers(-2, 2))))
    return doc


@hostile(max_examples=80)
@given(doc=results_docs())
def test_fidelity_reads_compares_or_refuses_results(
    scratch: pathlib.Path, doc: dict[str, Any]
) -> None:
    with folder(scratch) as where:
        path = where / "results.json"
        path.write_text(json.dumps(doc))
        try:
            results = read_results(path)
            workload, matched = served_workload(results)
            report = check_fidelity(
                matched, workload, LIMITS, OPTIONS, MODEL, max_steps=2000
            ).report
        except StepPlannerError as exc:
            assert refused_cleanly(exc), exc
            assert str(exc).startswith(f"results {path}: ") or "allowed" in str(exc)
            return
        json.dumps(report, allow_nan=False)  # every figure is a number (or None: unknown)


# --- fidelity: --pace-from timings and the output aliases --------------------------------------


@hostile(max_examples=100)
@given(
    starts=st.lists(magnitudes(), min_size=1, max_size=5),
    tokens=st.lists(st.sampled_from([0.0, 1.0, 8.0, 1e155, 1e300]), min_size=1, max_size=5),
    seconds=st.lists(magnitudes(5e-324), min_size=1, max_size=5),
    window=st.sampled_from([1e-300, 1e-9, 1e-6, 0.5, 1e6, 1e300]),
    zero=st.booleans(),
)
def test_measured_pace_is_a_pace_or_refused(
    scratch: pathlib.Path,
    starts: list[float],
    tokens: list[float],
    seconds: list[float],
    window: float,
    zero: bool,
) -> None:
    n = min(len(starts), len(tokens), len(seconds))
    with folder(scratch) as where:
        path = where / "t.csv"
        path.write_text(
            "seconds,tokens,context,start\n"
            + "".join(
                f"{s!r},{t!r},{t!r},{b!r}\n" for s, t, b in zip(seconds[:n], tokens[:n], starts[:n])
            )
        )
        model = LatencyModel(a=0.0, b=2e-4, c=6e-6) if zero else MODEL
        try:
            pace = measured_pace(read_step_timings(path), model, window, str(path))
        except StepPlannerError as exc:
            assert refused_cleanly(exc), exc
            return
        assert all(math.isfinite(f) and f > 0 for f in pace.factors)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, write_run_files) -> dict[str, pathlib.Path]:
    """A small real run to compare against, its files by the option that reads each."""
    from stepplanner.sim.workloads import synthetic

    workload = synthetic(requests=6, rate=8.0, seed=2, max_prompt=60, max_output=6)
    files = write_run_files(tmp_path_factory.mktemp("run"), workload, LIMITS, OPTIONS, MODEL)
    return {
        "RESULTS": files["results"],
        "--trace": files["trace"],
        "--pace-from": files["timings"],
        "--latency-model": files["model"],
    }


@hostile(max_examples=12)
@given(
    outputs=st.lists(
        st.tuples(
            st.sampled_from(["--json", "--plot"]),
            st.sampled_from(["RESULTS", "--trace", "--pace-from", "--latency-model", None]),
            st.sampled_from(["same", "dot", "link"]),
        ),
        min_size=1,
        max_size=2,
        unique_by=lambda o: o[0],
    ),
    window=st.sampled_from(["0.5", "1e-300", "1e-9"]),
)
def test_fidelity_never_writes_an_input(
    scratch: pathlib.Path,
    run: dict[str, pathlib.Path],
    outputs: list[tuple[str, str | None, str]],
    window: str,
) -> None:
    with folder(scratch) as where:
        args = [
            "fidelity",
            str(run["RESULTS"]),
            "--trace",
            str(run["--trace"]),
            "--pace-from",
            str(run["--pace-from"]),
            "--pace-window",
            window,
            "--latency-model",
            str(run["--latency-model"]),
            "--no-progress",
            "--format",
            "json",
        ]
        for option, target, how in outputs:
            suffix = ".png" if option == "--plot" else ".json"
            args += [
                option,
                (alias(where, run[target], how) if target else str(where / f"out{suffix}")),
            ]
        if any(option == "--plot" for option, _, _ in outputs):
            pytest.importorskip("matplotlib")
        inputs = {path: path.read_bytes() for path in run.values()}
        out = CliRunner().invoke(main, args, catch_exceptions=False)
        assert_the_contract(out, inputs)
        if any(target for _, target, _ in outputs):
            assert out.exit_code == 2  # as an input, or first as a plot's suffix


# --- serve-trace's argument checks ----------------------------------------------------------

TORCH = importlib.util.find_spec("torch") is not None


@hostile(max_examples=60)
@given(
    seed=st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(-(2**80), 2**80)),
    attn=st.one_of(
        st.sampled_from(["sdpa", "eager", "paged|sdpa", "bogus", "org/kernel", "SDPA", ""]),
        st.text(max_size=12),
    ),
    model=st.sampled_from([None, "empty", "config only", "file"]),
    results=st.sampled_from(["new", "trace", "trace via ./", "trace via link", "timings"]),
    timings=st.sampled_from(["new", "trace", "trace via link"]),
)
def test_serve_trace_refuses_before_serving(
    scratch: pathlib.Path, seed: int, attn: str, model: str | None, results: str, timings: str
) -> None:
    with folder(scratch) as where:
        trace = where / "trace.csv"
        trace.write_text("arrival_time,prompt_tokens,output_tokens\n0.0,4,2\n0.1,5,2\n")
        content = trace.read_bytes()
        names = {
            "new": str(where / "r.json"),
            "trace": str(trace),
            "trace via ./": f"{where}/./trace.csv",
            "trace via link": alias(where, trace, "link"),
        }
        results_path = names.get(results, str(where / "t.csv"))
        timings_path = (
            names["new"].replace("r.json", "t.csv") if timings == "new" else names[timings]
        )
        args = [
            "serve-trace",
            str(trace),
            "--results",
            results_path,
            "--timings",
            timings_path,
            "--model-seed",
            str(seed),
            "--attn-implementation",
            attn,
        ]
        if model is not None:
            directory = where / "model"
            if model == "file":
                directory.write_text("")
            else:
                directory.mkdir()
                if model == "config only":
                    (directory / "config.json").write_text("{}")
            args += ["--model", str(directory)]
        bad = (
            results != "new"
            or timings != "new"
            or not -(2**63) <= seed < 2**64
            or model is not None
            or attn not in ("sdpa", "eager", "paged|sdpa")
        )
        if not bad and TORCH:
            return  # it would serve the trace for real
        out = CliRunner().invoke(main, args, catch_exceptions=False)
        assert trace.read_bytes() == content
        # Past every check the harness import is what fails in a venv without torch (exit 1);
        # a bad argument is always exit 2, one line.
        assert out.exit_code in (1, 2), out.output
        assert_one_error_line(out.output)
        if bad:
            assert out.exit_code == 2, out.output
        else:
            assert out.exit_code == 1 and "needs torch and transformers" in out.output
        assert not (where / "r.json").exists() and not (where / "t.csv").exists()
