"""What the agent says about itself: the `npaudit status` snapshot, readiness (/readyz), the recent problems."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from prometheus_client import CollectorRegistry

from auditlog.syslog.status import SyslogStatus
from policy_agent.errors import AgentError, printable
from policy_agent.metrics import build_versions, category_name
from policy_agent.ovs.coverage import vswitchd_ctl_path
from policy_agent.ovs.unixctl import vswitchd_version

if TYPE_CHECKING:
    from policy_agent.http.endpoints import HttpListener, LimitSettings

    from policy_agent.agent import Agent

log = logging.getLogger(__name__)


class RecentProblems(logging.Handler):
    """The last `size` WARNING and ERROR lines logged in this process, for `npaudit status`."""

    def __init__(self, size: int = 20) -> None:
        super().__init__(logging.WARNING)
        # Bounded: a flood of warnings keeps the newest `size`.
        self._lines: collections.deque[dict[str, Any]] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append({"time": record.created, "level": record.levelname, "logger": record.name,
                                "message": printable(record.getMessage())[:500]})
        except Exception:  # a bad format argument: reported as logging reports it, never raised into the caller
            self.handleError(record)

    def snapshot(self) -> list[dict[str, Any]]:
        """Oldest first."""
        return list(self._lines)


def syslog_status(agent: Agent) -> SyslogStatus:
    """The forwarders' snapshots and the writer's newest seq, for `npaudit syslog status`."""
    writer_seq = agent.audit_writer.head[0] if agent.audit_writer is not None else None
    return SyslogStatus(writer_seq, tuple(forwarder.stats() for forwarder in agent.syslog))


async def read(agent: Agent) -> dict[str, Any]:
    """For `npaudit status|stats`: the snapshot, with what OVS says read off the event loop."""
    ctl = vswitchd_ctl_path(Path(agent.config.ovs.ovs_rundir))
    ovs_version = await asyncio.to_thread(vswitchd_version, ctl)
    ovs_losses = await asyncio.to_thread(agent.ovs_counters.read)
    syslog = await asyncio.to_thread(syslog_status, agent)  # forwarder children answer over a pipe
    return snapshot(agent, now=(time.time(), time.monotonic()), ovs_version=ovs_version, ovs_losses=ovs_losses,
                    syslog=syslog)


def snapshot(agent: Agent, *, now: tuple[float, float], ovs_version: str | None,
             ovs_losses: dict[str, int | None], syslog: SyslogStatus | None = None) -> dict[str, Any]:
    """The agent's state as JSON: process, OpenFlow, OVS, meters, eBPF, traces, policy, audit, syslog,
    packet-in counters since start, and the last problems logged. `now` is (time.time(), time.monotonic())."""
    cfg, engine, writer = agent.config, agent.engine, agent.audit_writer
    support = agent.channel.meter_support
    started = agent.started or now
    demux = {category_name(cat): counts for cat, counts in sorted(agent.demux.stats().items())}
    return {
        "agent": {"pid": os.getpid(), "version": build_versions()["version"], "node": cfg.node,
                  "started": started[0], "uptime_seconds": round(now[1] - started[1], 3)},
        "openflow": {"connected": agent.channel.ready, "target": cfg.openflow_target,
                     "connects": agent.channel.connects},
        "ovs": {"mode": cfg.ovs.mode, "bridge": cfg.ovs.bridge, "version": ovs_version,
                "datapath_type": agent.switch.datapath_type},
        "meters": {"supported": None if support is None else support.supported},
        "ebpf": agent.offload.status(),
        "traceflow": agent.traceflow.stats.to_json(),
        "policy": None if engine is None else {
            "tiers": len(engine.tiers), "policies": len(engine.policies), "rules": len(agent.rules),
            "namespaces": len(engine.namespaces), "pods": len(engine.pods)},
        "audit": {"enabled": writer is not None, "path": cfg.audit.path,
                  "head": None if writer is None else dict(zip(("seq", "chain"), writer.head))},
        "syslog": (syslog or syslog_status(agent)).to_json(),
        "packetin": {"by_category": demux, "ovs_lost": ovs_losses,
                     "meter_drops": agent.losses.dropped_json()},
        "nodes": {"subnet": agent.subnet.cidr or None, **agent.nodes.status()},
        "problems": agent.problems.snapshot(),
        "apply_settlement": None if agent.settlement is None else agent.settlement.to_json(),
    }


def readiness(agent: Agent) -> list[str]:
    """What keeps the node from taking Pods with their policy (/readyz); empty when ready."""
    waiting = []
    if not agent.channel.ready:
        waiting.append("OpenFlow not connected")
    if not agent.policy_ready:
        waiting.append("policy flows not installed yet")
    if agent.config.cni.enabled and (agent.cni is None or not agent.cni.listening):
        waiting.append("CNI server not listening")
    return waiting


def serve_endpoints(listen: str, registry: CollectorRegistry, readiness: Callable[[], list[str]],
                    limits: LimitSettings) -> HttpListener:
    """/metrics, /readyz and /healthz on `listen` (HOST:PORT), served from a thread until shut down."""
    from policy_agent.http.endpoints import serve

    host, _, port = listen.rpartition(":")
    try:
        server = serve(host, int(port), registry, readiness, limits)
    except OSError as exc:  # a port in use, an address not on this host
        raise AgentError(f"metrics.listen {listen}: cannot listen ({exc.strerror or exc})") from exc
    log.info("metrics on http://%s/metrics, probes on /readyz and /healthz", listen)
    return server
