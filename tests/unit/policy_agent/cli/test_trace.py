"""`npaudit trace`: exit codes by outcome, one line for errors, the table an operator reads."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from policy_agent.cli.main import build_parser
from policy_agent.config.loader import loads
from policy_agent.cli.trace import request_of, run_trace

TRACE = {
    "from": {"pod": "x/a", "ip": "10.0.0.2", "port": 3}, "to": {"pod": "y/b", "ip": "10.0.0.3"},
    "protocol": "tcp", "destination_port": 80, "source_port": 45000, "tag": 2, "elapsed_ms": 4.2,
    "observations": [{"table": 0, "name": "classifier", "action": "accept", "detail": "from the source Pod's port 3"},
                     {"table": 40, "name": "ingress: Antrea tiers", "action": "Drop",
                      "detail": "Drop by AntreaClusterNetworkPolicy sec-drop-web, rule no-web\x1b[31m, tier securityops"}],
    "outcome": {"result": "dropped", "detail": "Drop by AntreaClusterNetworkPolicy sec-drop-web"},
}


def run(tmp_path: Path, reply: Any, output: str = "table") -> tuple[int, str, str]:
    cfg = loads(f"state_dir: {tmp_path}\n")
    out, err = io.StringIO(), io.StringIO()

    def api(path: Path, request: dict[str, Any]) -> dict[str, Any]:
        assert path == cfg.api_socket and request["op"] == "trace"
        if isinstance(reply, Exception):
            raise reply
        return reply
    code = run_trace(cfg, {"op": "trace", "from": "x/a", "to": "y/b"}, output, api=api, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("result, code", [("delivered", 0), ("forwarded", 0), ("dropped", 1), ("rejected", 1),
                                          ("unknown-destination", 1), ("timeout", 3), ("no-report", 3)])
def test_exit_code_follows_the_outcome(tmp_path: Path, result: str, code: int) -> None:
    trace = {**TRACE, "outcome": {"result": result, "detail": "-"}}
    got, out, err = run(tmp_path, {"ok": True, "trace": trace}, "json")
    assert got == code and json.loads(out) == trace and err == ""


def test_the_table_names_each_table_and_escapes_what_the_agent_sent(tmp_path: Path) -> None:
    code, out, _ = run(tmp_path, {"ok": True, "trace": TRACE})
    lines = out.splitlines()
    assert code == 1
    assert lines[0] == "trace x/a (10.0.0.2, port 3) -> y/b (10.0.0.3) tcp 45000 -> 80, tag 2"
    assert lines[1].split() == ["TABLE", "NAME", "ACTION", "DETAIL"]
    assert lines[3].startswith("40     ingress: Antrea tiers  Drop    Drop by AntreaClusterNetworkPolicy")
    assert "\x1b" not in out and "\\x1b" in out
    assert lines[-1] == "outcome: dropped: Drop by AntreaClusterNetworkPolicy sec-drop-web (4.2 ms)"


def test_a_trace_across_nodes_says_on_which_node_each_table_was_met(tmp_path: Path) -> None:
    trace = {**TRACE, "to": {"pod": "y/b", "ip": "10.248.2.2", "node": "n2"},
             "observations": [{**TRACE["observations"][0], "node": "n1"},
                              {"table": 70, "name": "forward", "action": "tunnel", "node": "n1",
                               "tunnel": {"node": "n2", "address": "198.51.100.12"},
                               "detail": "into the Geneve tunnel (port 1) to Pod y/b on node n2 (198.51.100.12)"},
                              {**TRACE["observations"][1], "node": "n2"}],
             "outcome": {"result": "dropped", "node": "n2", "detail": "on node n2: Drop by X"}}
    code, out, _ = run(tmp_path, {"ok": True, "trace": trace})
    lines = out.splitlines()
    assert code == 1
    assert lines[0] == "trace x/a (10.0.0.2, port 3) -> y/b (10.248.2.2) on node n2 tcp 45000 -> 80, tag 2"
    assert lines[1].split() == ["NODE", "TABLE", "NAME", "ACTION", "DETAIL"]
    assert [line.split()[:2] for line in lines[2:5]] == [["n1", "0"], ["n1", "70"], ["n2", "40"]]
    assert lines[3].endswith("into the Geneve tunnel (port 1) to Pod y/b on node n2 (198.51.100.12)")
    assert lines[-1] == "outcome: dropped: on node n2: Drop by X (4.2 ms)"


def test_usage_errors_exit_2_and_failures_exit_4_with_one_line(tmp_path: Path) -> None:
    code, out, err = run(tmp_path, {"ok": False, "errors": ["from: no running Pod x/zz on this node"], "usage": True})
    assert (code, out, err) == (2, "", "npaudit trace: from: no running Pod x/zz on this node\n")
    code, _, err = run(tmp_path, {"ok": False, "errors": ["the switch did not take the trace: gone"], "usage": False})
    assert code == 4 and err.count("\n") == 1
    code, _, err = run(tmp_path, FileNotFoundError(2, "No such file or directory"))
    assert code == 4 and err.startswith("npaudit trace: no agent answers at ") and err.count("\n") == 1


def test_the_command_line_becomes_the_request() -> None:
    args = build_parser().parse_args(["trace", "--from", "x/a", "--to", "10.0.0.9", "--protocol", "udp",
                                      "--port", "53", "--source-port", "4000", "--timeout", "2"])
    assert request_of(args) == {"op": "trace", "from": "x/a", "to": "10.0.0.9", "protocol": "udp", "timeout": 2.0,
                                "port": 53, "source_port": 4000}
    minimal = request_of(build_parser().parse_args(["trace", "--from", "x/a", "--to", "y/b"]))
    assert minimal == {"op": "trace", "from": "x/a", "to": "y/b", "protocol": "tcp", "timeout": 5.0}
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["trace", "--from", "x/a", "--to", "y/b", "--protocol", "gre"])
    assert exc.value.code == 2
