"""What the docs state is what the project is: pointers resolve, figures are stated once,
excerpts say they are excerpts, and the docs speak of the project only."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

pytestmark = pytest.mark.skipif(not (ROOT / "docs").is_dir(), reason="runs from a checkout")


def _prose(path: pathlib.Path) -> str:
    """The file without its fenced code blocks."""
    return re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_speak_of_the_project_only(path: pathlib.Path) -> None:
    text = " ".join(_prose(path).split()).lower()
    for phrase in ("this session", "the session", "the issue's", "this issue", "the issue ",
                   "helpers' work", "all helpers", "the helper's"):
        assert phrase not in text, f"{path.name}: {phrase!r}"


def test_spec_points_only_to_files_the_repository_holds() -> None:
    text = (ROOT / "docs" / "SPEC.md").read_text(encoding="utf-8")
    assert "beside this file" not in text
    for path in re.findall(r"`([\w.-]+(?:/[\w.-]+)+\.\w+)`", text):
        assert any((base / path).exists() for base in (ROOT, ROOT / "docs", ROOT / "src")), path


def test_reliability_names_the_seeds_as_they_were_passed() -> None:
    text = " ".join((ROOT / "docs" / "reliability.md").read_text(encoding="utf-8").split())
    assert "20261121 to 202611212" not in text
    assert "-seed=2026112K` for K = 1 to 12" in text


def test_the_simulator_page_states_one_set_of_planner_costs() -> None:
    text = " ".join(_prose(ROOT / "docs" / "simulator.md").split())
    assert not re.search(r"ledger apply \d", text)  # the second, older set
    assert not re.search(r"`apply_to` itself \d", text)
    # The simulator measures the whole host step (ledger.step); its costs have one home.
    assert "`Ledger.apply` mean" not in text
    assert text.count("performance.md#the-whole-host-step") == 1


def test_readme_states_the_measured_time_of_the_main_job() -> None:
    setup = (ROOT / "README.md").read_text(encoding="utf-8").split("## Set up", 1)[1]
    setup = " ".join(setup.split("```", 1)[0].split())
    assert "a few seconds" not in setup
    assert re.search(r"about \d+ s", setup)


def test_readme_excerpts_say_they_are_excerpts() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n\$ (stepplanner[^\n]*)\n.*?```\n+([^\n]*)", text, flags=re.S)
    assert blocks
    for command, after in blocks:
        assert after.startswith("(excerpt:"), command
