"""Small pieces of the composition root (agent.py): the state directory, handler chaining."""

from __future__ import annotations

from pathlib import Path

from packetin.demux import Handler
from packetin.model import PacketIn
from policy_agent.errors import AgentError


def make_state_dir(state_dir: Path) -> None:
    try:
        state_dir.mkdir(mode=0o750, parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise AgentError(f"state_dir {state_dir}: exists and is not a directory") from exc
    except OSError as exc:
        raise AgentError(f"state_dir {state_dir}: cannot create ({exc.strerror}: {exc.filename})") from exc


def chain(first: Handler, then: Handler | None) -> Handler:
    """`first`, then the debug tap when there is one."""
    if then is None:
        return first

    def both(pin: PacketIn) -> None:
        first(pin)
        then(pin)
    return both
