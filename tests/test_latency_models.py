"""Latency-model presets, model files, and calibration on synthetic timings of known models."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from stepplanner.sim.latency import DEFAULT_LATENCY, LatencyModel
from stepplanner.sim.latency_models import (
    PRESETS,
    fit_latency,
    load_latency_model,
    read_timings,
    save_latency_model,
)


def _timings(model: LatencyModel, steps: int = 400, noise: float = 0.0,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    assert np.linalg.lstsq(np.column_stack([np.ones(5), tokens, context]), seconds,
                           rcond=None)[0][0] < 0
    fit = fit_latency(tokens, context, seconds)
    assert fit.model.a == 0.0 and fit.model.b > 0 and fit.model.c >= 0
    assert fit.r2 > 0.99


def test_calibration_needs_independent_tokens_and_context() -> None:
    tokens = np.array([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="cannot be told apart"):
        fit_latency(tokens, 2 * tokens, 0.001 + tokens * 1e-5)
    with pytest.raises(ValueError, match="at least 3"):
        fit_latency(tokens[:2], tokens[:2], tokens[:2])


def test_read_timings_and_round_trip(tmp_path: pathlib.Path) -> None:
    truth = LatencyModel(2e-3, 1e-5, 2e-8, "truth")
    tokens, context, seconds = _timings(truth, steps=20)
    path = tmp_path / "timings.csv"
    rows = "\n".join(f"{i},{t:.0f},{c:.0f},{float(s)!r}" for i, (t, c, s)
                     in enumerate(zip(tokens, context, seconds)))
    path.write_text("step,tokens,context,seconds\n" + rows + "\n")
    got = read_timings(path)
    assert np.allclose(got[2], seconds)
    fit = fit_latency(*got, name="mine")
    out = tmp_path / "model.json"
    save_latency_model(fit.model, out, fit.to_dict())
    data = json.loads(out.read_text())
    assert data["format"] == "stepplanner-latency/1" and data["fit"]["rows"] == 20
    loaded = load_latency_model(str(out))
    assert (loaded.a, loaded.b, loaded.c, loaded.name) == (fit.model.a, fit.model.b,
                                                          fit.model.c, "mine")


@pytest.mark.parametrize("body, fragment", [
    ("tokens,seconds\n1,2\n", "line 1: header \\['tokens', 'seconds'\\] lacks column\\(s\\) context"),
    ("tokens,context,seconds\n1,2,0.1\n3,x,0.2\n", "line 3: column 'context': 'x' is not a number"),
    ("tokens,context,seconds\n1,2,0\n", "line 2: column 'seconds': '0' is out of range"),
    ("tokens,context,seconds\n-1,2,0.1\n", "line 2: column 'tokens': '-1' is out of range"),
    ("tokens,context,seconds\n1,2,\n", "line 2: column 'seconds': '' is not a number"),
])
def test_bad_timings_name_row_and_column(tmp_path: pathlib.Path, body: str,
                                         fragment: str) -> None:
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
    assert PRESETS["llama-3.1-8b-bf16-a100"].step_seconds(512, 100_000) > \
        h100.step_seconds(512, 100_000)


@pytest.mark.parametrize("content, fragment", [
    (None, "neither a preset nor a file"),
    ("{not json", "cannot be read as JSON"),
    ('{"a": 1, "b": 1, "c": 1}', "format"),
    ('{"format": "stepplanner-latency/1", "a": 1, "b": 1}', "missing c"),
    ('{"format": "stepplanner-latency/1", "a": -1, "b": 1, "c": 1}', "out of range"),
])
def test_load_latency_model_errors(tmp_path: pathlib.Path, content: str | None,
                                   fragment: str) -> None:
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
