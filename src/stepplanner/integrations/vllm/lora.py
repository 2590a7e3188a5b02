"""LoRA: the running requests hold at most ``max_loras`` distinct adapters, so any step's rows do
(vLLM's worker has that many adapter slots per step); a waiting request whose adapter cannot join
waits without holding back the others (the ledgers' rule, docs/decisions.md)."""

from __future__ import annotations

from collections.abc import Iterable

from vllm.config import VllmConfig
from vllm.v1.request import Request

from ...ledger._shared import AdapterSlots


def max_loras(vllm_config: VllmConfig) -> int:
    """vLLM's ``--max-loras``; 0: LoRA is off."""
    lora = vllm_config.lora_config
    return lora.max_loras if lora is not None else 0


def lora_id(request: Request) -> int:
    """The request's LoRA adapter (vLLM's ``lora_int_id``), 0 for the base model."""
    lora = request.lora_request
    return lora.lora_int_id if lora is not None and lora.lora_int_id > 0 else 0


def running_adapters(max_loras: int, running: Iterable[Request]) -> AdapterSlots:
    """The adapter slots ``running`` holds (paused and in flight included), for admissions to
    join."""
    return AdapterSlots(max_loras, map(lora_id, running))
