"""A serving loop on stepplanner's Ledger: submit, one ledger.step() per engine step, retire.

Each request arrives with max_new_tokens; the runtime learns that a request finished from the
ledger: after each ledger.step(), ledger.finished_ids holds the requests that finished in the
step just run, either because they emitted max_new_tokens tokens (the chunk completing a prompt
emits the first, each decode row one more) or because the sampler's `finished` mask said so
(EOS, a stop string); they have already left their slots. Output counts are the ledger's
(ledger.output_tokens), the same convention as `stepplanner simulate`.
Run: python examples/serving_loop.py  (type-checked with mypy --strict in CI).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

import stepplanner as sp

EOS_ROW = 3  # the stand-in sampler ends request 3 after its second token


def run_model(
    plan: sp.StepPlan, tokens: dict[int, int], ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.bool_]:
    """Stand-in for the forward pass and the sampler: one bool per plan row, True where the
    sampled token ends its request (only rows with select_last_token_logits sample)."""
    rows = plan.as_array()
    finished = np.zeros(len(rows), dtype=bool)
    for k, (resident, emits) in enumerate(zip(rows["resident"], rows["select_last_token_logits"])):
        if emits:
            rid = int(ids[resident])
            tokens[rid] = tokens.get(rid, 0) + 1
            finished[k] = rid == EOS_ROW and tokens[rid] == 2
    return finished


def serve(prompt_lengths: list[int], max_new_tokens: int = 4) -> tuple[int, list[int]]:
    """Serve every prompt; return the engine steps taken and the ids in the order they finished."""
    limits = sp.StepPlannerLimits(max_batch_size=4, max_input_length=512, kv_page_size=16)
    policy = sp.resolve_scheduling_policy(sp.SchedulingOptions(), limits)
    planner = sp.StepPlanner(policy, limits)
    ledger = sp.Ledger(limits, policy, max_waiting=64)  # submit past 64 waiting: QueueFullError
    for rid, prompt_length in enumerate(prompt_lengths):
        ledger.submit(rid, prompt_length, max_new_tokens=max_new_tokens)
    tokens: dict[int, int] = {}
    order: list[int] = []
    steps = 0
    plan = ledger.step(planner)  # admit -> plan
    while ledger.count:
        finished = run_model(plan, tokens, ledger.request_ids)
        steps += 1
        # apply (SPEC §6) -> count tokens -> retire the finished -> admit -> plan, in one call
        plan = ledger.step(planner, finished)
        order.extend(ledger.finished_ids.tolist())  # send their last responses here
    return steps, order


if __name__ == "__main__":
    steps, order = serve([300, 40, 500, 120, 64, 16])
    print(f"served 6 requests in {steps} steps; finished in the order {order}")
