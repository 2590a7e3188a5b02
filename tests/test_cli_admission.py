"""Issue 43 item 5: the admission order as options of `simulate`, `compare` and `sweep`:
`--admission arrival|uncached-first` with one starvation bound (`--starvation-steps N` or
`--starvation-seconds S`). Bad values are refused in one line, exit 2, with the ledger's own
message; the run's report names the order it admitted in."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner import AdmissionOrder  # noqa: E402
from stepplanner.cli import main  # noqa: E402
from stepplanner.sim.engine import ServingQueue  # noqa: E402

BOUND = "allowed: starvation_steps=N (0..2147483647) or starvation_seconds=S (a finite number >= 0)"


def _invoke(*args: str):
    return CliRunner(env={"COLUMNS": "160"}).invoke(
        main, list(args), prog_name="stepplanner", catch_exceptions=False
    )


def _refused(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {message}\n"


@pytest.mark.parametrize("command", ["simulate", "compare", "sweep"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--admission", "uncached-first"],
            "admission=AdmissionOrder.UNCACHED_FIRST needs exactly one starvation bound, got "
            f"neither; {BOUND}",
        ),
        (
            ["--admission", "uncached-first", "--starvation-steps", "4"]
            + ["--starvation-seconds", "1"],
            "admission=AdmissionOrder.UNCACHED_FIRST needs exactly one starvation bound, got "
            f"starvation_steps and starvation_seconds; {BOUND}",
        ),
        (
            ["--starvation-steps", "4"],
            "starvation_steps is given but admission is AdmissionOrder.ARRIVAL, which has no "
            "starvation bound; allowed: None, or admission=AdmissionOrder.UNCACHED_FIRST",
        ),
        (
            ["--admission", "shortest"],
            "admission='shortest' is not a AdmissionOrder; allowed: arrival, uncached_first "
            "(any case) or 0..1",
        ),
        (
            ["--admission", "uncached-first", "--starvation-steps", "-1"],
            "starvation_steps=-1 is out of range; allowed: 0..2147483647",
        ),
        (
            ["--admission", "uncached-first", "--starvation-steps", "2147483648"],
            "starvation_steps=2147483648 is out of range; allowed: 0..2147483647",
        ),
        (
            ["--admission", "uncached-first", "--starvation-seconds", "nan"],
            "starvation_seconds=nan is out of range; allowed: a finite number >= 0",
        ),
        (
            ["--admission", "uncached-first", "--starvation-seconds", "-0.5"],
            "starvation_seconds=-0.5 is out of range; allowed: a finite number >= 0",
        ),
    ],
)
def test_bad_admission_options_are_one_line(command: str, args: list[str], message: str) -> None:
    _refused(_invoke(command, "--requests", "20", *args), message)


def _report(*args: str) -> dict:
    result = _invoke("simulate", "--requests", "400", "--rate", "40", "--json", *args)
    assert result.exit_code == 0, result.output
    report: dict = json.loads(result.output)
    return report


def test_the_report_names_the_order_and_its_bound() -> None:
    queue = _report("--admission", "Uncached-First", "--starvation-seconds", "0.5")["queue"]
    assert queue["admission"] == "uncached_first"
    assert queue["starvation_seconds"] == 0.5 and queue["starvation_steps"] is None
    assert _report()["queue"]["admission"] == "arrival"


def test_a_bound_of_zero_steps_admits_in_arrival_order() -> None:
    """starvation_steps=0: every request starves at its first pass, so the run is arrival
    order's, token for token (its latencies equal)."""
    arrival = _report()["latency_s"]
    zero = _report("--admission", "uncached-first", "--starvation-steps", "0")["latency_s"]
    assert zero == arrival


def test_uncached_first_changes_who_is_admitted_first() -> None:
    """Without prefix hits the work is the prompt: shortest first lowers the median TTFT at
    this load, and the bound keeps the longest wait finite."""
    arrival = _report()
    shortest = _report("--admission", "uncached-first", "--starvation-steps", "1000")
    a, s = arrival["latency_s"]["all"]["ttft"], shortest["latency_s"]["all"]["ttft"]
    assert s["p50"] < a["p50"]
    assert shortest["queue"]["longest_wait_s"] is not None


def test_serving_queue_checks_the_order_as_the_ledger_does() -> None:
    with pytest.raises(ValueError, match="needs exactly one starvation bound, got neither"):
        ServingQueue(admission=AdmissionOrder.UNCACHED_FIRST)
    queue = ServingQueue(admission=1, starvation_steps=3)  # type: ignore[arg-type]
    assert queue.admission is AdmissionOrder.UNCACHED_FIRST
    assert queue.ledger_options(10)["starvation_steps"] == 3


def test_sweep_runs_every_point_in_the_order() -> None:
    """sweep's points admit in the order given, as simulate's run does: the same TTFTs as
    simulate at the FCFS point, and a lower mean TTFT than arrival order's at each point."""

    def sweep_ttft(*args: str) -> dict[str, tuple[float, float]]:
        result = _invoke(
            "sweep",
            "--requests",
            "400",
            "--rate",
            "40",
            "--grid",
            "policy=fcfs,priority",
            "--json",
            *args,
        )
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)["results"]
        return {
            r["label"]: (r["metrics"]["mean_ttft_ms"], r["metrics"]["median_ttft_ms"]) for r in rows
        }

    arrival = sweep_ttft()
    shortest = sweep_ttft("--admission", "uncached-first", "--starvation-steps", "1000")
    assert set(shortest) == {"scheduling_policy=fcfs", "scheduling_policy=priority"}
    assert all(shortest[k][0] < arrival[k][0] for k in arrival)
    alone = _report("--admission", "uncached-first", "--starvation-steps", "1000")
    p50 = alone["latency_s"]["all"]["ttft"]["p50"] * 1000
    assert shortest["scheduling_policy=fcfs"][1] == pytest.approx(p50, rel=1e-9)


@pytest.mark.parametrize("command", ["simulate", "compare", "sweep"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--peer-order", "sglang-hrrn", "--admission", "uncached-first"]
            + ["--starvation-steps", "3"],
            "peer_order='sglang-hrrn' with admission=UNCACHED_FIRST: the peer orders the queue, "
            "the ledger admits what it is given in arrival order; allowed: one of the two",
        ),
        (
            ["--peer-order", "vllm-cache-window", "--cache-window", "0"],
            "cache_window=0 is out of range; allowed: 1..2147483647 (vLLM's window of 0 is "
            "arrival order: peer_order=None)",
        ),
    ],
)
def test_bad_peer_orders_are_one_line(command: str, args: list[str], message: str) -> None:
    _refused(_invoke(command, "--requests", "20", *args), message)


def test_a_peer_order_needs_fcfs_and_says_so_in_one_line() -> None:
    _refused(
        _invoke(
            "simulate", "--requests", "20", "--peer-order", "sglang-hrrn", "--policy", "priority"
        ),
        "queue.peer_order='sglang-hrrn' orders a FCFS queue (vLLM's window and SGLang's HRRN "
        "have no priority classes); the policy is PRIORITY; allowed: FCFS",
    )


def test_the_peers_orders_run_and_the_report_names_them() -> None:
    """On 32 slots, without prefix hits: vLLM's window is arrival order (every hit 0), token for
    token, and HRRN (waited prompt tokens over the prompt) lowers the median TTFT as
    shortest-first does, at the price of a longer longest wait (it has no bound)."""

    def report(*args: str) -> dict:
        return _report("-B", "32", *args)

    arrival = report()
    window = report("--peer-order", "vllm-cache-window", "--cache-window", "16")
    hrrn = report("--peer-order", "sglang-hrrn")
    assert window["queue"]["peer_order"] == "vllm-cache-window"
    assert window["queue"]["cache_window"] == 16
    assert window["latency_s"] == arrival["latency_s"]
    assert hrrn["queue"]["peer_order"] == "sglang-hrrn"
    assert hrrn["latency_s"]["all"]["ttft"]["p50"] < arrival["latency_s"]["all"]["ttft"]["p50"]
    assert hrrn["queue"]["longest_wait_s"] > arrival["queue"]["longest_wait_s"]
