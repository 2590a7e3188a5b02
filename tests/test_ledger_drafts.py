"""SPEC §8 in the ledger: a decode row that verified g drafts of which the runtime accepted a
emits a + 1 tokens; committed, output counts, max_new_tokens and per-token deadlines move by
that much, and the rejected drafts leave nothing. On both ledgers, each with its own planner."""

from __future__ import annotations

import numpy as np
import pytest

from stepplanner import (
    SLO,
    SchedulingOptions,
    SchedulingPolicy,
    SequenceWork,
    StepPlannerLimits,
    resolve_scheduling_policy,
)

LIMITS = StepPlannerLimits(max_batch_size=4, max_input_length=64, kv_page_size=16)
POLICY = resolve_scheduling_policy(SchedulingOptions(), LIMITS)


@pytest.fixture
def make(ledger_impl):
    def build(policy=POLICY, **kw):
        return ledger_impl.Ledger(LIMITS, policy, **kw), ledger_impl.StepPlanner(policy, LIMITS)

    return build


def decoding(make, prompts=(20, 20), max_new=None, **kw):
    """A ledger whose requests have all taken their prompt (one token out each)."""
    ledger, planner = make(**kw)
    for rid, length in enumerate(prompts, 1):
        ledger.submit(rid, length, max_new_tokens=max_new)
    ledger.admit()
    ledger.apply(planner.plan(ledger.residents))
    assert ledger.residents["context_committed"].all()
    return ledger, planner


def test_a_verifying_row_emits_its_accepted_drafts_and_one_more(make) -> None:
    ledger, planner = decoding(make)
    committed = ledger.residents["committed"].tolist()  # [20, 20]
    plan = planner.plan(ledger.residents, drafts=[3, 2])
    assert [s.query_length for s in plan.sequences] == [4, 3]
    ledger.apply(plan, accepted=np.array([1, 2], dtype=np.int32))
    assert ledger.output_tokens.tolist() == [1 + 2, 1 + 3]
    # 1 + accepted committed; the rejected draft of row 0 leaves nothing.
    assert ledger.residents["committed"].tolist() == [committed[0] + 2, committed[1] + 3]


def test_without_accepted_every_verified_draft_counts(make) -> None:
    ledger, planner = decoding(make)
    plan = planner.plan(ledger.residents, drafts=[3, 0])
    ledger.apply(plan)
    assert ledger.output_tokens.tolist() == [1 + 4, 1 + 1]
    assert ledger.residents["committed"].tolist() == [24, 21]


def test_no_drafts_accepted_is_one_token(make) -> None:
    ledger, planner = decoding(make)
    ledger.apply(planner.plan(ledger.residents, drafts=[5, 5]), accepted=np.zeros(2, np.int32))
    assert ledger.output_tokens.tolist() == [2, 2]
    assert ledger.residents["committed"].tolist() == [21, 21]


def test_step_caps_drafts_at_max_new_tokens_and_finishes_on_time(make) -> None:
    ledger, planner = make()
    ledger.submit(1, 20, max_new_tokens=4)
    plan = ledger.step(planner, drafts=8)  # the prompt: no drafts for a prompt
    assert plan.draft_tokens == 0
    plan = ledger.step(planner, drafts=8)  # 1 token out of 4: at most 2 drafts (+1 = 3)
    assert plan.sequences[0].query_length == 3
    ledger.step(planner, accepted=np.array([2], np.int32), drafts=8)
    assert ledger.finished_ids.tolist() == [1]
    assert ledger.count == 0


def test_step_takes_drafts_by_request_id(make) -> None:
    ledger, planner = make()
    ledger.submit(7, 20)
    ledger.submit(9, 20)
    ledger.step(planner)
    plan = ledger.step(planner, drafts={9: 5, 1234: 3})  # 1234: not resident, passed over
    by_id = {int(ledger.request_ids[s.resident]): s.query_length for s in plan.sequences}
    assert by_id == {7: 1, 9: 6}
    ledger.step(planner, accepted=np.array([0, 5], np.int32))
    assert dict(zip(ledger.request_ids.tolist(), ledger.output_tokens.tolist())) == {7: 2, 9: 7}


def test_deadlines_move_by_the_tokens_emitted(make) -> None:
    policy = resolve_scheduling_policy(
        SchedulingOptions(scheduling_policy=SchedulingPolicy.DEADLINE), LIMITS
    )
    ledger, planner = make(policy)
    ledger.submit(1, 20, slo=SLO(ttft=1.0, tpot=0.1), arrival_time=0.0)
    ledger.step(planner, now=0.0)
    plan = ledger.step(planner, drafts=3, now=0.5)  # the first token came at 0.5: on time
    assert plan.sequences[0].query_length == 4
    # Tokens 2..5 are due at 1.1, 1.2, 1.3, 1.4: all four at 1.15 is late for the first only,
    # which relegates; at 1.05 none is late.
    ledger.step(planner, accepted=np.array([3], np.int32), drafts=0, now=1.05)
    assert ledger.relegated_ids.tolist() == []
    assert ledger.output_tokens.tolist() == [5]
    # Five tokens out: the sixth is due at 1.5 (had the count moved by one, at 1.2).
    ledger.step(planner, now=1.45)
    assert ledger.relegated_ids.tolist() == []
    ledger.step(planner, now=1.65)  # the seventh was due at 1.6
    assert ledger.relegated_ids.tolist() == [1]


@pytest.mark.parametrize(
    ("accepted", "error", "words"),
    [
        (np.array([4, 0], np.int32), ValueError, "accepted[0]=4 for plan row 0 (resident 0)"),
        (np.array([-1, 0], np.int32), ValueError, "allowed: 0..3"),
        (np.array([0], np.int32), ValueError, "accepted has shape (1,); allowed: (2,)"),
        (np.array([0, 0], np.int64), TypeError, "a 1-D numpy int32 array in native byte order"),
        ([0, 0], TypeError, "got list"),
    ],
)
def test_bad_accepted_counts_leave_the_ledger_as_it_was(make, accepted, error, words) -> None:
    ledger, planner = decoding(make)
    plan = planner.plan(ledger.residents, drafts=[3, 0])
    before = (ledger.to_records(), ledger.output_tokens.tolist())
    with pytest.raises(error) as raised:
        ledger.apply(plan, accepted=accepted)
    assert words in str(raised.value)
    assert (ledger.to_records(), ledger.output_tokens.tolist()) == before


def test_accepting_past_max_new_tokens_is_refused(make) -> None:
    ledger, planner = decoding(make, max_new=3)
    plan = planner.plan(ledger.residents, drafts=[4, 0])  # planned without step()'s cap
    before = ledger.to_records()
    with pytest.raises(ValueError, match=r"would emit 4 tokens with 1 of its max_new_tokens=3"):
        ledger.apply(plan, accepted=np.array([3, 0], np.int32))
    assert ledger.to_records() == before
    ledger.apply(plan, accepted=np.array([1, 0], np.int32))
    assert ledger.finished_ids.tolist() == [1]


@pytest.mark.parametrize(
    ("drafts", "error", "words"),
    [
        (-1, ValueError, "drafts=-1"),
        (1.5, TypeError, "drafts must be an int"),
        ({1: -2}, ValueError, "drafts[1]=-2"),
        ({1: "x"}, TypeError, "drafts[1] must be an integer"),
    ],
)
def test_bad_step_drafts_leave_the_ledger_as_it_was(make, drafts, error, words) -> None:
    ledger, planner = make()
    ledger.submit(1, 20)
    ledger.step(planner)
    before = ledger.to_records()
    with pytest.raises(error) as raised:
        ledger.step(planner, drafts=drafts)
    assert words in str(raised.value)
    assert ledger.to_records() == before
    plan = ledger.step(planner, drafts=2)  # the pending plan is still there to apply
    assert plan.sequences[0].work == SequenceWork.DECODE
    assert plan.sequences[0].query_length == 3


def test_an_empty_plan_takes_an_empty_accepted(make) -> None:
    ledger, planner = make()
    plan = planner.plan(ledger.residents, drafts=[])
    assert ledger.apply(plan, accepted=np.zeros(0, np.int32)).tolist() == []


# --- issue 41: drafts by id for requests that are not decoding this step; accepted read once --


def test_drafts_for_a_prefilling_resident_are_passed_over(make) -> None:
    # A proposer makes drafts for the requests that decoded last step; by this step's plan one of
    # them may be prefilling (admitted by this step), waiting or gone: each entry that names no
    # decoding resident is passed over, as one for a non-resident is.
    ledger, planner = make()
    ledger.submit(7, 20)
    ledger.step(planner)  # 7's prompt
    ledger.submit(9, 40)
    plan = ledger.step(planner, drafts={7: 2, 9: 5})  # 9 is admitted here: a prompt
    by_id = {int(ledger.request_ids[s.resident]): s for s in plan.sequences}
    assert by_id[7].work == SequenceWork.DECODE and by_id[7].query_length == 3
    assert by_id[9].work == SequenceWork.CONTEXT
    assert plan.draft_tokens == 2


def test_drafts_for_a_waiting_request_are_passed_over(make) -> None:
    ledger, planner = make()
    for rid in range(1, 6):  # B = 4: request 5 waits
        ledger.submit(rid, 20)
    ledger.step(planner)
    plan = ledger.step(planner, drafts={5: 3, 1: 1})
    assert ledger.waiting == 1
    assert plan.draft_tokens == 1


def test_drafts_naming_a_prefilling_resident_lose_no_shed_request_under_deadline(make) -> None:
    # The case: under DEADLINE the step hands a relegated request back (shed_ids) before
    # it plans; a step that then raised on the entry lost it (no later shed_ids named it). Now
    # the entry is passed over and the step reports what it shed.
    options = SchedulingOptions(
        scheduling_policy=SchedulingPolicy.DEADLINE, max_num_tokens=32, max_chunk_tokens=16
    )
    policy = resolve_scheduling_policy(options, LIMITS)
    ledger, planner = make(policy, relegated_wait=0.0, step_time=(0.01, 0.0))
    slo = SLO(ttft=100.0, tpot=1.0)
    ledger.submit(1, 20, slo=slo, arrival_time=0.0)
    ledger.step(planner, now=0.0)  # 1's prompt; from now on 1 decodes, 31 tokens for prompts
    for rid in (2, 3, 4):  # every slot taken; a prompt of 60 advances 16 a step at most
        ledger.submit(rid, 60, slo=slo, arrival_time=0.0)
    ledger.submit(5, 60, 1, slo=SLO(ttft=0.1, tpot=1.0), arrival_time=0.0)  # a lower class: waits
    ledger.step(planner, now=0.0)
    assert ledger.waiting_ids() == [5]
    assert not ledger.residents["context_committed"][1]  # request 2: prefilling
    plan = ledger.step(planner, drafts={1: 1, 2: 4}, now=0.5)  # 5 can no longer make it
    assert plan.draft_tokens == 1
    assert ledger.shed_ids.tolist() == [5]
    assert ledger.waiting == 0


@pytest.mark.parametrize(
    ("drafts", "error", "words"),
    [
        ({7: -1}, ValueError, "drafts[7]=-1"),
        ({7: 2**31}, OverflowError, "drafts[7]"),
        ({7: 1.0}, TypeError, "drafts[7]"),
        ({"x": 1}, TypeError, "request_id"),
    ],
)
def test_bad_draft_values_are_refused_by_request_id_before_anything_changes(
    make, drafts, error, words
) -> None:
    ledger, planner = make()
    ledger.submit(7, 20)
    ledger.step(planner)
    ledger.submit(8, 20)  # waiting: a step that went ahead would admit it
    before = (ledger.to_records(), ledger.waiting_ids())
    with pytest.raises(error) as raised:
        ledger.step(planner, drafts=drafts)
    assert words in str(raised.value)
    assert (ledger.to_records(), ledger.waiting_ids()) == before


@pytest.mark.parametrize("order", [">i4", "<i4"])
def test_accepted_in_a_foreign_byte_order_is_refused(make, order) -> None:
    ledger, planner = decoding(make)
    plan = planner.plan(ledger.residents, drafts=[3, 0])
    accepted = np.array([2, 0], dtype=order)
    if accepted.dtype.isnative:
        ledger.apply(plan, accepted=accepted)  # the native spelling is int32 itself
        assert ledger.output_tokens.tolist() == [1 + 3, 1 + 1]
        return
    before = (ledger.to_records(), ledger.output_tokens.tolist())
    with pytest.raises(TypeError, match=r"dtype >i4 \(non-native byte order\)"):
        ledger.apply(plan, accepted=accepted)
    with pytest.raises(TypeError, match=r"non-native byte order"):
        ledger.apply(plan, accepted=np.array([2**24, 0], dtype=order))
    assert (ledger.to_records(), ledger.output_tokens.tolist()) == before


def test_accepted_aliasing_the_residents_is_read_once(make) -> None:
    # accepted over the ledger's own rows: the counts are the ones checked, read before the plan
    # is applied (the compiled ledger read them again after writing the rows).
    ledger, planner = decoding(make, prompts=(20,), max_new=3)
    plan = planner.plan(ledger.residents, drafts=[1])  # verifies 1 draft
    words = ledger.residents.view(np.int32)
    field = ledger.residents.dtype.fields["consecutive_paused_steps"][1] // 4
    accepted = words[field : field + 1]  # the row's consecutive_paused_steps, 0 now
    assert accepted.tolist() == [0]
    ledger.residents["consecutive_paused_steps"] = 1  # accepted reads 1 (all it verified)
    ledger.apply(plan, accepted=accepted)
    assert ledger.output_tokens.tolist() == [1 + 2]  # 1 accepted + 1: max_new_tokens exactly
    assert ledger.residents["committed"].tolist() == [20 + 2]
