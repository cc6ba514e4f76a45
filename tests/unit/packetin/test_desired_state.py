"""packetin.desired_state.settle and packetin.refusals: what a partly refused batch leaves behind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp

from packetin.desired_state import DesiredState, settle
from packetin.errors import OpenFlowError
from packetin.refusals import meter_exists, refusal


def refused(err_type: int = ofp.OFPET_BAD_ACTION, code: int = ofp.OFPBAC_BAD_OUT_PORT, xid: int = 7,
            what: str = "meter_id=1") -> OpenFlowError:
    return refusal(SimpleNamespace(type=err_type, code=code), None, what, xid)


def test_confirmed_installs_enter_and_refused_ones_leave_then_the_first_refusal_is_raised() -> None:
    store = {"stale": "old", "b": "old b"}
    first, second = refused(xid=1, what="b"), refused(xid=2, what="c")
    with pytest.raises(OpenFlowError) as info:
        settle(store, ["a", "b", "c"], ["new a", "new b", "new c"], {2: second, 1: first})
    assert info.value is first
    assert store == {"stale": "old", "a": "new a"}


def test_confirmed_deletes_leave_and_refused_deletes_stay() -> None:
    store = {"a": 1, "b": 2}
    with pytest.raises(OpenFlowError):
        settle(store, ["a", "b"], None, {1: refused()})
    assert store == {"b": 2}


def test_a_clean_batch_raises_nothing() -> None:
    store: dict[str, int] = {}
    settle(store, ["a"], [1], {})
    assert store == {"a": 1}


def test_refusal_names_the_message_and_keeps_the_reply() -> None:
    reply = SimpleNamespace(type=ofp.OFPET_METER_MOD_FAILED, code=ofp.OFPMMFC_METER_EXISTS)
    err = refusal(reply, object(), "meter_id=3 rate=10pktps burst=0", 42)
    assert str(err) == "switch refused object xid=42 (meter_id=3 rate=10pktps burst=0): error type 12 code 1"
    assert (err.err_type, err.err_code, err.xid, err.reply) == (12, 1, 42, reply)
    assert meter_exists(err)


def test_desired_state_is_empty_until_something_is_confirmed() -> None:
    state = DesiredState()
    assert not state and state.describe() == "0 meters, 0 flows"
    state.meters[1] = object()  # type: ignore[assignment]
    assert state and state.describe() == "1 meters, 0 flows"
