"""KVPageTable on both implementations: pages per slot over one pool, all-or-nothing growth."""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import PageTableInvariantError, worst_case_pages
from stepplanner.kv._checks import check_page_table


def state(table):
    return (table.rows.copy(), table.page_counts.copy(), table.num_free_pages)


def test_fresh_table_hands_out_pages_in_order(kv):
    table = kv.KVPageTable(3, 4, 10, 16)
    assert table.rows.shape == (3, 4) and table.rows.dtype == np.int32
    assert (table.rows == -1).all() and table.num_free_pages == 10
    assert table.ensure(0, 33)  # 3 pages
    assert table.ensure(2, 1)  # 1 page
    assert table.rows.tolist() == [[0, 1, 2, -1], [-1] * 4, [3, -1, -1, -1]]
    assert table.page_counts.tolist() == [3, 0, 1]
    assert table.num_free_pages == 6
    assert table.tokens_held(0) == 48
    table.check()


def test_ensure_grows_only_what_is_missing_and_never_shrinks(kv):
    table = kv.KVPageTable(2, 8, 8, 4)
    assert table.ensure(0, 4)
    assert table.ensure(0, 9)  # 1 page -> 3 pages, the first one kept
    assert table.rows[0, :3].tolist() == [0, 1, 2]
    assert table.ensure(0, 2)  # fewer tokens than held: nothing changes
    assert table.page_counts[0] == 3
    assert table.ensure(1, 0)  # zero tokens need zero pages
    assert table.page_counts[1] == 0
    table.check()


def test_ensure_is_all_or_nothing_when_the_pool_is_short(kv):
    table = kv.KVPageTable(2, 8, 5, 4)
    assert table.ensure(0, 12)  # 3 of 5 pages
    before = state(table)
    assert table.ensure(1, 12) is False  # needs 3, 2 are free
    after = state(table)
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert table.ensure(1, 8) is True  # exactly the 2 that are free
    assert table.num_free_pages == 0
    assert table.ensure(0, 12) is True  # already held: True even with an empty pool
    table.check()


def test_release_returns_pages_and_they_come_back_in_order(kv):
    table = kv.KVPageTable(2, 4, 6, 2)
    table.ensure(0, 6)
    table.ensure(1, 2)
    table.release(0)
    assert table.rows[0].tolist() == [-1] * 4 and table.num_free_pages == 5
    table.ensure(1, 8)  # grows by 3: the released pages, first page first
    assert table.rows[1].tolist() == [3, 0, 1, 2]
    table.release(0)  # releasing an empty slot is a no-op
    table.check()


def test_move_is_the_ledgers_swap_remove(kv):
    table = kv.KVPageTable(3, 4, 12, 4)
    for slot, tokens in enumerate((5, 9, 13)):
        table.ensure(slot, tokens)
    last = table.rows[2].tolist()
    table.release(0)  # retire row 0 ...
    table.move(2, 0)  # ... and the last row moves into it
    assert table.rows[0].tolist() == last
    assert table.rows[2].tolist() == [-1] * 4
    assert table.page_counts.tolist() == [4, 3, 0]
    table.move(1, 1)  # onto itself: nothing to do
    assert table.page_counts[1] == 3
    table.check()


def test_move_onto_a_slot_with_pages_is_refused(kv):
    table = kv.KVPageTable(2, 4, 8, 4)
    table.ensure(0, 4)
    table.ensure(1, 4)
    before = state(table)
    with pytest.raises(ValueError, match=r"dst=1 holds 1 page\(s\); allowed: an empty slot"):
        table.move(0, 1)
    assert all(np.array_equal(a, b) for a, b in zip(before, state(table)))


def test_rows_is_a_read_only_zero_copy_view(kv):
    table = kv.KVPageTable(2, 4, 8, 4)
    view = table.rows
    with pytest.raises(ValueError):
        view[0, 0] = 5
    table.ensure(1, 4)
    assert view[1, 0] == 0  # the same memory, seen after the update
    assert not table.page_counts.flags.writeable


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4, 8, 4), "max_batch_size=0 is out of range; allowed: >= 1"),
        ((2, 0, 8, 4), "max_pages_per_sequence=0 is out of range"),
        ((2, 4, -1, 4), "num_pages=-1 is out of range"),
        ((2, 4, 8, 0), "kv_page_size=0 is out of range"),
        ((2**16, 2**16, 8, 4), r"max_batch_size \* max_pages_per_sequence=4294967296"),
    ],
)
def test_constructor_names_the_bad_argument(kv, args, message):
    with pytest.raises(ValueError, match=message):
        kv.KVPageTable(*args)


def test_constructor_types(kv):
    with pytest.raises(TypeError, match="num_pages must be an integer, got float"):
        kv.KVPageTable(2, 4, 8.0, 4)
    with pytest.raises(OverflowError, match="kv_page_size=4294967296 does not fit int32"):
        kv.KVPageTable(2, 4, 8, 2**32)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda t: t.ensure(3, 1), ValueError, r"slot=3 is out of range; allowed: 0\.\.2"),
        (lambda t: t.ensure(-1, 1), ValueError, "slot=-1 is out of range"),
        (lambda t: t.ensure(0, -1), ValueError, "num_tokens=-1 is out of range; allowed: >= 0"),
        (
            lambda t: t.ensure(0, 17),
            ValueError,
            r"num_tokens=17 needs more than max_pages_per_sequence=4 pages of 4 tokens; "
            r"allowed: 0\.\.16",
        ),
        (lambda t: t.ensure(0, "3"), TypeError, "num_tokens must be an integer, got str"),
        (lambda t: t.release(5), ValueError, "slot=5 is out of range"),
        (lambda t: t.move(0, 3), ValueError, "dst=3 is out of range"),
        (lambda t: t.move(9, 0), ValueError, "src=9 is out of range"),
        (lambda t: t.tokens_held(None), TypeError, "slot must be an integer, got NoneType"),
    ],
)
def test_bad_arguments_name_the_argument_and_change_nothing(kv, call, error, message):
    table = kv.KVPageTable(3, 4, 6, 4)
    table.ensure(0, 8)
    before = state(table)
    with pytest.raises(error, match=message):
        call(table)
    assert all(np.array_equal(a, b) for a, b in zip(before, state(table)))


def test_numpy_integers_are_accepted(kv):
    table = kv.KVPageTable(np.int64(2), np.int32(4), np.int16(8), np.uint8(4))
    assert table.ensure(np.int64(1), np.int32(5))
    assert table.page_counts[1] == 2


# --- the invariant check, over hand-broken storage ------------------------------------------


def good():
    rows = np.array([[0, 1, -1], [2, -1, -1]], dtype=np.int32)
    return rows, np.array([2, 1], dtype=np.int32), np.array([4, 3], dtype=np.int32)


def test_check_accepts_a_consistent_table():
    check_page_table(*good(), 5)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda r, c, f: r.__setitem__((0, 2), 3), "slot 0 has page 3 at 2, after its last"),
        (lambda r, c, f: r.__setitem__((1, 0), 7), "slot 1 holds page id 7 at 0"),
        (lambda r, c, f: r.__setitem__((1, 0), 1), r"page 1 is held twice \(slots \[0, 1\]\)"),
        (lambda r, c, f: c.__setitem__(1, 2), "slot 1 holds page id -1 at 1"),
        (lambda r, c, f: c.__setitem__(0, 4), "slot 0 counts 4 pages"),
        (lambda r, c, f: f.__setitem__(0, 9), "free pool holds an id outside"),
        (lambda r, c, f: f.__setitem__(0, 3), "free pool holds a page twice"),
        (lambda r, c, f: f.__setitem__(0, 2), "page 2 is both free and held"),
    ],
)
def test_check_finds_each_broken_invariant(breakage, message):
    rows, counts, free = good()
    breakage(rows, counts, free)
    with pytest.raises(PageTableInvariantError, match=message):
        check_page_table(rows, counts, free, 5)


def test_check_finds_a_lost_page():
    rows, counts, free = good()
    with pytest.raises(PageTableInvariantError, match="1 free \\+ 3 held pages != num_pages=5"):
        check_page_table(rows, counts, free[:1], 5)


# --- worst-case reservation -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "new", "page", "pages"),
    [(1, 0, 16, 1), (16, 0, 16, 1), (16, 1, 16, 2), (100, 28, 64, 2), (100, 29, 64, 3)],
)
def test_worst_case_pages(prompt, new, page, pages):
    assert worst_case_pages(prompt, new, page) == pages


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((0, 1, 16), ValueError, "prompt_length=0 is out of range"),
        ((1, -1, 16), ValueError, "max_new_tokens=-1 is out of range"),
        ((1, 1, 0), ValueError, "kv_page_size=0 is out of range"),
        ((2**31 - 1, 1, 16), ValueError, "prompt_length \\+ max_new_tokens"),
        ((1.5, 1, 16), TypeError, "prompt_length must be an integer"),
    ],
)
def test_worst_case_pages_errors(args, error, message):
    with pytest.raises(error, match=message):
        worst_case_pages(*args)


# --- the page table's side of the ledger's swap-remove --------------------------------------


@pytest.mark.parametrize("retired", [[0], [4], [1, 3], [3, 1, 0], [0, 1, 2, 3, 4], []])
def test_release_rows_keeps_slots_equal_to_ledger_rows(kv, retired):
    from stepplanner import Ledger, StepPlannerLimits, release_rows

    ledger = Ledger(StepPlannerLimits(6, 32, 4))
    table = kv.KVPageTable(6, 8, 48, 4)
    for rid in range(5):
        ledger.submit(100 + rid, 4)
    ledger.admit()
    pages_of = {}
    for row, rid in enumerate(ledger.request_ids.tolist()):
        table.ensure(row, 4 * (row + 1))  # each request its own page count
        pages_of[rid] = table.rows[row].tolist()
    release_rows(table, retired, ledger.count)
    ledger.retire_rows(retired)
    for row, rid in enumerate(ledger.request_ids.tolist()):
        assert table.rows[row].tolist() == pages_of[rid]
    assert (table.rows[ledger.count :] == -1).all()
    table.check()


@pytest.mark.parametrize(
    ("rows", "count", "error", "message"),
    [
        ([3], 3, ValueError, r"rows=3 is out of range; allowed: 0\.\.2"),
        ([1, 1], 3, ValueError, "repeat a row"),
        ([0], 7, ValueError, r"count=7 is out of range; allowed: 0\.\.6"),
        (["0"], 3, TypeError, "rows must be an integer"),
    ],
)
def test_release_rows_errors_change_nothing(kv, rows, count, error, message):
    from stepplanner import release_rows

    table = kv.KVPageTable(6, 8, 48, 4)
    for slot in range(3):
        table.ensure(slot, 4)
    before = state(table)
    with pytest.raises(error, match=message):
        release_rows(table, rows, count)
    assert all(np.array_equal(a, b) for a, b in zip(before, state(table)))


@pytest.mark.limits_address_space
def test_a_table_too_large_to_hold_is_a_clear_memory_error(kv):
    """Valid sizes whose table cannot be had (8 GiB under a 3 GiB address-space cap) raise a
    MemoryError naming the sizes, not numpy's bare one."""
    import subprocess
    import sys
    import textwrap

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import importlib, resource
        kv = importlib.import_module("{kv.__name__}")
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))
        try:
            kv.KVPageTable(2**16, 2**15 - 1, 8, 16)
        except MemoryError as exc:
            print("MemoryError", exc)
    """),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(
        "MemoryError KVPageTable(max_batch_size=65536, max_pages_per_sequence=32767, "
        "num_pages=8) needs"
    ), proc.stdout
