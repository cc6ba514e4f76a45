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


# Connects to each IP:PORT of argv[2:] until every one answered once or argv[1] seconds passed; prints
# those that never did.
WARM = ("import socket, sys, time\n"
        "left = set(sys.argv[2:]); deadline = time.monotonic() + float(sys.argv[1])\n"
        "while left and time.monotonic() < deadline:\n"
        "    for t in sorted(left):\n"
        "        ip, port = t.rsplit(':', 1); s = socket.socket(); s.settimeout(1.0)\n"
        "        try:\n            s.connect((ip, int(port))); left.discard(t)\n"
        "        except OSError:\n            pass\n"
        "        finally:\n            s.close()\n"
        "    time.sleep(0.2)\n"
        "print(' '.join(sorted(left)))\n")


def _warm_up(pods: dict[str, PodPlan], seconds: float = 30.0) -> list[str]:
    """Connect every Pod to every other (port 80), all sources at once; the `src -> ip:port` never reached."""
    procs = {ref: subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-c", WARM, str(seconds),
                                    *(f"{o.ip}:80" for r, o in pods.items() if r != ref)],
                                   stdout=subprocess.PIPE, text=True)
             for ref, pod in pods.items()}
    out = []
    for ref, proc in procs.items():
        left, _ = proc.communicate(timeout=seconds + 60)
        out += [f"{ref} -> {t}" for t in left.split()]
    return out


def _npaudit(say: Callable[[str], None], *args: str) -> int:
    say(f"$ npaudit {' '.join(args)}")
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], timeout=120).returncode


def _known_everywhere(plan: ClusterPlan, policies: int, pods: int, timeout: float) -> bool:
    """Whether every node came to hold `policies` policies and `pods` Pods (the shared source's) in time."""
    from policy_agent.cluster.local_run import status

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((n.policies or 0) >= policies and (n.pods or 0) >= pods for n in status(plan.path)[1]):
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
        pods: dict[str, PodPlan] = {}
        for ref, node_name in where.items():
            pods[ref] = add_pod(plan.path, node_name, ref, [f"pod={ref.split('/')[1]}"], say)
            proc = subprocess.Popen(["ip", "netns", "exec", pods[ref].netns, sys.executable, "-c", SERVER],
                                    stdout=subprocess.PIPE)
            servers.append(proc)
            if proc.stdout is not None:
                proc.stdout.readline()
        # Before any policy: every Pod reaches every other (retried while a tunnel resolves its peer's
        # underlay address), so what follows shows the policies, not the tunnels warming up.
        unreachable = _warm_up(pods)
        if unreachable:
            say("not reached before any policy: " + ", ".join(unreachable))
            failed.append(f"{len(unreachable)} Pods unreachable before any policy")
        text = shared_manifests()
        apply_shared(plan.path, "demo-samples.yaml", text)
        expected_policies = sum(1 for d in yaml.safe_load_all(text) if isinstance(d, dict)
                                and d.get("kind") in ("ClusterNetworkPolicy", "NetworkPolicy"))
        if not _known_everywhere(plan, expected_policies, len(pods), 60.0):
            failed.append("the shared policies and Pods did not reach every node")
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
