"""Frames lost on a port before ovs-vswitchd read them: the sock_diag dump of packet sockets, per-port totals,
and their place in the loss records."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from auditlog.loss_records import FRAMES, PORT_SOCKET_OVERFLOW, LossKey, loss_record
from policy_agent.limits.losses import LossAccounting
from policy_agent.ovs import port_stats
from policy_agent.ovs.netlink import IFLA_IFNAME, NETLINK_ROUTE, NLMSG_DONE, RTM_NEWLINK
from policy_agent.ovs.port_stats import (IFLA_STATS64, PortDropReader, PortDropTotals, _dump, link_dump_request,
                                         packet_diag_request, parse_link_dump, parse_packet_diag, port_counts)
from tests.support.clock import ManualClock

# The kernel's answer (6.x) to packet_diag_request() for one packet socket bound to ifindex 1:
# packet_diag_msg, then PACKET_DIAG_INFO, PACKET_DIAG_UID and PACKET_DIAG_MEMINFO (drops: 9th u32).
RECORDED = bytes.fromhex(
    "6c0000001400020001000000d91600001103030090b9670008100000000000001c000000010000000000000000000000"
    "000000000000000001000000080005000000000028000600000000000040030000000000004003000000000000000000"
    "000000000000000000000000")


def with_drops(n: int, ifindex: int = 1) -> bytes:
    raw = bytearray(RECORDED)
    struct.pack_into("=I", raw, 16 + 16 + 4, ifindex)
    meminfo = raw.index(bytes.fromhex("28000600")) + 4
    struct.pack_into("=I", raw, meminfo + 4 * 8, n)
    return bytes(raw)


def done() -> bytes:
    return struct.pack("=IHHIIi", 20, NLMSG_DONE, 2, 1, 0, 0)


def test_the_request_dumps_packet_sockets_with_their_interface_and_memory_counters() -> None:
    raw = packet_diag_request()
    length, kind, flags = struct.unpack_from("=IHH", raw)
    family, _, _, _, show = struct.unpack_from("=BBHII", raw, 16)
    assert (length, kind, flags & 0x300, family, show) == (len(raw), 20, 0x300, socket.AF_PACKET, 0x11)


def test_the_recorded_dump_gives_each_interfaces_socket_drops_until_done() -> None:
    assert parse_packet_diag(RECORDED) == ({1: 0}, False)
    assert parse_packet_diag(with_drops(24107, 7) + with_drops(3, 7) + done()) == ({7: 24110}, True)


def test_a_cut_dump_or_a_netlink_error_is_an_error_not_a_count() -> None:
    with pytest.raises(ValueError):
        parse_packet_diag(RECORDED[:60] + struct.pack("=I", 0))
    error = struct.pack("=IHHIIi", 20, 2, 0, 1, 0, -1)
    with pytest.raises(ValueError, match="not permitted"):
        parse_packet_diag(error)


def test_ports_are_named_and_the_kernels_own_drops_come_beside_the_sockets() -> None:
    assert port_counts({7: 5, 9: 1}, {7: ("np1", 2), 8: ("np2", 0)}) == {"np1 socket_dropped": 5,
                                                                          "np1 rx_dropped": 2}


def test_port_totals_baseline_first_then_count_new_ports_in_full_and_restarted_ones_on() -> None:
    totals = PortDropTotals()
    totals.update({"np1 socket_dropped": 100})  # before the agent looked
    totals.update({"np1 socket_dropped": 130, "np2 socket_dropped": 40})  # np2 is new: all 40 are ours
    totals.update({"np1 socket_dropped": 5, "np2 socket_dropped": 40})  # np1 made again
    assert totals.totals == {"np1 socket_dropped": 35, "np2 socket_dropped": 40}


def test_frames_lost_before_the_pipeline_are_their_own_reasons_in_frames() -> None:
    record = loss_record({LossKey("all", PORT_SOCKET_OVERFLOW, "np1", FRAMES): 9,
                          LossKey("policy", "meter", "policy_deny"): 3}, 1.0, 2.0)
    loss = record["npaudit"]["loss"]
    assert (loss["packet_ins"], loss["frames"], loss["by_reason"][0]["reason"]) == (3, 9, PORT_SOCKET_OVERFLOW)
    assert "9 frames ovs-vswitchd never read off port np1" in record["message"]


class NoChannel:
    ready = False
    meter_support = None

    async def multipart(self, msg: Any) -> list[bytes]:
        raise AssertionError("not asked")


def test_each_window_states_the_ports_and_the_datapaths_new_drops() -> None:
    ports = {"np1 socket_dropped": 10, "np1 rx_dropped": 0}
    datapath: dict[str, int | None] = {"datapath_drop_upcall_error": 4, "datapath_drop_lock_error": None}
    records: list[dict[str, Any]] = []
    acc = LossAccounting(NoChannel(), interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         submit=lambda t: records.append(t.record()) or True, port_drops=lambda: dict(ports),
                         datapath_drops=lambda: dict(datapath), mono_clock=ManualClock(0.0),
                         wall_clock=ManualClock(1_700_000_000.0))

    async def windows() -> None:
        await acc.tick()  # the baseline
        ports["np1 socket_dropped"], ports["np1 rx_dropped"] = 250, 2
        datapath["datapath_drop_upcall_error"] = 5
        await acc.tick()

    asyncio.run(windows())
    assert len(records) == 1
    assert {(i["reason"], i["source"], i["unit"]): i["count"] for i in records[0]["npaudit"]["loss"]["by_reason"]} \
        == {("port_rx_dropped", "np1", "frames"): 2, ("port_socket_overflow", "np1", "frames"): 240,
            ("datapath_drop", "datapath_drop_upcall_error", "frames"): 1}


def test_a_port_reading_that_fails_is_logged_and_the_other_losses_still_stated(
        caplog: pytest.LogCaptureFixture) -> None:
    def fail() -> dict[str, int]:
        raise OSError("no such namespace")

    records: list[dict[str, Any]] = []
    acc = LossAccounting(NoChannel(), interval=1.0, admission=lambda: {}, ovs_losses=lambda: {},
                         writer_full=lambda: len(records) + 1, submit=lambda t: records.append(t.record()) or True,
                         port_drops=fail, mono_clock=ManualClock(0.0), wall_clock=ManualClock(1_700_000_000.0))
    asyncio.run(acc.tick())
    assert acc.read_errors == 1 and "no such namespace" in caplog.text
    assert records and records[0]["npaudit"]["loss"]["records"] == 1


def newlink(ifindex: int, name: str, rx_dropped: int) -> bytes:
    """An RTM_NEWLINK as the kernel sends it in a link dump: ifinfomsg, IFLA_IFNAME, IFLA_STATS64."""
    ifname = name.encode() + b"\0"
    attrs = struct.pack("=HH", 4 + len(ifname), IFLA_IFNAME) + ifname + b"\0" * (-len(ifname) % 4)
    stats = [0] * 24
    stats[0], stats[6] = 1000, rx_dropped  # rx_packets, rx_dropped
    attrs += struct.pack("=HH", 4 + 8 * 24, IFLA_STATS64) + struct.pack("=24Q", *stats)
    body = struct.pack("=BxHiII", 0, 1, ifindex, 0, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, 2, 1, 0) + body


def test_the_link_dump_gives_each_links_name_and_its_kernel_receive_drops_until_done() -> None:
    raw = newlink(7, "np1", 3) + newlink(9, "a-longer-name", 2**40)
    assert parse_link_dump(raw) == ({7: ("np1", 3), 9: ("a-longer-name", 2**40)}, False)
    assert parse_link_dump(raw + done()) == ({7: ("np1", 3), 9: ("a-longer-name", 2**40)}, True)
    with pytest.raises(ValueError, match="length"):
        parse_link_dump(newlink(7, "np1", 3)[:-8])  # cut: the header says more than came


def test_the_link_dump_of_this_namespace_says_what_pyroute2_says() -> None:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        theirs = {link["index"]: (link.get_attr("IFLA_IFNAME"), int((link.get_attr("IFLA_STATS64") or {})
                                                                   .get("rx_dropped", 0))) for link in ipr.get_links()}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        ours = _dump(sock, link_dump_request(), parse_link_dump)
    assert ours == theirs and theirs


def test_a_kept_reader_opens_its_sockets_once_and_again_only_after_a_failure(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reader = PortDropReader(None)
    try:
        first = reader.read()
        for _ in range(5):
            assert reader.read().keys() == first.keys()
        assert reader.opened == 1

        def cut(data: bytes) -> tuple[dict[int, int], bool]:
            raise ValueError("netlink message of length 9 at 0 of 4")

        monkeypatch.setattr(port_stats, "parse_packet_diag", cut)
        with pytest.raises(ValueError):
            reader.read()
        monkeypatch.undo()
        assert reader.read().keys() == first.keys() and reader.opened == 2
    finally:
        reader.close()
