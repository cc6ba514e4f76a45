"""`npaudit bundle` against a real private OVS with no agent running: OVS state in, absence said, --redact holds."""

from __future__ import annotations

import gzip
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from policy_agent.cli.main import main
from tests.integration.conftest import OvsEnv
from tests.support.bridge import BRIDGE


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_bundle_holds_the_bridge_flows_meters_and_counters_and_says_the_agent_is_not_running(
        ovs_env: OvsEnv, tmp_path: Path, capsys: Any) -> None:
    subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "add-flow", ovs_env.mgmt,
                    "table=0,priority=77,ip,nw_src=10.123.45.67,actions=drop"], check=True)
    subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "add-meter", ovs_env.mgmt,
                    "meter=9,pktps,band=type=drop,rate=100"], check=False)  # netdev: meters supported
    cfg = tmp_path / "npaudit.yaml"
    cfg.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "node_name": "bundle-node-x",
                               "ovs": {"run_dir": str(ovs_env.run_dir), "netns": ovs_env.netns, "bridge": BRIDGE},
                               "metrics": {"listen": ""}}))
    out = tmp_path / "b.tar.gz"
    assert main(["bundle", "--config", str(cfg), "-o", str(out)]) == 0
    members = _members(out)
    manifest = json.loads(members["manifest.json"])
    assert b"nw_src=10.123.45.67" in members["ovs/dump-flows.txt"]
    assert BRIDGE.encode() in members["ovs/vsctl-show.txt"]
    assert b"meter=9" in members["ovs/dump-meters.txt"]
    assert members["ovs/coverage.txt"].startswith(b"Event coverage")
    assert b"bridge|INFO|bridge " + BRIDGE.encode() in members["ovs/ovs-vswitchd.log"]
    assert manifest["agent_running"] is False
    assert {"agent/status.json", "audit/audit.jsonl"} <= {e["name"] for e in manifest["skipped"]}

    assert main(["bundle", "--config", str(cfg), "-o", str(out), "--redact"]) == 0
    raw = gzip.decompress(out.read_bytes())
    assert b"10.123.45.67" not in raw and b"bundle-node-x" not in raw
    assert b"priority=77,ip,nw_src=2" in _members(out)["ovs/dump-flows.txt"]  # 240.0.0.0/4: still a flow
