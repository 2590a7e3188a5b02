"""ResidentState, on both implementations: construction, defaults, attributes, repr, equality,
pickling."""

from __future__ import annotations

import copy
import pickle

import pytest

FIELDS = (
    "priority",
    "arrival",
    "prompt_length",
    "committed",
    "context_committed",
    "consecutive_paused_steps",
)
VALUES = {
    "priority": -3,
    "arrival": 2**64 - 1,
    "prompt_length": 40,
    "committed": 17,
    "context_committed": True,
    "consecutive_paused_steps": 2,
}


def test_defaults(core):
    r = core.ResidentState()
    assert [getattr(r, f) for f in FIELDS] == [0, 0, 0, 0, False, 0]
    assert r.context_committed is False


def test_keyword_and_positional_construction(core):
    by_kw = core.ResidentState(**VALUES)
    by_pos = core.ResidentState(*VALUES.values())
    assert [getattr(by_kw, f) for f in FIELDS] == list(VALUES.values())
    assert by_kw == by_pos


def test_attributes_are_writable(core):
    r = core.ResidentState()
    for field, value in VALUES.items():
        setattr(r, field, value)
    assert r == core.ResidentState(**VALUES)
    r.context_committed = 0
    assert r.context_committed is False


def test_unknown_attribute(core):
    r = core.ResidentState()
    with pytest.raises(AttributeError):
        r.prompt = 3
    with pytest.raises(TypeError):
        core.ResidentState(prompt=3)


def test_repr_round_trips(core):
    r = core.ResidentState(**VALUES)
    text = repr(r)
    assert text == (
        "ResidentState(priority=-3, arrival=18446744073709551615, prompt_length=40, "
        "committed=17, context_committed=True, consecutive_paused_steps=2)"
    )
    assert eval(text, {"ResidentState": core.ResidentState}) == r


def test_equality(core, compiled, reference):
    a, b = core.ResidentState(**VALUES), core.ResidentState(**VALUES)
    assert a == b and not a != b  # noqa: SIM202 - __ne__ is under test, not only __eq__
    b.committed += 1
    assert a != b
    assert a != (tuple(VALUES.values()))
    # the two implementations' states compare by value
    assert compiled.ResidentState(**VALUES) == reference.ResidentState(**VALUES)


def test_unhashable_because_mutable(core):
    with pytest.raises(TypeError):
        hash(core.ResidentState())


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle(core, protocol):
    r = core.ResidentState(**VALUES)
    back = pickle.loads(pickle.dumps(r, protocol))
    assert type(back) is core.ResidentState and back == r and back is not r


def test_copy(core):
    r = core.ResidentState(**VALUES)
    c = copy.copy(r)
    c.committed = 0
    assert r.committed == 17 and copy.deepcopy(r) == r
