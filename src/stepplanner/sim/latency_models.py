"""Named step-latency models (model x accelerator) and fitting one to a runtime's own timings.

Every model is ``latency.LatencyModel``: ``t_step = a + b * tokens + c * context`` (+ the
``d``, ``e``, ``f`` terms a calibration may find; the presets have none).

Presets. ``llama-3.1-8b-fp8-h100`` is the package default (``latency.DEFAULT_LATENCY``), fitted
to NVIDIA's published TensorRT-LLM throughput table. The others are *roofline* estimates scaled
from that fit: each coefficient has a physical floor on a given device,

* ``a``: streaming the weights once per step, ``params x weight_bytes / HBM bandwidth``;
* ``b``: the dense layers, ``2 x params`` FLOPs per token at the dense tensor peak;
* ``c``: attention reading one KV position, ``2 x layers x kv_heads x head_dim x kv_bytes``
  bytes per position at HBM bandwidth;

and the default fit tells how far above its floor each coefficient lands in practice (the
fraction of peak reached). A preset is its own floors divided by those same fractions. That is
an estimate, not a measurement: it carries over the default engine's efficiency and ignores
tensor-parallel communication. ``stepplanner calibrate`` replaces it with a fit to real
timings. Device and model figures, with their sources, are in docs/tuning.md.

Calibration reads a runtime's per-step timings (``read_step_timings``: ``seconds``, ``tokens``,
``context`` and, when the file has them, the other ``STEP_TIMING_COLUMNS``) and fits the
coefficients ``>= 0`` by least squares (the best of the unconstrained fits over every subset of
the coefficients whose solution is non-negative: with at most six coefficients that enumeration
is the exact non-negative least-squares answer), reporting R², the median and the worst
relative error. R² is ``1 - residual / total``; when the seconds do not vary (total 0) it is 1
for an exact fit and 0 otherwise, as scikit-learn's ``r2_score(force_finite=True)`` reports. Every
column the fit uses (and the seconds) is at most ``FIT_LIMIT``: least squares squares them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import StepPlannerValueError
from ._least_squares import nonnegative_least_squares
from .latency import COEFFICIENTS, DEFAULT_LATENCY, EnginePace, LatencyModel
from .traces import csv_records

__all__ = [
    "FIT_LIMIT",
    "LATENCY_FORMAT",
    "MAX_PACE_WINDOWS",
    "PRESETS",
    "STEP_TIMING_COLUMNS",
    "Accelerator",
    "Fit",
    "ModelShape",
    "PACE_WINDOW",
    "StepTimings",
    "fit_latency",
    "fit_step_latency",
    "load_latency_model",
    "measured_pace",
    "read_step_timings",
    "read_timings",
    "roofline",
    "save_latency_model",
]

LATENCY_FORMAT = "stepplanner-latency/1"
TIMING_COLUMNS = ("tokens", "context", "seconds")  # what every timings file must have
# The timings contract (docs/simulator.md, "The timings file"): what a runtime writes per step so
# that calibrate can fit every term of the model; a harness that times a runtime writes them all.
STEP_TIMING_COLUMNS = (
    "seconds",
    "tokens",
    "context",
    "rows",
    "decode_rows",
    "prefill_tokens",
    "prefill_context",
    "attention",
)


def step_timing_row(seconds: float, batch: Sequence[tuple[int, int, bool]]) -> dict[str, float]:
    """The timings contract's row (``STEP_TIMING_COLUMNS``) for one step that took ``seconds``
    over ``batch``: per planned row, (tokens computed before the step, tokens in it, whether it
    decodes). What a harness timing a runtime writes, so every harness writes it alike."""
    chunks = [(past, query) for past, query, decode in batch if not decode]
    return {
        "seconds": seconds,
        "tokens": sum(query for _, query, _ in batch),
        "context": sum(past + query for past, query, _ in batch),
        "rows": len(batch),
        "decode_rows": len(batch) - len(chunks),
        "prefill_tokens": sum(query for _, query in chunks),
        "prefill_context": sum(past + query for past, query in chunks),
        "attention": sum(query * (past + query) for past, query, _ in batch),
    }


# Read when present, for ``measured_pace`` only: when each step started, in seconds from the run's
# first arrival (serve-trace writes it).
PACE_COLUMNS = ("start",)
# measured_pace's window: short enough to follow a shared machine's speed (0.8-1.36x from one 2-s
# window to the next), long enough to average ~10 of the longest steps of a small engine.
PACE_WINDOW = 0.5
# The most windows measured_pace makes: a week of 0.5-s windows is 1.2e6, a realistic run far
# fewer; its arrays (three float64 per window, then a tuple) stay within tens of MB.
MAX_PACE_WINDOWS = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Accelerator:
    """What bounds a step on one device: HBM bandwidth and dense tensor throughput."""

    name: str
    bytes_per_s: float
    dense_flops: float  # at the precision the model computes in


@dataclasses.dataclass(frozen=True, slots=True)
class ModelShape:
    """What a step moves and computes: parameters and the KV layout (from config.json)."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int

    def kv_bytes_per_position(self, kv_bytes: float) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_bytes


H100_SXM_FP8 = Accelerator("H100 SXM", 3.35e12, 1979e12)
H200_SXM_FP8 = Accelerator("H200 SXM", 4.8e12, 1979e12)
A100_SXM_BF16 = Accelerator("A100 SXM 80GB", 2.039e12, 312e12)
JETSON_AGX_ORIN_FP16 = Accelerator("Jetson AGX Orin 64GB", 204.8e9, 42.5e12)

LLAMA31_8B = ModelShape("Llama-3.1-8B", 8.03e9, 32, 8, 128)
LLAMA31_70B = ModelShape("Llama-3.1-70B", 70.6e9, 80, 8, 128)
LLAMA32_3B = ModelShape("Llama-3.2-3B", 3.21e9, 28, 8, 128)


def _floors(
    model: ModelShape, weight_bytes: float, kv_bytes: float, device: Accelerator, devices: int
) -> tuple[float, float, float]:
    bandwidth, flops = device.bytes_per_s * devices, device.dense_flops * devices
    return (
        model.params * weight_bytes / bandwidth,
        2 * model.params / flops,
        model.kv_bytes_per_position(kv_bytes) / bandwidth,
    )


# The reference point: the default model's floors on the device it was fitted for.
_REFERENCE = _floors(LLAMA31_8B, 1.0, 1.0, H100_SXM_FP8, 1)
_EFFICIENCY = tuple(
    floor / fitted
    for floor, fitted in zip(_REFERENCE, (DEFAULT_LATENCY.a, DEFAULT_LATENCY.b, DEFAULT_LATENCY.c))
)


def roofline(
    model: ModelShape,
    weight_bytes: float,
    kv_bytes: float,
    device: Accelerator,
    devices: int = 1,
    precision: str = "",
) -> LatencyModel:
    """The floors of ``model`` on ``devices`` x ``device``, at the default fit's efficiency."""
    a, b, c = (
        floor / eff
        for floor, eff in zip(_floors(model, weight_bytes, kv_bytes, device, devices), _EFFICIENCY)
    )
    where = device.name if devices == 1 else f"{devices}x {device.name} (tensor parallel)"
    label = f"{model.name} {precision} on {where} (roofline scaled from the default fit)"
    return LatencyModel(a, b, c, label)


PRESETS: dict[str, LatencyModel] = {
    "llama-3.1-8b-fp8-h100": DEFAULT_LATENCY,
    "llama-3.1-8b-fp8-h200": roofline(LLAMA31_8B, 1.0, 1.0, H200_SXM_FP8, 1, "FP8"),
    "llama-3.1-8b-bf16-a100": roofline(LLAMA31_8B, 2.0, 2.0, A100_SXM_BF16, 1, "BF16"),
    "llama-3.1-70b-fp8-h100x4": roofline(LLAMA31_70B, 1.0, 1.0, H100_SXM_FP8, 4, "FP8"),
    # Edge: 4-bit weights (AWQ-style W4A16), FP16 activations and KV cache.
    "llama-3.2-3b-int4-jetson-agx-orin": roofline(
        LLAMA32_3B, 0.5, 2.0, JETSON_AGX_ORIN_FP16, 1, "INT4 weights"
    ),
}


def load_latency_model(text: str) -> LatencyModel:
    """A preset name, or a JSON file written by ``save_latency_model``/``calibrate``."""
    key = text.strip()
    if key.lower() in PRESETS:
        return PRESETS[key.lower()]
    path = pathlib.Path(key)
    if not path.is_file():
        raise StepPlannerValueError(
            f"latency model {text!r} is neither a preset nor a file; presets: {', '.join(PRESETS)}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StepPlannerValueError(
            f"latency model file {path}: cannot be read as JSON ({exc})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != LATENCY_FORMAT:
        raise StepPlannerValueError(
            f"latency model file {path}: expected an object with "
            f'"format": "{LATENCY_FORMAT}" and a, b, c (as calibrate writes)'
        )
    missing = [k for k in ("a", "b", "c") if k not in data]
    if missing:
        raise StepPlannerValueError(f"latency model file {path}: missing {', '.join(missing)}")
    try:  # d, e, f are optional: files written before they existed mean 0
        return LatencyModel(
            name=str(data.get("name", path.stem)), **{k: data.get(k, 0.0) for k in COEFFICIENTS}
        )
    except (TypeError, ValueError) as exc:
        raise StepPlannerValueError(f"latency model file {path}: {exc}") from None


def save_latency_model(
    model: LatencyModel, path: str | pathlib.Path, fit: dict[str, Any] | None = None
) -> None:
    data: dict[str, Any] = {"format": LATENCY_FORMAT, "name": model.name, **model.coefficients()}
    if fit is not None:
        data["fit"] = fit
    pathlib.Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


# --- calibration -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepTimings:
    """One row per measured engine step: ``seconds`` and what the step held (the contract columns;
    a column the file lacks is None). ``tokens`` = sum of query lengths, ``context`` = sum of
    past + query, ``rows`` planned rows, ``decode_rows`` rows decoding one token,
    ``prefill_tokens``/``prefill_context`` the same sums over the chunk rows, ``attention`` = sum
    of query x (past + query)."""

    seconds: np.ndarray
    tokens: np.ndarray
    context: np.ndarray
    rows: np.ndarray | None = None
    decode_rows: np.ndarray | None = None
    prefill_tokens: np.ndarray | None = None
    prefill_context: np.ndarray | None = None
    attention: np.ndarray | None = None
    start: np.ndarray | None = None  # not the contract's: seconds from the first arrival

    def __len__(self) -> int:
        return len(self.seconds)

    def features(self) -> dict[str, np.ndarray | None]:
        """Each coefficient's column (None where the file cannot give it); a product that
        overflows is inf, which the fit refuses by name."""
        with np.errstate(over="ignore"):
            product = self.tokens * self.context
        return {
            "a": np.ones(len(self.seconds)),
            "b": self.tokens,
            "c": self.context,
            "d": product,
            "e": self.attention,
            "f": self.rows,
        }


# The optional terms' columns: a model with the term needs the column in the timings file.
_TERM_COLUMNS = {"e": "attention", "f": "rows"}
# Each coefficient's column, by what it holds (the messages' words).
_FEATURE_NAMES = {
    "a": "1",
    "b": "tokens",
    "c": "context",
    "d": "tokens x context",
    "e": "attention",
    "f": "rows",
}
# The largest value a fitted column may hold: least squares and R² sum squares, which overflow
# float64 (1.8e308) beyond ~1e154; 1e150 leaves room for 1e8 rows. Real counts are below 1e20.
FIT_LIMIT = 1e150
# How close every step must be for a fit of seconds that do not vary to count as exact: the
# fit's own rounding (scaled columns, then the norms divided out) is ~1e-16 relative.
_EXACT = 1e-12

# (column, must hold) pairs checked row by row: a file that breaks one was not written by a
# runtime that counted what it ran.
_CONSISTENT = (
    ("decode_rows", "rows"),
    ("prefill_tokens", "tokens"),
    ("prefill_context", "context"),
    ("tokens", "context"),
    ("tokens", "attention"),
)


def read_step_timings(path: str | pathlib.Path) -> StepTimings:
    """The timings file (CSV, one row per step): ``seconds``, ``tokens`` and ``context`` are
    required, the other contract columns (``STEP_TIMING_COLUMNS``) are read when the header has
    them, any other column is ignored."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StepPlannerValueError(f"timings {path}: cannot be read ({exc})") from None
    where = f"timings {path}"
    names: tuple[str, ...] = TIMING_COLUMNS
    columns: dict[str, list[float]] = {}
    for line, row, header in csv_records(text, where, TIMING_COLUMNS):
        if not columns:
            names = tuple(c for c in (*STEP_TIMING_COLUMNS, *PACE_COLUMNS) if c in header)
            columns = {c: [] for c in names}
        for name in names:
            columns[name].append(_cell(where, line, name, row.get(name)))
        for small, large in _CONSISTENT:
            if small in columns and large in columns and columns[small][-1] > columns[large][-1]:
                raise StepPlannerValueError(
                    f"{where} line {line}: column {small!r}={row.get(small)!r} exceeds column "
                    f"{large!r}={row.get(large)!r}; allowed: {small} <= {large}"
                )
    arrays = {c: np.array(columns.get(c, []), dtype=np.float64) for c in names}
    if not columns:  # a header and no rows: still the columns the header named, empty
        arrays = {c: np.zeros(0) for c in TIMING_COLUMNS}
    return StepTimings(**arrays)


def _cell(where: str, line: int, name: str, raw: Any) -> float:
    raw = (raw or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise StepPlannerValueError(
            f"{where} line {line}: column {name!r}: {raw!r} is not a number"
        ) from None
    low_ok = value > 0 if name == "seconds" else value >= 0
    if not math.isfinite(value) or not low_ok:
        allowed = "> 0" if name == "seconds" else ">= 0"
        raise StepPlannerValueError(
            f"{where} line {line}: column {name!r}: "
            f"{raw!r} is out of range; allowed: a finite number {allowed}"
        )
    return value


def read_timings(path: str | pathlib.Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, context, seconds) from a CSV with at least those columns; one row per step."""
    timings = read_step_timings(path)
    return timings.tokens, timings.context, timings.seconds


@dataclasses.dataclass(frozen=True)
class Fit:
    model: LatencyModel
    rows: int
    r2: float
    worst_relative_error: float
    worst_row: int  # 0-based data row
    terms: str = "abc"  # the coefficients that were fitted (the others are 0)
    median_relative_error: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "r2": self.r2,
            "terms": self.terms,
            "median_relative_error": self.median_relative_error,
            "worst_relative_error": self.worst_relative_error,
            "worst_row": self.worst_row,
        }


def fit_latency(
    tokens: np.ndarray, context: np.ndarray, seconds: np.ndarray, name: str = "calibrated"
) -> Fit:
    """Least-squares ``a, b, c >= 0`` for ``seconds ~ a + b * tokens + c * context``."""
    timings = StepTimings(
        np.asarray(seconds, dtype=np.float64),
        np.asarray(tokens, dtype=np.float64),
        np.asarray(context, dtype=np.float64),
    )
    return fit_step_latency(timings, name, terms="abc")


def fit_step_latency(
    timings: StepTimings, name: str = "calibrated", terms: str | None = None
) -> Fit:
    """Least-squares coefficients ``>= 0`` of the step model (``latency.LatencyModel``) for
    ``timings``, in seconds (not relative: the simulator adds step times up, and a relative fit
    of timings whose noise is all upward spikes comes out 10-30% short in their sum).

    ``terms``: which coefficients to fit, e.g. ``"abc"``; default every one the file's columns
    give (``e`` needs ``attention``, ``f`` needs ``rows``). a, b and c must be told apart by the
    timings; d, e or f that the timings cannot tell apart from the terms before them (e.g.
    ``rows`` equal to ``tokens`` in decode-only timings) are left at 0.
    """
    features = timings.features()
    given = {k: v for k, v in features.items() if v is not None}
    if terms is None:
        wanted = [k for k in COEFFICIENTS if k in given]
    else:
        wanted = [k for k in COEFFICIENTS if k in terms]
        unknown = sorted(set(terms) - set(COEFFICIENTS))
        if unknown or not wanted:
            raise StepPlannerValueError(
                f"terms={terms!r} is not known; allowed: letters of {''.join(COEFFICIENTS)}"
            )
        lacking = [k for k in wanted if k not in given]
        if lacking:
            raise StepPlannerValueError(
                f"terms={terms!r} needs column(s) "
                f"{', '.join(_TERM_COLUMNS[k] for k in lacking)}, which the timings lack"
            )
    y = np.asarray(timings.seconds, dtype=np.float64)
    if len(y) < 3:
        raise StepPlannerValueError(
            f"timings have {len(y)} rows; allowed: at least 3 (three coefficients)"
        )
    _check_magnitude("seconds", y)
    for k in wanted:
        _check_magnitude(f"{_FEATURE_NAMES[k]} (the column of {k})", given[k])
    base = [k for k in wanted if k in "abc"]
    x = np.column_stack([given[k] for k in base] or [np.zeros((len(y), 0))]).astype(np.float64)
    # Ranked on scaled columns, as the optional terms are: unscaled, a column of counts near
    # 1e17 makes the column of ones fall below matrix_rank's tolerance.
    if np.linalg.matrix_rank(_scaled(x)[0]) < len(base):
        raise StepPlannerValueError(
            "timings do not vary tokens and context independently, so a, b and c "
            "cannot be told apart; allowed: steps with different token counts and "
            "different contexts (not proportional to each other)"
        )
    used = list(base)
    for k in wanted:
        if k in "abc":
            continue
        trial = np.column_stack([x, given[k]])
        if np.linalg.matrix_rank(_scaled(trial)[0]) > x.shape[1]:
            x, used = trial, used + [k]
    scaled, norms = _scaled(x)
    coef = nonnegative_least_squares(scaled, y) / norms
    if not np.any(coef > 0):
        raise StepPlannerValueError("no non-negative coefficients fit these timings")
    predicted = x @ coef
    with np.errstate(over="ignore"):
        relative = np.abs(predicted - y) / y
    if not np.all(np.isfinite(relative)):
        row = int(np.flatnonzero(~np.isfinite(relative))[0])
        raise StepPlannerValueError(
            f"timings data row {row + 1}: seconds={float(y[row])!r} is too small to divide by: "
            "the fit's relative error there is not a finite number; allowed: seconds a "
            "measured step takes"
        )
    worst = int(np.argmax(relative))
    values = dict.fromkeys(COEFFICIENTS, 0.0)
    values.update(zip(used, map(float, coef)))
    model = LatencyModel(name=name, **values)
    return Fit(
        model,
        len(y),
        _r2(y, predicted, relative),
        float(relative[worst]),
        worst,
        "".join(used),
        float(np.median(relative)),
    )


def _r2(y: np.ndarray, predicted: np.ndarray, relative: np.ndarray) -> float:
    """R² of the fit (see the module). Seconds that do not vary are tested for that directly:
    their mean is not exact in floats (0.1 x 3 / 3), and its rounding error as a variance
    would turn a perfect fit's rounding into any R² at all."""
    if np.ptp(y) == 0:
        return 1.0 if bool(np.all(relative <= _EXACT)) else 0.0
    residual = float(np.sum((predicted - y) ** 2))
    return 1.0 - residual / float(np.sum((y - y.mean()) ** 2))


def _check_magnitude(name: str, column: np.ndarray) -> None:
    """A value the fit cannot square (or a product that overflowed) is refused by data row."""
    bad = np.flatnonzero(~(column <= FIT_LIMIT))
    if bad.size:
        row = int(bad[0])
        value = float(column[row])
        said = f"is {value:g}" if math.isfinite(value) else "overflows float64"
        raise StepPlannerValueError(
            f"timings data row {row + 1}: {name} {said}; allowed: at most {FIT_LIMIT:g} (the "
            "least-squares fit squares every column)"
        )


def _scaled(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns scaled to unit norm: token x context products reach 1e9 beside a column of ones,
    and rank and least squares are only meaningful on comparable columns."""
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0] = 1.0
    return x / norms, norms


def measured_pace(
    timings: StepTimings, model: LatencyModel, window: float = PACE_WINDOW, where: str = "timings"
) -> EnginePace:
    """The engine's speed over a run against ``model``: per ``window`` seconds (by each step's
    ``start``), the steps' measured seconds over ``model``'s seconds for the same steps. A window
    in which no step started (the engine was idle), or whose steps ``model`` prices at 0 s (no
    ratio exists there), keeps the factor before it (the first busy window's, before any). At
    most ``MAX_PACE_WINDOWS`` windows: a run that needs more needs a longer ``window``.

    Replayed with ``simulate(..., pace=)`` it removes from a simulation's error what the engine's
    changing speed put there (a diagnostic; see :class:`~stepplanner.sim.latency.EnginePace`).
    """
    if timings.start is None:
        raise StepPlannerValueError(
            f"{where}: no 'start' column; allowed: a timings file with "
            "each step's start in seconds from the first arrival (as "
            "serve-trace writes)"
        )
    if len(timings) == 0:
        raise StepPlannerValueError(f"{where}: no steps; allowed: at least one timed step")
    EnginePace(window, (1.0,))  # the window checked before it is used
    modelled = np.zeros(len(timings))
    for coefficient, column in timings.features().items():
        weight = getattr(model, coefficient)
        if not weight:
            continue
        if column is None:
            name = _TERM_COLUMNS[coefficient]
            raise StepPlannerValueError(
                f"{where}: no {name!r} column, and the model has "
                f"{coefficient}={weight!r}; allowed: the column, or a "
                f"model with {coefficient}=0"
            )
        modelled = modelled + weight * column
    last = float(timings.start.max())
    # Counted in floats before any array is sized: start // window overflows int64 (and
    # np.bincount) for a tiny window or a huge start, and a merely small window asks for GBs.
    if not last / window < MAX_PACE_WINDOWS:
        raise StepPlannerValueError(
            f"{where}: steps start up to {last!r} s, more than {MAX_PACE_WINDOWS} windows of "
            f"{window!r} s; allowed: at most {MAX_PACE_WINDOWS} windows (a longer window)"
        )
    slot = (timings.start // window).astype(np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        measured = np.bincount(slot, weights=timings.seconds)
        priced = np.bincount(slot, weights=modelled)
        busy = priced > 0
        if not busy.any():
            raise StepPlannerValueError(
                f"{where}: the model prices every timed step at 0 s, so no window has a ratio "
                "of measured to modelled seconds; allowed: a model that prices some step above "
                "0 s (a > 0, or a term whose column these steps fill)"
            )
        factors = np.zeros(len(priced))
        factors[busy] = measured[busy] / priced[busy]
    bad = np.flatnonzero(busy & ~(np.isfinite(factors) & (factors > 0)))
    if bad.size:
        k = int(bad[0])
        raise StepPlannerValueError(
            f"{where}: window {k} (steps starting from {k * window!r} s) has no factor: its "
            "measured seconds, its modelled seconds or their ratio is out of float64's range; "
            "allowed: steps whose seconds, and the model's, sum to a finite ratio > 0"
        )
    last = float(factors[np.argmax(busy)])  # idle windows keep the factor before them
    for k in range(len(factors)):
        if busy[k]:
            last = float(factors[k])
        factors[k] = last
    return EnginePace(float(window), tuple(factors.tolist()))
