"""The agent's state directory (applied store, CNI records, round file, sockets): made at start, 0750."""

from __future__ import annotations

from pathlib import Path

from policy_agent.errors import AgentError


def make_state_dir(state_dir: Path) -> None:
    """`state_dir` (and its parents) made if missing; AgentError naming it when that cannot be."""
    try:
        state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise AgentError(f"state_dir {state_dir}: exists and is not a directory") from exc
    except OSError as exc:
        raise AgentError(f"state_dir {state_dir}: cannot create ({exc.strerror}: {exc.filename})") from exc

