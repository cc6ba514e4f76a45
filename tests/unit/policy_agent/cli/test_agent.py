"""`npaudit agent` around the Agent: its last line never says "cleanly" over lost records, start-up
failures are one line, the debug tap is private."""

from __future__ import annotations

import asyncio
import logging
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from auditlog.writer import STAT_KEYS, WriterEvents, WriterStats
from policy_agent import agent as agent_mod
from policy_agent.cli import agent as agent_cli
from policy_agent.cli.main import main
from policy_agent.errors import AgentError


class _Demux:
    def stats(self) -> dict[str, int]:
        return {"received": 7}


class _Writer:
    def __init__(self, **counts: int) -> None:
        self.events = replace(WriterEvents(**dict.fromkeys(STAT_KEYS, 0)), **counts)

    def snapshot(self) -> WriterStats:
        return WriterStats(events=self.events, queued=0, seq=3)


def _fake_agent(monkeypatch: pytest.MonkeyPatch, writer: _Writer | None = None,
                fail: BaseException | None = None) -> list[Any]:
    made: list[Any] = []

    class FakeAgent:
        def __init__(self, config: Any, handlers: Any) -> None:
            self.demux, self.audit_writer, self.handlers = _Demux(), writer, handlers
            made.append(self)

        async def run(self, stop: asyncio.Event) -> None:
            if fail is not None:
                raise fail

    monkeypatch.setattr(agent_mod, "Agent", FakeAgent)
    monkeypatch.setattr(agent_cli, "install_stop_signals", lambda loop, stop: None)
    return made


def _run(tmp_path: Path, *extra: str) -> int:
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n")
    return main(["agent", "--config", str(config), *extra])


def test_a_stop_that_lost_records_says_so_instead_of_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    _fake_agent(monkeypatch, _Writer(lost_write_error=190, dropped_closed=4, written=6))
    with caplog.at_level(logging.INFO):
        rc = _run(tmp_path)
    last = caplog.records[-1]
    assert rc == 1 and last.levelno == logging.ERROR
    assert "stopped cleanly" not in caplog.text
    assert "194 audit records NOT written (dropped_closed 4, lost_write_error 190)" in last.getMessage()


def test_a_stop_without_loss_is_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    _fake_agent(monkeypatch, _Writer(written=6))
    with caplog.at_level(logging.INFO):
        assert _run(tmp_path) == 0
    assert caplog.records[-1].getMessage().startswith("stopped cleanly")


def test_a_start_up_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    _fake_agent(monkeypatch, fail=AgentError("metrics.listen 127.0.0.1:9495: cannot listen (Address already in use)"))
    assert _run(tmp_path) == 1
    err = capsys.readouterr().err
    assert err == "error: metrics.listen 127.0.0.1:9495: cannot listen (Address already in use)\n", err


def test_an_unexpected_failure_is_one_line_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _fake_agent(monkeypatch, fail=KeyError("x\ny"))
    assert _run(tmp_path) == 1
    assert capsys.readouterr().err == "error: agent stopped: KeyError: 'x\\ny'\n"


@pytest.mark.parametrize("existing", [False, True])
def test_the_debug_tap_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    made = _fake_agent(monkeypatch, _Writer())
    tap = tmp_path / "tap.jsonl"
    if existing:
        tap.write_text("old line\n")
        tap.chmod(0o644)
    assert _run(tmp_path, "--tap", str(tap)) == 0
    assert stat.S_IMODE(tap.stat().st_mode) == 0o600
    assert made[0].handlers  # the tap was handed to the agent
    assert tap.read_text().startswith("old line\n" if existing else "")
