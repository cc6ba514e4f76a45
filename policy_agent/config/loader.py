"""Typed, frozen agent configuration, validated at load with errors that name the field.

Every default is documented next to its field and in config/npaudit.yaml.
Each component receives only its own section.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

# The sections live in modules of their own; their names are re-exported here for
# `from policy_agent.config.loader import X`.
from policy_agent.config.audit import AuditConfig
from policy_agent.config.checks import absolute_path, checked, listen_address, one_of, record_name
from policy_agent.config.cluster import ClusterConfig
from policy_agent.config.node import NodeNetworkConfig
from policy_agent.config.overload import FairShareConfig, OverloadConfig
from policy_agent.config.ovs import OpenFlowConfig, OvsConfig
from policy_agent.config.packetin import CategoryLimits, MeterLimit, MetersConfig, PacketInConfig
from policy_agent.config.services import BundleConfig, CniConfig, KubernetesConfig, MetricsConfig, PolicyConfig
from policy_agent.config.syslog import SyslogConfig, SyslogDestinationConfig, syslog_destination
from policy_agent.config.offload import OffloadConfig
from policy_agent.config.strict_yaml import ConfigError, strict_load

__all__ = [
    "AgentConfig", "AuditConfig", "BundleConfig", "CategoryLimits", "CniConfig", "ConfigError", "FairShareConfig",
    "KubernetesConfig", "MeterLimit", "MetersConfig", "MetricsConfig", "NODE_NAME_ENV", "OffloadConfig",
    "OpenFlowConfig", "OverloadConfig", "OvsConfig", "PacketInConfig", "PolicyConfig", "SyslogConfig",
    "SyslogDestinationConfig", "load", "loads", "node_name_from_env", "syslog_destination",
]


@dataclass(frozen=True)
class AgentConfig:
    # Node name written into records and naming this node's Node object; "" = the
    # NODE_NAME environment variable (a DNS-1123 subdomain), else this host's name.
    # No control characters.
    node_name: str = field(default="", metadata=checked(record_name))
    # Cluster name written into records; "" = omitted. No control characters.
    cluster_name: str = field(default="", metadata=checked(record_name))
    log_level: str = field(default="info", metadata=checked(one_of("debug", "info", "warning", "error")))
    # The agent's own state: local API and CNI sockets (0600), agent round, IPAM data.
    state_dir: str = field(default="/var/run/npaudit", metadata=checked(absolute_path))
    ovs: OvsConfig = OvsConfig()
    openflow: OpenFlowConfig = OpenFlowConfig()
    packetin: PacketInConfig = PacketInConfig()
    meters: MetersConfig = MetersConfig()
    offload: OffloadConfig = OffloadConfig()  # the eBPF drop offload (policy_agent/config/offload.py)
    policy: PolicyConfig = PolicyConfig()
    cni: CniConfig = CniConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    audit: AuditConfig = AuditConfig()
    syslog: SyslogConfig = SyslogConfig()
    metrics: MetricsConfig = MetricsConfig()
    bundle: BundleConfig = BundleConfig()
    node_network: NodeNetworkConfig = NodeNetworkConfig()  # Pod subnet, gateway port (policy_agent/config/node.py)
    cluster: ClusterConfig = ClusterConfig()  # the other nodes and the way to them (policy_agent/config/cluster.py)

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


# Set by a DaemonSet to the node's address (downward API status.hostIP): replaces metrics.listen, so that a
# cluster Prometheus reaches the agent on the host network. Applied in `loads`: check-config sees what the agent does.
METRICS_LISTEN_ENV = "NPAUDIT_METRICS_LISTEN"


def metrics_listen_from_env(environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(NPAUDIT_METRICS_LISTEN or None when unset or empty, problem or None)."""
    value = environ.get(METRICS_LISTEN_ENV, "")
    if not value:
        return None, None
    problem = listen_address(value)
    if problem:
        return None, f"{METRICS_LISTEN_ENV} (environment, used as metrics.listen): {problem}"
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
        data = strict_load(text)
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
    env_listen, problem = metrics_listen_from_env(environ)
    errors += [problem] if problem else []
    if env_listen is not None:
        config = dataclasses.replace(config, metrics=dataclasses.replace(config.metrics, listen=env_listen))
    if not errors:
        errors += config.audit.overload.problems() + config.node_network.problems() \
            + config.cluster.problems(config.node_network.pod_cidr) + _syslog_errors(config)
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
            import difflib  # only for a field name that is wrong

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
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
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
        # The field's own bounds first; a field without any still takes no number that overflows C.
        problem = (check(coerced) if check else None) or _size_limit(coerced)
        if problem:
            errors.append(f"{full}: {problem}")
            continue
        values[name] = coerced
    return cls(**values)


_INVALID = object()
INT_MAX = (1 << 63) - 1
# Seconds (about 31 years) or a rate: a timeout beyond it overflows threading's waits (PY_TIMEOUT_MAX).
FLOAT_MAX = 1e9


def _tuple_of(kind: Any) -> Any:
    """The dataclass X of a `tuple[X, ...]` field, else None."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis \
            and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _optional(kind: Any) -> Any:
    """X of an `X | None` field, else None."""
    args = typing.get_args(kind)
    if len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


def _coerce(kind: Any, value: Any) -> Any:
    inner = _optional(kind)
    if inner is not None:  # null (YAML) = the field's own default behaviour, e.g. a value found at run time
        return None if value is None else _coerce(inner, value)
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
    inner = _optional(kind)
    if inner is not None:
        return f"{_type_name(inner)} or null"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}.get(kind, str(kind))


def _size_limit(value: Any) -> str | None:
    """Why a number of the right type is still refused (its size), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > INT_MAX:  # a C long: counts and sizes reach syscalls and structs
        return f"must be at most {INT_MAX} in size, got {value}"
    if isinstance(value, float) and abs(value) > FLOAT_MAX:
        return f"must be at most {FLOAT_MAX:g} in size, got {value}"
    return None


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
