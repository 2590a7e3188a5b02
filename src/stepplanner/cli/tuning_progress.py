"""A progress bar across configurations, on stderr, and what Ctrl-C leaves behind."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class ConfigProgress:
    """``with ConfigProgress(total, enabled) as tick: run_tasks(..., progress=tick)``."""

    def __init__(self, total: int, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.bar = Progress(
            TextColumn(label),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task(label, total=total)

    def __enter__(self) -> ConfigProgress:
        if self.enabled:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.stop()

    def __call__(self, done: int, total: int) -> None:
        self.bar.update(self.task, completed=done)


def report_interrupt(outcome: Any, total: int) -> None:
    if outcome.interrupted:
        click.echo(
            f"interrupted: {len(outcome.finished)} of {total} configurations finished; "
            "showing those",
            err=True,
        )
