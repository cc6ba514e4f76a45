"""`npaudit get`: the command line becomes a local API request, and the answer prints as kubectl would (table, wide,
json, yaml); the reply comes from a real engine that applied the sample manifests."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from policy_agent.cli.get import request_of, run_get
from policy_agent.cli.main import build_parser, main
from policy_agent.config.loader import loads
from tests.support.inventory_engine import ask


def parse(*argv: str) -> dict[str, Any]:
    return request_of(build_parser(["get"]).parse_args(["get", *argv]))


def test_the_command_line_becomes_the_request() -> None:
    assert parse("pods") == {"op": "get", "kind": "pods"}
    assert parse("po", "y/a", "--flows") == {"op": "get", "kind": "pods", "namespace": "y", "name": "a", "flows": True}
    assert parse("netpol", "-n", "z") == {"op": "get", "kind": "policies", "namespace": "z"}
    assert parse("rule", "drop-x-a-http") == {"op": "get", "kind": "rules", "name": "drop-x-a-http"}
    with pytest.raises(SystemExit) as exc:
        parse("secrets")
    assert exc.value.code == 2


def run(tmp_path: Path, request: dict[str, Any], output: str) -> tuple[int, str, str]:
    cfg = loads(f"state_dir: {tmp_path}\n")
    out, err = io.StringIO(), io.StringIO()

    def api(path: Path, req: dict[str, Any]) -> dict[str, Any]:
        assert path == cfg.api_socket and req == request
        (reply,), _ = ask({k: v for k, v in req.items() if k != "op"})
        return reply
    code = run_get(cfg, request, output, api=api, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_rules_print_as_a_table_with_their_ids_and_tiers(tmp_path: Path) -> None:
    code, out, err = run(tmp_path, {"op": "get", "kind": "rules"}, "table")
    lines = out.splitlines()
    assert code == 0 and err == ""
    assert lines[0].split() == ["ID", "TIER", "POLICY", "RULE", "DIRECTION", "ACTION"]
    row = next(line.split() for line in lines if "drop-x-a-http" in line)
    assert row[1:] == ["securityops", "AntreaClusterNetworkPolicy:drop-x-a-to-y-http", "drop-x-a-http", "ingress",
                       "Drop"] and row[0].isdigit()
    _, wide, _ = run(tmp_path, {"op": "get", "kind": "rules"}, "wide")
    assert wide.splitlines()[0].split()[-3:] == ["PRIORITY", "LOGGED", "LOG-LABEL"] and "x-a-to-y-http" in wide


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_a_pods_flows_come_in_json_and_yaml_alike(tmp_path: Path, output: str) -> None:
    request = {"op": "get", "kind": "pods", "namespace": "y", "name": "a", "flows": True}
    code, out, _ = run(tmp_path, request, output)
    data = json.loads(out) if output == "json" else yaml.safe_load(out)
    (pod,) = data["items"]
    assert code == 0 and data["kind"] == "pods" and pod["name"] == "a" and pod["class"] > 0
    assert any("in_port=7" in flow for flow in pod["flows"])
    _, table, _ = run(tmp_path, request, "table")
    assert "flows of y/a:" in table and any("in_port=7" in line for line in table.splitlines())


def test_no_agent_or_no_such_name_is_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(tmp_path, {"op": "get", "kind": "pods", "namespace": "y", "name": "nope"}, "table")
    assert (code, out, err) == (1, "", "npaudit get: pod 'nope' in namespace y: not found\n")
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path}\n")
    assert main(["get", "pods", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("npaudit get: no agent answers at ") and err.count("\n") == 1
