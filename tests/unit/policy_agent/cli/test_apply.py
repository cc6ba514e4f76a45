"""`npaudit apply`'s reply side: what the user is told when the agent answers, refuses or vanishes."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy_agent.cli import apply as apply_cli, main as cli
from tests.support.fake_local_agent import apply, fake_agent, state_dir  # noqa: F401 (fixtures)


def test_an_agent_that_vanishes_mid_request_means_outcome_unknown(state_dir: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    agent = fake_agent(state_dir / "api.sock", None)
    rc, err = apply(state_dir, capsys)
    agent.close()
    assert rc == apply_cli.EXIT_OUTCOME_UNKNOWN and rc not in (0, 1)
    assert err.count("\n") == 1 and "outcome unknown; the agent's next start keeps the change if OVS enforced it" in err


def test_a_refusal_is_exit_1_with_the_agents_lines(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent = fake_agent(state_dir / "api.sock", {"ok": False, "errors": ["Tier/sec: spec.priority: 10 is taken"]})
    rc, err = apply(state_dir, capsys)
    agent.close()
    assert (rc, err) == (1, "error: Tier/sec: spec.priority: 10 is taken\n")


def test_the_exit_statuses_are_in_the_help() -> None:
    text = cli.build_parser()._subparsers._group_actions[0].choices["apply"].format_help()  # type: ignore[union-attr]
    assert "3 outcome unknown" in " ".join(text.split())
