"""Demultiplex packet-ins by category into bounded subscriber channels.

The reader calls `dispatch` on the event-loop thread for each batch it decoded;
`dispatch` never blocks and never raises: a packet-in either enters its
category's channel or is counted as dropped (rate limit, full channel, no
subscriber, unknown category). One consumer task per subscriber drains its
channel and calls the handler; a handler exception is counted, logged at a
limited rate, and the loop goes on. A handler with `begin_batch` / `end_batch` is
told where each slice of its channel starts and ends (so it can hand its output on
once per slice). Grouped packet-ins (packetin/groups.py, read in overload) go
through `dispatch_groups`: a group is one item of its channel but takes as much of
its room as it holds packet-ins, and goes to the handler's `handle_group`, or one
by one to a handler without it; every count stays per packet-in. A read of one packet-in may come through `lone`
instead: its handler's output (the audit record) first, the same counts after.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from itertools import repeat
from dataclasses import dataclass, field
from collections.abc import Hashable
from functools import partial
from typing import Any, Callable, Iterable, cast

from meters.fair_share import FairShare
from meters.token_bucket import TokenBucket
from packetin.demux_counts import (DELIVERED, DROPPED_FAIR, DROPPED_QUEUE, DROPPED_RATE, HANDLER_ERROR, MALFORMED,
                                   NO_SUBSCRIBER, OUTCOMES, RECEIVED, UNKNOWN_CATEGORY, UNROUTABLE_REASONS,
                                   FairShareSettings, FairShareStats)
from packetin.groups import PacketInGroup
from packetin.handlers import Handler, RunHandler, chain_handlers, one_by_one  # noqa: F401 (chain_handlers: agent.py's)
from packetin.layouts import common_category
from packetin.model import Category, PacketIn
from packetin.ratelimited_log import RateLimitedLog
from packetin.read_pacing import READ_BATCH_TCP
from packetin.tasks import cancel_and_wait

_KNOWN = frozenset(int(c) for c in Category)

# How many items a consumer handles before yielding to the reader.
_CONSUMER_SLICE = 512
# The agent's `inline_max`: reads this small are what a rate the agent keeps up with brings (a paced read
# aims for READ_BATCH_TCP; twice that means behind; over a unix socket it aims for READ_BATCH, well under
# this, and a read past twice that is handled here all the same). Handled within the read, they cost no task wake-up
# (bench/agent_cpu.py: with 64 here, reads of 65-255 went to the task; 255 measured lower at 10k and 20k
# in both of 2 alternated rounds, by 0.1-4.2 µs a packet-in, bench/RESULTS.md). 511 since the batch became 256.
INLINE_MAX = 2 * READ_BATCH_TCP - 1

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Subscription:
    category: int
    name: str
    handler: Handler
    bucket: TokenBucket
    queue_size: int
    group_handler: Callable[[PacketInGroup], None]  # the handler's own handle_group, else one by one
    queue: collections.deque[PacketIn | PacketInGroup] = field(default_factory=collections.deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    task: asyncio.Task[None] | None = None
    fair: FairShare | None = None
    fair_key: Callable[[PacketIn], Hashable] | None = None
    fair_keys: Callable[[list[PacketIn]], list[Hashable]] | None = None  # a read's keys at once (fair_key.keys)
    in_groups: int = 0  # packet-ins queued in groups beyond one per group: the room they take
    # The handler's begin_batch / end_batch, called around each slice drained (None: it has none).
    begin_batch: Callable[[], None] | None = None
    end_batch: Callable[[], None] | None = None
    # The handler's handle_run (None: it has none): a slice's packet-ins in one call, see _drain_runs.
    run_handler: RunHandler | None = None
    failed: Callable[[], None] | None = None  # logs a packet-in the handler failed on (from inside its except)
    # The handler's lone and early (None: it has none): a read's only packet-in, its output first (`lone`, `early`).
    lone: Callable[[PacketIn], bool] | None = None
    early: Callable[[bytes, float], None] | None = None


class Demux:
    """Routes packet-ins to one subscriber per category."""

    def __init__(self, *, error_log: RateLimitedLog | None = None, inline_max: int = 0) -> None:
        """`inline_max`: a batch of at most this many packet-ins that finds its (running) channel
        empty is handed to the handler within `dispatch`, not through the consumer task: at
        moderate rates every read brings a packet-in or two, and a task wake-up each would cost
        more than the packet-in's own work. A backlog (larger reads, a channel not empty) queues
        as before, so the channel's fill still shows it."""
        self._subs: dict[int, _Subscription] = {}
        self._inline_max = inline_max
        self.unroutable: dict[str, int] = dict.fromkeys(UNROUTABLE_REASONS, 0)
        self._errors = error_log or RateLimitedLog(log)
        self._running = False
        self._common_category = common_category()  # a read's one category at once (None: one by one)

    def subscribe(self, category: int, handler: Handler, *, rate: float, burst: float,
                  queue_size: int, now: float, name: str | None = None,
                  fair: FairShareSettings | None = None) -> None:
        """Register the handler for `category` with its own token bucket and channel
        (and with `fair`, a bucket per key under the category's: meters/fair_share.py)."""
        if category in self._subs:
            raise ValueError(f"category {category} already has subscriber {self._subs[category].name!r}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        sub = _Subscription(
            category=category,
            name=name or str(getattr(handler, "__qualname__", repr(handler))),
            handler=handler,
            bucket=TokenBucket(rate, burst, now),
            queue_size=queue_size,
            group_handler=getattr(handler, "handle_group", None) or one_by_one(handler),
            begin_batch=getattr(handler, "begin_batch", None),
            end_batch=getattr(handler, "end_batch", None),
            run_handler=getattr(handler, "handle_run", None),
            lone=getattr(handler, "lone", None), early=getattr(handler, "early", None),
        )
        sub.failed = partial(self._handler_failed, sub)
        if fair is not None:
            sub.fair = FairShare(rate, burst, key_rate=fair.key_rate, key_burst=fair.key_burst,
                                 max_keys=fair.max_keys, now=now)
            sub.fair_key = fair.key
            sub.fair_keys = getattr(fair.key, "keys", None)
        self._subs[category] = sub
        if self._running:
            sub.task = asyncio.get_running_loop().create_task(self._consume(sub))

    def count_malformed(self, n: int = 1) -> None:
        self.unroutable[MALFORMED] += n

    def dispatch(self, batch: Iterable[PacketIn], now: float) -> None:
        """Admit each packet-in to its category's channel, or count why not.

        Per packet-in this only sorts by category (a read whose packet-ins all carry one
        subscribed category in their userdata, as a flood's do, is taken whole: packetin/layouts.py
        common_category); admission then happens once per
        category and batch, with the same outcome as admitting one by one: a packet
        is queued while the channel has room and the bucket has a token; the rest
        count as dropped_queue_full if the channel filled first, else as
        dropped_rate_limit.
        """
        subs = self._subs
        by_category: dict[int, list[PacketIn]] = {}
        common = self._common_category
        one = common(batch) if common is not None and type(batch) is list else None
        if one is not None and one in subs:
            by_category[one] = cast("list[PacketIn]", batch)
        else:
            for pin in batch:
                category = pin.category
                group = by_category.get(category)  # type: ignore[arg-type]
                if group is None:
                    if category is None:
                        self.unroutable[UNKNOWN_CATEGORY] += 1
                        continue
                    if category not in subs:
                        self.unroutable[NO_SUBSCRIBER if category in _KNOWN else UNKNOWN_CATEGORY] += 1
                        continue
                    group = by_category[category] = []
                group.append(pin)
        for category, group in by_category.items():
            sub = subs[category]
            counts = sub.counts
            n = len(group)
            counts[RECEIVED] += n
            if sub.fair is not None:
                self._admit_fairly(sub, group, now)
                continue
            room = sub.queue_size - len(sub.queue) - sub.in_groups
            admitted = sub.bucket.take_up_to(now, min(n, room)) if room > 0 else 0
            if admitted < n:
                # Whichever limit ran out first decided the rest.
                limited_by_queue = admitted == room
                counts[DROPPED_QUEUE if limited_by_queue else DROPPED_RATE] += n - admitted
            if admitted:
                self._hand_over(sub, group if admitted == n else group[:admitted])

    def _lone_sub(self, category: int | None, now: float) -> _Subscription | None:
        """The subscription `lone` hands a packet-in of `category` to now, else None."""
        sub = self._subs.get(category) if category is not None else None
        if sub is None or sub.lone is None or sub.queue or sub.task is None or self._inline_max < 1 \
                or sub.in_groups >= sub.queue_size:
            return None
        fair = sub.fair  # admitted whatever its key: a token in the bucket, or above the fair shares' reserve
        return sub if (sub.bucket.tokens(now) >= 1 if fair is None else sub.fair_key is not None
                       and fair.admits_any(now)) else None

    def early(self, raw: bytes, now: float, wall: float) -> None:
        """Before a lone read's message is decoded: the policy handler's early (its record made from the bytes)."""
        sub = self._lone_sub(Category.POLICY, now)
        if sub is not None and sub.early is not None:
            sub.early(raw, wall)

    def early_arm(self, now: float) -> tuple[Any, ...] | None:
        """What the policy handler's early would use for a lone read now (its early_arm: the event loop's quiet
        wait, packetin/quiet.py), else None."""
        sub = self._lone_sub(Category.POLICY, now)
        arm = getattr(sub.handler, "early_arm", None) if sub is not None and sub.early is not None else None
        return arm() if arm is not None else None

    def lone(self, pin: PacketIn, now: float) -> bool:
        """dispatch([pin], now) for a read whose only packet-in the channel admits whatever its key (an empty
        channel handled inline, _lone_sub): its handler's `lone` takes it, which puts its output (the audit record)
        first, and the counts and admission come after, as dispatch leaves them. False, nothing done, when the
        handler has no lone or declines, or admission is not certain."""
        sub = self._lone_sub(pin.category, now)
        if sub is None or sub.lone is None:
            return False
        fair, failed = sub.fair, False
        try:
            if not sub.lone(pin):
                return False
        except Exception:  # taken, failed: as a batch of one counts it
            failed = True
            self._handler_failed(sub)
        counts = sub.counts
        counts[RECEIVED] += 1
        if fair is not None:
            keys = sub.fair_keys([pin]) if sub.fair_keys is not None else [sub.fair_key(pin)]  # type: ignore[misc]
            admitted = len(self._fair_indexes(sub, keys, 1, sub.queue_size - sub.in_groups, now))
        else:
            admitted = sub.bucket.take_up_to(now, 1)
        if not admitted:  # not expected: admission was certain before the handler ran
            self._errors.log(logging.ERROR, f"lone-{sub.category}", "subscriber %s: a lone packet-in was handled "
                             "but not admitted after (category %d)", sub.name, sub.category)
        counts[HANDLER_ERROR if failed else DELIVERED] += 1
        return True

    def dispatch_groups(self, groups: Iterable[PacketInGroup], now: float) -> None:
        """Admit groups of packet-ins as `dispatch` admits their packet-ins, in order: each
        while the channel has room (a group takes as much as it holds) and a token (and its
        key's share); only the admitted part of a group is queued, as one item."""
        subs = self._subs
        for group in groups:
            n = len(group.raws)
            category = group.sample.category
            sub = subs.get(category) if category is not None else None
            if sub is None:
                self.unroutable[NO_SUBSCRIBER if category in _KNOWN else UNKNOWN_CATEGORY] += n
                continue
            counts = sub.counts
            counts[RECEIVED] += n
            room = sub.queue_size - len(sub.queue) - sub.in_groups
            if sub.fair is not None and sub.fair_key is not None:
                admitted = self._admit_group_fairly(sub, group, room, now)
            else:
                k = sub.bucket.take_up_to(now, min(n, room)) if room > 0 else 0
                if k < n:
                    counts[DROPPED_QUEUE if k == room or room <= 0 else DROPPED_RATE] += n - k
                admitted = group.head(k) if k else None
            if admitted is not None:
                sub.queue.append(admitted)
                sub.in_groups += len(admitted.raws) - 1
                sub.wake.set()

    def _admit_group_fairly(self, sub: _Subscription, group: PacketInGroup, room: int, now: float
                            ) -> PacketInGroup | None:
        """The group's packet-ins share one key (rule id, in_port and destination address)."""
        n = len(group.raws)
        return group.pick(self._fair_indexes(sub, repeat(sub.fair_key(group.sample), n), n, room, now))  # type: ignore[misc]

    def _admit_fairly(self, sub: _Subscription, group: list[PacketIn], now: float) -> None:
        key, queue = sub.fair_key, sub.queue
        if sub.fair is None or key is None:
            return
        keys = sub.fair_keys(group) if sub.fair_keys is not None else map(key, group)
        kept = self._fair_indexes(sub, keys, len(group), sub.queue_size - len(queue) - sub.in_groups, now)
        if kept:
            self._hand_over(sub, group if len(kept) == len(group) else [group[i] for i in kept])

    def _hand_over(self, sub: _Subscription, admitted: list[PacketIn]) -> None:
        """Queue a read's admitted packet-ins: a small read into an empty channel is handled now, within the
        read (no task wake-up); the rest waits for the consumer task (behind the backlog, and in the queue
        the overload mode watches)."""
        queue = sub.queue
        inline = not queue and len(admitted) <= self._inline_max and sub.task is not None
        queue.extend(admitted)
        if inline:
            self._drain(sub, len(admitted))
        elif not sub.wake.is_set():
            sub.wake.set()

    @staticmethod
    def _fair_indexes(sub: _Subscription, keys: Iterable[Hashable], n: int, room: int, now: float) -> list[int]:
        """Per packet-in, in order: the channel's room first, then its key's share and the
        category's bucket. The indexes admitted; the drops are counted."""
        counts = sub.counts
        kept, judged, rate_drops, fair_drops = sub.fair.admit_read(keys, now, room)  # type: ignore[union-attr]
        if judged < n:
            counts[DROPPED_QUEUE] += n - judged
        counts[DROPPED_RATE] += rate_drops
        counts[DROPPED_FAIR] += fair_drops
        return kept

    def start(self) -> None:
        """Start one consumer task per subscriber (call from inside the event loop)."""
        loop = asyncio.get_running_loop()
        self._running = True
        for sub in self._subs.values():
            if sub.task is None:
                sub.task = loop.create_task(self._consume(sub), name=f"demux-{sub.name}")

    async def stop(self, drain: bool = True) -> None:
        """Stop the consumers; with `drain`, hand every queued packet-in to its handler first."""
        self._running = False
        for sub in self._subs.values():
            await cancel_and_wait(sub.task)
            sub.task = None
            if drain:
                self._drain(sub, len(sub.queue))

    async def wait_idle(self) -> None:
        """Return once every channel is empty (for tests and orderly shutdown)."""
        while any(sub.queue for sub in self._subs.values()):
            await asyncio.sleep(0.001)

    def stats(self) -> dict[int, dict[str, int]]:
        return {cat: dict(sub.counts) for cat, sub in self._subs.items()}

    def admission_drops(self, category: int) -> int:
        """Packet-ins of the category its token bucket or fair shares turned away, so far."""
        sub = self._subs.get(category)
        return sub.counts[DROPPED_RATE] + sub.counts[DROPPED_FAIR] if sub is not None else 0

    def queue_depths(self) -> dict[int, int]:
        """Packet-ins waiting per category (those in groups included)."""
        return {cat: len(sub.queue) + sub.in_groups for cat, sub in self._subs.items()}

    def queue_fill(self, category: int) -> float:
        """How full the category's channel is, 0.0 .. 1.0 (0.0 without a subscriber)."""
        sub = self._subs.get(category)
        return (len(sub.queue) + sub.in_groups) / sub.queue_size if sub is not None else 0.0

    def fair_share_stats(self) -> dict[int, FairShareStats]:
        return {cat: FairShareStats(len(sub.fair), sub.fair.evicted, sub.fair.borrowed)
                for cat, sub in self._subs.items() if sub.fair is not None}

    def _drain(self, sub: _Subscription, limit: int) -> None:
        """Hand up to `limit` queued items to the handler, as one batch (begin_batch .. end_batch)."""
        if sub.begin_batch is None or sub.end_batch is None or not sub.queue:
            self._drain_items(sub, limit)
            return
        try:
            sub.begin_batch()
        except Exception:
            self._handler_failed(sub)
        try:
            self._drain_items(sub, limit)
        finally:
            try:
                sub.end_batch()
            except Exception:
                self._handler_failed(sub)

    def _drain_items(self, sub: _Subscription, limit: int) -> None:
        queue = sub.queue
        handler = sub.handler
        counts = sub.counts
        n = min(limit, len(queue))
        if sub.run_handler is not None and n > 1:
            self._drain_runs(sub, n)
            return
        errors = extra = 0
        for _ in range(n):
            pin = queue.popleft()
            if isinstance(pin, PacketInGroup):  # read in overload: its packet-ins count one by one
                more, failed = self._take_group(sub, pin)
                extra += more
                errors += failed
                continue
            try:
                handler(pin)
            except Exception:  # one bad packet must not stop the loop
                errors += 1
                self._handler_failed(sub)
        counts[DELIVERED] += n + extra - errors
        counts[HANDLER_ERROR] += errors

    def _drain_runs(self, sub: _Subscription, n: int) -> None:
        """_drain_items for a handler with handle_run: the slice's packet-ins in as few calls as it takes (it hands
        each as __call__ would have had it, and says how many failed), its groups one by one as before."""
        queue, counts = sub.queue, sub.counts
        run_handler, failed = cast("RunHandler", sub.run_handler), cast("Callable[[], None]", sub.failed)
        if n == len(queue):
            items = list(queue)
            queue.clear()
        else:
            items = [queue.popleft() for _ in range(n)]
        errors = extra = 0
        i = 0
        while i < n:
            try:
                i, failures = run_handler(items, i, n, failed)
            except Exception:  # not expected (it catches and counts its own): the rest of the slice counts as failed
                self._handler_failed(sub)
                for item in items[i:]:
                    weight = len(item.raws) if isinstance(item, PacketInGroup) else 1
                    extra += weight - 1
                    sub.in_groups -= weight - 1
                    errors += weight
                break
            errors += failures
            if i < n:  # a group (read in overload): its packet-ins count one by one
                more, failures = self._take_group(sub, cast(PacketInGroup, items[i]))
                extra += more
                errors += failures
                i += 1
        counts[DELIVERED] += n + extra - errors
        counts[HANDLER_ERROR] += errors

    def _take_group(self, sub: _Subscription, group: PacketInGroup) -> tuple[int, int]:
        """A queued group to its handler: (its packet-ins beyond the one item it was, how many failed)."""
        weight = len(group.raws)
        sub.in_groups -= weight - 1
        try:
            sub.group_handler(group)
        except Exception:
            self._handler_failed(sub)
            return weight - 1, weight
        return weight - 1, 0

    def _handler_failed(self, sub: _Subscription) -> None:
        self._errors.log(logging.WARNING, f"handler-{sub.category}",
                         "subscriber %s failed on a packet-in (category %d)",
                         sub.name, sub.category, exc_info=True)

    async def _consume(self, sub: _Subscription) -> None:
        while True:
            await sub.wake.wait()
            sub.wake.clear()
            while sub.queue:
                self._drain(sub, _CONSUMER_SLICE)
                if sub.queue:
                    await asyncio.sleep(0)  # let the reader in between slices

