"""`npaudit status` is quick by default: the kernel probe (compile and load the XDP program here,
seconds) runs only with --probe-kernel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policy_agent.cli import status
from policy_agent.cli.main import main
from tests.support.fake_local_agent import fake_agent, state_dir  # noqa: F401 (fixture)

NOT_RUNNING = {"ok": True, "status": {"agent": {"pid": 7}, "ebpf": {"active": False, "state": "disabled"},
                                      "problems": []}}


def run(state_dir: Path, *flags: str) -> int:
    config = state_dir / "npaudit.yaml"
    config.write_text(f"state_dir: {state_dir}\n")
    served = fake_agent(state_dir / "api.sock", NOT_RUNNING)
    try:
        return main(["status", "--config", str(config), "-o", "json", *flags])
    finally:
        served.close()
        (state_dir / "api.sock").unlink(missing_ok=True)


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def probe() -> tuple[bool, str]:
        calls.append(1)
        return False, "no kernel headers"
    monkeypatch.setattr(status, "_probe_ebpf", probe)
    return calls


def test_status_does_not_probe_the_kernel_by_default(state_dir: Path, probes: list[int], capsys: Any) -> None:
    assert run(state_dir) == 0
    assert probes == []
    assert "probe" not in json.loads(capsys.readouterr().out)["ebpf"]


def test_probe_kernel_asks_whether_the_ebpf_tier_could_run_here(state_dir: Path, probes: list[int],
                                                                 capsys: Any) -> None:
    assert run(state_dir, "--probe-kernel") == 0
    assert probes == [1]
    assert json.loads(capsys.readouterr().out)["ebpf"]["probe"] == {"ok": False, "reason": "no kernel headers"}


def test_the_old_no_probe_flag_is_still_accepted(state_dir: Path, probes: list[int]) -> None:
    assert run(state_dir, "--no-ebpf-probe") == 0
    assert probes == []
