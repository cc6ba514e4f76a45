"""Per rule: what the audit pipeline took (for the rule's stated loss) and `npaudit stats --rule`'s sum."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.loss_records import LossKey, loss_record  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.stats import count_records  # noqa: E402
from tests.support.audit_pipeline import RULE, Writer, context, pin, udp_to  # noqa: E402


def test_the_pipeline_counts_per_rule_what_it_took_less_the_packets_of_refused_records() -> None:
    async def run() -> tuple[AuditPipeline, Writer]:
        writer = Writer(room=2)  # the first record of each key, then the writer is full
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: 50.0)
        for i in range(10):
            pipeline(pin(udp_to(53 + i % 2), 10.0 + i * 0.01))
        await pipeline.close()  # the two aggregates (4 packets each) are refused
        return pipeline, writer

    pipeline, writer = asyncio.run(run())
    assert pipeline.rule_packet_ins == {RULE.rule_id: 10}
    assert pipeline.rule_seen() == {RULE.rule_id: 2} == {RULE.rule_id: writer.packets()}


def record(rule: dict[str, str], packets: int) -> tuple[bytes, dict[str, Any]]:
    return b"", {"event": {"action": "dropped"}, "rule": rule, "npaudit": {"aggregate": {"packets": packets}}}


A = {"id": "11", "name": "drop-a", "ruleset": "AntreaClusterNetworkPolicy:p"}
B = {"id": "12", "name": "drop-b", "ruleset": "AntreaClusterNetworkPolicy:p"}


def trail() -> list[tuple[bytes, dict[str, Any]]]:
    meter = LossKey("policy", "meter", "policy_deny")
    return [record(A, 1), record(B, 1), record(A, 40),
            (b"", loss_record({meter: 90}, 1.0, 2.0, by_rule=[{"rule": A, "count": 60}, {"rule": B, "count": 25}])),
            (b"", loss_record({}, 2.0, 3.0, by_rule=[{"rule": A, "count": 5}])), record(B, 9)]


def test_stats_for_one_rule_is_its_records_plus_its_stated_loss() -> None:
    for selector in ("11", "drop-a", "AntreaClusterNetworkPolicy:p drop-a"):
        account = count_records(trail(), rule=selector).to_json()["rule"]
        assert (account["records"], account["packets_in_records"], account["stated_loss"], account["packets_hit"]) \
            == (2, 41, 65, 106), selector
    other = count_records(trail(), rule="drop-b").to_json()["rule"]
    assert (other["packets_in_records"], other["stated_loss"], other["packets_hit"]) == (10, 25, 35)


def test_stats_never_adds_the_losses_by_rule_to_the_losses_by_reason() -> None:
    counts = count_records(trail()).to_json()
    assert counts["losses_stated"] == {"policy meter policy_deny packet_ins": 90}
    assert counts["rule_losses_stated"] == {"AntreaClusterNetworkPolicy:p drop-a": 65,
                                            "AntreaClusterNetworkPolicy:p drop-b": 25}
    assert "rule" not in counts and counts["packets"] == 51
