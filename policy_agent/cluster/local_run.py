"""A cluster on one machine, made and unmade: what `npaudit cluster up|down|status|apply|pod add` do.

The plan (policy_agent/cluster/local.py) is recorded in DIR/cluster.json before anything is made;
`down` reads that record and stops exactly what it names: agents by the pids in their pid files
(checked to still be that agent), OVS daemons by their run directories' pid files, namespaces by
their recorded names. Nothing is created outside those namespaces: every veth and bridge lives in
the underlay namespace or a node's, and the host's interfaces and routes are never touched.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import yaml

from auditlog.atomic_file import write_atomically
from policy_agent.cluster.local import (
    NODE_UNDERLAY_IF, RECORD, UNDERLAY_BRIDGE, ClusterPlan, NodePlan, PlanError, PodPlan, check_requested_ip,
    kubeconfig, netconf,
    node_config_yaml, node_objects, plan_cluster, plan_pod, pod_object, shared_name, teardown)
from policy_agent.cluster.local_agents import (agent_pid, how_it_ended, log_tail, readiness, start_agent,
                                              started_here_running)
from policy_agent.errors import AgentError
from policy_agent.ovs.embedded import EmbeddedOvs, netns_exists
from policy_agent.ovs.pids import stop_pid

Say = Callable[[str], None]


class ClusterError(AgentError):
    """`npaudit cluster` could not do what it was asked; the text is the line to print."""


def _run(cmd: list[str], timeout: float = 60) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)}: {res.stderr.strip() or f'exit {res.returncode}'}")


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 now (bound together, then released)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def load_record(directory: Path) -> ClusterPlan:
    path = directory / RECORD
    try:
        return ClusterPlan.from_json(path.read_text())
    except FileNotFoundError as exc:
        raise ClusterError(f"no cluster in {directory} ({RECORD} not found)") from exc
    except (OSError, ValueError) as exc:
        raise ClusterError(f"{path}: {exc}") from exc


def save_record(plan: ClusterPlan) -> None:
    write_atomically(plan.record_path, plan.to_json().encode(), mode=0o644)


def add_netns(name: str) -> None:
    """A network namespace `name` with its loopback up."""
    _run(["ip", "netns", "add", name])
    _run(["ip", "-n", name, "link", "set", "lo", "up"])


def make_underlay(netns: str) -> None:
    """The underlay: a namespace `netns` holding the Linux bridge (UNDERLAY_BRIDGE) every node's veth joins."""
    add_netns(netns)
    _run(["ip", "-n", netns, "link", "add", UNDERLAY_BRIDGE, "type", "bridge"])
    _run(["ip", "-n", netns, "link", "set", UNDERLAY_BRIDGE, "up"])


def join_underlay(underlay_netns: str, port: str, node_netns: str) -> None:
    """The node namespace `node_netns` (made already) on the underlay: a veth whose end `port` is on the
    underlay's bridge and whose other end is NODE_UNDERLAY_IF in the node's namespace, both up. Made
    before the node's agent starts, which finds it there (cluster.underlay_interface) and leaves it to us."""
    _run(["ip", "-n", underlay_netns, "link", "add", port, "type", "veth", "peer", "name", NODE_UNDERLAY_IF,
          "netns", node_netns])
    _run(["ip", "-n", underlay_netns, "link", "set", port, "master", UNDERLAY_BRIDGE, "up"])
    _run(["ip", "-n", node_netns, "link", "set", NODE_UNDERLAY_IF, "up"])


# --- agents ------------------------------------------------------------------------------------


def wait_ready(plan: ClusterPlan, timeout: float, say: Say) -> None:
    deadline = time.monotonic() + timeout
    waiting = {n.name: n for n in plan.nodes}
    why: dict[str, str] = {}
    while waiting:
        for name, node in list(waiting.items()):
            running = started_here_running(node)  # our own child's status, when we started it
            if running is False or (running is None and agent_pid(node) is None):
                raise ClusterError(f"node {name}: the agent exited{how_it_ended(node)}; {node.log_path} ends:\n"
                                   f"{log_tail(node)}")
            ok, why[name] = readiness(node)
            if ok:
                say(f"node {name} ready")
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            raise ClusterError("not ready within %gs: %s" % (
                timeout, "; ".join(f"{n}: {why.get(n) or 'no answer'}" for n in waiting)))
        time.sleep(0.2)


# --- up / down ---------------------------------------------------------------------------------


def up(directory: Path, nodes: int, encapsulation: str, timeout: float, say: Say,
       kubernetes_api: str = "", deny_unknown_sources: bool = True) -> ClusterPlan:
    """Make the cluster and return once every node's agent is ready; on any failure undo what was made
    (files stay) and raise. With `kubernetes_api` every node watches that API server instead of DIR/shared."""
    directory = directory.resolve()
    if (directory / RECORD).exists():
        raise ClusterError(f"{directory} holds a cluster already ({RECORD}): `npaudit cluster down --dir "
                           f"{directory}` and remove it, or choose another --dir")
    try:
        plan = plan_cluster(directory, nodes, encapsulation, secrets.token_hex(3), free_ports(nodes), kubernetes_api,
                            deny_unknown_sources)
    except PlanError as exc:
        raise ClusterError(str(exc)) from exc
    taken = [name for name in plan.namespaces() if netns_exists(name)]
    if taken:
        raise ClusterError(f"network namespace {taken[0]} exists already; try again (a new tag is drawn)")
    directory.mkdir(parents=True, exist_ok=True)
    save_record(plan)  # before anything is made: `down` undoes a failed `up` from it
    try:
        _make(plan, say)
        wait_ready(plan, timeout, say)
    except BaseException:
        say("up failed: stopping what it started (files stay)")
        down(directory, say)
        raise
    return plan


def _make(plan: ClusterPlan, say: Say) -> None:
    if plan.kubernetes_api:
        write_atomically(plan.kubeconfig_path, kubeconfig(plan).encode(), mode=0o644)
        write_atomically(plan.nodes_path, yaml.safe_dump_all(node_objects(plan), sort_keys=False).encode(),
                         mode=0o644)
        say(f"every node watches the Kubernetes API {plan.kubernetes_api} ({plan.kubeconfig_path}); its Node "
            f"objects (podCIDR, InternalIP) are in {plan.nodes_path}: create them there")
    else:
        plan.shared_dir.mkdir(exist_ok=True)
    make_underlay(plan.underlay_netns)
    for node in plan.nodes:
        for d in (node.path, node.state_dir, node.audit_path.parent, node.ipam_dir):
            d.mkdir(parents=True, exist_ok=True)
        write_atomically(node.config_path, node_config_yaml(plan, node).encode(), mode=0o644)
        write_atomically(node.netconf_path, (json.dumps(netconf(plan, node), indent=2) + "\n").encode(), mode=0o644)
        add_netns(node.netns)  # pre-created: the agent's embedded OVS runs in it and leaves it to us
        join_underlay(plan.underlay_netns, node.underlay_port, node.netns)
        pid = start_agent(node)
        say(f"node {node.name}: agent pid {pid}, Pod subnet {node.pod_cidr}, underlay {node.address}, "
            f"netns {node.netns}")


def down(directory: Path, say: Say) -> None:
    """Stop what the record names, in teardown order; what is already gone is skipped (idempotent)."""
    plan = load_record(directory.resolve())
    plan_down = teardown(plan)
    for name in plan_down.pod_netns:
        _delete_netns(name, say)
    for node in plan.nodes:
        pid = agent_pid(node)
        if pid is not None:
            say(f"node {node.name}: stopping agent {pid}")
            stop_pid(pid, lambda: agent_pid(node) == pid, timeout=20.0)
    for run_dir, netns in plan_down.ovs_run_dirs:
        ovs = EmbeddedOvs(Path(run_dir), netns)
        if ovs.pid("ovs-vswitchd") is not None or ovs.pid("ovsdb-server") is not None:
            say(f"stopping OVS of {run_dir}")
        ovs.stop_daemon("ovs-vswitchd")
        ovs.stop_daemon("ovsdb-server")
    for name in (*plan_down.node_netns, plan_down.underlay_netns):
        _delete_netns(name, say)


def _delete_netns(name: str, say: Say) -> None:
    if netns_exists(name):
        say(f"deleting network namespace {name}")
        _run(["ip", "netns", "delete", name])


# --- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    name: str
    pod_cidr: str
    address: str
    netns: str
    config: str
    pid: int | None
    ready: bool
    waiting: str
    policies: int | None
    pods: int | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pod_cidr": self.pod_cidr, "address": self.address, "netns": self.netns,
                "config": self.config, "pid": self.pid, "alive": self.pid is not None, "ready": self.ready,
                "waiting": self.waiting, "policies": self.policies, "pods": self.pods}


def status(directory: Path) -> tuple[ClusterPlan, list[NodeStatus]]:
    from policy_agent.config.loader import ConfigError, load
    from policy_agent.sources.local_api import STATUS_OP, call

    plan = load_record(directory.resolve())
    out = []
    for node in plan.nodes:
        pid = agent_pid(node)
        ready, why = readiness(node) if pid is not None else (False, "agent not running")
        policies = pods = None
        if pid is not None:
            try:
                reply = call(load(node.config_path).api_socket, {"op": STATUS_OP}, timeout=10)
                counts = (reply.get("status") or {}).get("policy") or {}
                policies, pods = counts.get("policies"), counts.get("pods")
            except (OSError, ConfigError, AgentError):
                pass
        out.append(NodeStatus(node.name, node.pod_cidr, node.address, node.netns, str(node.config_path), pid,
                              ready, why, policies, pods))
    return plan, out


# --- the shared policy source and Pods ----------------------------------------------------------


def check_shared_set(plan: ClusterPlan, name: str, text: str, source: str) -> None:
    """ClusterError unless DIR/shared with `text` as its file `name` loads as one set, as every node loads
    it: a set that does not (a duplicate object, a Tier priority taken) would be refused by every node."""
    from policy_agent.policy.manifests import ManifestError, load_path, load_text

    try:
        load_text(text, source)
        others = [f for f in sorted(plan.shared_dir.iterdir()) if f.suffix in (".yaml", ".yml", ".json")
                  and f.name != name]
        if others:
            with tempfile.TemporaryDirectory(prefix=".check-", dir=plan.path) as staged:
                for f in others:
                    (Path(staged) / f.name).write_bytes(f.read_bytes())
                (Path(staged) / name).write_text(text)
                load_path(staged)
    except ManifestError as exc:
        raise ClusterError("rejected, nothing written:\n" + "\n".join(exc.errors)) from exc


def apply_shared(directory: Path, source: str, text: str) -> Path:
    """Write `text` (manifests, validated with what DIR/shared holds already, as every node will read the
    set) into DIR/shared whole or not at all; every node's manifest directory picks it up."""
    plan = load_record(directory.resolve())
    if plan.kubernetes_api:
        raise ClusterError(f"this cluster's nodes take their policies from the Kubernetes API {plan.kubernetes_api}: "
                           "create them there (DIR/shared is not read)")
    target = plan.shared_dir / shared_name(source)
    check_shared_set(plan, target.name, text, source)
    write_atomically(target, text.encode(), mode=0o644)
    return target


def add_pod(directory: Path, node_name: str, ref: str, labels: list[str], say: Say, ip: str = "") -> PodPlan:
    """A Pod on one node: its object (labels, spec.nodeName) applied to that node's agent first, so the
    Pod's policy is in OVS before its port forwards; its network namespace wired by that node's
    `npaudit cni`; then its object with status.podIP published in DIR/shared for every node. A failure
    undoes what this call made. With a Kubernetes API the Pod's object is the API's (the user's, as
    kubelet's): the CNI ADD waits for it there, and its status.podIP is set there after. `ip`: the address
    to ask the node's IPAM for (in its Pod subnet); "" = the next free one."""
    plan = load_record(directory.resolve())
    try:
        pod = plan_pod(plan, node_name, ref, labels)
    except PlanError as exc:
        raise ClusterError(str(exc)) from exc
    node = plan.node(pod.node)
    if ip:
        try:
            ip = check_requested_ip(node, ip)
        except PlanError as exc:
            raise ClusterError(str(exc)) from exc
    if not plan.kubernetes_api:
        check_shared_set(plan, pod.manifest_name, yaml.safe_dump(pod_object(pod)), pod.ref)
    if agent_pid(node) is None:
        raise ClusterError(f"node {node.name}: no agent running (`npaudit cluster status --dir {plan.dir}`)")
    save_record(replace(plan, pods=(*plan.pods, pod)))  # before its namespace exists
    try:
        pod = replace(pod, ip=_wire_pod(node, pod, local_object=not plan.kubernetes_api, ip=ip))
    except BaseException:
        _undo_pod(directory, node, pod, say, local_object=not plan.kubernetes_api)
        raise
    plan = load_record(directory.resolve())
    save_record(replace(plan, pods=tuple(pod if p.netns == pod.netns else p for p in plan.pods)))
    if plan.kubernetes_api:
        say(f"Pod {pod.ref} on {node.name}: {pod.ip}, network namespace {pod.netns}; set its status.podIP "
            f"to {pod.ip} in the Kubernetes API")
        return pod
    write_atomically(plan.shared_dir / pod.manifest_name, yaml.safe_dump(pod_object(pod)).encode(), mode=0o644)
    say(f"Pod {pod.ref} on {node.name}: {pod.ip}, network namespace {pod.netns}")
    return pod


def delete_pod(directory: Path, ref: str, say: Say) -> PodPlan:
    """What `pod add` made, undone: the Pod's object out of DIR/shared (with a Kubernetes API: the user
    deletes it there), its port and address given back by its node's `npaudit cni` DEL, its namespace
    deleted, its entry out of the record."""
    plan = load_record(directory.resolve())
    pod = next((p for p in plan.pods if p.ref == ref), None)
    if pod is None:
        raise ClusterError(f"no Pod {ref} in this cluster (`npaudit cluster status --dir {plan.dir}`)")
    if not plan.kubernetes_api:
        (plan.shared_dir / pod.manifest_name).unlink(missing_ok=True)
    _undo_pod(directory, plan.node(pod.node), pod, say, local_object=not plan.kubernetes_api, undoing="deleting")
    say(f"Pod {pod.ref} deleted from {pod.node}" + (f" (its address {pod.ip} is free again)" if pod.ip else ""))
    return pod


def _wire_pod(node: NodePlan, pod: PodPlan, *, local_object: bool, ip: str) -> str:
    """The Pod's object to its node's agent (unless the API holds it), then its namespace through that
    node's `npaudit cni`; its address."""
    from policy_agent.sources.local_api import call

    add_netns(pod.netns)
    if local_object:
        reply = call(node.state_dir / "api.sock", {"op": "apply", "manifests": yaml.safe_dump(pod_object(pod)),
                                                    "source": f"cluster pod add {pod.ref}"})
        if not reply.get("ok"):
            raise ClusterError(f"node {node.name} refused Pod {pod.ref}: "
                               f"{'; '.join(map(str, reply.get('errors', [])))}")
    res = _cni(node, pod, "ADD", ip)
    if res.returncode != 0:
        raise ClusterError(f"CNI ADD of {pod.ref} on {node.name} failed: {res.stdout.decode(errors='replace')}"
                           f"{res.stderr.decode(errors='replace')}")
    return str(json.loads(res.stdout)["ips"][0]["address"].split("/")[0])


def _cni(node: NodePlan, pod: PodPlan, command: str, ip: str = "") -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=pod.container_id,
               CNI_NETNS=f"/run/netns/{pod.netns}", CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni",
               CNI_ARGS=f"K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}")
    conf = node.netconf_path.read_bytes()
    if ip:  # host-local takes a requested address from the runtime configuration (the "ips" capability)
        conf = json.dumps({**json.loads(conf), "runtimeConfig": {"ips": [ip]}}).encode()
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "cni"], input=conf,
                          env=env, capture_output=True, timeout=120)


def _undo_pod(directory: Path, node: NodePlan, pod: PodPlan, say: Say, *, local_object: bool = True,
              undoing: str = "undoing what was made") -> None:
    """After a failed `pod add` (or for `pod delete`): its port and address given back, its object off the
    node, its namespace deleted, its entry out of the record (so the same Pod can be added again)."""
    from policy_agent.sources.local_api import call

    say(f"Pod {pod.ref}: {undoing}")
    if agent_pid(node) is not None:
        _cni(node, pod, "DEL")
        if local_object:
            try:
                call(node.state_dir / "api.sock", {"op": "delete", "manifests": yaml.safe_dump(pod_object(pod)),
                                                   "source": f"cluster pod {pod.ref} ({undoing})"})
            except (OSError, AgentError):
                pass
    _delete_netns(pod.netns, say)
    plan = load_record(directory.resolve())
    save_record(replace(plan, pods=tuple(p for p in plan.pods if p.netns != pod.netns)))
