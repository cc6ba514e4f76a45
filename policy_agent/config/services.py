"""The `policy:`, `kubernetes:`, `cni:`, `metrics:` and `bundle:` config sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from policy_agent.config.checks import bounded, checked, listen_address, optional_file, optional_path, positive


@dataclass(frozen=True)
class PolicyConfig:
    # A directory of manifests the agent loads at start and re-reads when a file
    # changes ("" = none). `npaudit apply -f` works in either case.
    manifest_dir: str = field(default="", metadata=checked(optional_path))
    poll_interval: float = field(default=2.0, metadata=checked(positive))


@dataclass(frozen=True)
class KubernetesConfig:
    # Take Namespaces, every node's Pods, Nodes, NetworkPolicies, Antrea policies and
    # Tiers from the Kubernetes API (list + watch) instead of standalone manifests.
    enabled: bool = False
    # kubeconfig file (an absolute path); "" = in-cluster service account (KUBERNETES_SERVICE_HOST).
    kubeconfig: str = field(default="", metadata=checked(optional_file))
    # Seconds to wait for the first full list before serving CNI.
    sync_timeout: float = field(default=60.0, metadata=checked(positive))
    # Seconds CNI ADD waits for its Pod object (labels) to arrive from the API:
    # policy is never realised for a Pod whose labels are not known yet.
    pod_wait: float = field(default=10.0, metadata=checked(positive))


@dataclass(frozen=True)
class CniConfig:
    # Serve CNI ADD/DEL/CHECK for `npaudit cni` on <state_dir>/cni.sock.
    enabled: bool = True


@dataclass(frozen=True)
class MetricsConfig:
    # Prometheus endpoint, HOST:PORT; "" disables it.
    listen: str = field(default="127.0.0.1:9495", metadata=checked(listen_address))
    # Connections the listener holds at once (a probe or a scrape needs one, briefly). At the cap a
    # new connection replaces the least recently active one, so a flood cannot lock out the probes
    # (one yet to send its first byte is passed over for a second while another can go).
    max_connections: int = field(default=64, metadata=checked(bounded(2, 4096)))
    # Descriptors below RLIMIT_NOFILE's soft limit the listener leaves to the agent's own work
    # (OVSDB, OpenFlow, CNI, applies, audit files; at most half the limit is reserved). It holds at
    # most (limit - reserve) connections, and a connection that lands on a reserved descriptor is
    # closed at once and accepting pauses.
    fd_reserve: int = field(default=128, metadata=checked(bounded(0, 1 << 20)))
    # Seconds from connecting to the end of the request head (slow senders are closed).
    request_timeout: float = field(default=10.0, metadata=checked(bounded(0.1, 300)))
    # Seconds a connection may move no byte (in or out) before it is closed.
    idle_timeout: float = field(default=3.0, metadata=checked(bounded(0.1, 300)))


@dataclass(frozen=True)
class BundleConfig:
    # `npaudit bundle --include-audit` adds audit records only when this is true as well: the
    # node's owner opts in here, the person collecting asks on the command line.
    allow_audit_logs: bool = False
    # Default --max-size: MiB of content (before compression) a bundle may hold.
    max_size_mb: int = field(default=100, metadata=checked(bounded(1, 1 << 20)))
    # The bundle is not written when the disk would keep less than this many MiB free.
    min_free_mb: int = field(default=256, metadata=checked(bounded(0, 1 << 30)))
