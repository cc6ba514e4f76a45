"""Three nodes on this machine, one Kubernetes API: the reachability matrix across nodes, records from
the right nodes, a reused address never named with the old Pod, and one agent SIGKILLed.

`npaudit cluster up --nodes 3 --kubernetes-api URL` (tests/support/local_cluster.py) with every node
watching one test API server (tests/support/kube_store.py: every watch sees every change). The test
does what a user and the kubelets would: creates the Node objects `up` wrote (DIR/nodes.yaml), the
Namespaces, each Pod's object (spec.nodeName, labels) before its node's `npaudit cni` ADD (`cluster
pod add`), then its status.podIP; and the policies, all in the API.

The 9 Pods x/y/z x a/b/c are spread so that every node holds one Pod of each namespace and of each
name: 54 of the 72 ordered pairs cross nodes.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import signal
import subprocess
import textwrap
import time
from typing import Any, Iterator

import pytest
import yaml

from policy_agent.ovs.pids import pid_alive
from tests.support.cluster import SERVER_PORTS, UDP_PORT
from tests.support.e2e_scenarios import NAMESPACES, PODS, matrix_expect, matrix_policies
from tests.support.k8s_objects import namespace, pod
from tests.support.kube_store import KubeStore
from tests.support.local_cluster import LocalCluster, npaudit
from tests.support.waiting import wait_for

NODES = ("n1", "n2", "n3")
PLACEMENT = {"x/a": "n1", "y/b": "n1", "z/c": "n1",
             "x/b": "n2", "y/c": "n2", "z/a": "n2",
             "x/c": "n3", "y/a": "n3", "z/b": "n3"}
CLUSTER_CIDR = "10.248.0.0/16"  # every node's Pod subnet (10.248.<i>.0/24)
PROBE_TIMEOUT = 1.0  # seconds per probe; a "timeout" outcome costs this once per source (probes run in parallel)
MATRIX_POLICIES = 7
# A logged Allow of x/a -> z/b TCP 81 at both ends (egress on x/a's node n1, ingress on z/b's node n3): Allows
# in the first tier of what the matrix allows anyway, so its outcomes stay as matrix_expect says.
LOGGED_ALLOWS = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: xa-to-zb-out}
    spec:
      tier: securityops
      priority: 2
      appliedTo: [{podSelector: {matchLabels: {pod: a}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
      egress:
      - action: Allow
        name: out-81
        enableLogging: true
        logLabel: xz-out
        to: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]
        ports: [{protocol: TCP, port: 81}]
    ---
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: xa-to-zb-in}
    spec:
      tier: securityops
      priority: 3
      appliedTo: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]
      ingress:
      - action: Allow
        name: in-81
        enableLogging: true
        logLabel: xz-in
        from: [{podSelector: {matchLabels: {pod: a}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
        ports: [{protocol: TCP, port: 81}]
""")
ALL_POLICIES = MATRIX_POLICIES + 2


class Rig:
    """The API, the cluster and its 9 Pods (ref -> {"ip", "netns", "node"})."""

    def __init__(self, api: KubeStore, local: LocalCluster) -> None:
        self.api = api
        self.local = local
        self.pods: dict[str, dict[str, str]] = {}

    def status(self, node: str) -> dict[str, Any]:
        return self.local.node_status(node)

    def wait_counts(self, pods: int, policies: int) -> None:
        got: list[tuple[int, int]] = []

        def every_node() -> bool:
            got[:] = [(s["policy"]["pods"], s["policy"]["policies"]) for s in map(self.status, NODES)]
            return got == [(pods, policies)] * len(NODES)

        wait_for(every_node, timeout=60, interval=0.2,
                 what=lambda: f"{pods} Pods and {policies} policies on every node, got {got}")

    def add_pod(self, ref: str, node: str, labels: dict[str, str], ip: str = "", server: bool = True) -> dict[str, str]:
        """As Kubernetes does: the object (scheduled to `node`), the node's CNI ADD, then its status.podIP."""
        ns, name = ref.split("/")
        self.api.put(pod(ns, name, node, None, labels))
        made = self.local.add_pod(node, ref, server=server, ip=ip)
        self.api.put(pod(ns, name, node, made["ip"], labels))
        return made

    def records(self, node: str) -> list[dict[str, Any]]:
        return self.local.audit_records(node)

    def labelled(self, node: str, label: str, start: int = 0) -> list[dict[str, Any]]:
        return [r for r in self.records(node)[start:] if r.get("labels", {}).get("log_label") == label]

    def matrix(self, timeout: float = PROBE_TIMEOUT) -> dict[tuple[str, str, str], str]:
        """(src, dst, "port/proto") -> outcome for every ordered pair of the 9 Pods, every source at once."""
        by_ip = {p["ip"]: ref for ref, p in self.pods.items()}

        def from_(src: str) -> dict[str, str]:
            targets = [f"{p['ip']}:{port}/tcp" for dst, p in self.pods.items() if dst != src for port in SERVER_PORTS]
            targets += [f"{p['ip']}:{UDP_PORT}/udp" for dst, p in self.pods.items() if dst != src]
            return self.local.probe(self.pods[src]["netns"], targets, timeout=timeout)

        out: dict[tuple[str, str, str], str] = {}
        with concurrent.futures.ThreadPoolExecutor(len(self.pods)) as ex:
            for src, result in zip(self.pods, ex.map(from_, self.pods)):
                for target, outcome in result.items():
                    addr, proto = target.split("/")
                    ip, port = addr.rsplit(":", 1)
                    out[(src, by_ip[ip], f"{port}/{proto}")] = outcome
        return out

    def compare(self, expected: dict[tuple[str, str, str], str]) -> dict[tuple[str, str, str], tuple[str, str]]:
        """The probes whose outcome differs from `expected`: (observed, expected). Each probed once."""
        observed = self.matrix()
        assert len(observed) == 9 * 8 * 3
        return {k: (observed[k], expected[k]) for k in observed if observed[k] != expected[k]}


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    api = KubeStore()
    api.start()
    local = LocalCluster()
    try:
        for ns in NAMESPACES:
            api.put(namespace(ns))
        local.up(3, "--kubernetes-api", api.url)
        r = Rig(api, local)
        # The Node objects `up` wrote, as a user creates them: each node's peers come from the others.
        for obj in yaml.safe_load_all((local.dir / "nodes.yaml").read_text()):
            api.put(obj)
        wait_for(lambda: all(len(r.status(n)["nodes"]["nodes"]) == 2 for n in NODES), timeout=60, interval=0.2,
                 what="every node routing to the other two (from the Node objects)")
        for ns, name in itertools.product(NAMESPACES, PODS):
            ref = f"{ns}/{name}"
            r.pods[ref] = r.add_pod(ref, PLACEMENT[ref], {"pod": name})
        assert {ref: p["node"] for ref, p in r.pods.items()} == PLACEMENT
        r.wait_counts(9, 0)
        # No policy yet: every pair connects, across nodes too (probed until then: the underlay's neighbours
        # are resolved on first use).
        everything = {k: "connected" for k in itertools.product(r.pods, r.pods, ("80/tcp", "81/tcp", "53/udp"))
                      if k[0] != k[1]}
        left: dict[Any, Any] = {}

        def all_connected() -> bool:
            left.clear()
            left.update(r.compare(everything))
            return not left

        wait_for(all_connected, timeout=60, interval=0.5, what=lambda: f"every pair connected, not yet: {left}")
        api.put_yaml(matrix_policies(r.pods["y/b"]["ip"], CLUSTER_CIDR) + "---\n" + LOGGED_ALLOWS)
        r.wait_counts(9, ALL_POLICIES)
        yield r
    finally:
        try:
            local.close()
        finally:
            api.close()


def test_the_matrix_holds_with_the_pods_spread_over_three_nodes(rig: Rig) -> None:
    cross = [(s, d) for s, d in itertools.permutations(rig.pods, 2) if PLACEMENT[s] != PLACEMENT[d]]
    assert len(cross) == 54
    expected = {(s, d, port): matrix_expect(s, d, port) for s, d in itertools.permutations(rig.pods, 2)
                for port in ("80/tcp", "81/tcp", "53/udp")}
    # 32 of the 216 probes are denied by policy, 25 of them across nodes.
    denied = [k for k, v in expected.items() if v != "connected"]
    assert (len(denied), sum(PLACEMENT[s] != PLACEMENT[d] for s, d, _ in denied)) == (32, 25)
    wrong = rig.compare(expected)
    assert not wrong, f"{len(wrong)} of {len(expected)} probes differ (observed, expected): {wrong}"


def _pods_of(record: dict[str, Any]) -> tuple[Any, Any]:
    """(source Pod, destination Pod) a record names; None for an address it names no Pod for."""
    return tuple((record["npaudit"].get(end) or {}).get("pod") for end in ("source", "destination"))  # type: ignore[return-value]


def test_a_cross_node_logged_drop_and_allow_are_recorded_on_the_nodes_that_judged_them(rig: Rig) -> None:
    xa, ya, zb = rig.pods["x/a"], rig.pods["y/a"], rig.pods["z/b"]
    assert (xa["node"], ya["node"], zb["node"]) == ("n1", "n3", "n3")
    marks = {n: len(rig.records(n)) for n in NODES}
    got = rig.local.probe(xa["netns"], [f"{ya['ip']}:80/tcp", f"{zb['ip']}:81/tcp"], timeout=PROBE_TIMEOUT)
    assert got == {f"{ya['ip']}:80/tcp": "timeout", f"{zb['ip']}:81/tcp": "connected"}

    def mine(node: str, label: str, dst: dict[str, str]) -> list[dict[str, Any]]:
        return [r for r in rig.labelled(node, label, marks[node]) if r["destination"]["ip"] == dst["ip"]]

    wait_for(lambda: bool(mine("n1", "sec-web", ya) and mine("n1", "xz-out", zb) and mine("n3", "xz-in", zb)),
             timeout=30, interval=0.2, what=lambda: {n: [r.get("labels") for r in rig.records(n)[marks[n]:]]
                                                     for n in NODES})
    # The Drop is an egress rule: judged on the source's node (n1) only; the packet never crossed.
    dropped = mine("n1", "sec-web", ya)[0]
    assert dropped["event"]["action"] == "dropped" and dropped["observer"]["hostname"] == "n1"
    assert _pods_of(dropped) == ({"namespace": "x", "name": "a"}, {"namespace": "y", "name": "a"})
    assert mine("n3", "sec-web", ya) == []
    # The Allow is judged at both ends: egress on n1, ingress on n3, each naming both Pods.
    out, in_ = mine("n1", "xz-out", zb)[0], mine("n3", "xz-in", zb)[0]
    for record, node in ((out, "n1"), (in_, "n3")):
        assert record["event"]["action"] == "allowed" and record["observer"]["hostname"] == node
        assert _pods_of(record) == ({"namespace": "x", "name": "a"}, {"namespace": "z", "name": "b"})
        assert record["source"]["ip"] == xa["ip"]
    # n2 is on neither path; neither end wrote the other's rule.
    assert mine("n2", "xz-out", zb) == mine("n2", "xz-in", zb) == mine("n2", "sec-web", ya) == []
    assert mine("n3", "xz-out", zb) == [] and mine("n1", "xz-in", zb) == []


TO_N1 = textwrap.dedent("""
    apiVersion: crd.antrea.io/v1beta1
    kind: ClusterNetworkPolicy
    metadata: {name: xb-to-n1}
    spec:
      tier: securityops
      priority: 4
      appliedTo: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]
      egress:
      - action: Allow
        name: to-n1-web
        enableLogging: true
        logLabel: to-n1
        to: [{ipBlock: {cidr: 10.248.1.0/24}}]
        ports: [{protocol: TCP, port: 80}]
""")


def test_an_address_reused_by_a_new_pod_is_never_named_with_the_old_pod(rig: Rig) -> None:
    """z/old on n1 is deleted and its address taken by z/new (on n1: the address is in n1's subnet); n2
    (x/b's node) records x/b's connections to that address by a logged egress rule. Kubernetes' order:
    the deletion begins (z/old's object gets its deletionTimestamp), n1's kubelet tears z/old down (CNI
    DEL gives the address back), z/new starts there with the address before its status.podIP is in the
    API, then its status, then z/old's deletion becomes final. From the moment the address is reused no
    record on any node names z/old: while z/old's object still claims it (alone, or with z/new's) a
    record names no Pod; once z/old is gone, z/new."""
    xb = rig.pods["x/b"]
    assert xb["node"] == "n2"
    rig.api.put_yaml(TO_N1)
    old = rig.add_pod("z/old", "n1", {"pod": "old"})
    rig.wait_counts(10, ALL_POLICIES + 1)
    addr, target = old["ip"], f"{old['ip']}:80/tcp"

    def recorded(start: dict[str, int]) -> list[dict[str, Any]]:
        return [r for r in rig.labelled("n2", "to-n1", start["n2"]) if r["destination"]["ip"] == addr]

    def connect_until_recorded(start: dict[str, int]) -> dict[str, Any]:
        outcomes: list[str] = []

        def seen() -> bool:  # every connection goes through (the first to a Pod just started too)
            outcomes.append(rig.local.probe(xb["netns"], [target], 2.0)[target])
            assert outcomes[-1] == "connected", outcomes
            return bool(recorded(start))
        wait_for(seen, timeout=30, interval=0.3, what=lambda: f"a to-n1 record of {target} on n2 ({outcomes})")
        return recorded(start)[-1]

    start = {n: len(rig.records(n)) for n in NODES}
    assert _pods_of(connect_until_recorded(start))[1] == {"namespace": "z", "name": "old"}

    # `kubectl delete pod z/old`: the object stays, marked, until its containers are gone.
    deleting = pod("z", "old", "n1", addr, {"pod": "old"})
    deleting["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", deletionGracePeriodSeconds=30)
    rig.api.put(deleting)
    res = npaudit("cluster", "pod", "delete", "--dir", str(rig.local.dir), "z/old")  # n1's kubelet: CNI DEL
    assert res.returncode == 0, res.stdout + res.stderr
    reused = {n: len(rig.records(n)) for n in NODES}
    # z/new is scheduled to n1 and started with the same address; its status.podIP is not in the API yet.
    rig.api.put(pod("z", "new", "n1", None, {"pod": "new"}))
    new = rig.local.add_pod("n1", "z/new", ip=addr)
    assert new["ip"] == addr
    # One more object on the same watch after z/old's deletion mark: once every node counts it, every
    # node has seen the mark too.
    rig.api.put(pod("z", "marker", "n3", None, {"pod": "marker"}))
    rig.wait_counts(12, ALL_POLICIES + 1)
    unsure = connect_until_recorded(reused)
    assert _pods_of(unsure) == ({"namespace": "x", "name": "b"}, None), unsure["npaudit"]

    # z/new's address in the API: two objects claim it (z/old's deletion is not final yet).
    rig.api.put(pod("z", "new", "n1", addr, {"pod": "new"}))
    rig.api.delete(pod("z", "marker", "n3"))
    rig.wait_counts(11, ALL_POLICIES + 1)
    both = {n: len(rig.records(n)) for n in NODES}
    claimed = connect_until_recorded(both)
    assert _pods_of(claimed) == ({"namespace": "x", "name": "b"}, None), claimed["npaudit"]

    # The deletion becomes final: the address is z/new's alone.
    rig.api.delete(pod("z", "old", "n1"))
    rig.wait_counts(10, ALL_POLICIES + 1)
    final = {n: len(rig.records(n)) for n in NODES}
    assert _pods_of(connect_until_recorded(final))[1] == {"namespace": "z", "name": "new"}

    stale = [(n, r["npaudit"]) for n in NODES for r in rig.records(n)[reused[n]:]
             if {"namespace": "z", "name": "old"} in _pods_of(r)]
    assert stale == [], stale


def _flows(local: LocalCluster, node: str) -> list[str]:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "--no-stats", "dump-flows",
                          f"unix:{local.dir / node / 'ovs' / 'br-int.mgmt'}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return sorted(line.strip() for line in out.stdout.splitlines() if "cookie=" in line)


def _logged_batch(rig: Rig) -> dict[str, list[tuple[Any, ...]]]:
    """Logged connections judged on n1 and n3 (none by n2): x/a -> y/a 80 (Drop, n1), x/a -> z/b 81 (Allow,
    n1 and n3), x/a -> y/c 80 (Drop, n1; y/c is on n2). What each node recorded of them, as
    (label, action, source Pod, destination Pod, observer) rows."""
    xa = rig.pods["x/a"]
    targets = [f"{rig.pods['y/a']['ip']}:80/tcp", f"{rig.pods['z/b']['ip']}:81/tcp", f"{rig.pods['y/c']['ip']}:80/tcp"]
    marks = {n: len(rig.records(n)) for n in NODES}
    assert rig.local.probe(xa["netns"], targets, PROBE_TIMEOUT) == dict(zip(targets, ("timeout", "connected",
                                                                                      "timeout")))
    want = {"n1": 3, "n3": 1}

    def rows(node: str) -> list[tuple[Any, ...]]:  # distinct: a retransmitted SYN may be recorded again
        return sorted({(r["labels"]["log_label"], r["event"]["action"], *map(str, _pods_of(r)),
                       r["observer"]["hostname"])
                      for r in rig.records(node)[marks[node]:] if r.get("labels", {}).get("log_label")
                       in ("sec-web", "xz-out", "xz-in") and r["source"]["ip"] == xa["ip"]})

    wait_for(lambda: all(len(rows(n)) >= k for n, k in want.items()), timeout=30, interval=0.2,
             what=lambda: {n: rows(n) for n in NODES})
    return {n: rows(n) for n in NODES}


def test_sigkill_of_one_agent_leaves_every_nodes_enforcement_and_the_others_records(rig: Rig) -> None:
    """n2's agent is SIGKILLed. Its OVS keeps its flows (fail_mode secure), so the matrix stays as it was
    with one difference the agent itself makes: a Reject judged on n2 is answered by n2's agent (a TCP RST),
    so with no agent there it is dropped unanswered. n1 and n3 keep their flows and write the same records."""
    flows = {n: _flows(rig.local, n) for n in NODES}
    before = _logged_batch(rig)
    assert before["n2"] == [] and len(before["n1"]) == 3 and len(before["n3"]) == 1, before

    pid = int((rig.local.dir / "n2" / "agent.pid").read_text())
    cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    assert str(rig.local.dir / "n2" / "npaudit.yaml").encode() in cmdline  # that node's agent, by its pid file
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), timeout=10, what=f"agent {pid} gone")
    for daemon in ("ovs-vswitchd", "ovsdb-server"):
        ovs_pid = int((rig.local.dir / "n2" / "ovs" / f"{daemon}.pid").read_text())
        assert pid_alive(ovs_pid), f"n2's {daemon} went with its agent"
    time.sleep(1.0)  # what would change on the other nodes (none watches n2's agent) has had time to

    assert {n: _flows(rig.local, n) for n in NODES} == flows
    expected = {(s, d, port): matrix_expect(s, d, port) for s, d in itertools.permutations(rig.pods, 2)
                for port in ("80/tcp", "81/tcp", "53/udp")}
    unanswered = {k for k, v in expected.items() if v == "refused" and PLACEMENT[k[1]] == "n2"}
    assert unanswered  # the matrix has Rejects judged on n2
    expected.update({k: "timeout" for k in unanswered})
    wrong = rig.compare(expected)
    assert not wrong, f"after n2's agent was killed, {len(wrong)} probes differ (observed, expected): {wrong}"
    assert _logged_batch(rig) == before
    assert {n: _flows(rig.local, n) for n in NODES} == flows
    for node in ("n1", "n3"):
        res = npaudit("verify", "--config", rig.local.config(node))
        assert res.returncode == 0, f"{node}: {res.stdout}{res.stderr}"
