#!/usr/bin/env python3
"""A cluster's figures (issue 21), each beside a baseline measured in the same run. Prints JSON.

1. Throughput: a cluster of --nodes nodes on this machine (`npaudit cluster up`, tests/support/
   local_cluster.py: a netns per node with its embedded OVS and agent, Geneve between them). Short TCP
   streams (Python sockets, 128 KiB writes, --seconds) from x/a on n1 to y/a on n2 (cross-node) and to
   y/b on n1 (same node), --steps steps, the ClusterNetworkPolicy that allows them switched between
   `enableLogging` false and true every step (bench/_cluster_throughput.py): logging on / off is the
   median of the ratios of adjacent streams of a path, with its spread, and the same per CPU-second
   (sender, receiver, the vswitchd(s) crossed); cross-node / same-node the median of per-step ratios.
   Target: cross-node logging on / off >= 0.95.
2. Policy propagation, in two modes (--propagation-modes): one Pod t/t<i> per node, each probed on TCP 80
   from the Pod of the next node (a connect every few ms, each a new connection). A ClusterNetworkPolicy
   is rewritten to Reject that port, then to reject another one, --changes times in all; the time from
   the write to the first connect on each node's Pod that shows the new verdict (refused by the Reject
   rule's RST, or connected again) is that node's figure, the slowest node the change's. Traffic is the
   exact witness: a verdict seen is the policy in force in that node's OVS. `kubernetes_api` (the
   target's mode): a second cluster, `cluster up --kubernetes-api`, every node watching one test API
   server (tests/support/kube_store.py) holding the Nodes, the Namespace, the Pods and the policy, which
   the bench replaces there; `shared_source` (the baseline): the policy written to the first cluster's
   shared source (DIR/shared, polled every 0.5 s).
3. Agent RSS with 10,000 Pods on 8 other nodes and 1,000 NetworkPolicies listed from the test API
   server (bench/kubernetes_pods_rss.py; baseline: RSS after the imports, and the Kubernetes side alone).
4. CNI ADD agent side at 1,000 rules with 10,000 remote Pods known (bench/remote_pods_scale.py, --adds
   ADDs for a p99), baseline the same with no remote Pod.

The machine may be shared: the load average is in the JSON before and after each part.
Run as root: `.venv/bin/python bench/cluster_scale.py` (`--parts throughput,propagation,rss,cni_add`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PARTS = ("throughput", "propagation", "rss", "cni_add")
PROBED_PORT, OTHER_PORT = 80, 81
THROUGHPUT_TARGET = 0.95
PROPAGATION_TARGET_S = 1.0
CNI_ADD_TARGET_MS = 30.0
PROPAGATION_MODES = ("kubernetes_api", "shared_source")
NOTES = ("policy propagation from a Kubernetes API (the test API server, every node watching it; the target's mode) "
         "and through the shared policy source (DIR/shared, polled every 0.5 s)",
         "in force = the new verdict seen by traffic to each node's Pod (a Reject's RST, or a connection again)",
         "the machine has 2 cores shared with other work: see load_average")

# Connects to argv[1]:argv[2] every argv[3] seconds (each a new connection, argv[4] s timeout); prints
# "<monotonic> <state>" at the start and each time the outcome changes (connected|refused|timeout|error:N).
PROBER = r"""
import socket, sys, time
ip, port, period, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
last = None
while True:
    s = socket.socket(); s.settimeout(timeout)
    try:
        s.connect((ip, port)); state = "connected"
    except ConnectionRefusedError: state = "refused"
    except socket.timeout: state = "timeout"
    except OSError as e: state = "error:%d" % e.errno
    finally: s.close()
    now = time.monotonic()
    if state != last:
        print("%.6f %s" % (now, state), flush=True); last = state
    time.sleep(period)
"""


# --- pure helpers (tests/unit/bench/test_cluster_scale.py) ---------------------------------------

def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of non-empty samples: p99 of 40 samples is the largest."""
    if not samples:
        raise ValueError("no samples")
    s = sorted(samples)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


def summary_ms(seconds: Sequence[float]) -> dict[str, float | int]:
    ms = [x * 1000 for x in seconds]
    return {"samples": len(ms), "p50_ms": round(percentile(ms, 50), 1), "p99_ms": round(percentile(ms, 99), 1),
            "max_ms": round(max(ms), 1)}


def parse_transition(line: str) -> tuple[float, str] | None:
    """A PROBER line: (monotonic seconds, state), or None for anything else."""
    parts = line.split()
    if len(parts) != 2:
        return None
    try:
        return float(parts[0]), parts[1]
    except ValueError:
        return None


def first_at(transitions: Sequence[tuple[float, str]], after: float, state: str) -> float | None:
    """When the outcome first became `state` after time `after`: the first transition to it after
    `after`, or `after` itself when it already was `state` then (no transition needed)."""
    current = None
    for t, s in transitions:
        if t <= after:
            current = s
        elif s == state:
            return t
    return after if current == state else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def reject_policy(port: int) -> str:
    """The ClusterNetworkPolicy the propagation part rewrites: namespace t's Pods Reject TCP `port` from t."""
    return ("apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: bench-propagation}\n"
            "spec:\n  tier: securityops\n  priority: 4\n"
            "  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: t}}}]\n"
            "  ingress:\n  - name: reject-probe\n    action: Reject\n"
            "    from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: t}}}]\n"
            f"    ports: [{{protocol: TCP, port: {port}}}]\n")


def namespaces(*names: str) -> str:
    return "---\n".join(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {n}\n  labels:\n"
                        f"    kubernetes.io/metadata.name: {n}\n" for n in names)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- the cluster parts ---------------------------------------------------------------------------

def _apply(cluster: Any, name: str, text: str) -> None:
    from policy_agent.cluster.local_run import apply_shared

    apply_shared(cluster.dir, name, text)


def _wait_pods_everywhere(cluster: Any, nodes: list[str], pods: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((cluster.node_status(n)["policy"]["pods"] or 0) >= pods for n in nodes):
            return
        time.sleep(1)
    raise SystemExit(f"not every node knew {pods} Pods within {timeout:.0f}s")


def _warm(cluster: Any, src: dict[str, str], dsts: Sequence[dict[str, str]], timeout: float = 60) -> None:
    """Connect `src` to each of `dsts` (TCP 80) until every one answered: the first packet into a cold
    tunnel is lost (silently) while OVS resolves the peer's underlay address, and a 1 s probe ends before
    TCP's SYN retry."""
    targets = [f"{d['ip']}:{PROBED_PORT}/tcp" for d in dsts]
    deadline = time.monotonic() + timeout
    while True:
        got = cluster.probe(src["netns"], targets, timeout=1.0)
        if all(v == "connected" for v in got.values()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{src['netns']} never reached {got}")
        time.sleep(0.3)


class _Prober:
    """PROBER in one Pod's namespace, its transitions collected by a thread."""

    def __init__(self, netns: str, ip: str, port: int, period: float) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", PROBER, ip, str(port),
                                      str(period), "1.0"], stdout=subprocess.PIPE, text=True)
        self.transitions: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            got = parse_transition(line)
            if got is not None:
                with self._lock:
                    self.transitions.append(got)

    def seen(self) -> list[tuple[float, str]]:
        with self._lock:
            return list(self.transitions)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def propagation_summary(per_change: Sequence[dict[str, Any]], nodes: int) -> dict[str, Any]:
    """The figures of the changes timed (each with seconds_by_node: node -> seconds or None, not seen):
    a change is in force on all nodes when its slowest node saw it."""
    node_samples = [v for ch in per_change for v in ch["seconds_by_node"].values() if v is not None]
    slowest = [max(ch["seconds_by_node"].values()) for ch in per_change
               if all(v is not None for v in ch["seconds_by_node"].values())]
    missed = sum(1 for ch in per_change for v in ch["seconds_by_node"].values() if v is None)
    all_nodes = summary_ms(slowest) if slowest else None
    return {"in_force_on_all_nodes": all_nodes,
            "in_force_per_node": summary_ms(node_samples) if node_samples else None,
            "not_seen_within_10s": missed,
            "target": f"p99 <= {PROPAGATION_TARGET_S} s, in force on all {nodes} nodes",
            "target_met": all_nodes is not None and missed == 0 and all_nodes["p99_ms"] <= PROPAGATION_TARGET_S * 1000}


def propagation_verdict(modes: dict[str, Any]) -> dict[str, Any]:
    """The target is for a change picked up from the API: met by the kubernetes_api mode's figures (the
    shared source's alone cannot meet it); the API's p99 over the shared source's beside it."""
    api, shared = modes.get("kubernetes_api"), modes.get("shared_source")
    p99 = {m: r["in_force_on_all_nodes"]["p99_ms"] if r and r.get("in_force_on_all_nodes") else None
           for m, r in (("kubernetes_api", api), ("shared_source", shared))}
    return {"in_force_on_all_nodes_p99_ms": p99,
            "kubernetes_api_vs_shared_source_p99_ratio": ratio(p99["kubernetes_api"], p99["shared_source"]),
            "target": f"p99 <= {PROPAGATION_TARGET_S} s from the Kubernetes API, in force on all nodes",
            "target_met": bool(api and api["target_met"])}


def propagation(cluster: Any, nodes: list[str], changes: int, period: float, write: Callable[[str], None],
                add_pod: Callable[[str, str], dict[str, str]]) -> dict[str, Any]:
    """One target Pod per node (`add_pod(node, ref)`), probed from the next node's; the Reject moved between
    ports `changes` times, each time by `write(manifest)` (to the shared source, or to the API)."""
    known = min(cluster.node_status(n)["policy"]["pods"] or 0 for n in nodes)
    targets = {n: add_pod(n, f"t/t{i + 1}") for i, n in enumerate(nodes)}
    _wait_pods_everywhere(cluster, nodes, known + len(targets))
    for i, n in enumerate(nodes):
        _warm(cluster, targets[nodes[(i + 1) % len(nodes)]], [targets[n]])
    write(reject_policy(OTHER_PORT))
    time.sleep(1.5)
    probers = {n: _Prober(targets[nodes[(i + 1) % len(nodes)]]["netns"], targets[n]["ip"], PROBED_PORT, period)
               for i, n in enumerate(nodes)}
    per_change: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while not all(p.seen() and p.seen()[-1][1] == "connected" for p in probers.values()):
            if time.monotonic() > deadline:
                raise SystemExit(f"probes never all connected: { {n: p.seen()[-3:] for n, p in probers.items()} }")
            time.sleep(0.2)
        rng = random.Random(21)
        for c in range(changes):
            rejecting = c % 2 == 0
            expect = "refused" if rejecting else "connected"
            time.sleep(rng.uniform(0.3, 0.8))  # the write falls anywhere in the shared source's poll period
            written = time.monotonic()
            write(reject_policy(PROBED_PORT if rejecting else OTHER_PORT))
            seen: dict[str, float | None] = {n: None for n in nodes}
            give_up = written + 10
            while any(v is None for v in seen.values()) and time.monotonic() < give_up:
                time.sleep(0.02)
                for n, p in probers.items():
                    if seen[n] is None:
                        at = first_at(p.seen(), written, expect)
                        seen[n] = None if at is None else at - written
            per_change.append({"change": c, "expect": expect,
                               "seconds_by_node": {n: None if v is None else round(v, 4) for n, v in seen.items()}})
    finally:
        for p in probers.values():
            p.close()
    return {"nodes": len(nodes), "changes": changes, "probe_period_s": period,
            **propagation_summary(per_change, len(nodes)), "per_change": per_change}


def shared_cluster(parts: set[str], args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Throughput, and propagation through the shared source (DIR/shared), on one `cluster up`."""
    import _cluster_throughput

    from tests.support.local_cluster import LocalCluster

    nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
    cluster = LocalCluster()
    try:
        t0 = time.monotonic()
        cluster.up(args.nodes)
        result["cluster"] = {"nodes": args.nodes, "encapsulation": "geneve",
                             "seconds_to_up": round(time.monotonic() - t0, 1)}
        _apply(cluster, "bench-namespaces.yaml", namespaces("x", "y", "t"))
        if "throughput" in parts:
            result["throughput"] = {
                "load_average_before": load(),
                **_cluster_throughput.run(cluster, lambda name, text: _apply(cluster, name, text),
                                          lambda src, dsts: _warm(cluster, src, dsts),
                                          lambda ns, count: _wait_pods_everywhere(cluster, ns, count),
                                          args.seconds, args.steps),
                "load_average_after": load()}
        if "propagation" in parts:
            result.setdefault("propagation", {})["shared_source"] = {
                "load_average_before": load(), "source": "DIR/shared, polled every 0.5 s",
                **propagation(cluster, nodes, args.changes, args.probe_period,
                              lambda text: _apply(cluster, "bench-propagation.yaml", text),
                              lambda node, ref: cluster.add_pod(node, ref, "app=target")),
                "load_average_after": load()}
    finally:
        cluster.close()


def api_cluster(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Propagation from a Kubernetes API: every node of `cluster up --kubernetes-api` watches one test API
    server (tests/support/kube_store.py, every watch sees every change), which holds the Node objects `up`
    wrote, the Namespace, each Pod (its object before its node's CNI ADD, then its status.podIP, as a
    kubelet does) and the policy the bench rewrites."""
    import yaml

    from tests.support.k8s_objects import namespace, pod
    from tests.support.kube_store import KubeStore
    from tests.support.local_cluster import LocalCluster

    nodes = [f"n{i}" for i in range(1, args.nodes + 1)]
    api = KubeStore()
    api.start()
    cluster = LocalCluster()

    def add_pod(node: str, ref: str) -> dict[str, str]:
        ns, name = ref.split("/")
        api.put(pod(ns, name, node, None, {"app": "target"}))
        made: dict[str, str] = cluster.add_pod(node, ref, "app=target")
        api.put(pod(ns, name, node, made["ip"], {"app": "target"}))
        return made

    try:
        api.put(namespace("t"))
        t0 = time.monotonic()
        cluster.up(args.nodes, "--kubernetes-api", api.url)
        for obj in yaml.safe_load_all((cluster.dir / "nodes.yaml").read_text()):
            api.put(obj)
        deadline = time.monotonic() + 60
        while not all(len(cluster.node_status(n)["nodes"]["nodes"]) == len(nodes) - 1 for n in nodes):
            if time.monotonic() > deadline:
                raise SystemExit("not every node learnt its peers from the Node objects within 60 s")
            time.sleep(0.3)
        up = round(time.monotonic() - t0, 1)
        result.setdefault("propagation", {})["kubernetes_api"] = {
            "load_average_before": load(), "source": "one Kubernetes API server (the test one), watched by every node",
            "seconds_to_up_and_peers": up,
            **propagation(cluster, nodes, args.changes, args.probe_period, api.put_yaml, add_pod),
            "load_average_after": load()}
    finally:
        try:
            cluster.close()
        finally:
            api.close()


def rss_part() -> dict[str, Any]:
    import kubernetes_pods_rss

    before = load()
    got = kubernetes_pods_rss.run()
    keys = ("rss_mb_after_imports", "rss_mb_listed", "rss_mb", "peak_rss_mb", "pods", "policies", "rules",
            "source_only", "seconds_to_list", "rss_target_met")
    return {"load_average_before": before, **{k: got[k] for k in keys},
            "baseline_rss_mb_after_imports": got["rss_mb_after_imports"],
            "target": f"rss_mb <= {kubernetes_pods_rss.TARGET_MB}", "load_average_after": load()}


def cni_add_part(adds: int) -> dict[str, Any]:
    import remote_pods_scale

    before = load()
    base = asyncio.run(remote_pods_scale.main(False, rounds=adds, remote=False))
    full = asyncio.run(remote_pods_scale.main(False, rounds=adds, remote=True))
    p99 = {k: round(percentile(r["cni_add_seconds"], 99) * 1000, 2)  # type: ignore[arg-type]
           for k, r in (("no_remote_pods", base), ("remote_pods_10000", full))}
    return {"load_average_before": before, "adds": adds, "rules": full["rules"],
            "agent_side_p99_ms": p99,
            "agent_side_median_ms": {"no_remote_pods": base["cni_add"]["median_ms"],  # type: ignore[index]
                                     "remote_pods_10000": full["cni_add"]["median_ms"]},  # type: ignore[index]
            "remote_vs_none_p99_ratio": ratio(p99["remote_pods_10000"], p99["no_remote_pods"]),
            "target": f"p99 <= {CNI_ADD_TARGET_MS} ms with 10,000 remote Pods",
            "target_met": p99["remote_pods_10000"] <= CNI_ADD_TARGET_MS, "load_average_after": load()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of each throughput stream")
    ap.add_argument("--steps", type=int, default=24,
                    help="throughput steps (logging switched each step; a cross-node and a same-node stream each)")
    ap.add_argument("--propagation-modes", default=",".join(PROPAGATION_MODES),
                    help=f"comma-separated, of {', '.join(PROPAGATION_MODES)}")
    ap.add_argument("--changes", type=int, default=40, help="policy changes timed")
    ap.add_argument("--probe-period", type=float, default=0.005, help="seconds between a prober's connects")
    ap.add_argument("--adds", type=int, default=100, help="CNI ADDs timed per case")
    args = ap.parse_args()
    parts = {p for p in args.parts.split(",") if p}
    if parts - set(PARTS):
        ap.error(f"unknown part(s): {', '.join(sorted(parts - set(PARTS)))}")
    modes = {m for m in args.propagation_modes.split(",") if m}
    if modes - set(PROPAGATION_MODES) or not modes:
        ap.error(f"--propagation-modes: of {', '.join(PROPAGATION_MODES)}")
    started = time.monotonic()
    result: dict[str, Any] = {"benchmark": "cluster_scale", "notes": list(NOTES), "load_average_at_start": load()}
    if "throughput" in parts or ("propagation" in parts and "shared_source" in modes):
        shared_cluster(parts if "shared_source" in modes else parts - {"propagation"}, args, result)
    if "propagation" in parts and "kubernetes_api" in modes:
        api_cluster(args, result)
    if "propagation" in result:
        result["propagation"].update(propagation_verdict(result["propagation"]))
    if "rss" in parts:
        result["rss"] = rss_part()
    if "cni_add" in parts:
        result["cni_add"] = cni_add_part(args.adds)
    result["targets_met"] = {k: result[k]["target_met"] if k != "rss" else result[k]["rss_target_met"]
                             for k in PARTS if k in result}
    result.update(load_average_at_end=load(), wall_seconds=round(time.monotonic() - started, 1))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
