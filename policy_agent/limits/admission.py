"""Tier 2 of rate limiting: each packet-in category's subscriber behind the agent's token bucket and a bounded
queue, and in the policy category a fair share per (rule, applied-to Pod) so one flooding source hides no other."""

from __future__ import annotations

from typing import Callable, Mapping

from packetin.demux import Demux, FairShareSettings, Handler
from packetin.fair_key import applied_to_key
from packetin.model import Category
from policy_agent.config.packetin import CategoryLimits, PacketInConfig


def subscribe(demux: Demux, handlers: Mapping[int, Handler], config: PacketInConfig, *,
              direction: Callable[[int], str | None], now: float) -> None:
    """Every handler on `demux` with its category's limits (a category without its own: traceflow's);
    `direction` says whether a rule id is an ingress or an egress rule, for the fair-share key."""
    limits: dict[int, CategoryLimits] = {Category.POLICY: config.policy, Category.TRACEFLOW: config.traceflow}
    fair = config.fair_share
    for category, handler in handlers.items():
        lim = limits.get(category, config.traceflow)
        demux.subscribe(category, handler, rate=lim.rate, burst=lim.burst, queue_size=lim.queue_size, now=now,
                        fair=FairShareSettings(applied_to_key(direction), fair.key_rate, fair.key_burst, fair.max_keys)
                        if category == Category.POLICY and fair.enabled else None)
