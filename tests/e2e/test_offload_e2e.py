"""The eBPF drop offload in the running agent: real OVS, Pods through CNI, XDP on their veths (root; bcc).

A Pod floods a logged Drop rule below the OVS meter's rate (so every packet is
accounted: OVS-seen packets plus what XDP dropped). The offload engages, OVS's
flow counter stops following the flood, the receiver sees nothing; then a change
(policy to Allow, a label, the Pod's deletion, expiry) must never leave a cached
verdict behind: the very next packets pass, and the records' totals equal what
the sender sent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support.cluster import Cluster, _npaudit
from tests.support.e2e_scenarios import wait_records
from tests.support.ports import free_port
from tests.support.offload_scenario import NAMESPACES, PORT, SENDER, pod_y, policy
from tests.support.waiting import wait_for

RATE = 600           # below the policy_deny meter (1000 pps): nothing is metered away
THRESHOLD = 50
SAMPLE_RATE = 5      # what a cached flow still sends on to OVS, per second (burst the same)
OFFLOAD = (f"offload:\n  enabled: true\n  threshold_pps: {THRESHOLD}\n  rate_pps: {SAMPLE_RATE}\n"
           f"  burst: {SAMPLE_RATE}\n  read_interval: 0.5\n")

# Counts datagrams per phase until the stop file appears; prints {phase: [count, first seq]}.
RECEIVER = r"""
import json, os, socket, sys
port, stop = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port)); s.settimeout(0.1)
print("ready", flush=True)
seen = {}
while not os.path.exists(stop):
    try:
        data, _ = s.recvfrom(256)
    except socket.timeout:
        continue
    phase, seq = data.decode().split(":")
    entry = seen.setdefault(phase, [0, int(seq)])
    entry[0] += 1
print(json.dumps(seen), flush=True)
"""

def offload_cluster(extra: str = OFFLOAD, metrics_listen: str = "") -> Iterator[Cluster]:
    c = Cluster(extra_config=extra, metrics_listen=metrics_listen)
    try:
        c.start(timeout=120)  # clang compiles the XDP program first: seconds on a busy machine
        yield c
    finally:
        c.close()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    yield from offload_cluster()


class Receiver:
    """RECEIVER in a Pod; `result()` stops it and returns {phase: (count, first seq)}."""

    def __init__(self, cluster: Cluster, pod: str) -> None:
        self._stop = cluster.dir / f"stop-{time.monotonic_ns()}"
        self._proc = subprocess.Popen(["ip", "netns", "exec", cluster.pods[pod].netns, sys.executable, "-c",
                                       RECEIVER, str(PORT), str(self._stop)], stdout=subprocess.PIPE)
        assert self._proc.stdout is not None and self._proc.stdout.readline().strip() == b"ready"

    def result(self) -> dict[str, tuple[int, int]]:
        self._stop.touch()
        out, _ = self._proc.communicate(timeout=10)
        return {phase: (n, first) for phase, (n, first) in json.loads(out).items()}


def start_flood(cluster: Cluster, src: str, dst_ip: str, count: int, phase: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", cluster.pods[src].netns, sys.executable, "-c", SENDER, dst_ip,
                             str(PORT), str(RATE), str(count), phase], stdout=subprocess.PIPE)


def sent(proc: subprocess.Popen[bytes]) -> int:
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return int(out)


def status(cluster: Cluster) -> dict[str, Any]:
    res = _npaudit("status", "--config", str(cluster.config), "-o", "json", "--no-ebpf-probe")
    assert res.returncode == 0, res.stderr.decode()
    return json.loads(res.stdout)["ebpf"]


def ovs_flow_packets(cluster: Cluster) -> int:
    """n_packets of the flows matching the flood's port, once the datapath's counts are pushed to them."""
    for _ in range(2):
        cluster.ovs_appctl("revalidator/wait")
    return sum(int(n) for line in cluster.flows() if f"tp_dst={PORT}" in line
               for n in re.findall(r"n_packets=(\d+)", line))


def flood_records(records: list[dict], action: str) -> list[dict]:
    return [r for r in records if r.get("labels", {}).get("log_label") == "flood"
            and r["event"]["action"] == action]


def packets(records: list[dict]) -> int:
    return sum(r["npaudit"]["aggregate"]["packets"] for r in records)


def offloaded(records: list[dict]) -> int:
    return sum(r["npaudit"]["aggregate"]["offloaded_packets"] for r in records)


def setup(cluster: Cluster) -> tuple[str, str]:
    cluster.apply(NAMESPACES + "---\n" + pod_y("web"))
    cluster.add_pod("x", "a", server=False)
    ya = cluster.add_pod("y", "a", server=False)
    cluster.apply(policy("Drop"))
    return "x/a", ya.ip


def engaged_flood(cluster: Cluster, src: str, dst_ip: str, count: int, phase: str) -> int:
    """Flood `count` packets; check the offload engaged and OVS stopped seeing the flood; return the count sent."""
    proc = start_flood(cluster, src, dst_ip, count, phase)
    wait_for(lambda: status(cluster)["entries"] >= 1, 10.0, "the offload to cache the flood")
    before, t0 = ovs_flow_packets(cluster), time.monotonic()
    time.sleep(1.0)
    reached, elapsed = ovs_flow_packets(cluster) - before, time.monotonic() - t0
    n = sent(proc)
    # The sender kept going at RATE pps; OVS saw no more than the token bucket let through.
    assert proc.returncode == 0 and reached <= SAMPLE_RATE * (elapsed + 1) + SAMPLE_RATE, (reached, elapsed)
    return n


def test_a_cached_drop_flood_is_counted_exactly_and_a_change_to_allow_passes_the_very_next_packet(
        cluster: Cluster) -> None:
    src, dst_ip = setup(cluster)
    receiver = Receiver(cluster, "y/a")
    n_drop = engaged_flood(cluster, src, dst_ip, RATE * 4, "drop")
    entries = status(cluster)
    assert entries["active"] is True and entries["attached"] == 2 and entries["entries"] >= 1
    cluster.apply(policy("Allow"))  # the entry is still cached here: the change must flush it first
    n_allow = sent(start_flood(cluster, src, dst_ip, 200, "allow"))
    got = receiver.result()
    assert "drop" not in got  # a cached Drop never let a packet through
    assert got["allow"] == (n_allow, 0)  # the very next packet, and every one after it
    records = wait_records(cluster, lambda rs: packets(flood_records(rs, "dropped")) >= n_drop
                           and flood_records(rs, "allowed"), timeout=10)
    dropped = flood_records(records, "dropped")
    assert packets(dropped) == n_drop  # what the Pod sent, not what OVS saw
    assert offloaded(dropped) > n_drop // 2 and status(cluster)["offloaded_packets"] == offloaded(dropped)
    allowed = flood_records(records, "allowed")
    assert allowed[0]["npaudit"]["disposition"] == "Allow" and allowed[0]["destination"]["port"] == PORT
    assert status(cluster)["entries"] == 0


def test_a_label_change_pod_deletion_and_expiry_leave_no_cached_verdict_and_lose_no_count() -> None:
    for cluster in offload_cluster(OFFLOAD + "  ttl_s: 3.0\n"):
        src, dst_ip = setup(cluster)
        receiver = Receiver(cluster, "y/a")
        # Label change: y/a leaves the policy's appliedTo, so its traffic is allowed (unlogged) at once.
        n1 = engaged_flood(cluster, src, dst_ip, RATE * 3, "drop1")
        cluster.apply(pod_y("db"))
        n_after_label = sent(start_flood(cluster, src, dst_ip, 100, "relabelled"))
        # Expiry: back under the policy, flood, stop; the entry times out and its counts are folded.
        cluster.apply(pod_y("web"))
        n2 = engaged_flood(cluster, src, dst_ip, RATE * 2, "drop2")
        wait_for(lambda: status(cluster)["entries"] == 0, 15.0, "the entry to expire")
        # Pod deletion: the sender's entries go with its veth, their counts into the records.
        n3 = engaged_flood(cluster, src, dst_ip, RATE * 2, "drop3")
        assert cluster.cni("DEL", cluster.pods[src]).returncode == 0
        del cluster.pods[src]
        st = status(cluster)
        assert st["entries"] == 0 and st["attached"] == 1
        got = receiver.result()
        assert got == {"relabelled": (n_after_label, 0)}
        total = n1 + n2 + n3
        records = wait_records(cluster, lambda rs: packets(flood_records(rs, "dropped")) >= total, timeout=10)
        assert packets(flood_records(records, "dropped")) == total
        assert status(cluster)["offloaded_packets"] == offloaded(flood_records(records, "dropped")) > 0


def test_an_offload_that_cannot_load_is_one_warning_and_metric_0_and_policy_is_still_enforced_and_logged(
        tmp_path: Path) -> None:
    broken = tmp_path / "broken_xdp.c"
    broken.write_text("this is not C;\n")
    port = free_port()
    extra = OFFLOAD + f"  source: {broken}\n"
    for cluster in offload_cluster(extra, metrics_listen=f"127.0.0.1:{port}"):
        src, dst_ip = setup(cluster)
        st = status(cluster)
        assert st["active"] is False and st["state"].startswith("unavailable: XDP offload broken_xdp.c")
        warnings = [line for line in cluster.log().splitlines() if "eBPF drop offload unavailable" in line]
        assert len(warnings) == 1 and "npaudit_ebpf_offload_active=0" in warnings[0]
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert re.search(r"^npaudit_ebpf_offload_active 0\.0$", scrape, re.M)
        receiver = Receiver(cluster, "y/a")
        n = sent(start_flood(cluster, src, dst_ip, 300, "drop"))
        assert receiver.result() == {}  # the Drop still holds, in OVS
        records = wait_records(cluster, lambda rs: packets(flood_records(rs, "dropped")) >= n, timeout=10)
        assert packets(flood_records(records, "dropped")) == n and offloaded(flood_records(records, "dropped")) == 0
