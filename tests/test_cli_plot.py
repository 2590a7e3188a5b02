"""``simulate --plot``: paths checked before the run (``compare --plot``'s too), the timeline
binned in time; every latency axis labelled, whatever its range."""

from __future__ import annotations

import importlib
import pathlib

import numpy as np
import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402
from stepplanner.cli.plot import bin_in_time, fidelity_figure  # noqa: E402

SMALL = [
    "--requests",
    "200",
    "--rate",
    "40",
    "-B",
    "32",
    "--max-input-length",
    "4096",
    "--no-progress",
]


def test_twenty_thousand_steps_become_at_most_the_bins_asked_for() -> None:
    seconds = np.full(20_000, 0.01)
    residents = np.arange(20_000, dtype=np.float64)
    t, mean = bin_in_time(seconds, {"residents": residents}, 400)
    assert len(t) == len(mean["residents"]) == 400
    assert np.all(np.diff(t) > 0) and t[-1] < 200.0
    # Equal step lengths: each bin's mean is the mean of the 50 steps that ended in it.
    assert mean["residents"][0] == pytest.approx(residents[:50].mean(), abs=1.0)
    assert mean["residents"][-1] == pytest.approx(residents[-50:].mean(), abs=1.0)


def test_bins_weigh_each_step_by_its_length() -> None:
    seconds = np.array([1.0, 3.0] * 100)  # a short and a long step, alternately
    values = np.array([0.0, 4.0] * 100)
    _, mean = bin_in_time(seconds, {"v": values}, 10)
    assert mean["v"] == pytest.approx(np.full(10, 3.0))  # (0*1 + 4*3) / 4


def test_few_steps_are_left_as_they_are() -> None:
    t, mean = bin_in_time(np.array([0.5, 0.5]), {"v": np.array([1.0, 2.0])}, 400, start=1.0)
    assert t.tolist() == [1.5, 2.0] and mean["v"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("command", ["simulate", "compare"])
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing-dir/x.png", "directory"),
        ("x.txt", ".txt is not an image format matplotlib writes; allowed:"),
        ("x", "no suffix is not an image format"),
    ],
)
def test_a_bad_plot_path_fails_before_the_run(
    monkeypatch, tmp_path: pathlib.Path, command: str, name: str, message: str
) -> None:
    pytest.importorskip("matplotlib")
    module = importlib.import_module(f"stepplanner.cli.{command}")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the simulation ran before the plot path was checked")

    monkeypatch.setattr(module, "run", must_not_run)
    result = CliRunner().invoke(
        main, [command, *SMALL, "--plot", str(tmp_path / name)], catch_exceptions=False
    )
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_plot_is_written(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    result = CliRunner().invoke(
        main, ["simulate", *SMALL, "--plot", str(path)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def tick_labels(ax, axis=None) -> list:
    """The drawn tick labels of ``axis`` (default: the x axis), major and minor, that have
    text: those of ticks inside the view (matplotlib labels the ticks on either side of it too,
    and does not draw them)."""
    x = ax.xaxis if axis is None else axis
    lo, hi = sorted(ax.get_xlim() if x is ax.xaxis else ax.get_ylim())
    ticks = [
        (loc, tick)
        for locs, get in (
            (x.get_majorticklocs(), x.get_major_ticks),
            (x.get_minorticklocs(), x.get_minor_ticks),
        )
        for loc, tick in zip(locs, get(len(locs)))
    ]
    return [
        tick.label1
        for loc, tick in ticks
        if lo <= loc <= hi and tick.label1.get_visible() and tick.label1.get_text()
    ]


def drawn(fig):
    """``fig`` laid out and drawn by Agg, so tick labels hold their text and extents."""
    FigureCanvasAgg = pytest.importorskip("matplotlib.backends.backend_agg").FigureCanvasAgg
    FigureCanvasAgg(fig).draw()
    return fig


@pytest.mark.parametrize(
    "low_ms, high_ms",
    [
        (12.0, 80.0),  # inside one decade with no power of ten: the TPOT panel had no label
        (7.0, 60.0),  # one power of ten inside: one label only
        (25.0, 28.0),  # a narrow range
        (40.0, 7_000.0),  # two decades and more
        (0.5, 50_000.0),  # five decades
    ],
)
def test_every_fidelity_panel_has_labelled_ticks_that_do_not_overlap(
    low_ms: float, high_ms: float
) -> None:
    pytest.importorskip("matplotlib")
    seconds = np.geomspace(low_ms, high_ms, 60) / 1e3
    series = {m: seconds for m in ("ttft", "tpot", "e2e")}
    simulated = {m: s * 1.05 for m, s in series.items()}
    fig = drawn(fidelity_figure(series, simulated, "title"))
    for ax in fig.axes:
        labels = tick_labels(ax)
        assert len(labels) >= 2, (ax.get_title(), [t.get_text() for t in labels])
        boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), (
            ax.get_title(),
            [t.get_text() for t in labels],
        )


# --- issue 44: the hint names the one package; the sweep plot reads in plain numbers -------------


def test_the_plot_hint_names_the_plot_extras_one_package() -> None:
    import importlib.metadata

    from stepplanner.cli.plot import PLOT_REQUIREMENT

    extra = [
        r.split(";")[0].strip()
        for r in importlib.metadata.requires("stepplanner") or []
        if r.replace(" ", "").endswith('extra=="plot"')
    ]
    assert extra == [PLOT_REQUIREMENT]


def _front_records(goodputs, ttft_ms, tpot_ms):
    return [
        {
            "label": f"c{k}",
            "goodput": g,
            "pareto": k == 0,
            "policy": {"mode": "MIXED", "max_num_tokens": 256 + 64 * k, "max_chunk_tokens": 128},
            "metrics": {"p99_ttft_ms": t, "p99_tpot_ms": p},
        }
        for k, (g, t, p) in enumerate(zip(goodputs, ttft_ms, tpot_ms))
    ]


@pytest.mark.parametrize(
    ("ttft_ms", "tpot_ms"),
    [
        ([218.0, 355.0, 497.0, 696.0, 989.0, 2013.0], [10.9, 12.9, 15.3, 15.7, 16.2, 16.7]),
        ([40.0, 400.0, 4_000.0, 9_000.0, 20_000.0, 40_000.0], [5.0, 9.0, 20.0, 40.0, 60.0, 90.0]),
    ],
)
def test_the_sweep_plot_ticks_in_plain_numbers(ttft_ms, tpot_ms) -> None:
    pytest.importorskip("matplotlib")
    from stepplanner.cli.tuning_render import front_figure
    from stepplanner.tuning.slo import parse_slos

    records = _front_records([26.5, 26.4, 26.3, 24.3, 13.1, 10.9], ttft_ms, tpot_ms)
    fig = drawn(front_figure(records, parse_slos(["ttft_p99=500ms", "tpot_p99=15ms"]), "t"))
    ax = fig.axes[0]
    for axis in (ax.xaxis, ax.yaxis):
        texts = [t.get_text() for t in tick_labels(ax, axis)]
        assert len(texts) >= 2, texts
        assert all(t.replace(",", "").replace(".", "").isdigit() for t in texts), texts


def test_the_sweep_plot_colours_set_close_goodputs_apart() -> None:
    """Two configurations far below the rest used to leave the others one colour: the bands
    follow the goodputs' quantiles, so six goodputs get six colours."""
    pytest.importorskip("matplotlib")
    from stepplanner.cli.tuning_render import front_figure

    goodputs = [26.5, 26.45, 26.4, 26.35, 13.1, 10.9]
    records = _front_records(goodputs, [300.0] * 6, [12.0, 12.5, 13.0, 13.5, 14.0, 14.5])
    fig = drawn(front_figure(records, [], "t"))
    faces = fig.axes[0].collections[0].get_facecolors()
    assert len({tuple(np.round(f, 3)) for f in faces}) == len(goodputs)
