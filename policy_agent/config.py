"""Typed, frozen agent configuration, validated at load with errors that name the field.

Every default is documented next to its field and in config/npaudit.yaml.
Each component receives only its own section.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

import yaml

from policy_agent.config_checks import (
    QUEUE_MAX, U32_MAX, absolute_path, bounded, interface_name, listen_address, netns_name, ovs_queue_size,
    record_name,
)
from policy_agent.config_overload import FairShareConfig, OverloadConfig
from policy_agent.errors import AgentError
from policy_agent.offload_config import OffloadConfig

if TYPE_CHECKING:
    from auditlog.syslog.forwarder import Destination


class ConfigError(AgentError):
    """The configuration is invalid; `errors` lists "field.path: reason" lines."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


def _check(fn: Callable[[Any], str | None]) -> dict[str, Any]:
    return {"check": fn}


def _positive(v: Any) -> str | None:
    return None if v > 0 else f"must be > 0, got {v}"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {', '.join(choices)}; got {v!r}"
    return check




@dataclass(frozen=True)
class OvsConfig:
    # embedded: the agent starts a private ovsdb-server + ovs-vswitchd (userspace
    # datapath) in run_dir, never touching a system OVS. external: use the OVS at `db`.
    mode: str = field(default="embedded", metadata=_check(_one_of("embedded", "external")))
    # Where the embedded OVS keeps its database, sockets, pid and log files.
    run_dir: str = field(default="/var/run/npaudit/ovs", metadata=_check(absolute_path))
    # Network namespace the embedded ovs-vswitchd runs in, created if missing
    # ("" = the agent's own). Each netdev vswitchd claims a tap named ovs-netdev,
    # so two instances must not share a namespace.
    netns: str = field(default="npaudit-ovs", metadata=_check(netns_name))
    # OVSDB remote. "" = <run_dir>/db.sock when embedded,
    # unix:/var/run/openvswitch/db.sock when external.
    db: str = ""
    # At most 15 characters (an interface of this name is made).
    bridge: str = field(default="br-int", metadata=_check(interface_name))
    # auto = system when the openvswitch kernel module is loaded and vswitchd
    # supports it, else netdev (userspace).
    datapath_type: str = field(default="auto", metadata=_check(_one_of("auto", "netdev", "system")))
    # Packet-ins OVS queues for the agent's connection before dropping
    # (rconn_overflow). OVS allows 1..512; its own default is 100.
    controller_queue_size: int = field(default=512, metadata=_check(ovs_queue_size))
    # Seconds between looks at the OVS daemons' pid files. Embedded: a dead daemon is
    # restarted (ovsdb-server together with ovs-vswitchd), with backoff and a cap per
    # window. External: a dead daemon is only reported (log, npaudit_ovs_up).
    supervise_interval: float = field(default=1.0, metadata=_check(_positive))

    @property
    def db_remote(self) -> str:
        if self.db:
            return self.db
        if self.mode == "embedded":
            return f"unix:{Path(self.run_dir) / 'db.sock'}"
        return "unix:/var/run/openvswitch/db.sock"

    @property
    def ovs_rundir(self) -> Path:
        return Path(self.run_dir) if self.mode == "embedded" else Path("/var/run/openvswitch")


@dataclass(frozen=True)
class OpenFlowConfig:
    # Where the agent connects: a unix socket path or tcp:HOST:PORT. "" = a
    # controller the agent configures on the bridge itself (with
    # ovs.controller_queue_size), over `transport`.
    target: str = ""
    # auto = tcp when the embedded OVS has a namespace of its own (its 127.0.0.1
    # is reachable only from inside that namespace), unix otherwise.
    # tcp: ptcp:<tcp_port>:127.0.0.1. TCP buffers absorb bursts that overflow a
    # unix socket (bench/packetin_throughput.py measures both). On a host
    # namespace any local process could connect to it: prefer unix there.
    # unix: punix:<ovs rundir>/<bridge>.npaudit, protected by file permissions.
    transport: str = field(default="auto", metadata=_check(_one_of("auto", "unix", "tcp")))
    tcp_port: int = field(default=6653, metadata=_check(lambda v: None if 0 < v < 65536 else f"must be 1..65535, got {v}"))
    # Seconds between echo requests; the connection is dropped after
    # echo_timeout seconds without any message from the switch.
    echo_interval: float = field(default=5.0, metadata=_check(_positive))
    echo_timeout: float = field(default=15.0, metadata=_check(_positive))
    # Reconnect backoff cap in seconds (jittered, doubling from 50 ms).
    reconnect_max: float = field(default=2.0, metadata=_check(_positive))


@dataclass(frozen=True)
class CategoryLimits:
    # Token bucket: packet-ins admitted per second and burst size.
    rate: float = field(default=20000.0, metadata=_check(_positive))
    burst: float = field(default=40000.0, metadata=_check(_positive))
    # Bounded channel between the reader and the subscriber; full = drop and count. At most 10,000,000.
    queue_size: int = field(default=65536, metadata=_check(bounded(1, QUEUE_MAX)))


@dataclass(frozen=True)
class PacketInConfig:
    # Category 0, policy audit. Generous: OVS meters are the first limit.
    policy: CategoryLimits = CategoryLimits()
    # Category 1, traceflow: at most 9 copies per trace (npaudit trace); 500/s is ~50 traces/s.
    traceflow: CategoryLimits = CategoryLimits(rate=500.0, burst=500.0, queue_size=1024)
    fair_share: FairShareConfig = FairShareConfig()  # within the policy category (config_overload.py)
    # Debug tap: write one JSON line per delivered packet-in to this path
    # ("-" = stdout, "" = off). Not the audit log.
    tap: str = ""


@dataclass(frozen=True)
class MeterLimit:
    # OVS meter: packet-ins per second and burst, enforced in the datapath (32-bit in OVS).
    rate: int = field(default=1000, metadata=_check(bounded(1, U32_MAX)))
    burst: int = field(default=200, metadata=_check(bounded(0, U32_MAX)))


@dataclass(frozen=True)
class MetersConfig:
    # One meter per category and disposition class: a drop flood starves
    # neither allow records nor traceflow (DESIGN.md §3).
    policy_allow: MeterLimit = MeterLimit()
    policy_deny: MeterLimit = MeterLimit()  # Drop, Reject, Pass
    traceflow: MeterLimit = MeterLimit(rate=500, burst=200)  # at most 9 copies per trace
    # Seconds between reads of the meters' drop counts (npaudit_meter_dropped_*); each read
    # ends a window whose losses (meter, OVS queue, admission, writer) go into a loss record.
    stats_interval: float = field(default=5.0, metadata=_check(bounded(0.1, 3600)))


@dataclass(frozen=True)
class PolicyConfig:
    # A directory of manifests the agent loads at start and re-reads when a file
    # changes ("" = none). `npaudit apply -f` works in either case.
    manifest_dir: str = field(default="", metadata=_check(lambda v: absolute_path(v, optional=True)))
    poll_interval: float = field(default=2.0, metadata=_check(_positive))


@dataclass(frozen=True)
class KubernetesConfig:
    # Take Namespaces, this node's Pods, NetworkPolicies, Antrea policies and
    # Tiers from the Kubernetes API (list + watch) instead of standalone manifests.
    enabled: bool = False
    # kubeconfig file; "" = in-cluster service account (KUBERNETES_SERVICE_HOST).
    kubeconfig: str = ""
    # Seconds to wait for the first full list before serving CNI.
    sync_timeout: float = field(default=60.0, metadata=_check(_positive))
    # Seconds CNI ADD waits for its Pod object (labels) to arrive from the API:
    # policy is never realised for a Pod whose labels are not known yet.
    pod_wait: float = field(default=10.0, metadata=_check(_positive))


@dataclass(frozen=True)
class CniConfig:
    # Serve CNI ADD/DEL/CHECK for `npaudit cni` on <state_dir>/cni.sock.
    enabled: bool = True


@dataclass(frozen=True)
class AuditConfig:
    # Write policy audit records (category 0 packet-ins) as JSON lines.
    enabled: bool = True
    path: str = field(default="/var/log/npaudit/audit.jsonl", metadata=_check(absolute_path))
    # Size rotation (MiB, at most 1048576 = 1 TiB), gzip of rotated files, keep this many
    # (at most 10000) and this many days (at most 36500).
    max_size_mb: int = field(default=100, metadata=_check(bounded(1, 1 << 20)))
    backups: int = field(default=10, metadata=_check(bounded(1, 10_000)))
    max_age_days: int = field(default=28, metadata=_check(bounded(1, 36_500)))
    # Aggregation window in seconds for Drop/Reject/Pass (0 = a record per packet).
    window: float = field(default=1.0, metadata=_check(lambda v: None if v >= 0 else f"must be >= 0, got {v}"))
    # Records waiting for the writer thread (at most 10,000,000); a full queue drops and counts.
    queue_size: int = field(default=100000, metadata=_check(bounded(1, QUEUE_MAX)))
    overload: OverloadConfig = OverloadConfig()  # coarser records under load (config_overload.py)


@dataclass(frozen=True)
class SyslogDestinationConfig:
    # udp://HOST:PORT, tcp://HOST:PORT or tls://HOST:PORT (ports default to 514, 514, 6514).
    url: str = field(default="", metadata=_check(lambda v: None if v else "is required"))
    # Facility name (local0..local7, daemon, ...) or number 0..23; severity comes from the disposition.
    facility: str = "local0"
    # tcp/tls only: octet-counting (RFC 6587 / RFC 5425) or lf.
    framing: str = field(default="octet-counting", metadata=_check(_one_of("octet-counting", "lf")))
    # tls only: CA file the server must chain to ("" = the system's trust store), optional client
    # certificate and key, and the name the server certificate must carry ("" = the URL's host).
    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""
    # udp only: longest datagram; a longer record is sent with a JSON stub as MSG (counted).
    udp_max_bytes: int = 2048
    # One send: at most this many records and about this many bytes of them.
    batch_records: int = field(default=1000, metadata=_check(_positive))
    batch_bytes: int = field(default=1 << 20, metadata=_check(_positive))
    # tcp/tls: batches sent ahead while earlier ones are not yet acknowledged by the receiver's
    # TCP, at most this many and about this many bytes (one batch always goes). A dropped
    # connection resends from the last batch the receiver must have read: duplicates at most
    # the window plus a receive buffer (auditlog/syslog/window.py), never loss.
    window_batches: int = field(default=4, metadata=_check(_positive))
    window_bytes: int = field(default=8 << 20, metadata=_check(_positive))
    # The checkpoint (what was delivered) is saved once this many seconds or records have passed
    # since the last save, whenever the forwarder is idle or retrying, and at shutdown; a crash
    # sends at most that much again (duplicates, never loss). It never runs ahead of delivery.
    checkpoint_interval: float = field(default=1.0, metadata=_check(
        lambda v: None if v >= 0 else f"must be >= 0, got {v}"))
    checkpoint_records: int = field(default=50_000, metadata=_check(_positive))


@dataclass(frozen=True)
class SyslogConfig:
    # Forward every audit record to each destination (RFC 5424, one thread each).
    destinations: tuple[SyslogDestinationConfig, ...] = ()
    # Where each destination's checkpoint is kept; "" = <state_dir>/syslog. On a tmpfs
    # state_dir a reboot forgets it and the files on disk are sent again (duplicates, no loss).
    checkpoint_dir: str = ""


@dataclass(frozen=True)
class MetricsConfig:
    # Prometheus endpoint, HOST:PORT; "" disables it.
    listen: str = field(default="127.0.0.1:9495", metadata=_check(listen_address))


@dataclass(frozen=True)
class BundleConfig:
    # `npaudit bundle --include-audit` adds audit records only when this is true as well: the
    # node's owner opts in here, the person collecting asks on the command line.
    allow_audit_logs: bool = False
    # Default --max-size: MiB of content (before compression) a bundle may hold.
    max_size_mb: int = field(default=100, metadata=_check(bounded(1, 1 << 20)))
    # The bundle is not written when the disk would keep less than this many MiB free.
    min_free_mb: int = field(default=256, metadata=_check(bounded(0, 1 << 30)))


@dataclass(frozen=True)
class AgentConfig:
    # Node name written into records and used to select this node's Pods; "" = the
    # NODE_NAME environment variable (a DNS-1123 subdomain), else this host's name.
    # No control characters.
    node_name: str = field(default="", metadata=_check(record_name))
    # Cluster name written into records; "" = omitted. No control characters.
    cluster_name: str = field(default="", metadata=_check(record_name))
    log_level: str = field(default="info", metadata=_check(_one_of("debug", "info", "warning", "error")))
    # The agent's own state: local API and CNI sockets (0600), agent round, IPAM data.
    state_dir: str = field(default="/var/run/npaudit", metadata=_check(absolute_path))
    ovs: OvsConfig = OvsConfig()
    openflow: OpenFlowConfig = OpenFlowConfig()
    packetin: PacketInConfig = PacketInConfig()
    meters: MetersConfig = MetersConfig()
    offload: OffloadConfig = OffloadConfig()  # the eBPF drop offload (policy_agent/offload_config.py)
    policy: PolicyConfig = PolicyConfig()
    cni: CniConfig = CniConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    audit: AuditConfig = AuditConfig()
    syslog: SyslogConfig = SyslogConfig()
    metrics: MetricsConfig = MetricsConfig()
    bundle: BundleConfig = BundleConfig()

    @property
    def api_socket(self) -> Path:
        return Path(self.state_dir) / "api.sock"

    @property
    def cni_socket(self) -> Path:
        return Path(self.state_dir) / "cni.sock"

    @property
    def syslog_checkpoint_dir(self) -> Path:
        return Path(self.syslog.checkpoint_dir or Path(self.state_dir) / "syslog")

    @property
    def node(self) -> str:
        return self.node_name or socket.gethostname()

    @property
    def openflow_transport(self) -> str:
        transport = self.openflow.transport
        if transport == "auto":
            private_ns = self.ovs.mode == "embedded" and bool(self.ovs.netns)
            transport = "tcp" if private_ns else "unix"
        return transport

    @property
    def openflow_target(self) -> str:
        """What the agent connects to."""
        if self.openflow.target:
            return self.openflow.target
        if self.openflow_transport == "tcp":
            return f"tcp:127.0.0.1:{self.openflow.tcp_port}"
        return str(self.ovs.ovs_rundir / f"{self.ovs.bridge}.npaudit")

    @property
    def controller_target(self) -> str | None:
        """The Controller row the agent puts on the bridge; None when `target` is given."""
        if self.openflow.target:
            return None
        if self.openflow_transport == "tcp":
            return f"ptcp:{self.openflow.tcp_port}:127.0.0.1"
        return f"punix:{self.openflow_target}"

    @property
    def openflow_netns(self) -> str:
        """Namespace to open a tcp connection from: the embedded OVS's, else ours."""
        if self.openflow_target.startswith("tcp:") and self.ovs.mode == "embedded":
            return self.ovs.netns
        return ""


# Set by a DaemonSet from the downward API (spec.nodeName).
NODE_NAME_ENV = "NODE_NAME"
# Kubernetes node names are DNS-1123 subdomains (k8s.io/apimachinery IsDNS1123Subdomain).
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def node_name_from_env(environ: Mapping[str, str]) -> tuple[str, str | None]:
    """(NODE_NAME or "", problem or None): the name a Pod's downward API gave, checked as
    Kubernetes checks node names, since it selects Pods and is written into every record."""
    value = environ.get(NODE_NAME_ENV, "")
    if value and (len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value)):
        return "", (f"{NODE_NAME_ENV} (environment, used as node_name): must be a DNS-1123 subdomain "
                    f"(a-z, 0-9, '-', '.'; at most 253 characters), got {value[:64]!r}")
    return value, None


def load(path: str | Path, *, environ: Mapping[str, str] = os.environ) -> AgentConfig:
    """Read and validate a YAML config file; raise ConfigError listing every problem.
    An empty node_name is taken from NODE_NAME in `environ` when that is set."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc.strerror})"]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError([f"{path}: not UTF-8 at line {line} (byte {exc.start})"]) from exc
    return loads(text, source=str(path), environ=environ)


def loads(text: str, source: str = "<config>", *, environ: Mapping[str, str] = os.environ) -> AgentConfig:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:  # its text spans several lines: keep the problem and where
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{source}: not valid YAML{where}: {problem}"]) from exc
    if data is None:
        data = {}
    errors: list[str] = []
    config = _build(AgentConfig, data, "", errors)
    if not config.node_name:
        env_node, problem = node_name_from_env(environ)
        errors += [problem] if problem else []
        config = dataclasses.replace(config, node_name=env_node)
    if not errors:
        errors += config.audit.overload.problems() + _syslog_errors(config)
    if errors:
        raise ConfigError(errors)
    return config


def _build(cls: type, data: Any, path: str, errors: list[str]) -> Any:
    where = path.rstrip(".") or "(top level)"
    if not isinstance(data, dict):
        errors.append(f"{where}: must be a mapping, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            near = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            errors.append(f"{path}{key}: unknown field{hint}")
    values: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in data:
            continue
        value = data[name]
        full = f"{path}{name}"
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = _build(kind, value, full + ".", errors)
            continue
        item = _tuple_of(kind)
        if item is not None:
            if not isinstance(value, list):
                errors.append(f"{full}: must be a list, got {type(value).__name__}")
                continue
            values[name] = tuple(_build(item, v, f"{full}[{i}].", errors) for i, v in enumerate(value))
            continue
        coerced = _coerce(kind, value)
        if coerced is _INVALID:
            errors.append(f"{full}: must be {_type_name(kind)}, got {type(value).__name__} {value!r}")
            continue
        check = f.metadata.get("check")
        problem = check(coerced) if check else None
        if problem:
            errors.append(f"{full}: {problem}")
            continue
        values[name] = coerced
    return cls(**values)


_INVALID = object()


def _tuple_of(kind: Any) -> Any:
    """The dataclass X of a `tuple[X, ...]` field, else None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis \
            and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _coerce(kind: Any, value: Any) -> Any:
    if kind is bool:
        return value if isinstance(value, bool) else _INVALID
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if kind is float:  # .inf and .nan are YAML floats, but no timeout, window or rate can be one
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return _INVALID
    if kind is str:
        return value if isinstance(value, str) else _INVALID
    return _INVALID


def _type_name(kind: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(kind, str(kind))


def _syslog_errors(config: AgentConfig) -> list[str]:
    """What each syslog destination gets wrong across its fields (the forwarder's own checks)."""
    from auditlog.syslog.errors import SyslogConfigError

    errors = []
    if config.syslog.destinations and not config.audit.enabled:
        errors.append("syslog.destinations: forwarding needs audit.enabled: true")
    seen: dict[str, int] = {}
    for i, dest in enumerate(config.syslog.destinations):
        try:
            name = syslog_destination(dest, config.node).name
        except SyslogConfigError as exc:
            errors.append(f"syslog.destinations[{i}]: {exc}")
            continue
        if name in seen:  # one checkpoint per destination
            errors.append(f"syslog.destinations[{i}]: {name} is already destinations[{seen[name]}]")
        seen.setdefault(name, i)
    return errors


def syslog_destination(dest: SyslogDestinationConfig, node: str) -> Destination:
    """The forwarder's Destination for one configured destination; SyslogConfigError if it cannot work."""
    from auditlog.syslog.forwarder import make_destination
    from auditlog.syslog.transport import TlsOptions

    tls = None
    if dest.url.startswith("tls:") or dest.ca or dest.cert or dest.key or dest.server_name:
        tls = TlsOptions(ca=Path(dest.ca) if dest.ca else None, cert=Path(dest.cert) if dest.cert else None,
                         key=Path(dest.key) if dest.key else None, server_name=dest.server_name or None)
    framing = None if dest.url.startswith("udp:") and dest.framing == "octet-counting" else dest.framing
    return make_destination(dest.url, node_name=node, facility=dest.facility, framing=framing, tls=tls,
                            udp_max_bytes=dest.udp_max_bytes, batch_records=dest.batch_records,
                            batch_bytes=dest.batch_bytes, checkpoint_interval=dest.checkpoint_interval,
                            checkpoint_records=dest.checkpoint_records, window_batches=dest.window_batches,
                            window_bytes=dest.window_bytes)
