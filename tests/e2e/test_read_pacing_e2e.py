"""Read pacing in the running agent on real OVS (root): in a paced flood of packet-ins the agent
wakes once per batch, not once per packet-in, and every packet-in OVS emitted is still in a
record; a lone packet-in after a quiet spell, or a trickle of them, is read on its own, at once (no pause)."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.overload_scenario import FIRST_PORT, new_key_flood_cluster, settled, start_flood_pods

# COUNT datagrams at RATE per second to ports FIRST.., each its own port (a new audit key each).
PACED = r"""
import socket, sys, time
ip, first, count, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = time.monotonic()
for n in range(count):
    delay = start + n / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    s.sendto(b"pace", (ip, first + n))
"""


# COUNT datagrams to ports FIRST.., GAP seconds at least between two (never sent closer to catch up).
GAPPED = r"""
import socket, sys, time
ip, first, count, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in range(count):
    if n:
        time.sleep(gap)
    s.sendto(b"gap", (ip, first + n))
"""


def send_gapped(netns: str, ip: str, first: int, count: int, gap: float) -> None:
    subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", GAPPED, ip, str(first), str(count),
                    str(gap)], check=True, timeout=count * gap + 60)


def send_paced(netns: str, ip: str, first: int, count: int, rate: float) -> None:
    subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", PACED, ip, str(first), str(count),
                    str(rate)], check=True, timeout=count / rate + 60)


@pytest.fixture
def flood_cluster() -> Iterator[Cluster]:
    c = new_key_flood_cluster(meter_rate=1_000_000, overload=True)
    try:
        c.start(timeout=120)
        yield c
    finally:
        c.close()


def _emitted(cluster: Cluster) -> int:
    return cluster.controller_flow_packets() - cluster.meter_band_drops()


def _reads(counts: dict[str, float]) -> tuple[float, float]:
    return counts.get("npaudit_openflow_reads_total", 0.0), counts.get("npaudit_openflow_reads_paced_total", 0.0)


def test_a_paced_flood_is_read_in_batches_and_every_packet_in_is_recorded(flood_cluster: Cluster) -> None:
    cluster = flood_cluster
    netns, ip = start_flood_pods(cluster)
    counts0, records0 = settled(cluster)
    emitted0 = _emitted(cluster)
    send_paced(netns, ip, FIRST_PORT, 3000, 3000.0)  # 1 s at 3k/s
    counts1, records1 = settled(cluster)
    emitted = _emitted(cluster) - emitted0
    reads = _reads(counts1)[0] - _reads(counts0)[0]
    paced = _reads(counts1)[1] - _reads(counts0)[1]
    in_records = records1["packets"] - records0["packets"]
    print(f"emitted {emitted}, in records {in_records}, reads {reads:.0f} ({paced:.0f} paced)")
    assert emitted >= 2900, "the flood did not reach the controller"
    assert in_records == emitted  # nothing lost to the pauses
    assert records1["coarsened_records"] == records0["coarsened_records"]  # all at full detail
    assert paced > 0
    assert reads < emitted / 4, "one read per batch of packet-ins, not one each"

    # A packet-in every 0.2 s (far apart compared with the pause's cap): each read at once, on its own.
    counts2, _ = settled(cluster)
    emitted2 = _emitted(cluster)
    send_paced(netns, ip, FIRST_PORT + 5000, 10, 5.0)
    counts3, records3 = settled(cluster)
    lone = _emitted(cluster) - emitted2
    assert lone == 10
    assert _reads(counts3)[1] == _reads(counts2)[1], "a lone packet-in is never followed by a pause"
    assert _reads(counts3)[0] - _reads(counts2)[0] >= 10
    # Each taken by the lone path (its record written first), but for at most one: of any 64 packet-ins in a
    # row one is where the pipeline looks at its backlog, which the batch path does.
    lone_reads = counts3.get("npaudit_openflow_reads_lone_total", 0.0) - counts2.get("npaudit_openflow_reads_lone_total",
                                                                                      0.0)
    assert 9 <= lone_reads <= 10
    assert records3["packets"] - records1["packets"] == lone
    # And made from the message's bytes before the decode (the flood's records left the C encoder the texts of
    # this rule, these Pods and this OVS place), the one where the pipeline looks at its backlog too (the batch
    # path then takes the record made): all but where a window could close.
    early = counts3.get("npaudit_audit_records_early_total", 0.0) - counts2.get("npaudit_audit_records_early_total",
                                                                                0.0)
    assert 8 <= early <= lone, (early, lone)
    # And read from inside the event loop's wait, after the quiet spell before each (packetin/quiet.py): the record
    # made, sealed and appended before any Python ran.
    quiet_reads = counts3.get("npaudit_openflow_reads_quiet_total", 0.0) - counts2.get(
        "npaudit_openflow_reads_quiet_total", 0.0)
    assert 8 <= quiet_reads <= min(early, lone_reads), (quiet_reads, early, lone_reads)

    # A packet-in every 80 ms (12.5 a second): closer together than the longest pause (the agent's
    # default read_pace_max, 100 ms), farther than the trickle gap (20 ms): still each read at once.
    emitted4 = _emitted(cluster)
    send_gapped(netns, ip, FIRST_PORT + 6000, 10, 0.08)
    counts5, records5 = settled(cluster)
    assert _emitted(cluster) - emitted4 == 10
    assert _reads(counts5)[1] == _reads(counts3)[1], "a trickle is never paced, whatever the longest pause"
    assert records5["packets"] - records3["packets"] == 10
