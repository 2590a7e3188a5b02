"""The package's layout holds: the serving path apart from the offline tools, imports running one
way, and ``import stepplanner`` loading the serving path only (README, "Layout").

The import graph is read from the installed package's own sources (``.py``, and ``.pyx``/``.pxd``
where they are installed, as in a development install), so the test checks what ships.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
import subprocess
import sys

import pytest

import stepplanner

PACKAGE = pathlib.Path(stepplanner.__file__).parent

# Lower layers first: a module may import its own layer and the ones below it. The serving path
# is _errors/_select, planner (what the kernel shares), the kernel (_core, its twin _core_py, and
# core, which picks one), kv, ledger; everything from sim on is offline.
LAYERS = {
    "_errors": 0,
    "_select": 0,
    "planner": 1,
    "_core": 2,
    "_core_py": 2,
    "core": 2,
    "kv": 3,
    "ledger": 4,
    "testing": 5,
    "sim": 5,
    "tuning": 6,
    "bench": 6,
    "fidelity": 6,
    "cli": 7,
    "integrations": 7,
    "__init__": 8,
    "__main__": 9,
}
# Each compiled module and its pure-Python twin, named so that one finds the other.
TWINS = {
    "stepplanner._core": "stepplanner._core_py",
    "stepplanner.kv._kv": "stepplanner.kv._kv_py",
    "stepplanner.ledger._ledger": "stepplanner.ledger._ledger_py",
}
OFFLINE = ("sim", "tuning", "bench", "cli", "fidelity", "integrations", "testing")
MAX_UPWARD = 2


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def is_module(name: str) -> bool:
    base = PACKAGE.parent / name.replace(".", "/")
    return is_package(name) or any(base.parent.glob(base.name + ".*"))


def sources() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".pyx", ".pxd") and "__pycache__" not in path.parts:
            found.setdefault(
                module_name(path) + ("" if path.suffix == ".py" else path.suffix), path
            )
    return found


_FROM = re.compile(
    r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+c?import[ \t]+(\([^)]*\)|[^\n#]*)(.*)$", re.M
)
_IMPORT = re.compile(r"^[ \t]*c?import[ \t]+(stepplanner[\w.]*)(.*)$", re.M)


def imports(name: str, path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(target module, line, commented) for each import of the package's own modules."""
    text = path.read_text("utf-8")
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out = []
    for m in _FROM.finditer(text):
        source, names, rest = m.group(1), m.group(2), m.group(3)
        line = text.count("\n", 0, m.start()) + 1
        if source.startswith("."):
            dots = len(source) - len(source.lstrip("."))
            base = package.split(".")[: len(package.split(".")) - (dots - 1)]
            source = ".".join(base + ([source.lstrip(".")] if source.lstrip(".") else []))
        if not source.startswith("stepplanner"):
            continue
        commented = "#" in rest or "#" in names
        names = re.sub(r"\s+as\s+\w+", "", re.sub(r"#[^\n]*", "", names))  # "x as y" is x
        for item in re.split(r"[,\s()]+", names):
            if not item or item == "*":
                continue
            sub = f"{source}.{item}"
            if is_module(sub):
                out.append((sub, line, commented))
            elif (source, line, commented) not in out:
                out.append((source, line, commented))
    for m in _IMPORT.finditer(text):
        out.append((m.group(1), text.count("\n", 0, m.start()) + 1, "#" in m.group(2)))
    return [(t, line, c) for t, line, c in out if t != name]


def layer(name: str) -> int:
    parts = name.split(".")
    return LAYERS["__init__" if len(parts) == 1 else parts[1]]


@functools.cache
def graph() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> its imports of the package's modules; a .pyx and its .pxd are one module."""
    out: dict[str, list[tuple[str, int, bool]]] = {}
    for key, path in sources().items():
        name = key.removesuffix(".pyx").removesuffix(".pxd")
        out.setdefault(name, []).extend(imports(name, path))
    return out


def test_every_module_has_a_layer():
    for name in graph():
        layer(name)  # a KeyError names a module placed outside the layers


def test_at_most_ten_modules_directly_in_the_package():
    top = [p.name for p in PACKAGE.iterdir() if p.suffix == ".py"]
    assert len(top) <= 10, top


def test_no_module_imports_the_package_init():
    offenders = [
        (name, line)
        for name, edges in graph().items()
        if name not in ("stepplanner", "stepplanner.__main__")
        for target, line, _ in edges
        if target == "stepplanner"
    ]
    assert not offenders, offenders


def test_imports_run_downward_with_few_commented_exceptions():
    upward = []
    for name, edges in graph().items():
        for target, line, commented in edges:
            # A module importing its own package's __init__ runs upward too; a __main__ is the
            # entry point above its package.
            own_init = (
                name.startswith(target + ".")
                and target != "stepplanner"
                and not name.endswith(".__main__")
            )
            if layer(target) > layer(name) or own_init:
                upward.append((name, target, line, commented))
    assert len(upward) <= MAX_UPWARD, upward
    assert all(commented for *_, commented in upward), upward


def test_no_import_circles():
    edges = {name: {t for t, _, _ in targets if t in graph()} for name, targets in graph().items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(
                    "import circle: " + " -> ".join(stack[stack.index(nxt) :] + [nxt])
                )
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_the_graph_reader_sees_real_imports():
    # A reader that found nothing would pass every rule above.
    targets = {name: {t for t, _, _ in edges} for name, edges in graph().items()}
    assert "stepplanner.sim.simulator" in targets["stepplanner.sim.paged"]
    assert "stepplanner.core" in targets["stepplanner"]
    assert "stepplanner.ledger._shared" in targets["stepplanner.ledger._ledger_py"]
    if (PACKAGE / "kv" / "_kv.pyx").exists():  # a development install: the Cython sources too
        assert "stepplanner._core" in targets["stepplanner.kv._kv"]


def test_the_kernel_is_where_the_design_names_it():
    # src/stepplanner/_core.pyx (its .pxd and .pyi beside it), compiled as stepplanner._core;
    # no core/ package beside it meaning something else.
    import stepplanner._core as kernel

    assert kernel.__name__ == "stepplanner._core" and hasattr(kernel, "StepPlanner")
    assert (PACKAGE / "_core.pxd").exists() and (PACKAGE / "_core.pyi").exists()
    assert not (PACKAGE / "core").is_dir()


def test_every_compiled_module_has_its_twin_beside_it():
    import importlib

    for compiled, twin in TWINS.items():
        a, b = importlib.import_module(compiled), importlib.import_module(twin)
        assert a.__name__.rpartition(".")[0] == b.__name__.rpartition(".")[0]
        assert twin == compiled + "_py"


def _modules_after(code: str, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != "STEPPLANNER_IMPL"} | env
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code + "\nimport sys\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('stepplanner')))",
        ],
        capture_output=True,
        text=True,
        env=environ,
        check=True,
    )
    return out.stdout.split()


def test_import_loads_the_serving_path_only(compiled):
    loaded = _modules_after("import stepplanner")
    offline = [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in OFFLINE]
    twins = [m for m in loaded if m in TWINS.values()]
    assert not offline and not twins, offline + twins
    assert set(TWINS) <= set(loaded)


def test_python_impl_selects_every_twin():
    loaded = _modules_after(
        "import stepplanner as sp\n"
        "assert sp.IMPLEMENTATION == 'python'\n"
        "assert sp.StepPlanner.__module__ == 'stepplanner._core_py'\n"
        "assert sp.KVPageTable.__module__ == 'stepplanner.kv._kv_py'\n"
        "assert sp.Ledger.__module__ == 'stepplanner.ledger._ledger_py'",
        STEPPLANNER_IMPL="python",
    )
    assert not set(TWINS) & set(loaded)


@pytest.mark.parametrize(
    "name, module",
    [
        ("simulate", "stepplanner.sim.simulator"),
        ("SimulationResult", "stepplanner.sim.simulator"),
        ("LatencyModel", "stepplanner.sim.latency"),
        ("Workload", "stepplanner.sim.workloads"),
        ("synthetic", "stepplanner.sim.workloads"),
        ("load_trace", "stepplanner.sim.traces"),
    ],
)
def test_offline_names_load_on_first_use(name, module):
    loaded = _modules_after(
        f"import stepplanner\nassert stepplanner.{name} is "
        f"__import__('{module}', fromlist=['x']).{name}"
    )
    assert module in loaded
    assert name in dir(stepplanner) and name in stepplanner.__all__


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        stepplanner.simulat  # noqa: B018
    assert not hasattr(stepplanner, "PagedLedger")


def test_public_module_paths_stay():
    # python -m stepplanner and python -m stepplanner.bench, the integrations' documented paths,
    # stepplanner.testing: found where the README says (the integrations need their runtimes to
    # import, so only their modules' presence is checked here).
    import importlib.util

    import stepplanner.bench
    import stepplanner.cli
    import stepplanner.testing  # noqa: F401

    assert callable(stepplanner.bench.main) and callable(stepplanner.cli.main)
    for name in (
        "stepplanner.__main__",
        "stepplanner.bench.__main__",
        "stepplanner.integrations.vllm",
        "stepplanner.integrations.transformers",
    ):
        assert importlib.util.find_spec(name) is not None, name
