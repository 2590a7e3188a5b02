"""The shared renderer: a grid that is said to fit is printed with nothing cut."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("click", reason="the CLI needs the 'cli' extra (click, rich)")
from rich.console import Console  # noqa: E402

from stepplanner.cli.render import Column, TableData, grid_width, print_table  # noqa: E402

WORDS = st.text(alphabet="abcdefghij0123456789.,-", min_size=1, max_size=12)
CELLS = st.lists(WORDS, min_size=1, max_size=4).map(" ".join)


@st.composite
def tables(draw: st.DrawFn) -> TableData:
    ncols = draw(st.integers(1, 6))
    columns = [
        Column(
            draw(st.lists(WORDS, min_size=1, max_size=2).map("\n".join)),
            left=draw(st.booleans()),
            wrap=k > 0 and draw(st.booleans()),
        )
        for k in range(ncols)
    ]
    rows = draw(st.lists(st.lists(CELLS, min_size=ncols, max_size=ncols), min_size=1, max_size=4))
    return TableData("", columns, rows)


def _render(table: TableData, width: int) -> str:
    out = io.StringIO()
    print_table(Console(file=out, width=width, highlight=False), table)
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(tables(), st.integers(0, 30))
def test_nothing_is_ever_cut(table: TableData, slack: int) -> None:
    texts = [[str(v) for v in row] for row in table.rows]
    width = max(20, grid_width(table.columns, texts) - 10 + slack)
    out = _render(table, width)
    assert "…" not in out
    fits = grid_width(table.columns, texts) <= width
    for row in texts:
        for column, text in zip(table.columns, row):
            if fits and not column.wrap:  # in the grid, unwrappable cells stay on one line
                assert text in out
            for word in text.split():  # and no word is ever cut, grid or not
                assert word in out
