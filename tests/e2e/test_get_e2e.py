"""`npaudit get` against the real agent: the rule id it lists is the one a real dropped connection's audit record
carries, and a Pod's flows it lists are flows OVS holds (read back with ovs-ofctl)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, _npaudit
from tests.support.waiting import wait_for

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"


def get(cluster: Cluster, *argv: str) -> dict[str, Any]:
    res = _npaudit("get", *argv, "-o", "json", "--config", str(cluster.config))
    assert res.returncode == 0, res.stderr.decode()
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_get_lists_the_rule_ids_records_carry_and_the_flows_ovs_holds(cluster: Cluster) -> None:
    cluster.apply("\n---\n".join(p.read_text() for p in sorted(SAMPLES.glob("*.yaml"))))
    src, dst = cluster.add_pod("x", "a"), cluster.add_pod("y", "a")
    (rule,) = get(cluster, "rules", "drop-x-a-http")["items"]
    assert rule["tier"] == "securityops" and rule["action"] == "Drop"

    assert cluster.probe(src.ref, [f"{dst.ip}:80/tcp"]) == {f"{dst.ip}:80/tcp": "timeout"}
    wait_for(lambda: any(r.get("rule", {}).get("name") == "drop-x-a-http" for r in cluster.audit_records()))
    record = next(r for r in cluster.audit_records() if r.get("rule", {}).get("name") == "drop-x-a-http")
    assert str(record["rule"]["id"]) == str(rule["id"]), (record["rule"], rule)

    (pod,) = get(cluster, "pod", dst.ref, "--flows")["items"]
    assert pod["ip"] == dst.ip and pod["class"] > 0 and pod["flows"]
    held = {(int(m.group(1)), int(m.group(2))) for line in cluster.flows()
            if (m := re.search(r"table=(\d+), .*priority=(\d+)", line))}
    listed = {(int(m.group(1)), int(m.group(2))) for flow in pod["flows"]
              if (m := re.search(r"table=(\d+) priority=(\d+)", flow))}
    assert len(listed) > 2 and listed <= held, listed - held
    assert any(f"in_port={pod['ofport']}" in flow for flow in pod["flows"])
