"""A real run's per-request results, read and matched to the trace that was served.

Two layouts, told apart by a ``"stepplanner"`` object:

* stepplanner's (``"stepplanner": {"format": "stepplanner-results/1", ...}``, written by the
  real-engine harness): vLLM's per-request lists plus ``arrival_times`` (seconds from the run's
  start) and ``priorities``, and the limits and policy the run was made with;
* vLLM's, as ``vllm bench serve --save-result --save-detailed`` writes it (checked against vLLM
  0.33.0's ``vllm/benchmarks/serve.py``): ``input_lens``, ``output_lens``, ``ttfts``, ``itls``
  (seconds), and where present ``latencies`` (E2E; else TTFT + the sum of the gaps, which is how
  vLLM's client measures it), ``errors`` and ``start_times`` (the client's ``perf_counter`` at
  each send).

Every per-request list has one entry per request, in the order the requests were sent (the
optional ones too, when present). Seconds are at most ``MAX_SECONDS`` (1e12, 31,700 years): larger
finite values overflow float64 once summed or turned into milliseconds. A request
failed when its ``errors`` entry is non-empty or its ``output_lens`` is 0 (vLLM writes both for
one); failed requests are left out of every metric and counted.

Matching (``served_workload``): with the trace that was served, the trace gives arrivals, lengths
and priorities, and its rows are the results' rows (a trace file in arrival order, as traces
are; the simulator orders a trace by arrival), so every prompt length, every successful output
length and stepplanner's priorities must agree row for row. Without a trace, stepplanner's own
``arrival_times`` and ``priorities`` are the workload, or for a vLLM file ``start_times`` minus
their minimum with every request in one class; a failed request's output length is unknown, so
it is left out of that workload.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any

import numpy as np

from .._errors import INT32_MAX, INT32_MIN, StepPlannerValueError
from ..planner._policy import ResolvedSchedulingPolicy, StepPlannerLimits
from ..sim.simulator import policy_from_dict
from ..sim.workloads import Workload

__all__ = [
    "MAX_SECONDS",
    "RESULTS_FORMAT",
    "RunResults",
    "objective_lists",
    "read_results",
    "served_workload",
]

RESULTS_FORMAT = "stepplanner-results/1"
VLLM_KEYS = ("input_lens", "output_lens", "ttfts", "itls")
STEPPLANNER_KEYS = (*VLLM_KEYS, "arrival_times", "priorities")
OPTIONAL_KEYS = ("latencies", "errors", "start_times")
# stepplanner's own lists, which a vLLM file may carry too: then they are read and counted alike.
OWN_KEYS = ("arrival_times", "priorities")
MAX_SECONDS = 1e12
NUMBER = f"a finite number of seconds in [0, {MAX_SECONDS:g}]"


@dataclasses.dataclass(frozen=True, eq=False)
class RunResults:
    """One real run, per request (seconds); ``where`` names the file in messages."""

    where: str
    layout: str  # "stepplanner" or "vllm"
    input_lens: np.ndarray
    output_lens: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    itls: tuple[np.ndarray, ...]
    failed: np.ndarray
    num_failed: int  # in the file, including rows a match left out
    arrival: np.ndarray | None  # seconds from the run's first request; None: unknown
    priority: np.ndarray | None  # None: the file has no classes
    duration: float | None  # vLLM's ``duration``: the run's seconds, for throughput
    limits: StepPlannerLimits | None = None
    policy: ResolvedSchedulingPolicy | None = None
    scheduler: str | None = None
    trace: str | None = None

    def __len__(self) -> int:
        return len(self.input_lens)

    def take(self, rows: np.ndarray) -> RunResults:
        """These rows, in this order (``num_failed`` still counts the whole file)."""
        pick = {
            name: getattr(self, name)[rows]
            for name in ("input_lens", "output_lens", "ttft", "e2e", "failed")
        }
        for name in ("arrival", "priority"):
            value = getattr(self, name)
            pick[name] = None if value is None else value[rows]
        return dataclasses.replace(self, itls=tuple(self.itls[i] for i in rows), **pick)


def read_results(path: str | pathlib.Path) -> RunResults:
    """The results file at ``path``, checked; errors name the file, the key and the request."""
    where = f"results {path}"
    data = _load(path, where)
    run = data.get("stepplanner")
    layout = "vllm" if run is None else "stepplanner"
    required = VLLM_KEYS if run is None else STEPPLANNER_KEYS
    missing = [key for key in required if key not in data]
    if missing:
        what = (
            "a vLLM result (vllm bench serve --save-result --save-detailed)"
            if run is None
            else f"a {RESULTS_FORMAT} result"
        )
        raise StepPlannerValueError(
            f"{where}: key(s) {', '.join(map(repr, missing))} missing; {what} has the "
            f"per-request lists {', '.join(required)}"
        )
    keys = [
        *required,
        *(key for key in (*OPTIONAL_KEYS, *OWN_KEYS) if key in data and key not in required),
    ]
    n = _common_length(where, data, keys)
    input_lens = _integers(where, data, "input_lens", 0)
    output_lens = _integers(where, data, "output_lens", 0)
    errors = data.get("errors", [""] * n)
    for i, error in enumerate(errors):
        if error is not None and not isinstance(error, str):
            raise StepPlannerValueError(
                f'{where}: errors[{i}]={error!r} is not text; allowed: "" (success) or the '
                "error message"
            )
    failed = np.array([bool(e and e.strip()) for e in errors], dtype=bool) | (output_lens == 0)
    if failed.all():
        raise StepPlannerValueError(
            f"{where}: all {n} requests failed (errors or output_lens 0); allowed: a run with "
            "at least one successful request"
        )
    empty = np.flatnonzero(~failed & (input_lens == 0))
    if empty.size:
        raise StepPlannerValueError(
            f"{where}: input_lens[{int(empty[0])}]=0 for a successful request; allowed: a "
            "prompt of >= 1 token"
        )
    ttft = _seconds(where, data, "ttfts", failed)
    itls = _gaps(where, data["itls"], failed)
    if "latencies" in data:
        e2e = _seconds(where, data, "latencies", failed)
        short = np.flatnonzero(~failed & (e2e < ttft))
        if short.size:
            i = int(short[0])
            raise StepPlannerValueError(
                f"{where}: latencies[{i}]={float(e2e[i])!r} is below "
                f"ttfts[{i}]={float(ttft[i])!r}; allowed: E2E latency >= TTFT (the last token "
                "comes no earlier than the first)"
            )
    else:
        e2e = ttft + np.array([float(g.sum()) for g in itls])
    arrival = None
    if "arrival_times" in data:
        arrival = _seconds(where, data, "arrival_times", np.zeros(n, dtype=bool))
    elif "start_times" in data:
        starts = _numbers(
            where,
            data,
            "start_times",
            np.zeros(n, dtype=bool),
            f"a finite number in [{-MAX_SECONDS:g}, {MAX_SECONDS:g}]",
            -MAX_SECONDS,
        )
        arrival = starts - starts.min()
    priority = _integers(where, data, "priorities", INT32_MIN) if "priorities" in data else None
    limits, policy, scheduler, trace = _run_info(where, run) if run is not None else (None,) * 4
    return RunResults(
        where=where,
        layout=layout,
        input_lens=input_lens,
        output_lens=output_lens,
        ttft=ttft,
        e2e=e2e,
        itls=itls,
        failed=failed,
        num_failed=int(failed.sum()),
        arrival=arrival,
        priority=priority,
        duration=_duration(where, data),
        limits=limits,
        policy=policy,
        scheduler=scheduler,
        trace=trace,
    )


def served_workload(
    results: RunResults, trace: Workload | None = None, trace_name: str | None = None
) -> tuple[Workload, RunResults]:
    """The workload the run served and the results row for row with it (see the module)."""
    if trace is not None:
        return trace, _matched(results, trace, trace_name or trace.source)
    if results.arrival is None:
        raise StepPlannerValueError(
            f"{results.where}: has no start_times (vLLM writes them with --save-detailed), so "
            "the requests' arrivals are unknown; allowed: give the trace that was served "
            "(--trace)"
        )
    ok = np.flatnonzero(~results.failed)
    rows = ok[np.argsort(results.arrival[ok], kind="stable")]
    own = results.take(rows)
    assert own.arrival is not None  # take() keeps the arrivals checked above
    priority = own.priority if own.priority is not None else np.zeros(len(own), dtype=np.int64)
    dropped = f", {results.num_failed} failed requests left out" if results.num_failed else ""
    workload = Workload(
        own.arrival,
        own.input_lens,
        own.output_lens,
        priority,
        source=f"{results.where} ({results.layout} layout{dropped})",
    )
    return workload, dataclasses.replace(own, priority=workload.priority.astype(np.int64))


def _matched(results: RunResults, trace: Workload, name: str) -> RunResults:
    if len(trace) != len(results):
        raise StepPlannerValueError(
            f"{results.where}: {len(results)} requests, but trace {name} has {len(trace)}; "
            "allowed: the results of a run of this trace, one entry per trace row"
        )
    ok = ~results.failed
    # Rows of failed requests are not compared: vLLM leaves a failure's lengths at 0.
    checks = [
        ("input_lens", results.input_lens, "prompt_tokens", trace.prompt_tokens, ok, ""),
        (
            "output_lens",
            results.output_lens,
            "output_tokens",
            trace.output_tokens,
            ok,
            " (a request that stopped early, at an end-of-sequence token, was not served "
            "with the trace's output length: vllm bench serve takes --ignore-eos)",
        ),
    ]
    if results.priority is not None:
        checks.append(
            (
                "priorities",
                results.priority,
                "priority",
                trace.priority,
                np.ones(len(trace), dtype=bool),
                "",
            )
        )
    for key, got, column, want, rows, hint in checks:
        bad = np.flatnonzero(rows & (got != want))
        if bad.size:
            i = int(bad[0])
            raise StepPlannerValueError(
                f"{results.where}: request {i} has {key}={int(got[i])}, but trace {name} row "
                f"{i} (by arrival) has {column}={int(want[i])} ({bad.size} row(s) differ); "
                f"allowed: the results of a run of this trace, row for row{hint}"
            )
    arrival = results.arrival if results.arrival is not None else trace.arrival_time
    return dataclasses.replace(results, priority=trace.priority.astype(np.int64), arrival=arrival)


def objective_lists(workload: Workload) -> dict[str, list[float | None]]:
    """Each request's objectives as a results file lists them (``ttft_slos``, ``tpot_slos``:
    seconds, null where none; its own, else its class's), in the workload's order."""
    ttft, tpot = workload.objectives()
    return {
        key: [None if math.isnan(v) else v for v in values.tolist()]
        for key, values in (("ttft_slos", ttft), ("tpot_slos", tpot))
    }


# --- reading -----------------------------------------------------------------------------------


def _load(path: str | pathlib.Path, where: str) -> dict[str, Any]:
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StepPlannerValueError(f"{where}: cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StepPlannerValueError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise StepPlannerValueError(f"{where}: not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise StepPlannerValueError(
            f"{where}: expected a JSON object (the layout of vllm bench serve --save-result), "
            f"got {type(data).__name__}"
        )
    return data


def _common_length(where: str, data: dict[str, Any], keys: list[str]) -> int:
    for key in keys:
        if not isinstance(data[key], list):
            raise StepPlannerValueError(
                f"{where}: {key} is {type(data[key]).__name__}; allowed: a list with one entry "
                "per request"
            )
    lengths = {key: len(data[key]) for key in keys}
    if len(set(lengths.values())) != 1:
        told = ", ".join(f"{key} {n}" for key, n in lengths.items())
        raise StepPlannerValueError(
            f"{where}: the per-request lists differ in length ({told}); allowed: one entry per "
            "request in each"
        )
    n = lengths[keys[0]]
    if n == 0:
        raise StepPlannerValueError(f"{where}: no requests; allowed: at least one")
    return n


def _integers(where: str, data: dict[str, Any], key: str, low: int) -> np.ndarray:
    values = data[key]
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= INT32_MAX:
            raise StepPlannerValueError(
                f"{where}: {key}[{i}]={v!r} is out of range; allowed: an integer in "
                f"[{low}, {INT32_MAX}]"
            )
    return np.array(values, dtype=np.int64)


def _numbers(
    where: str, data: dict[str, Any], key: str, skip: np.ndarray, allowed: str, low: float
) -> np.ndarray:
    """``data[key]`` as floats; entries of ``skip`` rows (failed requests) may be anything a
    failure leaves (vLLM writes 0.0) and read as NaN."""
    out = np.full(len(skip), np.nan)
    for i, v in enumerate(data[key]):
        if skip[i]:
            continue
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or not low <= v <= MAX_SECONDS
        ):
            raise StepPlannerValueError(
                f"{where}: {key}[{i}]={v!r} is out of range; allowed: {allowed}"
            )
        out[i] = v
    return out


def _seconds(where: str, data: dict[str, Any], key: str, skip: np.ndarray) -> np.ndarray:
    return _numbers(where, data, key, skip, NUMBER, 0.0)


def _gaps(where: str, itls: list[Any], failed: np.ndarray) -> tuple[np.ndarray, ...]:
    out = []
    empty = np.zeros(0)
    for i, gaps in enumerate(itls):
        if failed[i]:
            out.append(empty)
            continue
        if not isinstance(gaps, list):
            raise StepPlannerValueError(
                f"{where}: itls[{i}] is {type(gaps).__name__}; allowed: a list of {NUMBER}"
            )
        try:
            values = np.array(gaps, dtype=np.float64)
        except (TypeError, ValueError):
            values = np.full(1, np.nan)
        if values.ndim != 1 or not np.all((values >= 0) & (values <= MAX_SECONDS)):
            bad = next(
                (
                    v
                    for v in gaps
                    if isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not 0 <= v <= MAX_SECONDS
                ),
                gaps,
            )
            raise StepPlannerValueError(
                f"{where}: itls[{i}] holds {bad!r}; allowed: a list of {NUMBER}"
            )
        out.append(values)
    return tuple(out)


def _duration(where: str, data: dict[str, Any]) -> float | None:
    value = data.get("duration")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0 < value <= MAX_SECONDS)
    ):
        raise StepPlannerValueError(
            f"{where}: duration={value!r} is out of range; allowed: a finite number of seconds "
            f"in (0, {MAX_SECONDS:g}]"
        )
    return float(value)


def _run_info(
    where: str, run: Any
) -> tuple[StepPlannerLimits | None, ResolvedSchedulingPolicy | None, str | None, str | None]:
    """The limits, policy, scheduler and trace path of stepplanner's ``"stepplanner"`` object."""
    if not isinstance(run, dict):
        raise StepPlannerValueError(
            f"{where}: stepplanner is {type(run).__name__}; allowed: an object "
            f'{{"format": "{RESULTS_FORMAT}", ...}}'
        )
    if run.get("format") != RESULTS_FORMAT:
        raise StepPlannerValueError(
            f"{where}: stepplanner.format={run.get('format')!r} is not known; allowed: "
            f"{RESULTS_FORMAT}"
        )
    limits = policy = None
    if run.get("limits") is not None:
        try:
            limits = StepPlannerLimits(**run["limits"])
        except (TypeError, ValueError, OverflowError) as exc:
            raise StepPlannerValueError(
                f"{where}: stepplanner.limits is not valid ({exc}); allowed: an object with "
                "max_batch_size, max_input_length, kv_page_size and max_step_tokens"
            ) from None
    if run.get("options") is not None:
        try:
            policy = policy_from_dict(run["options"])
        except (TypeError, ValueError, OverflowError) as exc:
            raise StepPlannerValueError(
                f"{where}: stepplanner.options is not valid ({exc}); allowed: null or a policy "
                "object as policy_to_dict writes it"
            ) from None
    text = {}
    for key in ("scheduler", "trace"):
        value = run.get(key)
        if value is not None and not isinstance(value, str):
            raise StepPlannerValueError(
                f"{where}: stepplanner.{key}={value!r} is not text; allowed: a string or null"
            )
        text[key] = value
    return limits, policy, text["scheduler"], text["trace"]
