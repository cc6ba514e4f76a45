"""How an interrupted apply was settled at start (sources/apply_intent.py) and its line in `npaudit status`."""

from __future__ import annotations

from typing import Any

__all__ = ["NOTHING", "ROLLED_BACK", "ROLLED_FORWARD", "describe"]

ROLLED_FORWARD = "rolled-forward"
ROLLED_BACK = "rolled-back"
NOTHING = "nothing"


def describe(settlement: Any) -> str:
    """One line for `npaudit status` from a settlement's JSON (or None: an agent not started)."""
    if not isinstance(settlement, dict):
        return "-"
    outcome = {ROLLED_FORWARD: "rolled forward", ROLLED_BACK: "rolled back"}.get(str(settlement.get("outcome")))
    if outcome is None:
        return f"no interrupted apply at start (store generation {settlement.get('store')})"
    return f"interrupted apply {outcome} at start: {settlement.get('reason')}"
