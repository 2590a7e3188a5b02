"""``simulate --plot``: the TTFT CDF per priority class and the batch timeline; ``fidelity --plot``:
the real and simulated CDFs (matplotlib); and what every figure is drawn with (``compare_plot``
draws from it too): a latency CDF, a millisecond axis that reads at any range, a figure, a file.

Each figure is built by a ``*_figure`` function that returns it (what the tests inspect) and
written by ``save``; the figures are ``matplotlib.figure.Figure`` objects, not pyplot's, so no
global state is touched and nothing needs closing."""

from __future__ import annotations

import importlib
import math
import pathlib
from typing import Any

import click
import numpy as np

from ..sim.simulator import SimulationResult
from .errors import InputError
from .files import check_output_path
from .render import class_name

TIMELINE_BINS = 400  # about one per horizontal pixel pair of the 12-inch figure at 110 dpi


# The one package the ``plot`` extra installs (pyproject.toml; a test holds them equal). The hint
# names it rather than the extra: ``pip install ".[plot]"`` in a checkout rebuilds the core.
PLOT_REQUIREMENT = "matplotlib>=3.7"


def require_matplotlib() -> None:
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed; install it with: "
            f"pip install '{PLOT_REQUIREMENT}'"
        ) from None


def check_plot_path(path: str) -> None:
    """Before the run: the directory exists and is writable, the suffix is a format matplotlib
    writes. A bad path is a one-line error, not a traceback after a long simulation."""
    check_output_path("--plot", path)
    figure = importlib.import_module("matplotlib.figure").Figure()
    formats = sorted(figure.canvas.get_supported_filetypes())
    suffix = pathlib.Path(path).suffix.lower().lstrip(".")
    if suffix not in formats:
        raise InputError(
            f"--plot {path}: {'.' + suffix if suffix else 'no suffix'} is not an "
            f"image format matplotlib writes; allowed: {', '.join(formats)}"
        )


def bin_in_time(
    seconds: np.ndarray, series: dict[str, np.ndarray], bins: int, start: float = 0.0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
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
    means = {
        name: np.bincount(span, weights=values * seconds, minlength=bins)[kept] / weight[kept]
        for name, values in series.items()
    }
    return middles, means


def new_figure(**kw: Any) -> Any:
    """A matplotlib ``Figure`` (imported by name: matplotlib is optional and has no stubs where
    it is not installed)."""
    return importlib.import_module("matplotlib.figure").Figure(**kw)


def save(fig: Any, path: str) -> None:
    fig.savefig(path, dpi=110)


def cdf(ax: Any, seconds: np.ndarray, *args: Any, **kw: Any) -> np.ndarray:
    """The empirical CDF of ``seconds`` (NaN left out) drawn in ms; the sorted ms values back."""
    values = np.sort(seconds[~np.isnan(seconds)]) * 1e3
    if values.size:
        ax.plot(values, np.arange(1, values.size + 1) / values.size, *args, **kw)
    return values


def latency_axis(
    ax: Any, values_ms: np.ndarray, label: str, max_labels: int = 8, which: str = "x"
) -> None:
    """An axis (``which``: ``"x"`` or ``"y"``) of milliseconds that has labelled,
    non-overlapping ticks whatever the range of ``values_ms``: log when they span more than a
    decade, ticked at 1, 2 and 5 times each power of ten (each power alone where that would be
    over ``max_labels`` labels: a panel's width holds about 8 at 110 dpi), the numbers written
    plainly; linear, with matplotlib's own ticks, within a decade. (A log axis within one
    decade may have no major tick at all, and the minor labels matplotlib then adds overlap.)
    The limits come from ``values_ms``, so panels given the same values agree."""
    ticker = importlib.import_module("matplotlib.ticker")
    getattr(ax, f"set_{which}label")(label)
    set_lim, axis = getattr(ax, f"set_{which}lim"), getattr(ax, f"{which}axis")
    shown = values_ms[np.isfinite(values_ms) & (values_ms > 0)]
    if shown.size == 0:
        return
    lo, hi = float(shown.min()), float(shown.max())
    decades = math.log10(hi / lo)
    if decades <= 1.0:
        pad = 0.03 * (hi - lo) or 0.05 * hi
        set_lim(max(0.0, lo - pad), hi + pad)
        return
    getattr(ax, f"set_{which}scale")("log")
    set_lim(lo / 10 ** (0.03 * decades), hi * 10 ** (0.03 * decades))
    subs = (1.0, 2.0, 5.0) if 3 * decades <= max_labels else (1.0,)
    axis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
    axis.set_major_formatter(ticker.FuncFormatter(plain_number))
    axis.set_minor_formatter(ticker.NullFormatter())


def plain_number(value: float, _position: Any = None) -> str:
    """A tick label: 5, 20, 1,000 or 0.5, never 10^3."""
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def result_figure(result: SimulationResult) -> Any:
    """``simulate --plot``: the TTFT CDF per priority class and the batch timeline."""
    w = result.workload
    ttft = result.latencies()["ttft"]
    fig = new_figure(figsize=(12, 4.5), layout="tight")
    ax_cdf, ax_time = fig.subplots(1, 2)
    shown = [cdf(ax_cdf, ttft[w.priority == p], label=class_name(str(p))) for p in w.classes]
    latency_axis(ax_cdf, np.concatenate(shown), "TTFT (ms, simulated)")
    ax_cdf.set(ylabel="fraction of requests", title="TTFT CDF by priority class")
    ax_cdf.legend()
    st = result.steps
    start = float(st["end_time"][0] - st["seconds"][0]) if len(st["seconds"]) else 0.0
    t, mean = bin_in_time(
        np.asarray(st["seconds"], dtype=np.float64),
        {k: np.asarray(st[k], dtype=np.float64) for k in ("residents", "waiting", "num_paused")},
        TIMELINE_BINS,
        start,
    )
    # Paused underneath as an area, so it never hides the lines it is part of.
    ax_time.fill_between(t, mean["num_paused"], step="mid", alpha=0.35, lw=0, label="paused")
    ax_time.plot(t, mean["residents"], label="residents", lw=1.0, drawstyle="steps-mid")
    ax_time.plot(t, mean["waiting"], label="waiting", lw=1.0, drawstyle="steps-mid")
    span = (t[-1] - start) / len(t) if len(t) else 0.0
    ax_time.set(
        xlabel="simulated time (s)",
        ylabel="requests (time-weighted mean)",
        title=f"batch timeline ({len(st['seconds']):,} steps"
        + (f", {span:.2g} s bins)" if len(t) < len(st["seconds"]) else ")"),
    )
    ax_time.legend()
    return fig


def plot_result(result: SimulationResult, path: str) -> None:
    save(result_figure(result), path)


def fidelity_figure(
    real: dict[str, np.ndarray], simulated: dict[str, np.ndarray], title: str
) -> Any:
    """``fidelity --plot``: the real and the simulated CDF of TTFT, TPOT and E2E (per-request
    seconds by metric), one panel each."""
    names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}
    fig = new_figure(figsize=(15, 4.5), layout="tight")
    axes = fig.subplots(1, len(names))
    for ax, (metric, name) in zip(axes, names.items()):
        shown = [
            cdf(ax, side[metric], style, label=label, drawstyle="steps-post")
            for label, side, style in (("real", real, "-"), ("simulated", simulated, "--"))
        ]
        latency_axis(ax, np.concatenate(shown), f"{name} (ms)")
        ax.set(ylabel="fraction of requests", title=f"{name} CDF")
        ax.legend()
    fig.suptitle(title)
    return fig


def plot_fidelity(
    real: dict[str, np.ndarray], simulated: dict[str, np.ndarray], path: str, title: str
) -> None:
    save(fidelity_figure(real, simulated, title), path)
