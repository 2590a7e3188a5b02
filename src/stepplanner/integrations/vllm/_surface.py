"""What the adapter knows of vLLM's scheduler, per release, and what an installed vLLM has.

vLLM's scheduler interface is private and moves every release (one every two weeks), so the
adapter records, for each minor release it supports, the surface it was written against: the
fields of the dataclasses it builds or reads (``SchedulerOutput``, ``CachedRequestData``,
``NewRequestData``, ``GrammarOutput``, ``ModelRunnerOutput``), the signature of every method of
``Scheduler`` and ``AsyncScheduler`` and of the ``KVCacheManager`` methods it calls, and the
attributes a ``Scheduler`` sets up in ``__init__``. ``surface/<minor>.json`` beside this file is
that record; ``read()`` reads the same from the installed vLLM, and ``differences()`` names each
thing one has and the other lacks. tests/integrations/test_vllm_surface.py fails by name on any
difference, and on an attribute the adapter reads that the installed ``Scheduler`` lacks, so a new
release is brought in by reading each name it prints (docs/development.md, "A new vLLM release"):

    python -m stepplanner.integrations.vllm._surface --write   # the installed vLLM's record
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from ._compat import minor

HERE = Path(__file__).parent
RECORDS = HERE / "surface"

# The dataclasses the adapter constructs (SchedulerOutput and the request data in it) or reads
# (ModelRunnerOutput, GrammarOutput): a new field may be one it must fill.
DATACLASSES = {
    "SchedulerOutput": "vllm.v1.core.sched.output",
    "CachedRequestData": "vllm.v1.core.sched.output",
    "NewRequestData": "vllm.v1.core.sched.output",
    "GrammarOutput": "vllm.v1.core.sched.output",
    "ModelRunnerOutput": "vllm.v1.outputs",
}
# Classes whose every method's signature is recorded: the adapter subclasses the schedulers and
# calls into the KV cache manager.
CLASSES = {
    "Scheduler": "vllm.v1.core.sched.scheduler",
    "AsyncScheduler": "vllm.v1.core.sched.async_scheduler",
    "KVCacheManager": "vllm.v1.core.kv_cache_manager",
}


def _import(module: str, name: str) -> Any:
    return getattr(__import__(module, fromlist=[name]), name)


def _signature(function: Any) -> str:
    try:
        text = str(inspect.signature(function))
    except (TypeError, ValueError):  # a builtin without one
        return "(?)"
    return re.sub(r" at 0x[0-9a-f]+", "", text)  # a default object's address changes every run


def _methods(cls: type) -> dict[str, str]:
    """The signature of each method ``cls`` itself defines (inherited ones are their own
    class's), properties marked as such."""
    out = {}
    for name, value in vars(cls).items():
        if isinstance(value, property):
            out[name] = "property"
        elif isinstance(value, (staticmethod, classmethod)):
            out[name] = _signature(value.__func__)
        elif inspect.isfunction(value):
            out[name] = _signature(value)
    return dict(sorted(out.items()))


def scheduler_attributes() -> list[str]:
    """The attributes a default ``Scheduler`` (CPU, prefix caching on) sets in ``__init__``."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from ..vllm_cpu import make_scheduler, write_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        scheduler = make_scheduler(
            Scheduler,
            write_model_dir(tmp),
            max_num_seqs=8,
            max_num_batched_tokens=256,
            num_blocks=64,
            enable_prefix_caching=True,
        )
    return sorted(vars(scheduler))


def read() -> dict[str, Any]:
    """The installed vLLM's surface, in the records' form."""
    import vllm

    fields = {}
    for name, module in DATACLASSES.items():
        cls = _import(module, name)
        fields[name] = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    methods = {name: _methods(_import(module, name)) for name, module in CLASSES.items()}
    return {
        "vllm": vllm.__version__.split("+")[0],
        "dataclasses": fields,
        "methods": methods,
        "scheduler_attributes": scheduler_attributes(),
    }


def record(version: str) -> dict[str, Any] | None:
    """The surface recorded for ``version``'s minor release, or None if there is none."""
    path = RECORDS / f"{minor(version)}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def differences(known: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """Each difference between a record and an installed vLLM's surface, named."""
    out = []
    for section in ("dataclasses", "methods"):
        for cls in sorted(set(known[section]) | set(found[section])):
            a, b = known[section].get(cls, {}), found[section].get(cls, {})
            what = "field" if section == "dataclasses" else "method"
            for name in sorted(set(a) | set(b)):
                if name not in a:
                    out.append(f"{cls}.{name}: a {what} the adapter does not know ({b[name]})")
                elif name not in b:
                    out.append(f"{cls}.{name}: the adapter knows this {what}; vLLM has none")
                elif a[name] != b[name]:
                    out.append(f"{cls}.{name}: {a[name]} known, {b[name]} found")
    a, b = set(known["scheduler_attributes"]), set(found["scheduler_attributes"])
    out += [f"Scheduler().{n}: an attribute the adapter does not know" for n in sorted(b - a)]
    out += [
        f"Scheduler().{n}: the adapter knows this attribute; vLLM has none" for n in sorted(a - b)
    ]
    return out


def adapter_reads() -> dict[str, set[str]]:
    """The names the adapter reads off the scheduler it extends (``self.X``, or ``scheduler.X``
    in its helper modules) and never sets itself: each must exist on vLLM's ``Scheduler``.
    Read from the adapter's source, so no list can fall behind it. The version layer
    (``_compat``) is left out: what it reads differs by release by design, each read behind a
    ``Release`` field that tests/integrations/test_vllm.py holds to the installed vLLM."""
    read_names: dict[str, set[str]] = {}
    own: set[str] = set()
    for path in sorted(HERE.glob("*.py")):
        if path.name in ("_compat.py", "_surface.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        own.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        own.update(t.id for t in item.targets if isinstance(t, ast.Name))
            if not (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "scheduler")
            ):
                continue
            if isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            else:
                read_names.setdefault(node.attr, set()).add(path.name)
    return {name: files for name, files in read_names.items() if name not in own}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m stepplanner.integrations.vllm._surface",
        description="The installed vLLM's scheduler surface against the adapter's record of it.",
    )
    parser.add_argument("--write", action="store_true", help="write the installed vLLM's record")
    parser.add_argument(
        "--against", metavar="MINOR", help="compare with this release's record (e.g. 0.34)"
    )
    args = parser.parse_args(argv)
    found = read()
    if args.write:
        RECORDS.mkdir(exist_ok=True)
        path = RECORDS / f"{minor(found['vllm'])}.json"
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path}")
        return 0
    known = record(args.against or found["vllm"])
    if known is None:
        print(f"no record for vLLM {args.against or found['vllm']} in {RECORDS}")
        return 1
    diff = differences(known, found)
    print("\n".join(diff) or f"vLLM {found['vllm']}: as recorded for {known['vllm']}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
