"""The engine flags of ``simulate``, ``compare`` and ``sweep`` beyond the planner's options: a
step-time budget (``--max-step-time``, ``ledger.StepTimeBudget``) and KV-pressure preemption
(``--kv-preemption``, ``sim.preemption``), with the lines and columns they add to the output.
``compare`` also takes them per configuration (``max_step_time=40ms``, ``kv_preemption=vllm``
beside ``num_pages``)."""

from __future__ import annotations

from typing import Any

import click

from ..planner._config_keys import canonical_key
from ..sim.engine import VICTIM_RULES
from ..tuning.slo import _duration
from .errors import InputError
from .options import compose
from .render import Block, Column, Line, with_main_columns

__all__ = [
    "ENGINE_KEYS",
    "engine_options",
    "engine_options_from",
    "max_step_seconds",
    "preemption_lines",
    "take_engine_keys",
    "with_preemption_columns",
]

engine_options = compose(
    click.option(
        "--max-step-time",
        "max_step_time",
        default=None,
        metavar="DURATION",
        help="Step-time budget: cap every step that has decode rows at this predicted time "
        "(e.g. 40ms; a number with ms, s or us) by its token budget, priced by the latency "
        "model on the decode rows' KV depth and the chunks, and refitted online from the "
        "steps' times (MIXED only; docs/scheduling.md, 'Step-time budget'). Default: none.",
    ),
    click.option(
        "--kv-preemption",
        type=click.Choice(VICTIM_RULES),
        default=None,
        help="With --num-pages: take pages as KV grows and, when a step would outgrow the "
        "pool, preempt a resident (its KV dropped, recomputed later): 'vllm' the one vLLM "
        "picks (admitted last; under a priority policy the lowest priority, latest "
        "arrival), 'least-work' the least computed work lost, never a class below "
        "--never-relegate-below while another will do. Default: reserve each request's "
        "worst case at admission (nothing preempted).",
    ),
)

# compare's per-configuration keys for these (num_pages is compare's own).
ENGINE_KEYS = ("max_step_time", "kv_preemption")


def max_step_seconds(text: Any, option: str = "--max-step-time") -> float | None:
    """``"40ms"`` -> 0.04; None for None; anything else an ``InputError`` naming ``option``."""
    if text is None:
        return None
    seconds = _duration(str(text))
    if seconds is None or not seconds > 0:
        raise InputError(
            f"{option}={text!r} is not a step time; allowed: a number > 0 followed by ms, s "
            "or us (e.g. 40ms, 0.04s)"
        )
    return seconds


def engine_options_from(kw: dict[str, Any], num_pages: int) -> dict[str, Any]:
    """Pop ``engine_options``' values: the ``Engine`` fields they set. ``--kv-preemption``
    without a pool is refused (it preempts for pages)."""
    seconds = max_step_seconds(kw.pop("max_step_time"))
    rule = kw.pop("kv_preemption")
    if rule is not None and not num_pages:
        raise InputError(
            f"--kv-preemption {rule} preempts when KV pages run out; give a pool with --num-pages N"
        )
    return {"max_step_seconds": seconds, "kv_preemption": rule}


def take_engine_keys(
    item: dict[str, Any], defaults: dict[str, Any], name: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``compare`` configuration without its ``max_step_time``/``kv_preemption`` keys, and
    the ``Engine`` fields they give it (``defaults``, the flags', where it has none)."""
    rest, fields = {}, dict(defaults)
    for key, value in item.items():
        field = canonical_key(key)
        if field == "max_step_time":
            fields["max_step_seconds"] = max_step_seconds(value, f"config {name!r}: max_step_time")
        elif field == "kv_preemption":
            rule = str(value).strip().lower()
            if rule in ("", "none"):
                fields["kv_preemption"] = None
            elif rule in VICTIM_RULES:
                fields["kv_preemption"] = rule
            else:
                raise InputError(
                    f"config {name!r}: kv_preemption={value!r} is not a victim rule; allowed: "
                    + ", ".join(VICTIM_RULES)
                    + ", none"
                )
        else:
            rest[key] = value
    return rest, fields


def _preemption_text(p: dict[str, Any]) -> str:
    text = (
        f"{p['victim_rule']}: {p['preemptions']:,} preemptions of {p['requests_preempted']:,} "
        f"requests; {p['recomputed_tokens']:,} computed tokens recomputed"
    )
    if p["protected_preemptions"]:
        text += f"; {p['protected_preemptions']:,} of a protected class (no other victim)"
    if p["overcommitted_steps"]:
        text += f"; {p['overcommitted_steps']:,} steps over the pool (no victim at all)"
    return text


def preemption_lines(reports: list[dict[str, Any]], named: bool = False) -> list[Block]:
    """A line per report that preempted for KV pages (``named``: the configuration's name)."""
    return [
        Line("preemption" + (f" [{r['name']}]" if named else ""), _preemption_text(r["preemption"]))
        for r in reports
        if "preemption" in r
    ]


def with_preemption_columns(blocks: list[Block], reports: list[dict[str, Any]]) -> list[Block]:
    """``compare``'s main table with the preemptions and recomputed tokens of each
    configuration (``-`` for one that reserves worst cases), when any preempted."""
    if not any("preemption" in r for r in reports):
        return blocks
    extra = [Column("preempt-\nions", ","), Column("recomputed\ntokens", ",")]

    def values(r: dict[str, Any]) -> list[Any]:
        p = r.get("preemption")
        return [None, None] if p is None else [p["preemptions"], p["recomputed_tokens"]]

    return with_main_columns(blocks, reports, extra, values)
