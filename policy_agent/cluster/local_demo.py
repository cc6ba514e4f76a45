"""`npaudit demo --nodes N`: the sample policies on a cluster of N nodes on this machine, with real packets.

`npaudit cluster up` (policy_agent/cluster/local_run.py) starts the nodes; the sample Namespaces,
ClusterNetworkPolicy, NetworkPolicy and Tier (config/samples) and one pair of logged rules go into the
shared source; Pods are spread over the nodes round robin through each node's own `npaudit cni`; TCP
connections between them, most across nodes, each printed with what the policies say of it; then every
node's records (`npaudit logs --config DIR/<node>/npaudit.yaml`) and its chain (`npaudit verify`). One
connection (x/a -> y/a port 81) meets a logged egress rule on the source node and a logged ingress rule
on the destination node, so both nodes write a record of it. Exit 1 when a connection was not as the
policies say or a node's records do not verify.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from policy_agent.cluster.local import ClusterPlan, PodPlan

SAMPLES = Path(__file__).resolve().parent.parent.parent / "config" / "samples"
PODS = ("x/a", "y/a", "z/a", "x/b")
PORTS = (80, 81)
# Ingress and egress Allow, logged, for x/a -> y/a:81: the egress rule is judged on x/a's node, the ingress
# rule on y/a's, and each node writes its record of the one connection.
BOTH_ENDS = """apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: x-a-egress-81}
spec:
  tier: securityops
  priority: 5
  appliedTo:
  - {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {pod: a}}}
  egress:
  - {name: to-y-81, action: Allow, enableLogging: true, logLabel: x-a-egress-81,
     to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}], ports: [{protocol: TCP, port: 81}]}
---
apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: y-ingress-81}
spec:
  tier: securityops
  priority: 6
  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
  ingress:
  - {name: from-x-81, action: Allow, enableLogging: true, logLabel: y-ingress-81,
     from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}], ports: [{protocol: TCP, port: 81}]}
"""
SERVER = ("import socket, threading\n"
          "def serve(port):\n"
          "    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "    s.bind(('0.0.0.0', port)); s.listen(16)\n"
          "    while True:\n        c, _ = s.accept(); c.close()\n"
          f"for p in {PORTS!r}:\n    threading.Thread(target=serve, args=(p,), daemon=True).start()\n"
          "print('ready', flush=True)\nthreading.Event().wait()\n")


@dataclass(frozen=True)
class Probe:
    source: str
    destination: str
    port: int
    expected: str  # "connected" or "timed out"
    why: str


PROBES = (
    Probe("x/a", "y/a", 80, "timed out", "securityops ClusterNetworkPolicy drop-x-a-to-y-http, logged on y/a's node"),
    Probe("x/b", "y/a", 80, "connected", "the ClusterNetworkPolicy names x/a only"),
    Probe("x/a", "z/a", 80, "connected", "K8s NetworkPolicy z/allow-x-to-a, logged on z/a's node (z logs)"),
    Probe("y/a", "z/a", 80, "timed out", "z/a is isolated by z/allow-x-to-a, logged on z/a's node"),
    Probe("x/a", "y/a", 81, "connected", "logged egress rule on x/a's node AND logged ingress rule on y/a's node"),
)


def placement(nodes: int) -> dict[str, str]:
    """Pod -> node, round robin over n1..nN, so most of the probes cross nodes."""
    return {pod: f"n{i % nodes + 1}" for i, pod in enumerate(PODS)}


def shared_manifests() -> str:
    """The samples' Namespaces (their Pod objects are left out: `cluster pod add` publishes each Pod with
    its node and address), their policies and Tier, and the pair of logged rules above."""
    docs = [d for d in yaml.safe_load_all((SAMPLES / "01-namespaces-pods.yaml").read_text())
            if isinstance(d, dict) and d.get("kind") == "Namespace"]
    parts = [yaml.safe_dump_all(docs)] + [(SAMPLES / f).read_text() for f in
                                          ("02-acnp-securityops.yaml", "03-k8s-netpol.yaml", "04-tier.yaml")]
    return "\n---\n".join([*parts, BOTH_ENDS])


def _connect(netns: str, ip: str, port: int) -> str:
    code = (f"import socket\ns=socket.socket(); s.settimeout(2.0)\n"
            f"try:\n    s.connect(('{ip}', {port})); print('connected')\n"
            f"except ConnectionRefusedError: print('refused')\nexcept OSError: print('timed out')\n")
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    return res.stdout.strip() or res.stderr.strip()[-200:]


def _npaudit(say: Callable[[str], None], *args: str) -> int:
    say(f"$ npaudit {' '.join(args)}")
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], timeout=120).returncode


def _policies_everywhere(plan: ClusterPlan, count: int, timeout: float) -> bool:
    from policy_agent.cluster.local_run import status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((n.policies or 0) >= count for n in status(plan.path)[1]):
            return True
        time.sleep(0.3)
    return False


def run_cluster_demo(nodes: int, output_dir: Path | None, keep: bool, say: Callable[[str], None]) -> int:
    from policy_agent.cluster.local_run import add_pod, apply_shared, down, up

    directory = output_dir or Path(tempfile.mkdtemp(prefix="npaudit-demo-", dir="/tmp"))
    plan = up(directory, nodes, "geneve", 300.0, say)
    failed: list[str] = []
    servers: list[subprocess.Popen[bytes]] = []
    try:
        where = placement(nodes)
        text = shared_manifests()
        apply_shared(plan.path, "demo-samples.yaml", text)
        expected_policies = sum(1 for d in yaml.safe_load_all(text) if isinstance(d, dict)
                                and d.get("kind") in ("ClusterNetworkPolicy", "NetworkPolicy"))
        if not _policies_everywhere(plan, expected_policies, 60.0):
            failed.append("the shared policies did not reach every node")
        pods: dict[str, PodPlan] = {}
        for ref, node_name in where.items():
            pods[ref] = add_pod(plan.path, node_name, ref, [f"pod={ref.split('/')[1]}"], say)
            proc = subprocess.Popen(["ip", "netns", "exec", pods[ref].netns, sys.executable, "-c", SERVER],
                                    stdout=subprocess.PIPE)
            servers.append(proc)
            if proc.stdout is not None:
                proc.stdout.readline()
        time.sleep(2 * 0.5 + 0.5)  # two polls of the shared directory: every node knows every Pod's address
        for p in PROBES:
            got = _connect(pods[p.source].netns, pods[p.destination].ip, p.port)
            hop = f"{where[p.source]} -> {where[p.destination]}"
            ok = got == p.expected
            say(f"{p.source} ({hop}) -> {p.destination}:{p.port} {got}: {p.why}"
                + ("" if ok else f"  [NOT as the policies say: expected {p.expected}]"))
            if not ok:
                failed.append(f"{p.source} -> {p.destination}:{p.port}")
        time.sleep(1.5)  # the aggregation window (audit.window) of the dropped connections' records
        for node in plan.nodes:
            say(f"--- records of node {node.name} ({node.audit_path}) ---")
            if not node.audit_path.exists():
                say("(none)")
            elif _npaudit(say, "logs", "--config", str(node.config_path), "-o", "compact") != 0:
                failed.append(f"npaudit logs of {node.name}")
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()
        if not keep:
            down(plan.path, say)
    for node in plan.nodes:
        if node.audit_path.exists() and _npaudit(say, "verify", str(node.audit_path.parent)) != 0:
            failed.append(f"npaudit verify of {node.name}")
    if keep:
        say(f"left running: npaudit cluster down --dir {plan.dir}")
    say(f"each node's files (config, audit, agent log) are in {plan.dir}/<node>/")
    if failed:
        say("demo: not as expected: " + "; ".join(failed))
        return 1
    return 0
