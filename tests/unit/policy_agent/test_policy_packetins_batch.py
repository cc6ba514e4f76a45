"""PolicyPacketIns over a batch (one read): whether a trace packet may be among the packet-ins and whether the
offload runs is asked once per batch; what each packet-in then gets is what it got one by one."""

from __future__ import annotations

from packetin.model import Flags, PacketIn, Userdata
from policy_agent.policy_packetins import PolicyPacketIns

LOGGED = Userdata(category=0, flags=int(Flags.LOG), rule_id=7).encode()


def pin(n: int) -> PacketIn:
    frame = bytes(12) + b"\x08\x00" + bytes([n]) * 20
    return PacketIn(reason=0, table_id=20, cookie=1, in_port=3, rule_id=7, reg7=1, userdata=LOGGED, packet=frame,
                    total_len=len(frame), received_at=1.0)


class Trace:
    """traceflow's suppress / may_suppress: packet-ins whose frame byte 14 is in `tagged` are trace packets."""

    def __init__(self) -> None:
        self.tagged: set[int] = set()
        self.asked = 0

    def may_suppress(self) -> bool:
        return bool(self.tagged)

    def suppress(self, p: PacketIn) -> bool:
        self.asked += 1
        return p.packet[14] in self.tagged


class Offload:
    def __init__(self, active: bool) -> None:
        self.active = active
        self.seen: list[int] = []

    def __call__(self, p: PacketIn) -> None:
        if self.active:  # as DropOffload: a no-op while not running
            self.seen.append(p.packet[14])


class Audit:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.batches = 0

    def __call__(self, p: PacketIn) -> None:
        self.seen.append(p.packet[14])

    def begin_batch(self) -> None:
        self.batches += 1

    def end_batch(self) -> None:
        pass


def rig(offload_active: bool = False) -> tuple[PolicyPacketIns, Trace, Offload, Audit]:
    trace, offload, audit = Trace(), Offload(offload_active), Audit()
    ppi = PolicyPacketIns(lambda m: 0, audit=audit, offload=offload, suppress=trace.suppress,
                          may_suppress=trace.may_suppress)
    return ppi, trace, offload, audit


def batch(ppi: PolicyPacketIns, ns: list[int]) -> None:
    ppi.begin_batch()
    try:
        for n in ns:
            ppi(pin(n))
    finally:
        ppi.end_batch()


def test_no_trace_lately_no_suppress_per_packet_in() -> None:
    ppi, trace, _, audit = rig()
    batch(ppi, [1, 2, 3])
    assert audit.seen == [1, 2, 3] and trace.asked == 0 and audit.batches == 1


def test_a_trace_packet_in_a_batch_is_still_suppressed() -> None:
    ppi, trace, _, audit = rig()
    batch(ppi, [1, 2])
    trace.tagged.add(5)  # a trace starts between two reads
    batch(ppi, [4, 5, 6])
    assert audit.seen == [1, 2, 4, 6] and trace.asked == 3


def test_outside_a_batch_every_packet_in_is_asked() -> None:
    ppi, trace, offload, audit = rig(offload_active=True)
    batch(ppi, [1])
    ppi(pin(2))
    trace.tagged.add(3)
    ppi(pin(3))
    assert audit.seen == [1, 2] and trace.asked == 2 and offload.seen == [1, 2]


def test_an_idle_offload_is_skipped_a_running_one_sees_every_logged_packet_in() -> None:
    ppi, _, offload, audit = rig(offload_active=False)
    batch(ppi, [1, 2])
    assert offload.seen == [] and audit.seen == [1, 2]
    offload.active = True  # loaded between two reads
    batch(ppi, [3, 4])
    assert offload.seen == [3, 4] and audit.seen == [1, 2, 3, 4]
