"""Griffe extension for the API reference (mkdocs.yml): what static analysis of ``src/`` misses.

1. **Docstrings of the compiled modules.** ``_core``, ``kv/_kv`` and ``ledger/_ledger`` are read
   from their stubs (``.pyi``), which carry the typed signatures but only one-line docstrings;
   the docstrings are written once, in the ``.pyx``. So each stub object takes the compiled
   object's ``__doc__`` (without the signature line Cython's ``embedsignature`` puts first),
   and keeps its own where the compiled object has none. The compiled modules must be importable
   (``tools/ci/docs.sh`` installs the package): a missing one is a warning, so
   ``mkdocs build --strict`` fails instead of publishing a reference without docstrings.
2. **``stepplanner.sim``**, a namespace package (no ``__init__.py``), which griffe does not
   descend into: its modules are visited here, so ``stepplanner.simulate`` and the other names
   the facade resolves lazily from it resolve in the reference too.
3. **reST in the docstrings** that Markdown would print as written: a role (``:class:`X```)
   becomes the code span ``X``, and a line ending in ``::`` before an indented block ends in
   ``:`` (the indented block is already code in Markdown).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from pathlib import Path
from typing import Any

import griffe

logger = logging.getLogger("mkdocs.plugins.griffe_stepplanner")

# Cython's embedsignature line: ``Name.method(self, a, b=1)`` or ``Name(a, b)``, maybe ``-> T``.
_SIGNATURE_LINE = re.compile(r"^[A-Za-z_][\w.]*\(.*\)(\s*->\s*.+)?$")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|exc|data|obj):`~?([^`]+)`")
_LITERAL_MARKER = re.compile(r"(\S)::$", re.M)
# What CPython writes on slots nobody documented (``__init__`` of an extension type, ...).
_GENERIC_DOCS = {
    doc
    for name in ("__init__", "__new__", "__repr__", "__eq__", "__reduce__", "__setstate__")
    if (doc := getattr(getattr(object, name, None), "__doc__", None))
}


def runtime_docstring(obj: Any) -> str | None:
    """``obj.__doc__`` without the embedded signature; ``None`` when nobody wrote one."""
    doc = inspect.getdoc(obj)
    if not doc or doc in _GENERIC_DOCS or doc == inspect.getdoc(type(obj)):
        return None
    lines = doc.splitlines()
    if lines and _SIGNATURE_LINE.match(lines[0].strip()):
        lines = lines[1:]
    text = "\n".join(lines).strip()
    return text or None


class CompiledDocstrings(griffe.Extension):
    """Fills the stubs' objects with the compiled modules' docstrings (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "stepplanner":
            return
        self._load_namespace_packages(pkg, loader)
        for module in _modules(pkg):
            if _is_compiled_stub(module):
                self._fill(module, loader)
        for obj in _objects(pkg):
            if obj.docstring is not None:
                text = _ROLE.sub(r"`\1`", obj.docstring.value)
                obj.docstring.value = _LITERAL_MARKER.sub(r"\1:", text)

    def _fill(self, module: griffe.Module, loader: griffe.GriffeLoader) -> None:
        try:
            runtime = importlib.import_module(module.path)
        except ImportError as error:
            logger.warning(
                "%s is not built (%s): install the package before building the docs",
                module.path,
                error,
            )
            return
        for obj, live in [(module, runtime), *_pairs(module, runtime)]:
            doc = runtime_docstring(live)
            if doc is not None:
                obj.docstring = griffe.Docstring(
                    doc,
                    parent=obj,
                    parser=loader.docstring_parser,
                    parser_options=loader.docstring_options,
                )

    def _load_namespace_packages(self, pkg: griffe.Module, loader: griffe.GriffeLoader) -> None:
        root = Path(pkg.filepath).parent if isinstance(pkg.filepath, Path) else None
        if root is None:
            return
        for directory in sorted(p for p in root.iterdir() if p.is_dir()):
            if (directory / "__init__.py").exists() or directory.name in pkg.members:
                continue
            files = sorted(directory.glob("*.py"))
            if not files:
                continue
            namespace = griffe.Module(directory.name, filepath=[directory], parent=pkg)
            pkg.set_member(directory.name, namespace)
            for path in files:
                module = griffe.visit(
                    path.stem,
                    filepath=path,
                    code=path.read_text(encoding="utf-8"),
                    parent=namespace,
                    extensions=loader.extensions,
                    docstring_parser=loader.docstring_parser,
                    docstring_options=loader.docstring_options,
                    lines_collection=loader.lines_collection,
                    modules_collection=loader.modules_collection,
                )
                namespace.set_member(path.stem, module)


def _modules(module: griffe.Module) -> list[griffe.Module]:
    found = [module]
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            found.extend(_modules(member))  # type: ignore[arg-type]
    return found


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found


def _is_compiled_stub(module: griffe.Module) -> bool:
    """A ``.pyi`` with no ``.py`` beside it: the stub of an extension module."""
    path = module.filepath
    return isinstance(path, Path) and path.suffix == ".pyi" and not path.with_suffix(".py").exists()


def _pairs(obj: griffe.Object, live: Any) -> list[tuple[griffe.Object, Any]]:
    """Each stub object under ``obj`` with the runtime object of the same name."""
    found: list[tuple[griffe.Object, Any]] = []
    for name, member in obj.members.items():
        if member.is_alias or not hasattr(live, name):
            continue
        if isinstance(live, type):
            # The descriptor itself (a property's getter doc), not what it returns.
            value = inspect.getattr_static(live, name)
        else:
            value = getattr(live, name)
        found.append((member, value))  # type: ignore[arg-type]
        if member.is_class:
            found.extend(_pairs(member, value))  # type: ignore[arg-type]
    return found
