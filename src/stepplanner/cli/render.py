"""Every table and text report the commands print (rich), shared so they look alike."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..workloads import DEFAULT_CLASSES


def stdout_console() -> Console:
    """The console reports go to; off a terminal it is 160 columns wide."""
    # Off a terminal rich assumes 80 columns, which folds the comparison table.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:,.1f}"


_CLASS_NAMES = {str(c.priority): f"{c.priority} {c.name}" for c in DEFAULT_CLASSES}


def class_name(key: str) -> str:
    return _CLASS_NAMES.get(key, key)


def print_report(console: Console, r: dict[str, Any]) -> None:
    w, t, s, p, pl = r["workload"], r["throughput"], r["steps"], r["pauses"], r["planner"]
    pol = r["policy"]
    console.print(f"[bold]workload[/] {w['source']}: {w['requests']} requests over "
                  f"{w['duration_s']:.1f} s, mean prompt {w['prompt_tokens_mean']:.0f} / output "
                  f"{w['output_tokens_mean']:.0f} tokens")
    console.print(f"[bold]engine[/] B={r['limits']['max_batch_size']} "
                  f"S_in={r['limits']['max_input_length']} P={r['limits']['kv_page_size']}; "
                  f"[bold]policy[/] {pol['mode']} max_num_tokens={pol['max_num_tokens']} "
                  f"max_chunk_tokens={pol['max_chunk_tokens']} {pol['scheduling_policy']} "
                  f"preemption={pol['preemption']} reserved={pol['priority_reserved_slots']} "
                  f"max_pause_steps={pol['max_pause_steps']}")
    console.print(f"[bold]latency model[/] {r['latency_model']['name']}: a={r['latency_model']['a']:g} s"
                  f" + b={r['latency_model']['b']:g} s/token + c={r['latency_model']['c']:g} s/context")
    req = r["requests"]
    console.print(f"[bold]requests[/] {req['completed']}/{req['submitted']} completed, "
                  f"{req['refused']} refused (prompt > S_in){', run cut by --max-steps' if s['truncated_by_max_steps'] else ''}")
    console.print(f"[bold]throughput[/] {t['requests_per_s']:.2f} req/s, "
                  f"{t['output_tokens_per_s']:,.0f} output tok/s, {t['tokens_per_s']:,.0f} tok/s "
                  f"over {t['simulated_seconds']:.1f} simulated s")
    console.print(f"[bold]steps[/] {s['count']:,}: mean {s['mean_tokens']:.0f} tokens, "
                  f"{s['mean_prefill_rows']:.2f} chunks + {s['mean_decode_rows']:.1f} decodes, "
                  f"{s['mean_residents']:.0f} residents, {s['mean_step_ms']:.2f} ms")
    console.print(f"[bold]pauses[/] {p['paused_resident_steps']:,} paused resident-steps, "
                  f"{p['requests_paused']} requests paused, longest {p['max_consecutive_paused_steps']}"
                  f" steps in a row, {p['released_by_max_pause_steps']:,} releases by max_pause_steps")
    table = Table(title="latency by priority class (ms)", title_justify="left")
    table.add_column("class")
    for col in ("queue p50", "queue p99", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50",
                "TPOT p99", "E2E p50", "E2E p99", "max ITL p99"):
        table.add_column(col, justify="right")
    for key, lat in r["latency_s"].items():
        table.add_row(class_name(key), _ms(lat["queue"]["p50"]), _ms(lat["queue"]["p99"]),
                      _ms(lat["ttft"]["p50"]), _ms(lat["ttft"]["p90"]), _ms(lat["ttft"]["p99"]),
                      _ms(lat["tpot"]["p50"]), _ms(lat["tpot"]["p99"]), _ms(lat["e2e"]["p50"]),
                      _ms(lat["e2e"]["p99"]), _ms(lat["max_itl"]["p99"]))
    console.print(table)
    reasons = ", ".join(f"{k} {v:,}" for k, v in r["reasons"].items() if v)
    console.print(f"[bold]reasons[/] (resident-steps) {reasons}")
    console.print(f"[bold]planner[/] plan() {pl['mean_plan_us']:.2f} us/step mean, "
                  f"p50 {pl['p50_plan_us']:.2f}, p99 {pl['p99_plan_us']:.2f}; ledger apply "
                  f"{pl['mean_apply_us']:.2f} us/step; {s['count']:,} steps in "
                  f"{pl['wall_seconds']:.2f} s = {pl['steps_per_s'] or 0:,.0f} steps/s")


def print_comparison(console: Console, reports: list[dict[str, Any]]) -> None:
    first = reports[0]
    w = first["workload"]
    console.print(f"[bold]workload[/] {w['source']}: {w['requests']} requests; engine "
                  f"B={first['limits']['max_batch_size']} S_in={first['limits']['max_input_length']}"
                  f" P={first['limits']['kv_page_size']}; {first['latency_model']['name']}")
    classes = [k for k in first["latency_s"] if k != "all"]
    table = Table(title_justify="left")
    table.add_column("configuration", max_width=26)
    for col in ("budget/\nchunk", "req/s", "out\ntok/s", "tok/\nstep", "TTFT\np50", "TTFT\np99",
                *(f"TTFT p99\n[{c}]" for c in classes), "TPOT\np99", "max ITL\np99",
                "E2E\np99", "paused\nsteps", "plan\nus"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in reports:
        lat, pol = r["latency_s"], r["policy"]
        table.add_row(
            r["name"], f"{pol['max_num_tokens']}/{pol['max_chunk_tokens']}",
            f"{r['throughput']['requests_per_s']:.2f}",
            f"{r['throughput']['output_tokens_per_s']:,.0f}", f"{r['steps']['mean_tokens']:.0f}",
            _ms(lat["all"]["ttft"]["p50"]), _ms(lat["all"]["ttft"]["p99"]),
            *(_ms(lat[c]["ttft"]["p99"]) if c in lat else "-" for c in classes),
            _ms(lat["all"]["tpot"]["p99"]), _ms(lat["all"]["max_itl"]["p99"]),
            _ms(lat["all"]["e2e"]["p99"]), f"{r['pauses']['paused_resident_steps']:,}",
            f"{r['planner']['mean_plan_us']:.2f}")
    console.print(table)
    console.print("latencies in ms of simulated time; plan us = measured planner microseconds "
                  "per step on this machine")


def print_explanation(console: Console, e: dict[str, Any]) -> None:
    table = Table(title="resolved policy (SPEC §2)", title_justify="left")
    for col in ("field", "value", "rule"):
        table.add_column(col)
    for row in e["policy"]:
        table.add_row(row["field"], str(row["value"]), row["rule"])
    console.print(table)
    table = Table(title="residents", title_justify="left")
    for col in ("#", "request", "prio", "arrival", "prompt", "committed", "ctx done",
                "paused", "reason", "planned"):
        table.add_column(col, justify="right" if col not in ("reason", "planned") else "left")
    for r in e["residents"]:
        reason = (r["reason"] or "-") + (" (released from pause)" if r["released_from_pause"]
                                        else "")
        planned = r["planned"]
        what = "-" if planned is None else (f"{planned['work']} past={planned['past_length']} "
                                            f"q={planned['query_length']}")
        table.add_row(str(r["index"]), str(r["request_id"]), str(r["priority"]),
                      str(r["arrival"]), str(r["prompt_length"]), str(r["committed"]),
                      "yes" if r["context_committed"] else "no",
                      str(r["consecutive_paused_steps"]), reason, what)
    console.print(table)
    p = e["plan"]
    console.print(f"[bold]plan[/] {p['num_prefill']} chunks ({p['prefill_tokens']} tokens) + "
                  f"{p['num_decode']} decodes = {p['total_tokens']} tokens; paused {p['paused']}")


def print_replay(console: Console, result: Any, show: int) -> None:
    if not result.diffs:
        console.print(f"replayed {result.steps} steps: every plan matches the recording")
        return
    console.print(f"[bold red]replayed {result.steps} steps: {len(result.diffs)} differ[/]")
    for diff in result.diffs[:show]:
        console.print(f"[bold]step {diff['step']}[/] (line {diff['line']}):")
        for text in diff["differences"][:12]:
            console.print(f"  {text}", markup=False)
        if len(diff["differences"]) > 12:
            console.print(f"  ... {len(diff['differences']) - 12} more")
