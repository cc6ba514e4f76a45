"""Several nodes on this machine for end-to-end tests: each one tests.support.cluster.Cluster (its
agent and embedded OVS in a network namespace of its own) with its own Pod subnet 10.246.N.0/24
and underlay address 198.51.100.N/24, joined by an underlay: a Linux bridge in a namespace of its
own, one veth per node whose other end sits in the node's OVS namespace (made here, before the
agent starts, so the agent finds it there and leaves it to us), made by the same functions as
`npaudit cluster up`'s (policy_agent/cluster/local_run.py). Unlike that verb, each node here is a
Cluster: a test drives its agent (stop, restart, config) and its Pods directly.

Everything is named with a random tag and removed by that name (namespaces: the veths go with
them) or pid (the agents, through Cluster.close), even when a test fails. `with MultiNode(...) as m`
starts every node and closes them all at the end.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from policy_agent.cluster.local import NODE_UNDERLAY_IF
from policy_agent.cluster.local_run import add_netns, join_underlay, make_underlay
from policy_agent.ovs.embedded import netns_exists
from tests.support.cluster import Cluster, PodHandle, StartedInWith
from tests.support.external_ovs import ExternalOvs
from tests.support.ports import free_port

UNDERLAY_PREFIX = "198.51.100"  # TEST-NET-2: never routed anywhere but inside the test's namespaces

# Receives TCP on port argv[1]; for each connection reads to EOF and answers the byte count.
BULK_SINK = r"""
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
print("ready", flush=True)
def serve(c):
    n = 0
    while True:
        b = c.recv(1 << 16)
        if not b:
            break
        n += len(b)
    c.sendall(str(n).encode()); c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# Sends argv[3] bytes to argv[1]:argv[2] (one connect: TCP's own SYN retry covers a packet a cold
# tunnel loses); prints the count the sink answered and the connection's MSS.
BULK_SOURCE = r"""
import socket, sys
ip, port, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.settimeout(10)
s.connect((ip, port))
mss = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
chunk = b"x" * 65536; sent = 0
while sent < total:
    sent += s.send(chunk[:min(len(chunk), total - sent)])
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(64)
    if not b: break
    got += b
print(got.decode(), mss)
"""


def node_name(i: int) -> str:
    return f"node-{i}"


def pod_cidr(i: int) -> str:
    return f"10.246.{i}.0/24"


def node_ip(i: int) -> str:
    return f"{UNDERLAY_PREFIX}.{i}"


class MultiNode(StartedInWith):
    """`n` nodes (1..n) joined by an underlay; `encapsulation` geneve or routed. `extra_peers` adds
    to what node i's config lists as peers: {i: YAML list items, one per line, indented by 2};
    `cluster_settings`: more `cluster:` fields for every node, e.g. "underlay_mtu: 9000".
    `deny_unknown_sources` is off unless asked for: these nodes know another node's Pod only from the
    objects a test applies to them, and most tests are about the tunnel, not about that check (the
    tests of it turn it on; the agent's default is on).
    `external_ovs`: each node's OVS is not the agent's but one started here (tests/support/external_ovs.py)
    in the node's namespace, the agent run there too with `ovs.mode: external`; `external[i]` is node i's."""

    def __init__(self, n: int, encapsulation: str = "geneve", extra_peers: dict[int, str] | None = None,
                 cluster_settings: str = "", deny_unknown_sources: bool = False, external_ovs: bool = False) -> None:
        self.tag = secrets.token_hex(3)
        self.underlay = f"npu-{self.tag}"
        self._made: list[str] = []  # namespaces made here (each node's OVS namespace, the underlay)
        self.nodes: dict[int, Cluster] = {}
        self.metrics: dict[int, str] = {}  # node -> its /metrics URL
        self.external: dict[int, ExternalOvs] = {}
        try:
            make_underlay(self._claim(self.underlay))
            for i in range(1, n + 1):
                peers = "".join(f"  - {{name: {node_name(j)}, pod_cidr: '{pod_cidr(j)}', address: '{node_ip(j)}'}}\n"
                                for j in range(1, n + 1) if j != i) + (extra_peers or {}).get(i, "")
                listen = f"127.0.0.1:{free_port()}"
                self.metrics[i] = f"http://{listen}/metrics"
                node = Cluster(gateway=True, subnet=pod_cidr(i), metrics_listen=listen, extra_config=(
                    f"node_name: {node_name(i)}\n"
                    f"cluster:\n  encapsulation: {encapsulation}\n  node_address: '{node_ip(i)}/24'\n"
                    f"  underlay_interface: {NODE_UNDERLAY_IF}\n"
                    f"  deny_unknown_sources: {'true' if deny_unknown_sources else 'false'}\n  peers:\n{peers}"
                    + "".join(f"  {line}\n" for line in cluster_settings.splitlines())))
                self.nodes[i] = node
                add_netns(self._claim(node.node_netns))
                join_underlay(self.underlay, f"ul{self.tag}{i}", node.node_netns)
                ns = node.node_netns
                if external_ovs:
                    self.external[i] = ext = ExternalOvs(Path(tempfile.mkdtemp(prefix=f"npx-{self.tag}{i}-", dir="/tmp")), ns)
                    ext.up()
                    node.add_settings("ovs", f"mode: external\ndb: '{ext.db}'\n")
                    node.agent_netns, node.ovs_run_dir = ns, ext.run_dir
        except BaseException:
            self.close()
            raise

    def _claim(self, netns: str) -> str:
        """`netns`, to be made here and so deleted at close (also when its making fails half-way); never
        one that exists already (another's)."""
        if netns_exists(netns):
            raise AssertionError(f"network namespace {netns} exists already")
        self._made.append(netns)
        return netns

    def start(self, timeout: float = 120) -> None:
        for node in self.nodes.values():
            node.start(timeout)

    def bulk_sink(self, node: int, pod: PodHandle, port: int) -> None:
        """A TCP sink on `port` in `pod` (of `node`), stopped at close."""
        c = self.nodes[node]
        proc = subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-c", BULK_SINK, str(port)],
                                stdout=subprocess.PIPE)
        c._servers.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            raise AssertionError(f"bulk sink in {pod.ref} did not start")

    def bulk_send(self, pod: PodHandle, ip: str, port: int, total: int) -> tuple[int, int]:
        """Sends `total` bytes from `pod` to ip:port; (bytes the sink counted, the connection's MSS)."""
        res = subprocess.run(["ip", "netns", "exec", pod.netns, sys.executable, "-c", BULK_SOURCE, ip, str(port),
                              str(total)], capture_output=True, text=True, timeout=180)
        if res.returncode != 0:
            raise AssertionError(f"bulk transfer {pod.ref} -> {ip}:{port} failed: {res.stderr}")
        got, mss = res.stdout.split()
        return int(got), int(mss)

    def metric(self, node: int, name: str, labels: str = "") -> float | None:
        """One sample of node `node`'s metrics (labels as written, e.g. 'state="routed"'); None: absent."""
        text = urllib.request.urlopen(self.metrics[node], timeout=10).read().decode()
        m = re.search(rf"^{re.escape(name)}{re.escape('{' + labels + '}') if labels else ''} (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def link_mtu(self, netns: str, ifname: str = "eth0") -> int:
        out = Path(f"/sys/class/net/{ifname}/mtu")
        res = subprocess.run(["ip", "netns", "exec", netns, "cat", str(out)], capture_output=True, text=True,
                             check=True)
        return int(res.stdout)

    def close(self) -> None:
        errors: list[BaseException] = []
        for node in self.nodes.values():
            try:
                node.close()
            except Exception as exc:  # the other nodes and namespaces are still cleaned
                errors.append(exc)
        for ext in self.external.values():
            ext.down()
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        self._made.clear()
        if errors:
            raise errors[0]
