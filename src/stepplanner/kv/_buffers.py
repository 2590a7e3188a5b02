"""The buffers of ``StepInputs``, sized once, and which of them each layout fills: one
definition for both implementations, and the read-only views users get of memory the
implementations write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from .. import _errors

__all__ = [
    "LAYOUTS",
    "PADDED",
    "block_table_rows",
    "check_layout",
    "family_of",
    "input_buffers",
    "layout_arrays",
    "read_only",
    "view_of",
]

# Every layout fills these: the token and row arrays every kernel family shares.
SHARED = ("positions", "cu_seqlens_q", "seq_lens_k", "slot_mapping", "logits_indices")
# FlashAttention (flash_attn_varlen_func / flash_attn_with_kvcache) and vLLM take a padded
# block_table; FlashInfer's paged wrappers take a CSR page list.
FAMILY = {
    "flash_attn": ("block_table",),
    "flashinfer": ("kv_indptr", "kv_indices", "kv_last_page_len"),
}
LAYOUTS: tuple[Literal["all", "flash_attn", "flashinfer"], ...] = (
    "all",
    "flash_attn",
    "flashinfer",
)
# Buffers whose unused entries are -1 (the rest start at 0).
PADDED = ("block_table",)


def block_table_rows(max_batch_size: int) -> int:
    """Rows of the ``block_table`` buffer: twice B, so that a step's B rows can start anywhere
    in the first half and the window can follow rows that move (``choose_block_start``)."""
    return 2 * max_batch_size


def check_layout(layout: object) -> str:
    """``layout`` itself, or the TypeError/ValueError naming it."""
    if not isinstance(layout, str):
        raise _errors.kv_layout_type(layout)
    if layout not in LAYOUTS:
        raise _errors.kv_layout(layout, LAYOUTS)
    return layout


def layout_arrays(layout: str) -> tuple[str, ...]:
    """The names of the arrays a ``layout`` fills (``qo_indptr`` is ``cu_seqlens_q``)."""
    families = FAMILY.values() if layout == "all" else (FAMILY[layout],)
    return SHARED + tuple(name for family in families for name in family)


def family_of(name: str) -> str:
    """The layout that fills array ``name`` besides ``'all'``."""
    return next(layout for layout, names in FAMILY.items() if name in names)


def input_buffers(
    max_batch_size: int,
    max_pages: int,
    max_tokens: int,
    layout: str,
    memory: Callable[[int], Any] = bytearray,
) -> dict[str, np.ndarray]:
    """The arrays ``prepare`` fills for ``layout``, by name, at their largest size (B rows,
    T tokens), each over its own zeroed ``memory(nbytes)``; the other family's arrays are not
    allocated at all. ``memory`` is a writable ``bytearray`` by default; the compiled module
    passes memory that Python can only read, so the caller fills the ``PADDED`` ones with -1."""
    b, m, t = max_batch_size, max_pages, max_tokens
    shapes: dict[str, tuple[tuple[int, ...], type[np.integer[Any]]]] = {
        "positions": ((t,), np.int32),
        "cu_seqlens_q": ((b + 1,), np.int32),
        "seq_lens_k": ((b,), np.int32),
        "slot_mapping": ((t,), np.int64),
        # One per row, or every position of a row that verifies drafts: at most T.
        "logits_indices": ((t,), np.int32),
        "block_table": ((block_table_rows(b), m), np.int32),
        "kv_indptr": ((b + 1,), np.int32),
        "kv_indices": ((b * m,), np.int32),
        "kv_last_page_len": ((b,), np.int32),
    }
    try:
        return {
            name: np.frombuffer(
                memory(int(np.prod(shape)) * np.dtype(dtype).itemsize), dtype=dtype
            ).reshape(shape)
            for name, (shape, dtype) in shapes.items()
            if name in layout_arrays(layout)
        }
    except MemoryError:
        raise _errors.kv_inputs_memory(b, t, m) from None


def read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be made writable: its base is a read-only memoryview, so
    neither the view, nor ``.base``, nor ``np.asarray(view.base)`` writes the array (DLPack
    exports it with its read-only flag)."""
    view = np.frombuffer(array.data.cast("B").toreadonly(), dtype=array.dtype)
    return view.reshape(array.shape)


def view_of(
    buffers: dict[str, np.ndarray], name: str, length: int, layout: str, start: int = 0
) -> np.ndarray:
    """Entries ``start .. start + length`` of buffer ``name`` (the valid part: a prefix for every
    buffer but ``block_table``), or the AttributeError saying the layout skips it."""
    buf = buffers.get(name)
    if buf is None:
        raise _errors.kv_array_not_filled(name, layout, family_of(name))
    return buf[start : start + length]
