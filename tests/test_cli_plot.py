"""``simulate --plot``: paths checked before the run, the timeline binned in time."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from click.testing import CliRunner  # noqa: E402

from stepplanner.cli import main  # noqa: E402
from stepplanner.cli.plot import bin_in_time  # noqa: E402

SMALL = ["--requests", "200", "--rate", "40", "-B", "32", "--max-input-length", "4096",
         "--no-progress"]


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
    seconds = np.array([1.0, 3.0] * 100)        # a short and a long step, alternately
    values = np.array([0.0, 4.0] * 100)
    _, mean = bin_in_time(seconds, {"v": values}, 10)
    assert mean["v"] == pytest.approx(np.full(10, 3.0))  # (0*1 + 4*3) / 4


def test_few_steps_are_left_as_they_are() -> None:
    t, mean = bin_in_time(np.array([0.5, 0.5]), {"v": np.array([1.0, 2.0])}, 400, start=1.0)
    assert t.tolist() == [1.5, 2.0] and mean["v"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize(("name", "message"), [
    ("missing-dir/x.png", "directory"),
    ("x.txt", ".txt is not an image format matplotlib writes; allowed:"),
    ("x", "no suffix is not an image format"),
])
def test_a_bad_plot_path_fails_before_the_run(monkeypatch, tmp_path: pathlib.Path, name: str,
                                              message: str) -> None:
    pytest.importorskip("matplotlib")
    import stepplanner.cli.simulate as simulate_module

    def must_not_run(*args, **kwargs):
        raise AssertionError("the simulation ran before the plot path was checked")

    monkeypatch.setattr(simulate_module, "run", must_not_run)
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--plot", str(tmp_path / name)],
                                catch_exceptions=False)
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_plot_is_written(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.png"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--plot", str(path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
