#!/usr/bin/env python3
"""Memory of the agent's Kubernetes side with a cluster's worth of objects. Prints JSON.

The test API server (tests/support/fake_apiserver.py) serves, in this process: 9 Nodes (this
one and 8 others), 10,000 Pods on the 8 others (1,250 each, each as a kubelet-filled Pod object
with managedFields), 20 Pods on this node, 50 Namespaces and 1,000 NetworkPolicies (each selects
one app and admits another). A child process, the measured one, runs what the agent runs for it:
KubernetesSource (every Pod, every Node) into the PolicyEngine (real compiler, a switch that
confirms and keeps nothing), KnownNodes and NodeSubnet; the 20 local Pods get interfaces, so
the rules compile against the 10,000 remote Pods' addresses. It reports its RSS (VmRSS, and the
peak VmHWM) after the imports, once everything is listed, and after the local Pods compiled; then
the same with an engine that only keeps the objects (`source_only`: the Kubernetes side's share).
The target (issue 21: agent RSS <= 150 MB) is for the whole agent, whose imports weigh more. Run it from the tree
to measure: `.venv/bin/python bench/kubernetes_pods_rss.py` (root not needed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fake_apiserver import (  # noqa: E402
    ACNP, ANP, NAMESPACES, NETPOL, NODES, PODS, TIERS, FakeApiServer,
)
from tests.support.k8s_objects import namespace, node, pod  # noqa: E402

OTHERS, PODS_PER_NODE, LOCAL_PODS, NAMESPACE_COUNT, POLICIES, APPS = 8, 1250, 20, 50, 1000, 200
TARGET_MB = 150

CHILD = r"""
import asyncio, gc, json, sys, time
from kubernetes import client
from policy_agent.cluster.peer_nodes import KnownNodes
from policy_agent.cni.subnet import NodeSubnet
from policy_agent.engine import PolicyEngine
from policy_agent.policy.rules import RuleRegistry
from policy_agent.sources.kubernetes import KubernetesSource
from tests.support.engine_doubles import Info

def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: round(int(fields[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM")}

class NullEngine:
    def __init__(self): self.pods, self.policies, self.registry = {}, {}, ()
    async def start(self): pass
    async def apply(self, namespaces=(), pods=(), tiers=(), policies=()):
        self.pods.update((p.key, p) for p in pods); self.policies.update((p.key, p) for p in policies)
    async def delete(self, namespaces=(), pods=(), tiers=(), policies=()):
        for p in pods: self.pods.pop(p.key, None)
    async def pod_added(self, info): pass

class Switch:
    flows = 0
    async def install_flows(self, flows): self.flows += len(flows)
    async def delete_flows(self, flows): pass
    async def commit_flows(self, install, delete): self.flows += len(install)
    async def install_meters(self, meters): pass

async def main(url, want_pods, local, mode):
    gc.collect()
    before = rss()
    cfg = client.Configuration(host=url); cfg.proxy = None
    api = client.ApiClient(cfg)
    switch = Switch()
    engine = PolicyEngine(switch, RuleRegistry(), round_=1, meters=lambda: False) if mode == "engine" else NullEngine()
    await engine.start()
    subnet = NodeSubnet()
    nodes = KnownNodes(lambda: subnet.cidr)
    subnet.subscribe(lambda _c: nodes.refresh())
    source = KubernetesSource(api, engine, node_name="node-0", subnet=subnet, peers=nodes)
    t0 = time.monotonic()
    source.start()
    await asyncio.wait_for(source.synced.wait(), 600)
    while len(engine.pods) < want_pods:
        await asyncio.sleep(0.1)
    listed = time.monotonic() - t0
    gc.collect()
    at_list = rss()
    for i in range(local):
        await engine.pod_added(Info("ns-%d" % (i % 50), "local-%d" % i, "10.244.0.%d" % (10 + i),
                                    "02:00:00:00:01:%02x" % i, 100 + i))
    compiled = time.monotonic() - t0
    gc.collect()
    await asyncio.sleep(0.5)
    after = rss()
    await source.close()
    api.close()
    print(json.dumps({"rss_mb_after_imports": before["VmRSS"], "rss_mb_listed": at_list["VmRSS"],
                      "rss_mb": after["VmRSS"],
                      "peak_rss_mb": after["VmHWM"], "pods": len(engine.pods), "policies": len(engine.policies),
                      "rules": len(engine.registry), "peers": len(nodes.peers), "flows_installed": switch.flows,
                      "seconds_to_list": round(listed, 2), "seconds_to_compile_with_local_pods": round(compiled, 2)}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
"""


def objects(server: FakeApiServer) -> int:
    """The cluster's objects into the server's lists; how many Pods."""
    # Each other node's Pods in a /16 of its own (1,250 do not fit the /24 this node has).
    server.set_items(NODES, [node("node-0", "10.244.0.0/24", "192.0.2.10")] +
                     [node(f"node-{n}", f"10.{100 + n}.0.0/16", f"192.0.2.{10 + n}") for n in range(1, OTHERS + 1)],
                     "9")
    server.set_items(NAMESPACES, [namespace(f"ns-{i}") for i in range(NAMESPACE_COUNT)], "9")
    pods = []
    for n in range(1, OTHERS + 1):
        for i in range(PODS_PER_NODE):
            p = pod(f"ns-{i % NAMESPACE_COUNT}", f"app-{n}-{i}", f"node-{n}", f"10.{100 + n}.{i // 250}.{i % 250 + 2}",
                    {"app": f"app-{i % APPS}", "tier": "web"})
            p["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Update",
                                               "fieldsV1": {"f:status": {"f:conditions": {}, "f:podIP": {}}}}]
            pods.append(p)
    pods += [pod(f"ns-{i % NAMESPACE_COUNT}", f"local-{i}", "node-0", f"10.244.0.{10 + i}",
                 {"app": f"app-{i % APPS}", "tier": "web"}) for i in range(LOCAL_PODS)]
    server.set_items(PODS, pods, "9")
    server.set_items(NETPOL, [{
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": f"np-{i}", "namespace": f"ns-{i % NAMESPACE_COUNT}", "resourceVersion": "9"},
        "spec": {"podSelector": {"matchLabels": {"app": f"app-{i % APPS}"}},
                 "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
                     "app": f"app-{(i + 1) % APPS}"}}}], "ports": [{"protocol": "TCP", "port": 80 + i % 50}]}]},
    } for i in range(POLICIES)], "9")
    for path in (TIERS, ACNP, ANP):
        server.set_items(path, [], "9")
    return len(pods)


def measure(url: str, total: int, mode: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(total), str(LOCAL_PODS), mode], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"measured process failed:\n{out.stderr[-4000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run() -> dict[str, object]:
    """Both measurements against one test API server; the result JSON (bench/cluster_scale.py reuses it)."""
    server = FakeApiServer()
    total = objects(server)
    server.start()
    try:
        started = time.monotonic()
        result = measure(server.url, total, "engine")
        # The same objects into an engine that only keeps them: the Kubernetes side's own share.
        source_only = measure(server.url, total, "null")
    finally:
        server.close()
    rss = float(result["rss_mb"])  # type: ignore[arg-type]
    result.update({"bench": "kubernetes_pods_rss", "remote_pods": OTHERS * PODS_PER_NODE, "local_pods": LOCAL_PODS,
                   "nodes": OTHERS + 1, "namespaces": NAMESPACE_COUNT,
                   "source_only": {k: source_only[k] for k in ("rss_mb_after_imports", "rss_mb", "peak_rss_mb")},
                   "wall_seconds": round(time.monotonic() - started, 1),
                   "note": "seconds_to_list is mostly the test API server (one Python thread serving 10,000 Pods)",
                   "rss_mb_vs_target": round(rss / TARGET_MB, 3), "rss_target_met": rss <= TARGET_MB})
    return result


def main() -> None:
    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
