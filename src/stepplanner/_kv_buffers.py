"""The buffers of ``StepInputs``, sized once: one layout for both implementations, and the
read-only views users get of memory the implementations write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import _errors

__all__ = ["PADDED", "input_buffers", "read_only"]

# Buffers whose unused entries are -1 (the rest start at 0).
PADDED = ("block_table",)


def input_buffers(max_batch_size: int, max_pages: int, max_tokens: int,
                  memory: Callable[[int], Any] = bytearray) -> dict[str, np.ndarray]:
    """Every array ``prepare`` fills, by name, at its largest size (B rows, T tokens), each over
    its own zeroed ``memory(nbytes)`` (a writable ``bytearray`` by default; the compiled module
    passes memory that Python can only read, and fills the ``PADDED`` ones with -1 itself)."""
    b, m, t = max_batch_size, max_pages, max_tokens
    layout = {
        "positions": (np.int32, (t,)),
        "cu_seqlens_q": (np.int32, (b + 1,)),
        "seq_lens_k": (np.int32, (b,)),
        "slot_mapping": (np.int64, (t,)),
        "block_table": (np.int32, (b, m)),
        "kv_indptr": (np.int32, (b + 1,)),
        "kv_indices": (np.int32, (b * m,)),
        "kv_last_page_len": (np.int32, (b,)),
        "logits_indices": (np.int32, (b,)),
    }
    try:
        return {name: np.frombuffer(memory(int(np.prod(shape)) * np.dtype(dtype).itemsize),
                                    dtype=dtype).reshape(shape)
                for name, (dtype, shape) in layout.items()}
    except MemoryError:
        raise _errors.kv_inputs_memory(b, t, m) from None


def read_only(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` that cannot be made writable: its base is a read-only memoryview, so
    neither the view, nor ``.base``, nor ``np.asarray(view.base)`` writes the array (DLPack
    exports it with its read-only flag)."""
    view = np.frombuffer(array.data.cast("B").toreadonly(), dtype=array.dtype)
    return view.reshape(array.shape)
