"""The buffers of ``StepInputs``, sized once: one layout for both implementations."""

from __future__ import annotations

import numpy as np

from . import _errors

__all__ = ["input_buffers"]


def input_buffers(max_batch_size: int, max_pages: int, max_tokens: int) -> dict[str, np.ndarray]:
    """Every array ``prepare`` fills, by name, at its largest size (B rows, T tokens)."""
    b, m, t = max_batch_size, max_pages, max_tokens
    try:
        return {
            "positions": np.zeros(t, dtype=np.int32),
            "cu_seqlens_q": np.zeros(b + 1, dtype=np.int32),
            "seq_lens_k": np.zeros(b, dtype=np.int32),
            "slot_mapping": np.zeros(t, dtype=np.int64),
            "block_table": np.full((b, m), -1, dtype=np.int32),
            "kv_indptr": np.zeros(b + 1, dtype=np.int32),
            "kv_indices": np.zeros(b * m, dtype=np.int32),
            "kv_last_page_len": np.zeros(b, dtype=np.int32),
            "logits_indices": np.zeros(b, dtype=np.int32),
        }
    except MemoryError:
        raise _errors.kv_inputs_memory(b, t, m) from None


def read_only(buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Read-only views of ``buffers``: what users see (their slices stay read-only, and DLPack
    exports them with its read-only flag), while ``prepare`` writes the originals."""
    views = {}
    for name, buf in buffers.items():
        view = buf.view()
        view.flags.writeable = False
        views[name] = view
    return views
