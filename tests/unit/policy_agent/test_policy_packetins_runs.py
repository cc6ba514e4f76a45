"""A read's packet-ins handed over in runs (PolicyPacketIns.handle_run, the demux's _drain_runs): the pipeline takes
runs of plain logged packet-ins in one call, everything else gets what it got one by one, in the same order, with
every failure counted once."""

from __future__ import annotations

import random
from typing import Any

import pytest
from scapy.all import IP, TCP, Ether, raw

from packetin import layouts, wire
from packetin.demux import DELIVERED, HANDLER_ERROR, RECEIVED, Demux
from packetin.groups import PacketInGroup
from packetin.model import Category, Flags, PacketIn, Userdata
from policy_agent.policy_packetins import PolicyPacketIns
from tests.support.packet_ins import AT, frame, message

FLOOD = [message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port) for port in range(1024, 1028)]
SYN = raw(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.0.0.1", dst="10.0.0.2")
          / TCP(sport=1, dport=2, flags="S"))


def pin(n: int, flags: int | None = int(Flags.LOG)) -> PacketIn:
    ud = b"" if flags is None else Userdata(category=0, flags=flags, rule_id=7).encode()
    return PacketIn(reason=0, table_id=20, cookie=1, in_port=3, rule_id=7, reg7=1, userdata=ud, packet=SYN,
                    total_len=len(SYN), received_at=float(n))


class RunAudit:
    """The pipeline's side: __call__ one by one, take_run for runs (stopping where told), both noted in order."""

    def __init__(self, stop_at: set[float] | None = None, fail_run: bool = False, fail_one: bool = False) -> None:
        self.seen: list[tuple[str, float]] = []
        self.runs: list[tuple[int, int]] = []
        self.takes_runs = True
        self._stop_at, self._fail_run, self._fail_one = stop_at or set(), fail_run, fail_one

    def __call__(self, p: PacketIn) -> None:
        if self._fail_one:
            raise RuntimeError("one")
        self.seen.append(("one", p.received_at))

    def take_run(self, pins: list[PacketIn], start: int, end: int) -> int:
        if self._fail_run:
            raise RuntimeError("run")
        self.runs.append((start, end))
        for i in range(start, end):
            if pins[i].received_at in self._stop_at:
                return i
            self.seen.append(("run", pins[i].received_at))
        return end

    def begin_batch(self) -> None:
        pass

    def end_batch(self) -> None:
        pass


def handle(ppi: PolicyPacketIns, items: list[Any]) -> tuple[int, int, list[int]]:
    failures: list[int] = []
    ppi.begin_batch()
    stop, errors = ppi.handle_run(items, 0, len(items), lambda: failures.append(1))
    ppi.end_batch()
    return stop, errors, failures


def test_the_end_of_a_run_of_plain_logged_packet_ins_is_the_same_in_c_and_python() -> None:
    rng = random.Random(5)
    group = PacketInGroup(pin(0), [b""])
    kinds = [pin(0), pin(0, None), pin(0, int(Flags.REJECT)), pin(0, int(Flags.REJECT | Flags.LOG)), pin(0, 0),
             pin(0)._replace(userdata=b"\x09\x00\x00\x00\x00\x00\x09"), pin(0)._replace(userdata=b"\x01\x00"),
             pin(0)._replace(userdata=bytearray(Userdata(category=0, flags=2, rule_id=7).encode())), group]
    c = layouts.logged_run_end()
    assert c is not layouts._py_logged_run_end  # built here: `make setup` compiles packetin._layout_fast
    for _ in range(300):
        items = [rng.choice(kinds) for _ in range(rng.randrange(0, 12))]
        start = rng.randrange(0, len(items) + 1)
        assert c(items, start, len(items)) == layouts._py_logged_run_end(items, start, len(items))
    assert c([pin(0)] * 3 + [pin(0, int(Flags.REJECT | Flags.LOG))], 0, 4) == 3
    assert c([pin(0, None), pin(0)._replace(userdata=b"\x09\x00\x02\x00\x00\x00\x09")], 0, 2) == 2  # not ours
    assert c([pin(0), group, pin(0)], 0, 3) == 1


def test_rejects_go_one_by_one_between_runs_and_everything_keeps_its_order() -> None:
    sent: list[Any] = []
    audit = RunAudit()
    ppi = PolicyPacketIns(lambda m: sent.append(m) or 1, audit=audit)
    items = [pin(0), pin(1), pin(2, int(Flags.REJECT | Flags.LOG)), pin(3, None), pin(4),
             pin(5, int(Flags.REJECT)), pin(6, 0), pin(7)]
    stop, errors, failures = handle(ppi, items)
    assert (stop, errors, failures) == (8, 0, [])
    assert audit.seen == [("run", 0.0), ("run", 1.0), ("one", 2.0), ("run", 3.0), ("run", 4.0), ("run", 7.0)]
    assert audit.runs == [(0, 2), (3, 5), (7, 8)]
    assert len(sent) == 2 and ppi.answered == 2  # both rejects answered, out of their in_port
    assert all(m.actions[0].port == 3 for m in sent)


def test_a_packet_in_the_pipeline_stops_at_goes_to_call_and_the_run_goes_on_after_it() -> None:
    audit = RunAudit(stop_at={2.0})
    ppi = PolicyPacketIns(lambda m: 0, audit=audit)
    assert handle(ppi, [pin(n) for n in range(5)])[:2] == (5, 0)
    assert audit.seen == [("run", 0.0), ("run", 1.0), ("one", 2.0), ("run", 3.0), ("run", 4.0)]


def test_a_group_ends_what_handle_run_takes() -> None:
    audit = RunAudit()
    ppi = PolicyPacketIns(lambda m: 0, audit=audit)
    items: list[Any] = [pin(0), pin(1, int(Flags.REJECT)), PacketInGroup(pin(2), [b""]), pin(3)]
    assert handle(ppi, items)[:2] == (2, 0)
    assert audit.seen == [("run", 0.0)]


@pytest.mark.parametrize("why", ["tap", "offload", "trace", "no runs now"])
def test_while_anything_else_may_act_on_them_packet_ins_go_one_by_one(why: str) -> None:
    audit = RunAudit()
    tapped: list[float] = []

    class Offload:
        active = why == "offload"

        def __call__(self, p: PacketIn) -> None:
            pass

    ppi = PolicyPacketIns(lambda m: 0, audit=audit, tap=(lambda p: tapped.append(p.received_at)) if why == "tap"
                          else None, offload=Offload(), suppress=lambda p: p.received_at == 1.0,
                          may_suppress=lambda: why == "trace")
    audit.takes_runs = why != "no runs now"
    assert handle(ppi, [pin(n) for n in range(3)])[:2] == (3, 0)
    assert audit.runs == []
    kept = [0.0, 2.0] if why == "trace" else [0.0, 1.0, 2.0]  # a trace's packet is neither logged nor answered
    assert audit.seen == [("one", t) for t in kept]
    assert tapped == (kept if why == "tap" else [])


def test_each_failure_is_counted_once_and_told() -> None:
    ppi = PolicyPacketIns(lambda m: 0, audit=RunAudit(fail_one=True))
    assert handle(ppi, [pin(0, int(Flags.REJECT | Flags.LOG)), pin(1), pin(2, int(Flags.REJECT | Flags.LOG))]) == \
        (3, 2, [1, 1])
    ppi = PolicyPacketIns(lambda m: 0, audit=RunAudit(fail_run=True))
    assert handle(ppi, [pin(0), pin(1), pin(2, 0), pin(3)]) == (4, 3, [1, 1])  # two runs (3 packet-ins), told twice


def demux_with(audit: RunAudit) -> tuple[Demux, Any]:
    demux = Demux(inline_max=0)
    demux.subscribe(int(Category.POLICY), PolicyPacketIns(lambda m: 0, audit=audit), rate=1e9, burst=1e9,
                    queue_size=1000, now=0.0)
    return demux, demux._subs[int(Category.POLICY)]


def test_the_demux_counts_a_slice_of_runs_and_groups_as_one_by_one() -> None:
    audit = RunAudit()
    demux, sub = demux_with(audit)
    group = PacketInGroup(wire.decode_packet_in2(FLOOD[0], AT), FLOOD[:4])
    demux.dispatch([pin(n) for n in range(3)], now=0.0)
    demux.dispatch_groups([group], now=0.0)
    demux.dispatch([pin(n) for n in range(10, 12)], now=0.0)
    assert sub.in_groups == 3 and len(sub.queue) == 6
    demux._drain(sub, 100)
    assert sub.counts[RECEIVED] == sub.counts[DELIVERED] == 9 and sub.counts[HANDLER_ERROR] == 0
    assert sub.in_groups == 0 and not sub.queue
    assert audit.runs == [(0, 3), (4, 6)]
    assert [t for how, t in audit.seen if how == "run"] == [0.0, 1.0, 2.0, 10.0, 11.0]
    assert len([how for how, _ in audit.seen if how == "one"]) == 4  # the group's, one by one (no handle_group)


def test_the_demux_counts_what_a_failing_run_handler_lost_as_failed() -> None:
    audit = RunAudit()
    demux, sub = demux_with(audit)
    demux.dispatch([pin(n) for n in range(3)], now=0.0)
    demux.dispatch_groups([PacketInGroup(wire.decode_packet_in2(FLOOD[0], AT), FLOOD[:4])], now=0.0)

    def broken(items: list[Any], start: int, end: int, failed: Any) -> tuple[int, int]:
        raise RuntimeError("broken")

    sub.run_handler = broken
    demux._drain(sub, 100)
    assert sub.counts[RECEIVED] == sub.counts[HANDLER_ERROR] == 7 and sub.counts[DELIVERED] == 0
    assert sub.in_groups == 0 and not sub.queue
