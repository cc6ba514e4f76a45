"""A cluster on one machine (`npaudit cluster`): the plan, with no side effects.

What `up` makes, named before anything is made: an underlay network namespace holding a Linux
bridge; per node a namespace for its embedded OVS, a veth pair (one end on the underlay bridge,
the other in the node's namespace as its `cluster.underlay_interface`), a directory
DIR/<node>/ with the agent's config, state, OVS run directory, audit files, CNI IPAM data, pid
file and log; and one shared manifest directory DIR/shared that every node's
`policy.manifest_dir` watches, or (with a Kubernetes API URL) DIR/kubeconfig naming that API server,
which every node watches instead (Namespaces, Pods, Nodes, policies; its own Node by its name) and
DIR/nodes.yaml, the Node objects to create there (each node's podCIDR and InternalIP). The plan is
written to DIR/cluster.json before `up` makes any of it, so `down` (policy_agent/cluster/local_run.py)
stops exactly that, even after a failed `up`.

Node i (1-based, named n<i>) gets the Pod subnet 10.248.<i>.0/24 and the underlay address
198.51.100.<10+i>/24; its peers are the other nodes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

POD_CIDR_BASE = "10.248"  # 10.248.<i>.0/24 per node: no other test uses 10.248/16
UNDERLAY_NET = ipaddress.IPv4Network("198.51.100.0/24")  # TEST-NET-2: never a real address
ADDRESS_OFFSET = 10  # node i holds 198.51.100.<10+i>
UNDERLAY_BRIDGE = "br-underlay"  # the Linux bridge inside the underlay namespace
NODE_UNDERLAY_IF = "underlay0"  # each node's end of its veth, in its OVS namespace
MAX_NODES = 200  # 198.51.100.11 .. .210; 10.248.1 .. .200
SHARED = "shared"  # DIR/shared: the one policy source of every node
RECORD = "cluster.json"
KUBECONFIG = "kubeconfig"  # DIR/kubeconfig: the Kubernetes API every node watches (when the cluster has one)
NODES = "nodes.yaml"  # DIR/nodes.yaml: the Node objects a user creates in that API
RECORD_VERSION = 1
SYNC_TIMEOUT = 20.0  # seconds a node waits for the API's first lists before serving CNI anyway
POLL_INTERVAL = 0.5  # the shared directory's poll, seconds: a cluster apply is in force within about this
# The longest unix socket path of a node (its OVS's control socket) must fit sockaddr_un (108 bytes
# with its NUL): DIR/<node>/ovs/ovs-vswitchd.ctl.
_SOCKET_LIMIT = 107
_LONGEST_SOCKET = "ovs/ovs-vswitchd.ctl"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_API_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(/[^\s'\"]*)?")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


class PlanError(ValueError):
    """A cluster that cannot be planned as asked; the text is the one line to print."""


@dataclass(frozen=True)
class NodePlan:
    """One node: its name, Pod subnet, underlay address, namespace, veth ends and directory."""

    name: str
    index: int
    pod_cidr: str
    address: str  # with its prefix: 198.51.100.11/24
    netns: str  # the embedded OVS's namespace (the node's host side)
    underlay_port: str  # its veth end on the underlay bridge (in the underlay namespace)
    dir: str
    metrics_port: int

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def config_path(self) -> Path:
        return self.path / "npaudit.yaml"

    @property
    def netconf_path(self) -> Path:
        return self.path / "cni.conf"

    @property
    def pid_path(self) -> Path:
        return self.path / "agent.pid"

    @property
    def log_path(self) -> Path:
        return self.path / "agent.log"

    @property
    def state_dir(self) -> Path:
        return self.path / "state"

    @property
    def ovs_run_dir(self) -> Path:
        return self.path / "ovs"

    @property
    def audit_path(self) -> Path:
        return self.path / "audit" / "audit.jsonl"

    @property
    def ipam_dir(self) -> Path:
        return self.path / "ipam"

    @property
    def metrics_listen(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    @property
    def ip(self) -> str:
        return self.address.split("/")[0]


@dataclass(frozen=True)
class PodPlan:
    """A Pod made by `npaudit cluster pod add`: its namespace (network), node and address once known."""

    namespace: str
    name: str
    node: str
    netns: str
    container_id: str
    labels: tuple[tuple[str, str], ...] = ()
    ip: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def manifest_name(self) -> str:
        """Its Pod object's file in DIR/shared."""
        return f"pod-{self.namespace}-{self.name}.yaml"


@dataclass(frozen=True)
class ClusterPlan:
    dir: str
    tag: str
    encapsulation: str
    underlay_netns: str
    nodes: tuple[NodePlan, ...]
    pods: tuple[PodPlan, ...] = field(default=())
    version: int = RECORD_VERSION
    kubernetes_api: str = ""  # "": policies and Pods from DIR/shared; else the API server's URL every node watches
    # Every node's cluster.deny_unknown_sources (geneve): a Pod's first packets to another node are
    # refused there until its object (DIR/shared) has reached that node.
    deny_unknown_sources: bool = True

    @property
    def path(self) -> Path:
        return Path(self.dir)

    @property
    def shared_dir(self) -> Path:
        return self.path / SHARED

    @property
    def record_path(self) -> Path:
        return self.path / RECORD

    @property
    def kubeconfig_path(self) -> Path:
        return self.path / KUBECONFIG

    @property
    def nodes_path(self) -> Path:
        return self.path / NODES

    def node(self, name: str) -> NodePlan:
        for node in self.nodes:
            if node.name == name:
                return node
        raise PlanError(f"no node {name!r} in {self.record_path} (nodes: {', '.join(n.name for n in self.nodes)})")

    def namespaces(self) -> list[str]:
        """Every namespace of the cluster in the order `up` makes them (underlay, nodes, Pods)."""
        return [self.underlay_netns, *(n.netns for n in self.nodes), *(p.netns for p in self.pods)]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterPlan:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
            raise PlanError(f"not a cluster record of version {RECORD_VERSION}")
        try:
            nodes = tuple(NodePlan(**n) for n in data["nodes"])
            pods = tuple(PodPlan(**{**p, "labels": tuple(tuple(kv) for kv in p.get("labels", ()))})
                         for p in data.get("pods", ()))
            return cls(dir=data["dir"], tag=data["tag"], encapsulation=data["encapsulation"],
                       underlay_netns=data["underlay_netns"], nodes=nodes, pods=pods,
                       kubernetes_api=str(data.get("kubernetes_api") or ""),
                       deny_unknown_sources=bool(data.get("deny_unknown_sources", True)))
        except (KeyError, TypeError) as exc:
            raise PlanError(f"cluster record incomplete or malformed: {exc}") from exc


def plan_cluster(directory: Path, nodes: int, encapsulation: str, tag: str, metrics_ports: list[int],
                 kubernetes_api: str = "", deny_unknown_sources: bool = True) -> ClusterPlan:
    """The cluster `up` makes in `directory` (absolute): `nodes` nodes, namespaces named npc-<tag>-*; with
    `kubernetes_api` (http(s)://HOST:PORT) every node takes Namespaces, Pods, Nodes and policies from it."""
    if not directory.is_absolute():
        raise PlanError(f"--dir must be absolute here, got {directory}")
    if not 1 <= nodes <= MAX_NODES:
        raise PlanError(f"--nodes must be 1..{MAX_NODES}, got {nodes}")
    if encapsulation not in ("geneve", "routed"):
        raise PlanError(f"--encapsulation must be geneve or routed, got {encapsulation!r}")
    if not re.fullmatch(r"[0-9a-f]{4,8}", tag):
        raise PlanError(f"tag must be 4-8 hex digits, got {tag!r}")
    if len(metrics_ports) != nodes or len(set(metrics_ports)) != nodes:
        raise PlanError(f"need {nodes} distinct metrics ports, got {metrics_ports}")
    if kubernetes_api and not _API_URL.fullmatch(kubernetes_api):
        raise PlanError(f"--kubernetes-api must be http(s)://HOST[:PORT], got {kubernetes_api!r}")
    longest = directory / f"n{nodes}" / _LONGEST_SOCKET
    if len(str(longest).encode()) > _SOCKET_LIMIT:
        raise PlanError(f"--dir {directory} is too long: the node's unix sockets ({longest}) must fit "
                        f"{_SOCKET_LIMIT} bytes; choose a shorter path")
    planned = tuple(
        NodePlan(name=f"n{i}", index=i, pod_cidr=f"{POD_CIDR_BASE}.{i}.0/24",
                 address=f"{UNDERLAY_NET.network_address + ADDRESS_OFFSET + i}/{UNDERLAY_NET.prefixlen}",
                 netns=f"npc-{tag}-n{i}", underlay_port=f"n{i}", dir=str(directory / f"n{i}"),
                 metrics_port=port)
        for i, port in zip(range(1, nodes + 1), metrics_ports))
    return ClusterPlan(dir=str(directory), tag=tag, encapsulation=encapsulation, underlay_netns=f"npc-{tag}-ul",
                       nodes=planned, kubernetes_api=kubernetes_api,
                       deny_unknown_sources=deny_unknown_sources)


def node_config(plan: ClusterPlan, node: NodePlan) -> dict[str, Any]:
    """The agent config of `node` (policy_agent/config: only fields the loader knows). With a Kubernetes
    API the node watches it (its own Node and Pods by its name) and its peers are the other Node objects;
    else it reads DIR/shared and its peers are in the config."""
    cluster: dict[str, Any] = {"encapsulation": plan.encapsulation, "node_address": node.address,
                               "underlay_interface": NODE_UNDERLAY_IF,
                               "deny_unknown_sources": plan.deny_unknown_sources}
    source: dict[str, Any]
    if plan.kubernetes_api:
        source = {"kubernetes": {"enabled": True, "kubeconfig": str(plan.kubeconfig_path),
                                 "sync_timeout": SYNC_TIMEOUT}}
    else:
        source = {"policy": {"manifest_dir": str(plan.shared_dir), "poll_interval": POLL_INTERVAL}}
        cluster["peers"] = [{"name": p.name, "pod_cidr": p.pod_cidr, "address": p.ip}
                            for p in plan.nodes if p.name != node.name]
    return {
        "node_name": node.name,
        "cluster_name": f"local-{plan.tag}",
        "state_dir": str(node.state_dir),
        "ovs": {"run_dir": str(node.ovs_run_dir), "netns": node.netns},
        "metrics": {"listen": node.metrics_listen},
        "audit": {"path": str(node.audit_path)},
        **source,
        "node_network": {"pod_cidr": node.pod_cidr},
        "cluster": cluster,
    }


def kubeconfig(plan: ClusterPlan) -> str:
    """DIR/kubeconfig: the cluster's API server, no credentials (a local test API server)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "npaudit",
        "clusters": [{"name": "npaudit", "cluster": {"server": plan.kubernetes_api}}],
        "users": [{"name": "npaudit", "user": {}}],
        "contexts": [{"name": "npaudit", "context": {"cluster": "npaudit", "user": "npaudit"}}]}, sort_keys=False)


def node_objects(plan: ClusterPlan) -> list[dict[str, Any]]:
    """The Node objects of the cluster as a user creates them in its Kubernetes API: each node's podCIDR
    (what its config pins too) and InternalIP (its underlay address: the other nodes tunnel to it)."""
    return [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name},
             "spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]},
             "status": {"addresses": [{"type": "InternalIP", "address": n.ip},
                                      {"type": "Hostname", "address": n.name}]}}
            for n in plan.nodes]


def node_config_yaml(plan: ClusterPlan, node: NodePlan) -> str:
    head = (f"# npaudit agent config of node {node.name}, written by `npaudit cluster up --dir {plan.dir}`.\n"
            f"# Use it with any verb: npaudit apply|logs|status|trace --config {node.config_path}\n")
    return head + yaml.safe_dump(node_config(plan, node), sort_keys=False)


def netconf(plan: ClusterPlan, node: NodePlan) -> dict[str, Any]:
    """The CNI network config `npaudit cni` gets for a Pod of `node`: its agent's socket and host-local IPAM
    over the node's Pod subnet (handed over by the agent: node_network.pod_cidr), default route via the gateway."""
    return {"cniVersion": "1.0.0", "name": f"npaudit-{plan.tag}", "type": "npaudit",
            "agentSocket": str(node.state_dir / "cni.sock"),
            "ipam": {"type": "host-local", "dataDir": str(node.ipam_dir), "routes": [{"dst": "0.0.0.0/0"}]}}


def parse_pod_ref(ref: str) -> tuple[str, str]:
    """NAMESPACE/NAME, each a DNS-1123 label."""
    namespace, sep, name = ref.partition("/")
    if not sep:
        raise PlanError(f"a Pod is NAMESPACE/NAME, got {ref!r}")
    for what, value in (("namespace", namespace), ("name", name)):
        if len(value) > 63 or not _NAME.fullmatch(value):
            raise PlanError(f"Pod {what} must be a DNS-1123 label (a-z, 0-9, '-'; at most 63), got {value!r}")
    return namespace, name


def parse_labels(items: list[str]) -> tuple[tuple[str, str], ...]:
    """k=v items as Kubernetes label pairs, in the order given; a key given twice is an error."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            raise PlanError(f"--label must be KEY=VALUE with a Kubernetes label key and value, got {item!r}")
        if key in out:
            raise PlanError(f"--label {key} given twice")
        out[key] = value
    return tuple(out.items())


def plan_pod(plan: ClusterPlan, node: str, ref: str, labels: list[str]) -> PodPlan:
    """A new Pod on `node`; its namespace name and container id follow from the cluster's tag."""
    namespace, name = parse_pod_ref(ref)
    target = plan.node(node)
    if any(p.namespace == namespace and p.name == name for p in plan.pods):
        raise PlanError(f"Pod {ref} exists in this cluster already")
    used = {p.netns for p in plan.pods}
    index = next(i for i in range(len(plan.pods) + 1) if f"npc-{plan.tag}-p{i}" not in used)
    container = hashlib.sha256(f"{plan.tag}/{ref}".encode()).hexdigest()[:32]
    return PodPlan(namespace=namespace, name=name, node=target.name, netns=f"npc-{plan.tag}-p{index}",
                   container_id=container, labels=parse_labels(labels))


def check_requested_ip(node: NodePlan, ip: str) -> str:
    """A Pod address asked for on `node`: a host address of its Pod subnet, not its gateway (the first)."""
    try:
        addr = ipaddress.IPv4Address(ip)
    except ValueError as exc:
        raise PlanError(f"--ip must be an IPv4 address, got {ip!r}") from exc
    net = ipaddress.IPv4Network(node.pod_cidr)
    if addr not in net or addr in (net.network_address, net.broadcast_address, net.network_address + 1):
        raise PlanError(f"--ip {ip}: not a Pod address of node {node.name}'s subnet {net} (its gateway is "
                        f"{net.network_address + 1})")
    return str(addr)


def pod_object(pod: PodPlan) -> dict[str, Any]:
    """The Pod object every node reads from DIR/shared: labels, spec.nodeName and, once known, status.podIP."""
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"namespace": pod.namespace, "name": pod.name, "labels": dict(pod.labels)},
                           "spec": {"nodeName": pod.node}}
    if pod.ip:
        obj["status"] = {"podIP": pod.ip, "podIPs": [{"ip": pod.ip}]}
    return obj


def shared_name(source: str) -> str:
    """The file in DIR/shared that `npaudit cluster apply -f SOURCE` writes: one per source name, so applying
    the same file again replaces what it put there."""
    stem = "stdin" if source == "-" else Path(source.rstrip("/")).name or "manifests"
    stem = re.sub(r"\.(ya?ml|json)$", "", stem)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip(".") or "manifests"
    return f"apply-{safe[:100]}.yaml"


@dataclass(frozen=True)
class Teardown:
    """What `down` stops, in order: Pod namespaces, the agents (pid files), the OVS daemons (run
    dirs' pid files), the nodes' namespaces, the underlay namespace."""

    pod_netns: tuple[str, ...]
    agent_pid_files: tuple[str, ...]
    ovs_run_dirs: tuple[tuple[str, str], ...]  # (run_dir, netns)
    node_netns: tuple[str, ...]
    underlay_netns: str

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (*self.pod_netns, *self.node_netns, self.underlay_netns)


def teardown(plan: ClusterPlan) -> Teardown:
    return Teardown(pod_netns=tuple(p.netns for p in reversed(plan.pods)),
                    agent_pid_files=tuple(str(n.pid_path) for n in plan.nodes),
                    ovs_run_dirs=tuple((str(n.ovs_run_dir), n.netns) for n in plan.nodes),
                    node_netns=tuple(n.netns for n in plan.nodes), underlay_netns=plan.underlay_netns)
