"""packetin.groups: the bytes key of grouped packet-ins read in overload, checked against the full decoder.

Messages are built like OVS 3.1 sends them in the new-key flood (packet, table_id, cookie,
reason, metadata with in_port, registers and the conntrack fields, userdata), and varied
in everything the key keeps and everything it must ignore. Two messages with one key must
decode (packetin.wire) to the same packet-in but for the frame; the audit pipeline must
write the same records and counts from groups as from the packet-ins one by one; the
demux must count groups per packet-in exactly as it counts single packet-ins.
"""

from __future__ import annotations

import asyncio
import logging
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)


from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.overload import Overload  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from packetin import wire  # noqa: E402
from packetin.demux import Demux, FairShareSettings  # noqa: E402
from packetin.errors import DecodeError  # noqa: E402
from packetin.groups import PacketInGroup, group_key, split_read  # noqa: E402
from packetin.model import Category, Flags, PacketIn  # noqa: E402
from tests.support.audit_overload import context  # noqa: E402
from tests.support.audit_pipeline import Writer  # noqa: E402
from tests.support.packet_ins import AT, frame, message  # noqa: E402

def fields_but_frame(pin: PacketIn) -> tuple:
    return pin._replace(packet=b"")


FLOOD = st.builds(
    lambda src, dst, l4, dport, ident, payload, frag, vlan, in_port, reg6, reg7, flags, ct, cookie, nxm, cut, xid:
        message(frame(src, dst, l4, dport, ident, payload, frag, vlan), in_port=in_port, reg6=reg6, reg7=reg7,
                flags=flags, ct_tp_dst=ct, cookie=cookie, nxm_regs=nxm, full_len=cut, xid=xid),
    st.sampled_from(["10.0.0.1", "10.0.0.3"]), st.sampled_from(["10.0.0.2", "10.0.0.4"]),
    st.sampled_from(["udp", "udp", "tcp", "tcpopt", "tcpcut", "icmp", "gre"]), st.integers(1024, 1040),
    st.integers(0, 0xFFFF), st.sampled_from([0, 8]), st.sampled_from([0, 0, 0, 0x2000, 0x4000, 5]),
    st.sampled_from([False, False, False, True]), st.sampled_from([1, 2]), st.sampled_from([7, 8]),
    st.sampled_from([0, 1, 2]), st.sampled_from([int(Flags.LOG), int(Flags.LOG | Flags.OFFLOAD_ELIGIBLE)]),
    st.integers(0, 0xFFFF), st.sampled_from([3, 4]), st.booleans(), st.sampled_from([None, None, 1500]),
    st.integers(0, 0xFFFFFFFF))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FLOOD, min_size=2, max_size=12))
def test_messages_with_one_key_decode_alike_but_for_the_frame(msgs: list[bytes]) -> None:
    by_key: dict = {}
    for raw in msgs:
        key = group_key(raw)
        pin = wire.decode_packet_in2(raw, AT)
        if key is None:
            continue
        f = pin.packet
        assert f[12:14] == b"\x08\x00" and f[14] >> 4 == 4 and not (f[20] & 0x3F or f[21]), "untagged IPv4, no fragment"
        by_key.setdefault(key, []).append(pin)
    for pins in by_key.values():
        first = pins[0]
        for other in pins[1:]:
            assert fields_but_frame(other) == fields_but_frame(first)
            a, b = first.packet, other.packet
            assert (len(a), a[14], a[23], a[26:34]) == (len(b), b[14], b[23], b[26:34])


def test_a_flood_of_new_ports_is_one_group_and_what_the_record_keeps_splits_it() -> None:
    base = dict(src="10.246.0.2", dst="10.246.0.3", l4="udp")
    flood = [message(frame(**base, dport=port, ident=port), ct_tp_dst=port, xid=port) for port in range(1024, 1124)]
    assert len({group_key(m) for m in flood}) == 1
    one = frame(**base, dport=1024)
    different = [message(frame(src="10.246.0.9", dst="10.246.0.3", l4="udp", dport=1024)),
                 message(frame(src="10.246.0.2", dst="10.246.0.9", l4="udp", dport=1024)),
                 message(frame(**base, dport=1024, payload=9)), message(frame(src="10.246.0.2", dst="10.246.0.3",
                                                                             l4="tcp", dport=1024)),
                 message(one, in_port=2), message(one, reg6=8), message(one, reg7=2), message(one, cookie=4),
                 message(one, flags=int(Flags.LOG | Flags.REJECT)), message(one, full_len=1500)]
    assert len({group_key(m) for m in flood[:1] + different}) == 1 + len(different)
    for kept_out in (message(frame(**base, dport=1024, frag=0x2000)), message(frame(**base, dport=1024, vlan=True)),
                     message(frame(src="10.246.0.2", dst="10.246.0.3", l4="udp", dport=1024), xid=1)[:-1]):
        assert group_key(kept_out) is None


def test_split_read_decodes_one_per_group_and_keeps_order() -> None:
    flood = [message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port) for port in range(1024, 1034)]
    other = [message(frame("10.0.0.3", "10.0.0.2", "udp", 9)), message(frame("10.0.0.1", "10.0.0.2", "udp", 9, vlan=True))]
    groups, rest = split_read([flood[0], other[0], *flood[1:], other[1]], AT, lambda n, e: None)
    assert [g.size for g in groups] == [10, 1]
    assert groups[0].sample == wire.decode_packet_in2(flood[0], AT)
    assert groups[0].packet_ins() == [wire.decode_packet_in2(m, AT) for m in flood]
    assert rest == [other[1]]
    assert groups[0].pick([2, 5]).packet_ins() == [wire.decode_packet_in2(flood[i], AT) for i in (2, 5)]
    assert groups[0].pick([]) is None and groups[0].head(3).raws == flood[:3]


def texts(writer: Writer) -> list[str]:
    """Record texts without event.id (each encoder numbers from a random prefix of its own)."""
    return [re.sub(r'"id":"[0-9a-f]{32}"', "", r.head + r.mid + r.tail) for r in writer.records]


def pipeline(level_backlog: float) -> tuple[AuditPipeline, Writer]:
    writer = Writer()
    overload = Overload(lambda: level_backlog, high_mark=0.5, peers_mark=0.8, low_mark=0.1)
    return AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload, wall_clock=lambda: AT + 9), writer


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(FLOOD, min_size=1, max_size=10), min_size=1, max_size=4),
       st.sampled_from([0.6, 0.9, 0.0]))
def test_the_pipeline_writes_the_same_records_from_groups_as_one_by_one(reads: list[list[bytes]], backlog: float
                                                                         ) -> None:
    """Ports level (0.6), peers level (0.9), and full detail (0.0: groups are taken one by one).
    The reader hands a read's ungrouped packet-ins over before its groups (one receive time for
    all): one by one in that order gives the same records, in the same order, and counts."""
    single, single_out = pipeline(backlog)
    grouped, grouped_out = pipeline(backlog)
    for i, read in enumerate(reads):
        at = AT + i * 0.4  # several reads per window, and windows closing
        groups, rest = split_read(read, at, lambda n, e: None)
        for raw in rest + [raw for g in groups for raw in g.raws]:
            try:
                single(wire.decode_packet_in2(raw, at))
            except DecodeError:
                pass
        for raw in rest:
            try:
                grouped(wire.decode_packet_in2(raw, at))
            except DecodeError:
                pass
        for g in groups:
            grouped.handle_group(g)
    asyncio.run(single.close())
    asyncio.run(grouped.close())
    assert texts(grouped_out) == texts(single_out)
    assert grouped.stats == single.stats


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 120), st.integers(1, 120), st.integers(1, 3), st.booleans())
def test_the_demux_counts_a_group_as_its_packet_ins(queue_size: int, burst: int, reads: int, fair: bool) -> None:
    """The same outcomes, packet-in by packet-in, as `dispatch` gives the decoded packet-ins:
    the channel's room (a group takes as many places as it holds), tokens, fair shares."""
    flood = [message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port) for port in range(1024, 1064)]
    results, delivered = [], []
    for grouped in (False, True):
        got: list[PacketIn] = []

        class Takes:
            def __call__(self, pin: PacketIn) -> None:
                got.append(pin)

            def handle_group(self, group: PacketInGroup) -> None:
                got.extend(group.packet_ins())

        demux = Demux()
        share = FairShareSettings(lambda pin: pin.rule_id, key_rate=1.0, key_burst=max(1, burst // 2),
                                  max_keys=16) if fair else None
        demux.subscribe(Category.POLICY, Takes(), rate=1.0, burst=float(burst), queue_size=queue_size, now=0.0,
                        fair=share)
        for r in range(reads):
            if grouped:
                demux.dispatch_groups(split_read(flood, AT, lambda n, e: None)[0], float(r))
            else:
                demux.dispatch([wire.decode_packet_in2(m, AT) for m in flood], float(r))
            assert demux.queue_depths()[Category.POLICY] <= queue_size
        asyncio.run(demux.stop())
        results.append(demux.stats()[Category.POLICY])
        delivered.append(got)
    assert results[0] == results[1]
    assert delivered[0] == delivered[1]


def test_a_handler_without_handle_group_gets_every_packet_in() -> None:
    flood = [message(frame("10.0.0.1", "10.0.0.2", "udp", port), ct_tp_dst=port) for port in range(1024, 1034)]
    got: list[PacketIn] = []
    demux = Demux()
    demux.subscribe(Category.POLICY, got.append, rate=1e9, burst=1e9, queue_size=100, now=0.0)
    demux.dispatch_groups(split_read(flood, AT, lambda n, e: None)[0], 0.0)
    assert demux.queue_fill(Category.POLICY) == 0.1
    asyncio.run(demux.stop())
    assert got == [wire.decode_packet_in2(m, AT) for m in flood]
    assert demux.stats()[Category.POLICY]["delivered"] == 10 and demux.queue_fill(Category.POLICY) == 0.0
