"""Category-0 (policy) packet-ins: Reject answered, LOG-flagged ones audited, the debug tap.

OVS copies a rejected packet to the agent (userdata flag REJECT) and drops it;
the agent sends the answer (policy/reject.py) back out of the port the packet came in on.
A packet-in is audited only when its rule logs (flag LOG), or when it carries no
userdata of ours (then the reason code routed it and nothing says otherwise).
"""

from __future__ import annotations

import json
from typing import Any, Callable, TextIO

from packetin.groups import PacketInGroup
from packetin.layouts import logged_run_end
from packetin.messages import packet_out
from packetin.model import Flags, PacketIn
from policy_agent.policy.reject import build_reject

Handler = Callable[[PacketIn], None]

_REJECT = int(Flags.REJECT)  # plain ints: IntFlag arithmetic costs on every packet-in
_LOG = int(Flags.LOG)


class PolicyPacketIns:
    """The category-0 subscriber: dispatches each packet-in on its userdata flags.

    `send` is the channel's fire-and-forget send (a packet-out). `audit`, `offload`
    (the XDP drop offload, which caches floods of logged Drops) and `tap` receive the
    packet-ins that are to be logged; a Reject is answered whether or not its rule logs.
    """

    def __init__(self, send: Callable[[Any], int], *, audit: Handler | None = None,
                 tap: Handler | None = None, offload: Handler | None = None,
                 suppress: Callable[[PacketIn], bool] | None = None,
                 may_suppress: Callable[[], bool] | None = None,
                 answer_out: Callable[[bytes, int], Any] | None = None) -> None:
        self._send = send
        # The packet-out for a Reject's answer when plain "out of the in_port" is not enough (the
        # tunnel port needs the sending node's address); None from it: the plain one.
        self._answer_out = answer_out
        self._logged = tuple(h for h in (audit, offload, tap) if h is not None)
        # While the offload is not running (`active` False) its call is a no-op: a batch skips it.
        self._offload = offload if hasattr(offload, "active") else None
        self._logged_idle_offload = tuple(h for h in (audit, tap) if h is not None)
        # Logged handlers that take a batch of packet-ins (one read) as one: the audit pipeline.
        self._batched = tuple(h for h in self._logged if hasattr(h, "begin_batch") and hasattr(h, "end_batch"))
        self._suppress = suppress  # True for a trace's packet (npaudit trace): neither answered nor logged
        # False when `suppress` cannot be True now (no recent trace): grouped packet-ins skip it.
        self._may_suppress = may_suppress
        self.answered = 0
        self.unanswerable = 0
        # What a packet-in goes through now: outside a batch, `suppress` and every logged handler; within
        # one, what begin_batch found could act (no trace packet lately: no suppress; offload idle: not it).
        self._suppress_now = suppress
        self._logged_now = self._logged
        # The audit pipeline takes runs of plain logged packet-ins in one call (take_run) while it is the only
        # logged handler that acts (no tap; the offload idle) and no trace packet may be among them.
        self._runs: Any = audit if audit is not None and hasattr(audit, "take_run") and tap is None else None
        self._run_alone = (audit,)
        self._run_end = logged_run_end()

    def __call__(self, pin: PacketIn) -> None:
        suppress = self._suppress_now
        if suppress is not None and suppress(pin):
            return
        flags = pin.flags
        if flags is not None and flags & _REJECT and pin.in_port is not None:
            answer = build_reject(pin.packet)
            if answer is None:
                self.unanswerable += 1
            else:
                out = self._answer_out(answer, pin.in_port) if self._answer_out is not None else None
                self._send(out if out is not None else packet_out(answer, pin.in_port))
                self.answered += 1
        if flags is None or flags & _LOG:
            for handler in self._logged_now:
                handler(pin)

    def begin_batch(self) -> None:
        """The packet-ins up to `end_batch` are one read's: handlers that batch hand their output over once.
        Whether a trace packet may be among them, and whether the offload runs, is asked once for the batch
        (both change only on the event loop, never while a read's packet-ins are handled)."""
        if self._suppress is not None and self._may_suppress is not None and not self._may_suppress():
            self._suppress_now = None
        if self._offload is not None and not self._offload.active:
            self._logged_now = self._logged_idle_offload
        for handler in self._batched:
            handler.begin_batch()

    def end_batch(self) -> None:
        self._suppress_now = self._suppress
        self._logged_now = self._logged
        for handler in self._batched:
            handler.end_batch()

    def lone(self, pin: PacketIn) -> bool:
        """A read's only packet-in, taken as the demux takes a batch of one (begin_batch, __call__, end_batch) when
        it is a plain logged packet-in and no trace packet came lately (no tap: the pipeline is _runs): the
        pipeline's lone, which writes its record before the bookkeeping, then the offload where it runs, as
        __call__ calls them. False, nothing done, otherwise."""
        pipeline = self._runs
        if pipeline is None or self._batched != self._run_alone or self._run_end([pin], 0, 1) != 1:
            return False
        if self._suppress is not None and (self._may_suppress is None or self._may_suppress()):
            return False
        offload = self._offload
        acting = self._logged_idle_offload if offload is not None and not offload.active else self._logged
        take = pipeline.lone
        if acting[0] is not pipeline or not take(pin):
            return False
        for handler in acting[1:]:  # the offload (never a tap here), after the pipeline as in __call__
            handler(pin)
        return True

    def early(self, raw: bytes, wall: float) -> None:
        """Before a lone packet-in is decoded: the pipeline's early (its record written from the message's bytes)
        when lone would hand it to the pipeline, as far as this can tell without the packet-in (the C encoder
        checks that it is a plain logged one)."""
        if (pipeline := self._early_pipeline()) is not None:
            pipeline.early(raw, wall)

    def early_arm(self) -> tuple[Any, ...] | None:
        """What early would use now (AuditPipeline.early_arm: the event loop's quiet wait), else None."""
        pipeline = self._early_pipeline()
        return pipeline.early_arm() if pipeline is not None else None

    def _early_pipeline(self) -> Any:
        pipeline = self._runs
        if pipeline is None or self._batched != self._run_alone or (
                self._suppress is not None and (self._may_suppress is None or self._may_suppress())):
            return None
        offload = self._offload
        acting = self._logged_idle_offload if offload is not None and not offload.active else self._logged
        return pipeline if acting[0] is pipeline else None

    def handle_run(self, items: list[Any], start: int, end: int, failed: Callable[[], None]) -> tuple[int, int]:
        """items[start:end] one read's, in order, as the demux would hand each to __call__, up to the first
        PacketInGroup (the demux takes it): (that index or end, how many packet-ins failed, each
        told to `failed` from inside its except). Runs of plain logged packet-ins (packetin/layouts.py
        logged_run_end) go to the pipeline's take_run as one call when nothing else acts on them now; every other
        packet-in to __call__."""
        pipeline, run_end = self._runs, self._run_end
        errors = 0
        i = start
        while i < end:
            k = i
            if pipeline is not None and self._suppress_now is None and self._logged_now == self._run_alone \
                    and pipeline.takes_runs:
                k = run_end(items, i, end)
                if k > i:
                    try:
                        k = pipeline.take_run(items, i, k)
                    except Exception:  # not expected (the pipeline's own path says what is wrong with a packet-in)
                        errors += k - i
                        failed()
                        i = k
                        continue
                if k >= end:
                    return end, errors
            pin = items[k]
            if isinstance(pin, PacketInGroup):
                return k, errors
            try:
                self(pin)
            except Exception:
                errors += 1
                failed()
            i = k + 1
        return end, errors

    def handle_group(self, group: PacketInGroup) -> None:
        """Packet-ins the reader grouped in overload (packetin/groups.py; they share userdata,
        so flags): as one by one, the group going whole to the logging handlers that take groups.
        Rejects (each gets its answer) and, while a trace may be running, every packet-in go one by one."""
        flags = group.sample.flags
        if (flags is not None and flags & _REJECT) or (
                self._suppress is not None and (self._may_suppress is None or self._may_suppress())):
            for pin in group.packet_ins():
                self(pin)
            return
        if flags is None or flags & _LOG:
            for handler in self._logged:
                take = getattr(handler, "handle_group", None)
                if take is not None:
                    take(group)
                else:
                    for pin in group.packet_ins():
                        handler(pin)


def packet_in_summary(pin: PacketIn) -> dict[str, object]:
    ud = pin.parsed_userdata
    return {
        "received_at": round(pin.received_at, 6),
        "category": pin.category,
        "reason": pin.reason,
        "table_id": pin.table_id,
        "cookie": f"{pin.cookie:#x}",
        "in_port": pin.in_port,
        "rule_id": pin.rule_id,
        "disposition": pin.disposition,
        "userdata": None if ud is None else {"version": ud.version, "category": ud.category,
                                             "flags": ud.flags, "rule_id": ud.rule_id},
        "total_len": pin.total_len,
        "packet": pin.packet[:64].hex(),
    }


class JsonTap:
    """The debug tap (`npaudit agent --tap`): one JSON line per packet-in, like `ovs-ofctl monitor`
    but typed, written to a text stream (line-buffered). Not the audit log."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def __call__(self, pin: PacketIn) -> None:
        self._out.write(json.dumps(packet_in_summary(pin), separators=(",", ":")) + "\n")
        self._out.flush()
