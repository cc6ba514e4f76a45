"""Audit overload mode in the running agent on real OVS (root): a flood in which every packet is a new
audit key (a new UDP destination port each) into a logged Drop rule over a port range.

With small overload marks the agent coarsens (records without ports, marked
npaudit.aggregate.coarsened, covering many keys), its reader then hands packet-ins over in
groups (packetin/groups.py), and the counts stay exact: the
packets in records plus what the agent's admission dropped plus what ovs-vswitchd
lost before sending equal the packet-ins OVS emitted (its controller flows'
n_packets minus the meter bands' drops).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.udp_flood import send_flood
from tests.support.overload_scenario import FIRST_PORT, PORTS, new_key_flood_cluster, settled
from tests.support.overload_scenario import start_flood_pods

@pytest.fixture
def small_marks() -> Iterator[Cluster]:
    # A small policy queue and low marks: the agent coarsens as soon as a few hundred packet-ins wait.
    c = new_key_flood_cluster(meter_rate=30000, overload=True, queue_size=4096, marks=(0.02, 0.5, 0.005))
    try:
        c.start(timeout=120)
        yield c
    finally:
        c.close()


def test_a_new_key_flood_coarsens_records_and_every_packet_in_ovs_emitted_is_accounted(small_marks) -> None:
    cluster = small_marks
    netns, ip = start_flood_pods(cluster)
    counts0, records0 = settled(cluster)
    flows0, meter0 = cluster.controller_flow_packets(), cluster.meter_band_drops()
    sent = send_flood(netns, ip, 3.0, port=FIRST_PORT, ports=PORTS)
    counts1, records1 = settled(cluster)
    emitted = (cluster.controller_flow_packets() - flows0) - (cluster.meter_band_drops() - meter0)
    in_records = records1["packets"] - records0["packets"]
    admission = int(counts1["admission_dropped"] - counts0["admission_dropped"])
    ovs_lost = int(counts1["ovs_lost"] - counts0["ovs_lost"])
    print(f"sent {sent}, OVS emitted {emitted}: {in_records} in {records1['records']} records "
          f"({records1['coarsened_records']} coarsened), admission {admission}, lost in OVS {ovs_lost}")
    assert emitted > 10_000, "the flood did not reach the controller"
    assert records1["coarsened_records"] > 0, "overload never engaged"
    assert records1["records"] < in_records, "coarsened records cover several keys each"
    grouped = counts1.get("npaudit_openflow_packetins_grouped_total", 0) - counts0.get(
        "npaudit_openflow_packetins_grouped_total", 0)
    assert grouped > 0, "in overload the reader hands packet-ins over in groups"
    assert in_records + admission + ovs_lost == emitted
