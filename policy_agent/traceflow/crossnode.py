"""A trace across nodes (pure): the source node's observations and the destination node's report, merged
into one answer; and what the source says when the destination never reports.

Every observation names the node that made it; the outcome is the destination node's, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from policy_agent.cluster.nodes import PeerNode
from policy_agent.traceflow.report import Report
from policy_agent.traceflow.result import NO_REPORT


@dataclass(frozen=True)
class CrossNode:
    """This node's part in traces between nodes (Geneve only: routed mode carries no mark)."""

    node: str  # this node's name (what its reports say)
    address: str  # its underlay address
    tunnel_ofport: int
    geneve: bool
    peer_for: Callable[[str], PeerNode | None]  # the routed peer whose Pod subnet holds an address


def merge(node: str, observations: list[dict[str, Any]], peer: PeerNode, report: Report | None,
          waited: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The whole trace: this node's `observations` (ending with the tunnel hop to `peer`), then the
    report's; the outcome is the report's, or NO_REPORT after `waited` seconds without one."""
    ours = [{**o, "node": node} for o in observations]
    if report is None:
        return ours, {"result": NO_REPORT, "node": peer.name, "address": peer.address,
                      "detail": f"sent through the tunnel to node {peer.name} ({peer.address}); node {peer.name} did "
                                f"not report its part within {waited:.1f} s (its agent not running or of an older "
                                "version, or the packet lost on the underlay): its decision is unknown"}
    theirs = [{**o, "node": report.node} for o in report.observations]
    outcome = {**report.outcome, "node": report.node,
               "detail": f"on node {report.node}: {report.outcome.get('detail')}"}
    return ours + theirs, outcome
