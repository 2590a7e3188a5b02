"""``compare --plot``: the image written in the format its suffix names, the figure's panels,
lines and bars per configuration and class (inspected on the figure object, not in pixels), and
inputs it would overwrite refused (test_cli_plot: the other bad paths)."""

from __future__ import annotations

import json
import pathlib
import struct
import sys

import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402
from stepplanner.cli.render import class_name  # noqa: E402

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
TWO = [
    "--config",
    "name=fcfs,policy=fcfs",
    "--config",
    "name=priority+pause,policy=priority,preemption=pause",
]
CLASSES = [class_name(c) for c in ("-1", "0", "1")]


def compare(*args: str):
    return CliRunner().invoke(main, ["compare", *SMALL, *args], catch_exceptions=False)


@pytest.fixture()
def figures(monkeypatch) -> list:
    """The figures compare --plot draws, kept (and still written) as the command saves them."""
    pytest.importorskip("matplotlib")
    import stepplanner.cli.compare_plot as compare_plot

    kept: list = []
    save = compare_plot.save

    def keep(fig, path: str) -> None:
        kept.append(fig)
        save(fig, path)

    monkeypatch.setattr(compare_plot, "save", keep)
    return kept


def test_the_png_is_written_and_sized_for_reading(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "compare.png"
    result = compare(*TWO, "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert f"plot written to {path}" in result.stderr
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 800 <= width <= 2400 and 400 <= height <= 1400, (width, height)
    assert 20_000 < len(data) < 2_000_000


@pytest.mark.parametrize(("suffix", "magic"), [(".svg", b"<svg"), (".pdf", b"%PDF")])
def test_the_suffix_names_the_format(tmp_path: pathlib.Path, suffix: str, magic: bytes) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / f"compare{suffix}"
    result = compare("--config", "policy=fcfs", "--plot", str(path))
    assert result.exit_code == 0, result.output
    assert magic in path.read_bytes()[:400]


def test_one_cdf_panel_per_configuration_and_a_bar_per_class(
    tmp_path: pathlib.Path, figures: list
) -> None:
    result = compare(*TWO, "--json", "--plot", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    reports = json.loads(result.stdout)
    (fig,) = figures
    *panels, bars = fig.axes
    assert [ax.get_title() for ax in panels] == ["fcfs", "priority+pause"]
    for ax in panels:
        curves = [line.get_label() for line in ax.get_lines()][:-1]
        assert curves == CLASSES  # one CDF per class, then the p99 level
        assert ax.get_lines()[-1].get_ydata()[0] == 0.99
        assert ax.get_xlabel() == "TTFT (ms, simulated)"
    assert bars.get_ylabel() == "TTFT p99 (ms, simulated)"
    assert [t.get_text() for t in bars.get_xticklabels()] == ["fcfs", "priority+pause"]
    # Grouped by configuration: one container of bars per class, one bar per configuration,
    # each the p99 compare's table reports for that class.
    assert [c.get_label() for c in bars.containers] == CLASSES
    for container, key in zip(bars.containers, ("-1", "0", "1")):
        heights = [patch.get_height() for patch in container]
        assert heights == pytest.approx([r["latency_s"][key]["ttft"]["p99"] * 1e3 for r in reports])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [*CLASSES, "p99: the bars' height"]


def test_many_configurations_put_the_bars_below_the_cdfs(
    tmp_path: pathlib.Path, figures: list
) -> None:
    configs = [
        a
        for budget in (320, 512, 768, 1024, 2048)
        for a in ("--config", f"policy=priority,max_num_tokens={budget}")
    ]
    result = compare(*configs, "--plot", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    (fig,) = figures
    *panels, bars = fig.axes
    assert len(panels) == 5 and len(bars.patches) == 5 * 3
    assert bars.get_position().y1 < min(ax.get_position().y0 for ax in panels)
    # The panels share one x range, so curves compare across them.
    assert len({ax.get_xlim() for ax in panels}) == 1


def test_the_plot_may_not_overwrite_an_input(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    configs = tmp_path / "configs.png"  # an image suffix: only this check stops it
    configs.write_text(json.dumps([{"policy": "fcfs"}]))
    result = compare("--config-file", str(configs), "--plot", str(configs))
    assert result.exit_code == 2
    assert f"--plot {configs}: is an input of this command" in result.output
    assert json.loads(configs.read_text()) == [{"policy": "fcfs"}]


def test_without_matplotlib_it_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = compare("--plot", "out.png")
    assert result.exit_code == 1  # as simulate --plot: the installation
    assert result.output == (
        "Error: --plot needs matplotlib, which is not installed; install it with: "
        "pip install 'matplotlib>=3.7'\n"
    )
    assert len(result.output.strip().splitlines()) == 1
