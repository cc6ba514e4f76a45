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

from collections import OrderedDict
from collections.abc import Hashable, Iterable

from meters.token_bucket import TokenBucket

# What `admit` decided.
ADMITTED = 0
DROPPED_FAIR_SHARE = 1  # the key was past its share and the category was down to its reserve
DROPPED_CATEGORY = 2    # the key was within its share, but the category had no token left

_NO_KEY = object()  # equal to no key


class FairShare:
    """Admission for one category: `admit(key, now)` per packet.

    The buckets are TokenBucket's arithmetic written out (a key's is a [tokens, last]
    pair): this runs on the reader for every packet-in of the category.
    """

    __slots__ = ("rate", "burst", "key_rate", "key_burst", "max_keys", "reserve", "_tokens", "_last", "_keys",
                 "evicted", "borrowed")

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

    def __len__(self) -> int:
        return len(self._keys)

    def admit(self, key: Hashable, now: float) -> int:
        """ADMITTED, DROPPED_FAIR_SHARE or DROPPED_CATEGORY for one packet of `key` at `now`
        (a clock going backwards adds no tokens): a read of one."""
        kept, _, category_drops, _ = self.admit_read((key,), now, 1)
        return ADMITTED if kept else DROPPED_CATEGORY if category_drops else DROPPED_FAIR_SHARE

    def admit_read(self, keys: Iterable[Hashable], now: float, room: int) -> tuple[list[int], int, int, int]:
        """Each key of one read, in order, all at `now`, while `room` lasts: (the indexes admitted, how many
        keys were judged, how many of those were DROPPED_CATEGORY and how many DROPPED_FAIR_SHARE). The keys
        after the room ran out are not judged. The same buckets, LRU and counters as judging one key at a
        time: the category is refilled once (later keys at the same `now` would add nothing), and a run of
        one key is looked up once."""
        kept: list[int] = []
        if room <= 0:
            return kept, 0, 0, 0
        table = self._keys
        lookup, to_end = table.get, table.move_to_end
        key_rate, key_burst, max_keys = self.key_rate, self.key_burst, self.max_keys
        borrow_from = self.reserve + 1
        category = self._tokens
        refilled = now - self._last > 0
        if refilled:
            category += (now - self._last) * self.rate
            if category > self.burst:
                category = self.burst
        judged = category_drops = fair_drops = evicted = borrowed = 0
        last_key: Hashable = _NO_KEY
        own: list[float] = []
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
