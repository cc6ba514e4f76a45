"""The switch's OFPT_ERROR replies as OpenFlowError, which of them mean "already exists", and the
ADD-else-MODIFY that acts on those."""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Protocol, Sequence

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


Batch = Callable[[list[tuple[Any, str]]], Awaitable[dict[int, OpenFlowError]]]


async def add_or_modify(batch: Batch, specs: Sequence[Any], build: Callable[[Any, int], Any],
                        add: int, modify: int, exists: Callable[[OpenFlowError], bool]) -> dict[int, OpenFlowError]:
    """ADD each spec through `batch` (the channel's: messages, then a barrier; refusals by index);
    MODIFY the ones the switch says exist. Returns the refusals left, by index."""
    refused = await batch([(build(x, add), x.describe()) for x in specs])
    again = [i for i, err in refused.items() if exists(err)]
    if again:
        retry = await batch([(build(specs[i], modify), specs[i].describe()) for i in again])
        for n, i in enumerate(again):
            if n in retry:
                refused[i] = retry[n]
            else:
                del refused[i]
    return refused
