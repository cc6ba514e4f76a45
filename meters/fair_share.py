"""Fair admission inside one category: a token bucket per key under the category's bucket.

Hierarchical token buckets in the HTB manner. Every key (the agent uses rule and
applied-to Pod) has an assured share, its own bucket (`key_rate`, `key_burst`); a
packet within its key's share takes a token from the key and one from the category.
A key past its share may still borrow from the category, but only while the category
holds more than `reserve` tokens. So one key flooding at full speed gets the whole
category rate when it is alone (work-conserving), yet can never take the last
`reserve` tokens and their refill: those stay for keys within their share, and a
quiet key is admitted as long as the keys within their share ask for less than the
category rate. Keys are kept in an LRU of at most `max_keys`; a key evicted and seen
again starts with a full bucket (evictions are counted). The clock is passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterable

from meters.token_bucket import TokenBucket

# What `admit` decided.
ADMITTED = 0
DROPPED_FAIR_SHARE = 1  # the key was past its share and the category was down to its reserve
DROPPED_CATEGORY = 2    # the key was within its share, but the category had no token left

_NO_KEY = object()  # equal to no key
# Below this, a bucket's tokens less a whole number of tokens is exact in a float (its ulp is at most 1), so a run
# of one key's packet-ins can be judged at once with the same result as one at a time (_judge_run).
_EXACT = float(2 ** 52)
# The shortest read judged as a run at once: the one step costs ~0.9 µs, a key by key ~0.1 µs (a lone packet-in's
# read, the latency path, stays key by key).
_RUN_MIN = 16


def _judge_run(n: int, own: list[float], category: float, room: int, borrow_from: float, kept: list[int]
               ) -> tuple[int, float, int, int, int, int]:
    """n packet-ins of one key, whose bucket `own` is refilled at the read's time, judged as admit_read's loop
    judges them one by one, with `category` tokens and `room` in the channel: (judged, the category's tokens
    after, the room after, borrowed, category drops, fair-share drops). Their indexes 0..n-1 that are admitted
    go to `kept`; `own` is left as the loop would leave it. Both buckets below _EXACT: every step is exact."""
    # Within the key's share while both buckets hold a token and the room lasts: one from each, a packet-in.
    tokens = own[0]
    within = min(n, room, math.floor(tokens) if tokens >= 1 else 0, math.floor(category) if category >= 1 else 0)
    own[0] = tokens - within
    category -= within
    room -= within
    kept.extend(range(within))
    judged, left = within, n - within
    borrowed = category_drops = fair_drops = 0
    if not left or room <= 0:  # all judged, or the room ran out: the rest are not judged
        return judged, category, room, borrowed, category_drops, fair_drops
    if own[0] >= 1:  # the category ran out first: the rest, within their share, find it empty (nothing changes)
        return judged + left, category, room, borrowed, left, fair_drops
    # Past the key's share: borrowed while the category holds borrow_from or more. category - k is exact for a
    # whole k, but category - borrow_from, which guesses how many, may round up to a whole number (6.3 - 1.3
    # gives 5.0, yet 6.3 - 5 < 1.3). Rounding never takes it below a whole number the exact difference reaches,
    # so the guess is only ever too high: it is walked down.
    can = 0
    if category >= borrow_from:
        can = math.floor(category - borrow_from) + 1
        while can > 0 and not category - (can - 1) >= borrow_from:
            can -= 1
    borrowed = min(can, left, room)
    kept.extend(range(within, within + borrowed))
    category -= borrowed
    room -= borrowed
    judged += borrowed
    left -= borrowed
    if left and room > 0:  # past its share, the category down to its reserve: the rest are dropped
        fair_drops = left
        judged += left
    return judged, category, room, borrowed, category_drops, fair_drops


class FairShare:
    """Admission for one category: `admit(key, now)` per packet.

    The buckets are TokenBucket's arithmetic written out (a key's is a [tokens, last]
    pair): this runs on the reader for every packet-in of the category.
    """

    __slots__ = ("rate", "burst", "key_rate", "key_burst", "max_keys", "reserve", "_tokens", "_last", "_keys",
                 "evicted", "borrowed", "_exact")

    def __init__(self, rate: float, burst: float, *, key_rate: float, key_burst: float, max_keys: int,
                 now: float, reserve: float | None = None) -> None:
        TokenBucket(rate, burst, now)  # the same checks as a plain bucket's, for both levels
        TokenBucket(key_rate, key_burst, now)
        if max_keys < 1:
            raise ValueError(f"fair share max_keys must be >= 1, got {max_keys}")
        self.rate, self.burst = float(rate), float(burst)
        self.key_rate, self.key_burst = float(key_rate), float(key_burst)
        self.max_keys = max_keys
        # Half the category's burst by default: enough for many quiet keys' first packets.
        self.reserve = self.burst / 2 if reserve is None else float(reserve)
        if not (0 <= self.reserve < self.burst):
            raise ValueError(f"fair share reserve must be >= 0 and below the burst {burst}, got {reserve}")
        self._tokens = self.burst
        self._last = now
        self._keys: OrderedDict[Hashable, list[float]] = OrderedDict()
        self.evicted = 0
        self.borrowed = 0  # packets admitted past their key's share (from the category's excess)
        self._exact = self.burst < _EXACT and self.key_burst < _EXACT  # a run of one key judged at once (_judge_run)

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, key: Hashable, now: float) -> int:
        """ADMITTED, DROPPED_FAIR_SHARE or DROPPED_CATEGORY for one packet of `key` at `now`
        (a clock going backwards adds no tokens): a read of one."""
        kept, _, category_drops, _ = self.admit_read((key,), now, 1)
        return ADMITTED if kept else DROPPED_CATEGORY if category_drops else DROPPED_FAIR_SHARE

    def admits_any(self, now: float) -> bool:
        """Whether a packet of any key is admitted at `now` (nothing taken): the category holds its reserve and one
        token more, so a key past its share may borrow and one within it finds a token."""
        return self._category_at(now) >= self.reserve + 1

    def _category_at(self, now: float) -> float:
        """The category's tokens refilled to `now`, nothing taken (a clock going backwards adds none)."""
        category = self._tokens
        if now - self._last > 0:
            category += (now - self._last) * self.rate
            if category > self.burst:
                category = self.burst
        return category

    def admit_read(self, keys: Iterable[Hashable], now: float, room: int) -> tuple[list[int], int, int, int]:
        """Each key of one read, in order, all at `now`, while `room` lasts: (the indexes admitted, how many
        keys were judged, how many of those were DROPPED_CATEGORY and how many DROPPED_FAIR_SHARE). The keys
        after the room ran out are not judged. The same buckets, LRU and counters as judging one key at a
        time: the category is refilled once (later keys at the same `now` would add nothing), and a run of
        one key is looked up once. A list of _RUN_MIN or more keys that are all one key (a flood's read) is
        judged in one step (_judge_run), not key by key."""
        kept: list[int] = []
        if room <= 0:
            return kept, 0, 0, 0
        table = self._keys
        lookup, to_end = table.get, table.move_to_end
        key_rate, key_burst, max_keys = self.key_rate, self.key_burst, self.max_keys
        borrow_from = self.reserve + 1
        category = self._category_at(now)
        refilled = now - self._last > 0
        judged = category_drops = fair_drops = evicted = borrowed = 0
        last_key: Hashable = _NO_KEY
        own: list[float] = []
        run = 0  # a read whose keys are all one key (a flood's, as a rule): judged at once below, not key by key
        if type(keys) is list and len(keys) >= _RUN_MIN and self._exact and keys.count(keys[0]) == len(keys):
            run = len(keys)
            keys = keys[:1]  # the loop looks the key up (and refills it) once, then stops
        for i, key in enumerate(keys):
            if room <= 0:
                break
            judged += 1
            if key != last_key:  # a flood's keys come in runs: a run's key is the newest already, refilled at `now`
                last_key = key
                found = lookup(key)
                if found is None:
                    if len(table) >= max_keys:
                        table.popitem(last=False)
                        evicted += 1
                    own = table[key] = [key_burst, now]
                else:
                    own = found
                    to_end(key)
                    elapsed = now - own[1]
                    if elapsed > 0:
                        tokens = own[0] + elapsed * key_rate
                        own[0] = tokens if tokens < key_burst else key_burst
                        own[1] = now
            if run:
                judged, category, room, borrowed, category_drops, fair_drops = _judge_run(
                    run, own, category, room, borrow_from, kept)
                break
            if own[0] >= 1:
                if category >= 1:
                    category -= 1
                    own[0] -= 1
                    kept.append(i)
                    room -= 1
                else:
                    category_drops += 1
            elif category >= borrow_from:
                category -= 1
                borrowed += 1
                kept.append(i)
                room -= 1
            else:
                fair_drops += 1
        if judged:  # as `admit` would have: no key, no refill
            self._tokens = category
            if refilled:
                self._last = now
        self.evicted += evicted
        self.borrowed += borrowed
        return kept, judged, category_drops, fair_drops
