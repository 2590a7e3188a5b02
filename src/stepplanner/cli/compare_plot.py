"""``compare --plot``: per configuration the TTFT CDF of each priority class, and the classes'
TTFT p99 side by side, in one figure (drawn with ``plot``'s helpers).

A class has one colour throughout. The CDF panels share one millisecond axis, so a curve further
right in one panel than in another is slower; the bars are the numbers of compare's
``TTFT p99 [class]`` columns, grouped by configuration and written on each bar."""

from __future__ import annotations

import importlib
import math
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..sim.simulator import SimulationResult
from .plot import cdf, latency_axis, new_figure, plain_number, save
from .render import class_name

PANEL = 3.4  # inches: one CDF panel's width, 3 panels to a row at most
PANEL_HEIGHT = 3.0
BARS_BESIDE = 4  # up to this many configurations the bars stand right of the CDFs, else below
MIN_WIDTH = 8.0  # inches: what the legend's one row needs
INCH_PER_CHAR = 0.075  # an 8-point tick label's character: how wide a bar group's name needs
TITLE_CHARS_PER_INCH = 10  # of the 12-point title


def compare_figure(runs: Sequence[tuple[str, SimulationResult]], title: str) -> Any:
    """The figure of ``(configuration name, result)`` pairs, all of one workload."""
    classes = runs[0][1].workload.classes
    colour = {p: f"C{k}" for k, p in enumerate(classes)}
    ttfts = [(name, r.latencies()["ttft"], r.workload.priority) for name, r in runs]
    n = len(runs)
    rows = math.ceil(n / 3)
    cols = math.ceil(n / rows)
    names = [_wrap(name, 20) for name, _ in runs]
    group = max(1.0, INCH_PER_CHAR * max(len(line) for name in names for line in name.splitlines()))
    bars_width = 1.2 + n * group
    beside = n <= BARS_BESIDE
    width = max(MIN_WIDTH, PANEL * cols + bars_width if beside else max(PANEL * cols, bars_width))
    fig = new_figure(
        figsize=(width, 1.2 + PANEL_HEIGHT * (rows if beside else rows + 1)), layout="constrained"
    )
    if beside:
        grid = fig.add_gridspec(rows, cols + 1, width_ratios=[PANEL] * cols + [bars_width])
        bars_cell = grid[:, cols]
    else:
        grid = fig.add_gridspec(rows + 1, cols)
        bars_cell = grid[rows, :]
    every = np.concatenate([ttft[~np.isnan(ttft)] for _, ttft, _ in ttfts]) * 1e3
    for k, (name, ttft, priority) in enumerate(ttfts):
        ax = fig.add_subplot(grid[k // cols, k % cols])
        for p in classes:
            cdf(ax, ttft[priority == p], color=colour[p], label=class_name(str(p)))
        p99_line = ax.axhline(0.99, color="grey", lw=0.8, ls=":", label="p99: the bars' height")
        bottom = k + cols >= n  # nothing below it: it carries the axis label
        latency_axis(ax, every, "TTFT (ms, simulated)" if bottom else "", max_labels=6)
        ax.set(ylim=(0, 1.02), title=_wrap(name, 30))
        ax.grid(alpha=0.25)
        if k % cols == 0:
            ax.set_ylabel("fraction of requests")
        else:
            ax.tick_params(labelleft=False)
    bars = fig.add_subplot(bars_cell)
    _p99_bars(bars, ttfts, classes, colour, names)
    handles, labels = bars.get_legend_handles_labels()
    # Below every panel, where it covers no curve and no bar.
    fig.legend(
        [*handles, p99_line],
        [*labels, p99_line.get_label()],
        loc="outside lower center",
        ncols=len(classes) + 1,
    )
    fig.suptitle(_wrap(title, int(width * TITLE_CHARS_PER_INCH)))
    return fig


def plot_compare(runs: Sequence[tuple[str, SimulationResult]], path: str, title: str) -> None:
    save(compare_figure(runs, title), path)


def _p99_bars(
    ax: Any,
    ttfts: list[tuple[str, np.ndarray, np.ndarray]],
    classes: Any,
    colour: dict[Any, str],
    names: list[str],
) -> None:
    """One group of bars per configuration, one bar per class, each with its number."""
    ticker = importlib.import_module("matplotlib.ticker")
    width = 0.8 / len(classes)
    for j, p in enumerate(classes):
        p99 = np.array([_p99(ttft[priority == p]) for _, ttft, priority in ttfts]) * 1e3
        drawn = ax.bar(
            np.arange(len(ttfts)) - 0.4 + width * (j + 0.5),
            p99,
            width,
            color=colour[p],
            label=class_name(str(p)),
        )
        ax.bar_label(
            drawn, labels=["" if np.isnan(v) else f"{v:,.0f}" for v in p99], fontsize=7, padding=2
        )
    ax.set_xticks(np.arange(len(ttfts)), names, fontsize=8)
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(plain_number))
    ax.set(ylabel="TTFT p99 (ms, simulated)", title="TTFT p99 by class")
    ax.margins(y=0.1)  # room above the tallest bar for its number
    ax.grid(axis="y", alpha=0.25)
    ax.set_axisbelow(True)


def _p99(seconds: np.ndarray) -> float:
    """As the report computes a class's p99 (NaN when no request of it got a first token)."""
    done = seconds[~np.isnan(seconds)]
    return float(np.percentile(done, 99)) if done.size else math.nan


def _wrap(name: str, width: int) -> str:
    """A configuration's name (or the title) in lines of about ``width`` characters, broken
    between its ``key=value`` items (an item is never cut)."""
    return textwrap.fill(name, width, break_long_words=False, break_on_hyphens=False)
