"""The switch's OFPT_ERROR replies as OpenFlowError, and which of them mean "already exists"."""

from __future__ import annotations

from typing import Protocol

from os_ken.ofproto import ofproto_v1_5 as ofp

from packetin.errors import OpenFlowError


class ErrorReply(Protocol):
    """What an OFPT_ERROR parsed by os-ken carries that we read."""

    type: int
    code: int


def refusal(reply: ErrorReply, msg: object | None, what: str, xid: int) -> OpenFlowError:
    """An OpenFlowError naming the refused message (`msg` None: a plain request)."""
    kind = type(msg).__name__ if msg is not None else "request"
    exc = OpenFlowError(
        f"switch refused {kind} xid={xid} ({what}): error type {reply.type} code {reply.code}",
        err_type=reply.type, err_code=reply.code, xid=xid, failed=f"{kind} {what}",
    )
    exc.reply = reply
    return exc


def raise_first(refused: dict[int, OpenFlowError]) -> None:
    """Raise the refusal of the earliest item of a batch, if any."""
    if refused:
        raise refused[min(refused)]


def meter_exists(err: OpenFlowError) -> bool:
    """An ADD refused because the meter is there already: MODIFY it instead."""
    return err.err_type == ofp.OFPET_METER_MOD_FAILED and err.err_code == ofp.OFPMMFC_METER_EXISTS


def group_exists(err: OpenFlowError) -> bool:
    """An ADD refused because the group is there already: MODIFY it instead."""
    return err.err_type == ofp.OFPET_GROUP_MOD_FAILED and err.err_code == ofp.OFPGMFC_GROUP_EXISTS
