"""What the demux (packetin/demux.py) counts per category and why a packet-in reaches none, and the fair-share
settings and figures of its admission (meters/fair_share.py)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Callable

from packetin.model import PacketIn

# Outcomes counted per category (exported as npaudit_packetin_total{category,outcome}).
RECEIVED = "received"
DELIVERED = "delivered"
DROPPED_RATE = "dropped_rate_limit"
DROPPED_QUEUE = "dropped_queue_full"
HANDLER_ERROR = "handler_error"
DROPPED_FAIR = "dropped_fair_share"  # past its key's fair share while the category was down to its reserve
OUTCOMES = (RECEIVED, DELIVERED, DROPPED_RATE, DROPPED_QUEUE, HANDLER_ERROR, DROPPED_FAIR)

# Packet-ins that never reach a category (npaudit_packetin_unroutable_total{reason}).
UNKNOWN_CATEGORY = "unknown_category"
NO_SUBSCRIBER = "no_subscriber"
MALFORMED = "malformed"
UNROUTABLE_REASONS = (UNKNOWN_CATEGORY, NO_SUBSCRIBER, MALFORMED)


@dataclass(frozen=True)
class FairShareSettings:
    """Fair admission between keys of one category (meters/fair_share.py).

    `key` runs on every packet-in of the category before admission: it must be cheap
    (the agent gives (rule id, applied-to Pod) from reg6, in_port and the frame).
    """

    key: Callable[[PacketIn], Hashable]
    key_rate: float
    key_burst: float
    max_keys: int


@dataclass(frozen=True)
class FairShareStats:
    keys: int      # keys tracked now
    evicted: int   # keys dropped from the LRU to stay within max_keys
    borrowed: int  # packet-ins admitted past their key's share, from the category's excess
