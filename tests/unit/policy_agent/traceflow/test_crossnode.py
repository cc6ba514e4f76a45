"""The two parts of a trace across nodes merged into one answer, or the source's part alone when the
destination node never reported."""

from __future__ import annotations

from policy_agent.cluster.nodes import PeerNode
from policy_agent.traceflow.crossnode import merge
from policy_agent.traceflow.report import Report

PEER = PeerNode("n2", "10.248.2.0/24", "198.51.100.12")
OURS = [{"table": 0, "action": "accept"}, {"table": 70, "action": "tunnel", "detail": "into the Geneve tunnel"}]


def test_each_observation_names_its_node_and_the_outcome_is_the_destination_s() -> None:
    report = Report(9, b"id", "n2", [{"table": 0, "action": "accept", "node": "forged"}],
                    {"result": "dropped", "table": 40, "detail": "Drop by X"})
    observations, outcome = merge("n1", OURS, PEER, report, 0.02)
    assert [(o["node"], o["table"]) for o in observations] == [("n1", 0), ("n1", 70), ("n2", 0)]
    assert outcome == {"result": "dropped", "table": 40, "node": "n2", "detail": "on node n2: Drop by X"}


def test_no_report_names_the_silent_node_and_its_address() -> None:
    observations, outcome = merge("n1", OURS, PEER, None, 5.0)
    assert [o["node"] for o in observations] == ["n1", "n1"]
    assert (outcome["result"], outcome["node"], outcome["address"]) == ("no-report", "n2", "198.51.100.12")
    assert "node n2 did not report its part within 5.0 s" in outcome["detail"]
