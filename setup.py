"""Build of the compiled core. Metadata lives in pyproject.toml; this file declares only the
extension and the Cython directives, in one place (a misspelled directive here is an error, a
misspelled ``# cython:`` header comment would be silently ignored).

STEPPLANNER_CYTHON_DEBUG=1 builds with bounds/initialisation checks and line tracing, for
running the test suite against a checked build.
"""

import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("STEPPLANNER_CYTHON_DEBUG", "") not in ("", "0")

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
    "freethreading_compatible": True,
    "linetrace": DEBUG,
    "profile": False,
}

# Built against numpy 2.x, the module runs on any numpy from NPY_TARGET_VERSION on: keep it equal
# to the runtime floor in pyproject.toml (numpy>=1.25), so an older numpy fails at import, loudly.
macros = [
    ("NPY_NO_DEPRECATED_API", "NPY_1_9_API_VERSION"),
    ("NPY_TARGET_VERSION", "NPY_1_25_API_VERSION"),
]
if DEBUG:
    macros += [("CYTHON_TRACE_NOGIL", "1")]

# Every function starts on a cache line (GCC and Clang; MSVC has no such flag). Without it the
# host step's speed depended on where the linker happened to put its hot functions: code added
# anywhere in a module moved them, and the fused step at B=256 was 1.5-3% slower with not one
# instruction more on its path (docs/performance.md, "Code placement").

extensions = [
    Extension(
        f"stepplanner.{name}",
        [f"src/stepplanner/{name.replace('.', '/')}.pyx"],
        include_dirs=[numpy.get_include()],
        define_macros=macros,
        extra_compile_args=(
            [] if os.name == "nt" else ["-O0", "-g"] if DEBUG else ["-falign-functions=64"]
        ),
    )
    # kv._kv cimports _core's structs; ledger._ledger cimports both; ledger._step_time, _core's.
    for name in ("_core", "kv._kv", "ledger._ledger", "ledger._step_time")
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
