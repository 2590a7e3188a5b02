"""Latency-model presets, model files, and calibration on synthetic timings of known models."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest

from stepplanner.sim.latency import DEFAULT_LATENCY, LatencyModel
from stepplanner.sim.latency_models import (
    FIT_LIMIT,
    PRESETS,
    STEP_TIMING_COLUMNS,
    StepTimings,
    fit_latency,
    fit_step_latency,
    load_latency_model,
    read_step_timings,
    read_timings,
    save_latency_model,
    step_timing_row,
)


def _timings(
    model: LatencyModel, steps: int = 400, noise: float = 0.0, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 4096, steps).astype(np.float64)
    context = tokens + rng.integers(0, 500_000, steps)
    seconds = model.a + model.b * tokens + model.c * context
    return tokens, context, seconds * (1 + noise * rng.standard_normal(steps))


def test_calibration_recovers_known_coefficients_exactly() -> None:
    truth = LatencyModel(3.1e-3, 12.5e-6, 31.0e-9, "truth")
    fit = fit_latency(*_timings(truth))
    assert fit.model.a == pytest.approx(truth.a, rel=1e-9)
    assert fit.model.b == pytest.approx(truth.b, rel=1e-9)
    assert fit.model.c == pytest.approx(truth.c, rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.worst_relative_error < 1e-9


def test_calibration_with_noise_reports_its_fit() -> None:
    truth = LatencyModel(3.1e-3, 12.5e-6, 31.0e-9, "truth")
    tokens, context, seconds = _timings(truth, noise=0.02, seed=1)
    fit = fit_latency(tokens, context, seconds)
    assert fit.model.b == pytest.approx(truth.b, rel=0.05)
    assert fit.model.c == pytest.approx(truth.c, rel=0.05)
    assert 0.9 < fit.r2 < 1.0
    predicted = fit.model.a + fit.model.b * tokens + fit.model.c * context
    relative = np.abs(predicted - seconds) / seconds
    assert fit.worst_relative_error == pytest.approx(relative.max())
    assert fit.worst_row == int(np.argmax(relative))


def test_calibration_keeps_coefficients_non_negative() -> None:
    # Timings on a line with a negative intercept: unconstrained, a would be -0.1 ms.
    tokens = np.array([100.0, 200.0, 400.0, 800.0, 1600.0])
    context = np.array([1000.0, 500.0, 4000.0, 900.0, 30000.0])
    seconds = 1e-5 * tokens + 1e-8 * context - 1e-4
    assert (
        np.linalg.lstsq(np.column_stack([np.ones(5), tokens, context]), seconds, rcond=None)[0][0]
        < 0
    )
    fit = fit_latency(tokens, context, seconds)
    assert fit.model.a == 0.0 and fit.model.b > 0 and fit.model.c >= 0
    assert fit.r2 > 0.99


def test_calibration_needs_independent_tokens_and_context() -> None:
    tokens = np.array([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="cannot be told apart"):
        fit_latency(tokens, 2 * tokens, 0.001 + tokens * 1e-5)
    with pytest.raises(ValueError, match="at least 3"):
        fit_latency(tokens[:2], tokens[:2], tokens[:2])


def test_r2_is_one_only_for_an_exact_fit() -> None:
    # Constant seconds leave no variance to explain: R² was 1.0 for b*tokens, off by a median
    # 53%, because 1 - residual / total fell back to 1 whenever total was 0.
    tokens = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    context = np.array([10.0, 30.0, 20.0, 50.0, 40.0])
    constant = StepTimings(np.full(5, 0.5), tokens, context)
    off = fit_step_latency(constant, terms="b")
    assert off.median_relative_error > 0.3 and off.r2 == 0.0
    # the same seconds fitted exactly (by a, to rounding, and 0.1 has no exact mean) score 1
    for seconds in (0.5, 0.1):
        exact = fit_step_latency(StepTimings(np.full(5, seconds), tokens, context))
        assert exact.worst_relative_error < 1e-12 and exact.r2 == 1.0
    # seconds that vary: R² as always, below 0 when the fit is worse than the mean
    varying = StepTimings(np.array([0.5, 0.1, 0.4, 0.2, 0.3]), tokens, context)
    assert fit_step_latency(varying, terms="b").r2 < 0


@pytest.mark.parametrize("terms", [None, "bd", "cd", "bcd", "d", "ad"])
def test_columns_beyond_what_the_fit_can_square_are_named(terms: str | None) -> None:
    # tokens x context of counts near 1e155 overflowed to inf and np.linalg raised LinAlgError
    # through the CLI; with default terms the message blamed tokens and context for not
    # varying independently
    tokens = np.array([1.0, 2.0, 3.0, 5.0]) * 1e155
    timings = StepTimings(
        np.array([0.1, 0.2, 0.3, 0.5]), tokens, tokens * np.array([1.0, 3.0, 2.0, 4.0])
    )
    column = {
        None: "tokens (the column of b)",
        "cd": "context (the column of c)",
        "bd": "tokens (the column of b)",
        "bcd": "tokens (the column of b)",
        "d": "tokens x context (the column of d)",
        "ad": "tokens x context (the column of d)",
    }[terms]
    value = "overflows float64" if "tokens x context" in column else "is 1e+155"
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"timings data row 1: {column} {value}; allowed: at most {FIT_LIMIT:g} (the "
            "least-squares fit squares every column)"
        ),
    ):
        fit_step_latency(timings, terms=terms)
    # at the limit the fit still runs and reports numbers
    small = StepTimings(
        np.array([0.1, 0.2, 0.3, 0.5]),
        np.array([1.0, 2.0, 3.0, 5.0]) * 1e70,
        np.array([1.0, 6.0, 6.0, 20.0]) * 1e70,
    )
    fit = fit_step_latency(small)
    assert all(np.isfinite([fit.r2, fit.median_relative_error, fit.worst_relative_error]))


def test_seconds_too_small_to_divide_by_are_named() -> None:
    timings = StepTimings(
        np.array([5e-324, 0.2, 0.3, 0.5]),
        np.array([1.0, 2.0, 3.0, 5.0]),
        np.array([1.0, 6.0, 6.0, 20.0]),
    )
    with pytest.raises(
        ValueError,
        match=re.escape(
            "timings data row 1: seconds=5e-324 is too small to divide by: the fit's relative "
            "error there is not a finite number; allowed: seconds a measured step takes"
        ),
    ):
        fit_step_latency(timings)


def test_read_timings_and_round_trip(tmp_path: pathlib.Path) -> None:
    truth = LatencyModel(2e-3, 1e-5, 2e-8, "truth")
    tokens, context, seconds = _timings(truth, steps=20)
    path = tmp_path / "timings.csv"
    rows = "\n".join(
        f"{i},{t:.0f},{c:.0f},{float(s)!r}"
        for i, (t, c, s) in enumerate(zip(tokens, context, seconds))
    )
    path.write_text("step,tokens,context,seconds\n" + rows + "\n")
    got = read_timings(path)
    assert np.allclose(got[2], seconds)
    fit = fit_latency(*got, name="mine")
    out = tmp_path / "model.json"
    save_latency_model(fit.model, out, fit.to_dict())
    data = json.loads(out.read_text())
    assert data["format"] == "stepplanner-latency/1" and data["fit"]["rows"] == 20
    loaded = load_latency_model(str(out))
    assert (loaded.a, loaded.b, loaded.c, loaded.name) == (
        fit.model.a,
        fit.model.b,
        fit.model.c,
        "mine",
    )


@pytest.mark.parametrize(
    "body, fragment",
    [
        (
            "tokens,seconds\n1,2\n",
            "line 1: header \\['tokens', 'seconds'\\] lacks column\\(s\\) context",
        ),
        (
            "tokens,context,seconds\n1,2,0.1\n3,x,0.2\n",
            "line 3: column 'context': 'x' is not a number",
        ),
        ("tokens,context,seconds\n1,2,0\n", "line 2: column 'seconds': '0' is out of range"),
        ("tokens,context,seconds\n-1,2,0.1\n", "line 2: column 'tokens': '-1' is out of range"),
        ("tokens,context,seconds\n1,2,\n", "line 2: column 'seconds': '' is not a number"),
    ],
)
def test_bad_timings_name_row_and_column(tmp_path: pathlib.Path, body: str, fragment: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=fragment) as info:
        read_timings(path)
    assert "\n" not in str(info.value)


def test_presets() -> None:
    assert PRESETS["llama-3.1-8b-fp8-h100"] is DEFAULT_LATENCY
    assert len(PRESETS) >= 4
    assert any("jetson" in name for name in PRESETS)  # an edge device
    for name, model in PRESETS.items():
        assert load_latency_model(name.upper()) is model
        assert model.a > 0 and model.b > 0 and model.c > 0
    # Physical sanity: the H200 streams faster than the H100; BF16 on an A100 is slower.
    h100, h200 = PRESETS["llama-3.1-8b-fp8-h100"], PRESETS["llama-3.1-8b-fp8-h200"]
    assert h200.a < h100.a and h200.c < h100.c and h200.b == pytest.approx(h100.b)
    assert PRESETS["llama-3.1-8b-bf16-a100"].step_seconds(512, 100_000) > h100.step_seconds(
        512, 100_000
    )


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "neither a preset nor a file"),
        ("{not json", "cannot be read as JSON"),
        ('{"a": 1, "b": 1, "c": 1}', "format"),
        ('{"format": "stepplanner-latency/1", "a": 1, "b": 1}', "missing c"),
        ('{"format": "stepplanner-latency/1", "a": -1, "b": 1, "c": 1}', "out of range"),
    ],
)
def test_load_latency_model_errors(
    tmp_path: pathlib.Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=fragment):
        load_latency_model(str(path))


def test_one_nonnegative_least_squares_serves_both_fits() -> None:
    from stepplanner.sim import calibration
    from stepplanner.sim._least_squares import nonnegative_least_squares

    assert calibration.nonnegative_least_squares is nonnegative_least_squares
    m = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # Unconstrained: x = (2, -1); the best x >= 0 drops the second column.
    x = nonnegative_least_squares(m, np.array([2.0, -1.0, 1.0]))
    assert x.tolist() == pytest.approx([1.5, 0.0])
    # No feasible support beats x = 0 when every column points away from the target.
    assert nonnegative_least_squares(m, np.array([-1.0, -1.0, -2.0])).tolist() == [0.0, 0.0]


def test_fit_latency_clamps_a_negative_slope_to_zero() -> None:
    tokens = np.array([1, 100, 200, 300, 50, 400])
    context = np.array([10, 10, 5000, 9000, 20000, 30000])
    # seconds fall with tokens: the best b >= 0 is 0, a and c absorb the rest
    seconds = 0.01 + 1e-7 * context - 1e-6 * tokens
    fit = fit_latency(tokens, context, seconds)
    assert fit.model.b == 0.0 and fit.model.a > 0 and fit.model.c > 0


# --- the timings contract (issue 21): every column a runtime writes per step -----------------

CONTRACT = (
    "seconds",
    "tokens",
    "context",
    "rows",
    "decode_rows",
    "prefill_tokens",
    "prefill_context",
    "attention",
)


def _steps(model: LatencyModel, steps: int = 300, seed: int = 3) -> list[dict[str, float]]:
    """Steps of random rows (a few chunks and some decode rows each), timed by ``model``."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        chunks = [
            (int(rng.integers(0, 512)), int(rng.integers(1, 256)))
            for _ in range(int(rng.integers(0, 3)))
        ]
        decodes = [(int(rng.integers(1, 2048)), 1) for _ in range(int(rng.integers(0, 9)))]
        rows = chunks + decodes or [(0, 7)]
        tokens = sum(q for _, q in rows)
        context = sum(p + q for p, q in rows)
        attention = sum(q * (p + q) for p, q in rows)
        out.append(
            {
                "seconds": model.step_seconds(tokens, context, len(rows), attention),
                "tokens": tokens,
                "context": context,
                "rows": len(rows),
                "decode_rows": len(decodes),
                "prefill_tokens": sum(q for _, q in chunks),
                "prefill_context": sum(p + q for p, q in chunks),
                "attention": attention,
            }
        )
    return out


def _write(
    path: pathlib.Path, steps: list[dict[str, float]], columns: tuple[str, ...], extra: str = ""
) -> None:
    head = ",".join(columns) + ("," + extra if extra else "")
    body = "\n".join(
        ",".join(repr(s[c]) for c in columns) + ("," + "x" if extra else "") for s in steps
    )
    path.write_text(head + "\n" + body + "\n")


def test_step_timings_contract_recovers_every_coefficient(tmp_path: pathlib.Path) -> None:
    truth = LatencyModel(4.7e-3, 9.8e-5, 3.1e-6, "truth", d=7.1e-8, e=2.5e-9, f=5.8e-4)
    path = tmp_path / "steps.csv"
    _write(path, _steps(truth), CONTRACT, extra="schedule_seconds")  # other columns ignored
    timings = read_step_timings(path)
    assert len(timings) == 300 and timings.decode_rows is not None
    fit = fit_step_latency(timings, "mine")
    assert fit.terms == "abcdef"
    for k in "abcdef":
        assert getattr(fit.model, k) == pytest.approx(getattr(truth, k), rel=1e-6), k
    assert fit.r2 == pytest.approx(1.0) and fit.worst_relative_error < 1e-6
    # The model alone cannot: it leaves a step-shape error behind.
    plain = fit_step_latency(timings, "abc", terms="abc")
    assert (plain.model.d, plain.model.e, plain.model.f) == (0.0, 0.0, 0.0)
    assert plain.worst_relative_error > 0.05


def test_old_three_column_timings_still_calibrate(tmp_path: pathlib.Path) -> None:
    truth = LatencyModel(2e-3, 1e-5, 2e-8, "truth")
    path = tmp_path / "old.csv"
    _write(path, _steps(truth, 40), ("tokens", "context", "seconds"))
    timings = read_step_timings(path)
    assert timings.rows is None and timings.attention is None
    fit = fit_step_latency(timings)
    assert fit.terms == "abcd"  # tokens x context needs no further column
    assert (fit.model.a, fit.model.b, fit.model.c) == pytest.approx((truth.a, truth.b, truth.c))
    assert fit.model.d == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(
        ValueError,
        match=r"terms='abcf' needs column\(s\) rows, which the "
        r"timings lack",
    ):
        fit_step_latency(timings, terms="abcf")
    with pytest.raises(ValueError, match="terms='abz' is not known; allowed: letters of abcdef"):
        fit_step_latency(timings, terms="abz")


def test_a_term_the_timings_cannot_tell_apart_is_left_at_zero(tmp_path: pathlib.Path) -> None:
    # Decode-only steps: rows == tokens, so f cannot be told from b; b takes it all.
    steps = [s for s in _steps(LatencyModel(3e-3, 2e-4, 4e-6, "t"), 400) if not s["prefill_tokens"]]
    path = tmp_path / "decode.csv"
    _write(path, steps, CONTRACT)
    fit = fit_step_latency(read_step_timings(path))
    assert "f" not in fit.terms and fit.model.f == 0.0
    assert fit.model.b == pytest.approx(2e-4, rel=1e-6)


@pytest.mark.parametrize(
    "row, fragment",
    [
        (
            "0.01,4,10,2,3,0,0,10",
            "line 2: column 'decode_rows'='3' exceeds column 'rows'='2'; "
            "allowed: decode_rows <= rows",
        ),
        ("0.01,4,10,2,2,5,5,10", "column 'prefill_tokens'='5' exceeds column 'tokens'='4'"),
        ("0.01,4,3,2,2,0,0,10", "column 'tokens'='4' exceeds column 'context'='3'"),
        ("0.01,4,10,2,2,0,0,x", "line 2: column 'attention': 'x' is not a number"),
        ("0.01,4,10,-2,2,0,0,10", "line 2: column 'rows': '-2' is out of range"),
    ],
)
def test_inconsistent_contract_rows_name_line_and_columns(
    tmp_path: pathlib.Path, row: str, fragment: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(",".join(CONTRACT) + "\n" + row + "\n")
    with pytest.raises(ValueError, match=re.escape(fragment)):
        read_step_timings(path)


def test_model_files_carry_the_new_terms_and_old_files_mean_zero(tmp_path: pathlib.Path) -> None:
    model = LatencyModel(1e-3, 2e-5, 3e-8, "full", d=4e-9, e=5e-10, f=6e-4)
    path = tmp_path / "m.json"
    save_latency_model(model, path)
    assert load_latency_model(str(path)) == model
    old = tmp_path / "old.json"
    old.write_text(
        '{"format": "stepplanner-latency/1", "name": "old", "a": 1e-3, "b": 2e-5, "c": 3e-8}'
    )
    assert load_latency_model(str(old)) == LatencyModel(1e-3, 2e-5, 3e-8, "old")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "stepplanner-latency/1", "a": 1, "b": 1, "c": 1, "f": -1}')
    with pytest.raises(ValueError, match=r"LatencyModel.f=-1 is out of range"):
        load_latency_model(str(bad))


def test_the_simulator_prices_each_step_with_every_term() -> None:
    from stepplanner.planner._policy import StepPlannerLimits
    from stepplanner.sim.simulator import simulate
    from stepplanner.sim.workloads import Workload

    # One request: a 40-token prompt in one chunk, then 2 decode steps at past 40 and 41.
    workload = Workload(np.zeros(1), np.array([40]), np.array([3]), np.zeros(1, dtype=np.int32))
    model = LatencyModel(1e-3, 1e-5, 1e-6, "m", d=1e-7, e=1e-8, f=1e-4)
    result = simulate(workload, StepPlannerLimits(4, 64, 8), latency=model)
    expected = [
        model.step_seconds(40, 40, 1, 40 * 40),
        model.step_seconds(1, 41, 1, 41),
        model.step_seconds(1, 42, 1, 42),
    ]
    assert result.steps["seconds"].tolist() == pytest.approx(expected, rel=1e-12)
    assert result.finish_time[0] == pytest.approx(sum(expected), rel=1e-12)


def test_step_timing_row_sums_the_contract_columns_over_the_batch() -> None:
    # Two decodes 40 and 9 tokens deep, a chunk of 32 after 64 computed, a first chunk of 16.
    row = step_timing_row(0.5, [(40, 1, True), (64, 32, False), (9, 1, True), (0, 16, False)])
    assert row == {
        "seconds": 0.5,
        "tokens": 50,
        "context": 41 + 96 + 10 + 16,
        "rows": 4,
        "decode_rows": 2,
        "prefill_tokens": 48,
        "prefill_context": 96 + 16,
        "attention": 41 + 32 * 96 + 10 + 16 * 16,
    }
    assert tuple(row) == STEP_TIMING_COLUMNS
