"""Traffic between nodes, end to end: two nodes on this machine (tests/support/multinode.py), each its
own agent and embedded OVS, joined by an underlay bridge; Geneve by default, routed as the option.

Policy across nodes: egress judged (and recorded) on the source Pod's node before the tunnel,
ingress on the destination Pod's node after it; each node names both Pods from the Pod objects
applied on it, in its own audit file with its own observer.hostname.
"""

from __future__ import annotations

import re
import textwrap
import time
import urllib.request
from typing import Callable, Iterator

import pytest

from tests.support.cluster import Cluster, PodHandle
from tests.support.multinode import MultiNode, node_name

MTU_1500_GENEVE = 1450  # cluster.underlay_mtu 1500 less Geneve's 50 bytes


def connect(c: Cluster, src: str, targets: list[str], want: str = "connected", timeout: float = 30.0
            ) -> dict[str, str]:
    """Probe until every target gives `want` or `timeout` passes: the first packet to a node may
    be lost to the tunnel's ARP (a client retries, as TCP itself does)."""
    deadline = time.monotonic() + timeout
    while True:
        got = c.probe(src, targets, timeout=2.0)
        if all(v == want for v in got.values()) or time.monotonic() > deadline:
            return got


def wait_records(c: Cluster, want: Callable[[list[dict]], bool], timeout: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    records = c.audit_records()
    while not want(records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = c.audit_records()
    return records


def labelled(records: list[dict], label: str) -> list[dict]:
    return [r for r in records if r.get("labels", {}).get("log_label") == label]


def pod_objects(pods: dict[str, tuple[PodHandle, int, str]]) -> str:
    """Namespace and Pod objects (status.podIP, spec.nodeName) for `pods`: {ref: (handle, node, app)}."""
    docs = [f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n" for ns in sorted({p.namespace for p, _, _
                                                                                              in pods.values()})]
    for pod, node, app in pods.values():
        docs.append(textwrap.dedent(f"""\
            apiVersion: v1
            kind: Pod
            metadata: {{name: {pod.name}, namespace: {pod.namespace}, labels: {{app: {app}}}}}
            spec: {{nodeName: {node_name(node)}, containers: [{{name: c, image: i}}]}}
            status: {{podIP: {pod.ip}, podIPs: [{{ip: {pod.ip}}}]}}
            """))
    return "---\n".join(docs)


@pytest.fixture
def geneve() -> Iterator[MultiNode]:
    m = MultiNode(2, "geneve")
    try:
        m.start()
        yield m
    finally:
        m.close()


def test_pods_on_two_nodes_talk_tcp_and_udp_through_geneve_and_a_full_mtu_bulk_transfer_arrives_whole(
        geneve: MultiNode) -> None:
    n1, n2 = geneve.nodes[1], geneve.nodes[2]
    a = n1.add_pod("x", "a")
    b = n2.add_pod("y", "b")
    assert a.ip.startswith("10.246.1.") and b.ip.startswith("10.246.2.")
    targets = [f"{b.ip}:80/tcp", f"{b.ip}:53/udp"]
    assert connect(n1, "x/a", targets) == {t: "connected" for t in targets}
    back = [f"{a.ip}:81/tcp", f"{a.ip}:53/udp"]
    assert connect(n2, "y/b", back) == {t: "connected" for t in back}
    # The tunnel really carried it: the geneve port's flows on both sides saw packets.
    for c in (n1, n2):
        assert any("set_field:198.51.100." in f and not re.search(r"n_packets=0,", f) for f in c.flows()), c.flows()

    # Pod interfaces leave room for Geneve's headers; a bulk transfer moves full-size segments across.
    assert geneve.link_mtu(a.netns) == MTU_1500_GENEVE and geneve.link_mtu(b.netns) == MTU_1500_GENEVE
    geneve.bulk_sink(2, b, 9000)
    total = 8 * 1024 * 1024
    got, mss = geneve.bulk_send(a, b.ip, 9000, total)
    assert got == total
    # Full-MTU segments (MTU less IPv4 and TCP headers, less 12 bytes when timestamps are on),
    # not a path squeezed by a smaller MTU somewhere.
    assert MTU_1500_GENEVE - 40 - 12 <= mss <= MTU_1500_GENEVE - 40


def metric(c: Cluster, name: str, labels: str) -> float:
    url = c.metrics_url  # type: ignore[attr-defined]
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    m = re.search(rf"^{name}{{{labels}}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0
