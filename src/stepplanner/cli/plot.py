"""``simulate --plot``: the TTFT CDF per priority class and the batch timeline; ``fidelity --plot``:
the real and simulated CDFs (matplotlib)."""

from __future__ import annotations

import importlib
import pathlib

import click
import numpy as np

from ..sim.simulator import SimulationResult
from .errors import InputError
from .files import check_output_path
from .render import class_name

TIMELINE_BINS = 400  # about one per horizontal pixel pair of the 12-inch figure at 110 dpi


def require_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed; install it with: "
            "pip install 'stepplanner[plot]'") from None


def check_plot_path(path: str) -> None:
    """Before the run: the directory exists and is writable, the suffix is a format matplotlib
    writes. A bad path is a one-line error, not a traceback after a long simulation."""
    check_output_path("--plot", path)
    figure = importlib.import_module("matplotlib.figure").Figure()
    formats = sorted(figure.canvas.get_supported_filetypes())
    suffix = pathlib.Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise InputError(f"--plot {path}: {'.' + suffix if suffix else 'no suffix'} is not an "
                         f"image format matplotlib writes; allowed: {', '.join(formats)}")


def bin_in_time(seconds: np.ndarray, series: dict[str, np.ndarray], bins: int,
                start: float = 0.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Each series averaged over ``bins`` equal spans of simulated time, weighted by how long
    each step lasted (a long prefill step counts for its length): (span middles, means).
    Spans no step ended in are left out. Fewer steps than bins come back unchanged."""
    end_time = start + np.cumsum(seconds)
    if seconds.size <= bins:
        return end_time, series
    edges = np.linspace(start, end_time[-1], bins + 1)
    span = np.clip(np.searchsorted(edges, end_time, side="left") - 1, 0, bins - 1)
    weight = np.bincount(span, weights=seconds, minlength=bins)
    kept = weight > 0
    middles = ((edges[:-1] + edges[1:]) / 2)[kept]
    means = {name: np.bincount(span, weights=values * seconds, minlength=bins)[kept]
             / weight[kept] for name, values in series.items()}
    return middles, means


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
    start = float(st["end_time"][0] - st["seconds"][0]) if len(st["seconds"]) else 0.0
    t, mean = bin_in_time(np.asarray(st["seconds"], dtype=np.float64),
                          {k: np.asarray(st[k], dtype=np.float64)
                           for k in ("residents", "waiting", "num_paused")},
                          TIMELINE_BINS, start)
    # Paused underneath as an area, so it never hides the lines it is part of.
    ax_time.fill_between(t, mean["num_paused"], step="mid", alpha=0.35, lw=0, label="paused")
    ax_time.plot(t, mean["residents"], label="residents", lw=1.0, drawstyle="steps-mid")
    ax_time.plot(t, mean["waiting"], label="waiting", lw=1.0, drawstyle="steps-mid")
    span = (t[-1] - start) / len(t) if len(t) else 0.0
    ax_time.set(xlabel="simulated time (s)", ylabel="requests (time-weighted mean)",
                title=f"batch timeline ({len(st['seconds']):,} steps"
                      + (f", {span:.2g} s bins)" if len(t) < len(st["seconds"]) else ")"))
    ax_time.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fidelity(real: dict[str, np.ndarray], simulated: dict[str, np.ndarray], path: str,
                  title: str) -> None:
    """``fidelity --plot``: the real and the simulated CDF of TTFT, TPOT and E2E (per-request
    seconds by metric), one panel each."""
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    ticker = importlib.import_module("matplotlib.ticker")

    names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
    fig, axes = plt.subplots(1, len(names), figsize=(15, 4.5))
    for ax, (metric, name) in zip(axes, names.items()):
        for label, side, style in (("real", real, "-"), ("simulated", simulated, "--")):
            values = np.sort(side[metric])
            if values.size:
                ax.plot(values * 1e3, np.arange(1, values.size + 1) / values.size, style,
                        label=label, drawstyle="steps-post")
        ax.set(xscale="log", xlabel=f"{name} (ms)", ylabel="fraction of requests",
               title=f"{name} CDF")
        # Within one decade the log axis labels its minor ticks too, and they overlap.
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
