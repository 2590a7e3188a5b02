"""Turn a saved ``pytest benchmarks --benchmark-json=FILE`` run into the docs' Markdown table.

    python benchmarks/table.py FILE

Figures are medians in ns per plan (every row of the suite is one plan, the C loop's too). Ratios
are taken between medians of the same run.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

NAME = re.compile(
    r"test_(?P<kind>\w+?)\[(?:(?P<scenario>[a-z_]+)-)?B(?P<batch>\d+)(?:-(?P<impl>\w+))?\]"
)


def medians(path: str) -> dict[tuple[str, int], dict[str, float]]:
    """{(scenario, B): {impl: median ns per plan}} from one saved run."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for b in data["benchmarks"]:
        m = NAME.fullmatch(b["name"])
        if m is None:
            continue
        ns = b["stats"]["median"] * 1e9
        kind, scenario = m["kind"], m["scenario"] or "priority_pause"
        impl = m["impl"] if kind == "compiled" else kind
        out[scenario, int(m["batch"])][impl] = ns
    return out


def _cell(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def render(rows: dict[tuple[str, int], dict[str, float]]) -> str:
    lines = [
        "| scenario | B | array | list | C loop | reference | shuffled | array/C | list/C "
        "| ref/array |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (scenario, batch), v in sorted(rows.items()):
        a, li, c, r, s = (v.get(k) for k in ("array", "list", "c_loop", "reference", "shuffled"))
        lines.append(
            f"| {scenario} | {batch} | {_cell(a)} | {_cell(li)} | {_cell(c)} | {_cell(r)} "
            f"| {_cell(s)} | {_cell(a / c, 2) if a and c else '-'} "
            f"| {_cell(li / c, 2) if li and c else '-'} | {_cell(r / a) if a and r else '-'} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(render(medians(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
