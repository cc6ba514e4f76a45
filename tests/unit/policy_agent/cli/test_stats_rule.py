"""`npaudit stats --rule`: one rule's account over real audit files, as a table and as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from auditlog.loss_records import LossKey, loss_record
from policy_agent.cli.main import main
from tests.support.audit_records import sample_record, write_set

RULE = {"id": "11", "name": "drop-a", "ruleset": "AntreaClusterNetworkPolicy:p", "category": "securityops"}


def trail(tmp_path: Path) -> Path:
    records: list[dict[str, Any]] = []
    for i in range(6):
        r = sample_record(i)
        if i % 2 == 0:
            r["rule"] = dict(RULE)
        records.append(r)
    loss = loss_record({LossKey("policy", "meter", "policy_deny"): 70}, 1.0, 2.0,
                       context={"observer": {"hostname": "n1"}},
                       by_rule=[{"rule": dict(RULE), "count": 50, "meter": 50},
                                {"rule": {"id": "12", "name": "drop-b"}, "count": 20}])
    records.insert(3, loss)
    live = tmp_path / "audit.jsonl"
    write_set(live, records, max_bytes=1 << 20, compress=False)
    return tmp_path


def config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\naudit:\n  path: {tmp_path / 'audit.jsonl'}\n")
    return path


def test_stats_rule_states_packets_that_hit_the_rule_as_its_records_plus_its_loss(tmp_path: Path,
                                                                                capsys: Any) -> None:
    directory = trail(tmp_path)
    in_records = sum(sample_record(i)["npaudit"]["aggregate"]["packets"] for i in (0, 2, 4))
    assert main(["stats", "--config", str(config(tmp_path)), "--rule", "drop-a", "-o", "json", str(directory)]) == 0
    account = json.loads(capsys.readouterr().out)["files"]["rule"]
    assert (account["records"], account["packets_in_records"], account["stated_loss"], account["packets_hit"]) == \
        (3, in_records, 50, in_records + 50)
    assert account["rules"] == ["AntreaClusterNetworkPolicy:p drop-a"]

    assert main(["stats", "--config", str(config(tmp_path)), "--rule", "11", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"rule 11: packets that hit it {in_records + 50} = {in_records} in its records + 50 stated lost" in out


def test_stats_without_rule_lists_the_losses_by_rule_apart_from_the_totals(tmp_path: Path, capsys: Any) -> None:
    directory = trail(tmp_path)
    assert main(["stats", "--config", str(config(tmp_path)), str(directory)]) == 0
    out = capsys.readouterr().out
    assert "losses stated by loss records in the files: policy meter policy_deny packet_ins 70" in out
    assert "the same losses by logged rule" in out and "AntreaClusterNetworkPolicy:p drop-a 50" in out
