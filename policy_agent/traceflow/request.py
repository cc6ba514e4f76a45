"""A trace request (the local API's "trace" op) checked and resolved against the Pod directory."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from policy_agent.errors import AgentError
from policy_agent.policy.model import Pod
from policy_agent.policy.selection import Endpoint
from policy_agent.traceflow.packet import PROTOCOLS

DEFAULT_PORT = 80
DEFAULT_TIMEOUT = 5.0
MAX_TIMEOUT = 60.0
# Source ports of traces: Linux's ephemeral range, like a real client's.
SOURCE_PORTS = (32768, 60999)


class TraceUsageError(AgentError):
    """A request that cannot be traced (bad field, unknown Pod): one line naming the field."""


class PodDirectory(Protocol):
    """What a trace needs of the Pods (the engine has all three): this node's running ones, and the
    objects and addresses of every Pod of the cluster."""

    @property
    def endpoints(self) -> Mapping[tuple[str, str], Endpoint]: ...

    @property
    def pods(self) -> Mapping[tuple[str, str], Pod]: ...

    def by_ip(self, ip: str) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class TraceRequest:
    source: Endpoint
    dst_ip: str
    destination: Endpoint | None  # None: no Pod has dst_ip
    protocol: str
    proto: int
    port: int | None
    source_port: int | None  # live: None = any
    timeout: float
    live: bool = False  # observe the next real packet matching the filter instead of injecting one
    remote: Pod | None = None  # the Pod holding dst_ip on another node (the cluster Pod directory)

    def describe(self) -> dict[str, Any]:
        src, dst, remote = self.source, self.destination, self.remote
        to: dict[str, Any] = {"pod": _ref(dst) if dst is not None else None, "ip": self.dst_ip}
        if remote is not None:
            to.update(pod=f"{remote.namespace}/{remote.name}", node=remote.node or None)
        return {"from": {"pod": _ref(src), "ip": src.ip, "port": src.ofport},
                "to": to,
                "protocol": self.protocol, "destination_port": self.port, "source_port": self.source_port,
                "live": self.live}


def _ref(ep: Endpoint) -> str:
    return f"{ep.pod.namespace}/{ep.pod.name}"


def _pod_ref(field: str, value: Any) -> tuple[str, str]:
    if not isinstance(value, str) or value.count("/") != 1 or "" in value.split("/"):
        raise TraceUsageError(f"{field}: must be NAMESPACE/POD, got {value!r}")
    ns, name = value.split("/")
    return ns, name


def _int(field: str, value: Any, lo: int, hi: int) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise TraceUsageError(f"{field}: must be an integer in {lo}..{hi}, got {value!r}")
    return value


def parse(request: Mapping[str, Any], pods: PodDirectory, rng: random.Random | None = None) -> TraceRequest:
    """Check the request's fields and find its Pods; TraceUsageError names the first problem."""
    ns, name = _pod_ref("from", request.get("from"))
    source = pods.endpoints.get((ns, name))
    if source is None:
        raise TraceUsageError(f"from: no running Pod {ns}/{name} on this node")
    to = request.get("to")
    remote: Pod | None = None
    if isinstance(to, str) and "/" in to:
        ref = _pod_ref("to", to)
        destination = pods.endpoints.get(ref)
        if destination is None:
            remote = pods.pods.get(ref)
            # A Pod of another node: the address the Pod directory gives it (one no other Pod claims).
            dst = next((ip for ip in remote.ips if pods.by_ip(ip) == ref), None) if remote is not None else None
            if remote is None or dst is None:
                raise TraceUsageError(f"to: no Pod {ref[0]}/{ref[1]} runs on this node or has an address "
                                      "known to it")
        dst_ip = destination.ip if destination is not None else str(dst)
    else:
        try:
            dst_ip = str(ipaddress.IPv4Address(to if isinstance(to, str) else ""))
        except ValueError:
            raise TraceUsageError(f"to: must be NAMESPACE/POD or an IPv4 address, got {to!r}") from None
        key = pods.by_ip(dst_ip)
        destination = pods.endpoints.get(key) if key is not None else None
        remote = pods.pods.get(key) if key is not None and destination is None else None
    protocol = request.get("protocol", "tcp")
    if protocol not in PROTOCOLS:
        raise TraceUsageError(f"protocol: must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    live = request.get("live", False)
    if type(live) is not bool:
        raise TraceUsageError(f"live: must be true or false, got {live!r}")
    port = source_port = None
    if protocol != "icmp":
        port = _int("port", request.get("port", DEFAULT_PORT), 1, 65535)
        sp = request.get("source_port")
        source_port = _int("source_port", sp, 1, 65535) if sp is not None else \
            None if live else (rng or random.SystemRandom()).randint(*SOURCE_PORTS)
    elif request.get("port") is not None:
        raise TraceUsageError("port: ICMP has no ports")
    timeout = request.get("timeout", DEFAULT_TIMEOUT)
    if type(timeout) not in (int, float) or not 0 < timeout <= MAX_TIMEOUT:
        raise TraceUsageError(f"timeout: must be seconds in (0, {MAX_TIMEOUT:.0f}], got {timeout!r}")
    return TraceRequest(source, dst_ip, destination, protocol, PROTOCOLS[protocol], port, source_port,
                        float(timeout), live, remote)
