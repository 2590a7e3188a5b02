"""The command line's counts checked against what the machine can hold, before a run allocates
anything: ``--requests`` (each request's workload row, ledger entry and results) and ``-B`` (each
resident slot's planner and ledger buffers), in the memory available now, times the runs a
command holds at once (a sweep's workers). A count past it is a one-line error (exit 2), not
numpy's ``MemoryError`` after a while or a machine swapping for minutes. The per-item figures
were measured (tracemalloc's peak of ``simulate``) and rounded up; docs/simulator.md
("Ceilings") states them.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

from .._errors import INT32_MAX
from ..tuning.backends import default_workers
from .errors import InputError

# A simulated request at its peak: ~1.8 KiB measured (workload arrays and the temporaries that
# draw them, the ledger's entry, the per-request results and latencies).
BYTES_PER_REQUEST = 2560
# A resident slot: ~330 bytes measured (the planner's scratch and plan buffers, the ledger's
# row and its columns, the simulator's per-slot state).
BYTES_PER_SLOT = 512


def available_memory() -> int | None:
    """Bytes the machine can give a run now: Linux's MemAvailable, capped by the cgroup's
    memory.max (a container's limit) and by what an address-space limit (``ulimit -v``) leaves;
    elsewhere the available physical pages; None where nothing can be read (then only int32
    applies)."""
    found = [n for n in (_meminfo(), _cgroup_left(), _address_space_left()) if n is not None]
    if not found and hasattr(os, "sysconf"):
        with contextlib.suppress(OSError, ValueError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    return max(min(found), 0) if found else None


def _meminfo() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_left() -> int | None:
    cgroup = pathlib.Path("/sys/fs/cgroup")
    with contextlib.suppress(OSError, ValueError):
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            return int(limit) - int((cgroup / "memory.current").read_text())
    return None


def _address_space_left() -> int | None:
    with contextlib.suppress(ImportError, OSError, ValueError, IndexError):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            pages = int(pathlib.Path("/proc/self/statm").read_text().split()[0])
            return soft - pages * os.sysconf("SC_PAGE_SIZE")
    return None


def ceiling(bytes_each: int, runs: int = 1) -> tuple[int, str]:
    """The most items of ``bytes_each`` that ``runs`` runs at once can hold: the available
    memory's worth, at most int32; and how it came about, for the message."""
    memory = available_memory()
    each = bytes_each * max(runs, 1)
    if memory is None:
        return INT32_MAX, "int32; this machine's available memory could not be read"
    if memory // each >= INT32_MAX:
        return INT32_MAX, "int32"
    at_once = f" x {runs} runs at once" if runs > 1 else ""
    return memory // each, (
        f"what {memory / 2**30:.1f} GiB of available memory holds at about "
        f"{bytes_each:,} bytes each{at_once}"
    )


def check_count(option: str, value: int, low: int, bytes_each: int, runs: int = 1) -> None:
    """``option``'s ``value`` within ``low..ceiling``, or a one-line error stating that range."""
    high, why = ceiling(bytes_each, runs)
    if not low <= value <= high:
        raise InputError(f"{option}={value} is out of range; allowed: {low}..{high:,} ({why})")


def check_requests(requests: int, runs: int = 1) -> None:
    """``--requests`` of the synthetic workload, before it is drawn."""
    check_count("requests", requests, 1, BYTES_PER_REQUEST, runs)


def check_slots(max_batch_size: int, runs: int = 1) -> None:
    """``-B``, before any planner or ledger allocates its slots' buffers up front."""
    check_count("max_batch_size", max_batch_size, 1, BYTES_PER_SLOT, runs)


def runs_at_once(workers: int | None, configurations: int) -> int:
    """How many simulations a command over ``configurations`` runs at once on ``workers``
    (None: every core this process may use)."""
    return max(1, min(workers or default_workers(), configurations))
