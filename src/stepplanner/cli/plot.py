"""``simulate --plot``: the TTFT CDF per priority class and the batch timeline (matplotlib)."""

from __future__ import annotations

import importlib

import click
import numpy as np

from ..simulator import SimulationResult
from .render import class_name


def require_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed; install it with: "
            "pip install 'stepplanner[plot]'") from None


def plot_result(result: SimulationResult, path: str) -> None:
    # Imported by name: matplotlib is optional and has no stubs where it is not installed.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    w = result.workload
    ttft = result.latencies()["ttft"]
    fig, (ax_cdf, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    for p in w.classes:
        values = np.sort(ttft[(w.priority == p) & ~np.isnan(ttft)])
        if values.size:
            ax_cdf.plot(values * 1e3, np.arange(1, values.size + 1) / values.size,
                        label=class_name(str(p)))
    ax_cdf.set(xscale="log", xlabel="TTFT (ms, simulated)", ylabel="fraction of requests",
               title="TTFT CDF by priority class")
    ax_cdf.legend()
    st = result.steps
    ax_time.plot(st["end_time"], st["residents"], label="residents", lw=0.8)
    ax_time.plot(st["end_time"], st["waiting"], label="waiting", lw=0.8)
    ax_time.plot(st["end_time"], st["num_paused"], label="paused", lw=0.8)
    ax_time.set(xlabel="simulated time (s)", ylabel="requests", title="batch timeline")
    ax_time.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
