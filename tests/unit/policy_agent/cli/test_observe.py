"""`npaudit observe`: `logs` under hubble's name and with hubble observe's spellings (--verdict FORWARDED|DROPPED,
--from-namespace, --to-namespace, --from-port, --to-port, --traffic-direction, --node-name), over a real audit file
set; each selects what its meaning says, counted independently of npaudit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from policy_agent.cli.main import main
from tests.support.audit_records import sample_record, write_set

N = 120
Rec = dict[str, Any]


@pytest.fixture(scope="module")
def logset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("observe")
    write_set(directory / "audit.jsonl", (sample_record(i) for i in range(N)), max_bytes=12_000)
    return directory


def shown(capsys: pytest.CaptureFixture[str], *argv: str) -> list[Rec]:
    capsys.readouterr()
    assert main([*argv, "-o", "json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def pod_ns(side: str) -> Callable[[Rec], Any]:
    return lambda r: ((r["npaudit"].get(side) or {}).get("pod") or {}).get("namespace")


@pytest.mark.parametrize("argv, wanted", [
    (["--verdict", "DROPPED"], lambda r: r["npaudit"]["disposition"] in ("Drop", "Reject")),
    (["--verdict", "forwarded"], lambda r: r["npaudit"]["disposition"] == "Allow"),
    (["--verdict", "pass"], lambda r: r["npaudit"]["disposition"] == "Pass"),
    (["--from-namespace", "backend"], lambda r: pod_ns("source")(r) == "backend"),
    (["--to-namespace", "backend"], lambda r: pod_ns("destination")(r) == "backend"),
    (["--to-port", "443"], lambda r: r["destination"]["port"] == 443),
    (["--from-port", "40003"], lambda r: r["source"]["port"] == 40003),
    (["--traffic-direction", "egress"], lambda r: r["network"]["direction"] == "egress"),
    (["--node-name", "node-b"], lambda r: r["observer"]["hostname"] == "node-b"),
    (["--not", "--verdict", "DROPPED", "--from-namespace", "frontend"],
     lambda r: r["npaudit"]["disposition"] not in ("Drop", "Reject") and pod_ns("source")(r) == "frontend"),
])
def test_hubble_spellings_select_what_they_mean(logset: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                                wanted: Callable[[Rec], bool]) -> None:
    everything = shown(capsys, "logs", str(logset))
    expected = [r for r in everything if wanted(r)]
    assert 0 < len(expected) < len(everything)
    assert shown(capsys, "observe", str(logset), *argv) == expected
    assert shown(capsys, "logs", str(logset), *argv) == expected  # the same options in `logs`


def test_a_verdict_hubble_does_not_have_is_a_usage_error(logset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["observe", str(logset), "--verdict", "AUDIT"]) == 2
    assert "not a verdict" in capsys.readouterr().err


def test_completion_knows_the_observe_verb_and_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "observe" in script and "--verdict" in script and "--traffic-direction" in script
