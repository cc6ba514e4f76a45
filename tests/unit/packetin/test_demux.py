"""packetin.demux.Demux: routing by category, bounded channels, rate limits, accounting.

Every test runs its own event loop with asyncio.run; consumers are driven with
`await asyncio.sleep(0)` (see `settle`), never by waiting on the wall clock.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packetin import demux as dm
from packetin.demux import Demux
from packetin.model import Category, PacketIn, Userdata

POLICY, TRACEFLOW = int(Category.POLICY), int(Category.TRACEFLOW)
DROPS = (dm.DROPPED_RATE, dm.DROPPED_QUEUE, dm.HANDLER_ERROR)
ROOMY = dict(rate=1e6, burst=1e6, queue_size=10_000, now=0.0)  # never limits


def pin(seq: int, *, category: int | None = None, reason: int = 0, userdata: bytes | None = None) -> PacketIn:
    """A packet-in tagged with `seq` (as its rule_id), routed by `category` or by `reason`."""
    if userdata is None:
        userdata = Userdata(category=category, rule_id=seq).encode() if category is not None else b""
    return PacketIn(reason=reason, table_id=0, cookie=0, in_port=1, rule_id=seq, reg7=0,
                    userdata=userdata, packet=b"", total_len=0, received_at=0.0)


class Recorder:
    """A handler remembering the rule_id of each packet-in it saw; raises on `fail_on`."""

    def __init__(self, fail_on: frozenset[int] = frozenset()) -> None:
        self.seen: list[int] = []
        self.fail_on = fail_on

    def __call__(self, p: PacketIn) -> None:
        self.seen.append(p.rule_id)
        if p.rule_id in self.fail_on:
            raise RuntimeError(f"handler failed on {p.rule_id}")


async def settle(demux: Demux, spins: int = 10_000) -> None:
    """Yield to the consumer tasks until every channel is empty."""
    for _ in range(spins):
        if not any(demux.queue_depths().values()):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"consumers did not drain: {demux.queue_depths()}")


def assert_accounting(demux: Demux) -> None:
    for category, counts in demux.stats().items():
        assert counts[dm.RECEIVED] == counts[dm.DELIVERED] + sum(counts[k] for k in DROPS), (category, counts)


def outcome(**by_name: int) -> dict[str, int]:
    """A full per-category counts dict: the named outcomes, zero for the rest."""
    names = {"received": dm.RECEIVED, "delivered": dm.DELIVERED, "rate": dm.DROPPED_RATE,
             "queue": dm.DROPPED_QUEUE, "error": dm.HANDLER_ERROR}
    out = dict.fromkeys(dm.OUTCOMES, 0)
    for name, n in by_name.items():
        out[names[name]] = n
    return out


# --- routing ---------------------------------------------------------------------------


def test_each_handler_gets_its_category_in_order():
    async def main():
        policy, trace = Recorder(), Recorder()
        d = Demux()
        d.subscribe(POLICY, policy, **ROOMY)
        d.subscribe(TRACEFLOW, trace, **ROOMY)
        d.start()
        # Userdata routing and reason fallback (0 -> POLICY, 1 -> TRACEFLOW), interleaved.
        d.dispatch([pin(1, category=POLICY), pin(2, category=TRACEFLOW), pin(3, reason=0)], now=0.0)
        d.dispatch([pin(4, reason=1), pin(5, category=POLICY, reason=1), pin(6, category=TRACEFLOW)], now=0.0)
        await settle(d)
        d.dispatch([pin(7, category=POLICY)], now=0.0)
        await settle(d)
        await d.stop()
        return d, policy.seen, trace.seen

    d, policy, trace = asyncio.run(main())
    assert policy == [1, 3, 5, 7]
    assert trace == [2, 4, 6]
    assert d.stats() == {POLICY: outcome(received=4, delivered=4), TRACEFLOW: outcome(received=3, delivered=3)}
    assert d.unroutable == dict.fromkeys(dm.UNROUTABLE_REASONS, 0)


def test_consumer_handles_more_than_one_slice_in_order():
    async def main():
        rec, d = Recorder(), Demux()
        d.subscribe(POLICY, rec, **ROOMY)
        d.start()
        d.dispatch([pin(i, category=POLICY) for i in range(2000)], now=0.0)
        await settle(d)
        await d.stop()
        return rec.seen

    assert asyncio.run(main()) == list(range(2000))


# Categories outside Category count as unknown; known ones nobody subscribed to as no_subscriber.
@pytest.mark.parametrize("unroutable, reason_key", [
    (pin(1, userdata=Userdata(category=9).encode()), dm.UNKNOWN_CATEGORY),  # ours, category 9
    (pin(1, userdata=b"\x02\x00\x01\x00\x00\x00\x2a"), dm.UNKNOWN_CATEGORY),  # foreign version byte
    (pin(1, userdata=b"\x01\x00"), dm.UNKNOWN_CATEGORY),  # our version byte, too short
    (pin(1, reason=7), dm.UNKNOWN_CATEGORY),  # no userdata, reason without a category
    (pin(1, reason=1), dm.NO_SUBSCRIBER),  # TRACEFLOW by reason, nobody subscribed
    (pin(1, category=TRACEFLOW), dm.NO_SUBSCRIBER),
], ids=["category-9", "foreign-userdata", "short-userdata", "reason-7", "reason-1", "traceflow"])
def test_unroutable_packet_ins_are_counted(unroutable, reason_key):
    async def main():
        rec, d = Recorder(), Demux()
        d.subscribe(POLICY, rec, **ROOMY)
        d.start()
        d.dispatch([pin(100, category=POLICY), unroutable, pin(101, category=POLICY)], now=0.0)
        await settle(d)
        await d.stop()
        return d, rec.seen

    d, seen = asyncio.run(main())
    assert seen == [100, 101]
    assert d.stats() == {POLICY: outcome(received=2, delivered=2)}
    assert d.unroutable == {**dict.fromkeys(dm.UNROUTABLE_REASONS, 0), reason_key: 1}


def test_count_malformed():
    d = Demux()
    d.count_malformed()
    d.count_malformed(3)
    assert d.unroutable == {dm.UNKNOWN_CATEGORY: 0, dm.NO_SUBSCRIBER: 0, dm.MALFORMED: 4}


# --- drops ----------------------------------------------------------------------------


def test_full_queue_drops_without_consuming_tokens():
    async def main():
        rec, d = Recorder(), Demux()
        d.subscribe(POLICY, rec, rate=1e-9, burst=5, queue_size=2, now=0.0)
        # Consumer not started yet: the channel fills after two.
        d.dispatch([pin(i, category=POLICY) for i in range(6)], now=0.0)
        assert d.queue_depths() == {POLICY: 2}
        assert d.stats()[POLICY] == outcome(received=6, queue=4)
        d.start()
        await settle(d)
        # 5 - 2 = 3 tokens are left if the 4 queue drops took none.
        for i in range(10, 15):
            d.dispatch([pin(i, category=POLICY)], now=0.0)
            await settle(d)
        await d.stop()
        return d, rec.seen

    d, seen = asyncio.run(main())
    assert seen == [0, 1, 10, 11, 12]
    assert d.stats()[POLICY] == outcome(received=11, delivered=5, queue=4, rate=2)


def test_empty_bucket_drops_until_it_refills():
    async def main():
        rec, d = Recorder(), Demux()
        d.subscribe(POLICY, rec, rate=2, burst=3, queue_size=100, now=0.0)
        d.start()
        d.dispatch([pin(i, category=POLICY) for i in range(5)], now=0.0)
        after_burst = dict(d.stats()[POLICY])
        d.dispatch([pin(5, category=POLICY), pin(6, category=POLICY)], now=0.25)  # half a token
        d.dispatch([pin(7, category=POLICY), pin(8, category=POLICY)], now=0.5)  # one token
        await settle(d)
        await d.stop()
        return d, rec.seen, after_burst

    d, seen, after_burst = asyncio.run(main())
    assert after_burst == outcome(received=5, rate=2)
    assert seen == [0, 1, 2, 7]
    assert d.stats()[POLICY] == outcome(received=9, delivered=4, rate=5)


def test_rate_limits_are_per_category():
    async def main():
        policy, trace, d = Recorder(), Recorder(), Demux()
        d.subscribe(POLICY, policy, rate=1, burst=1, queue_size=10, now=0.0)
        d.subscribe(TRACEFLOW, trace, rate=1, burst=3, queue_size=10, now=0.0)
        d.dispatch([pin(i, category=i % 2) for i in range(8)], now=0.0)
        await d.stop(drain=True)
        return d, policy.seen, trace.seen

    d, policy, trace = asyncio.run(main())
    assert policy == [0]
    assert trace == [1, 3, 5]
    assert d.stats()[POLICY][dm.DROPPED_RATE] == 3
    assert d.stats()[TRACEFLOW][dm.DROPPED_RATE] == 1


# --- handler errors ------------------------------------------------------------------


def test_handler_error_is_counted_and_delivery_goes_on(caplog):
    async def main():
        rec, d = Recorder(fail_on=frozenset({2, 4})), Demux()
        d.subscribe(POLICY, rec, **ROOMY)
        d.start()
        d.dispatch([pin(i, category=POLICY) for i in range(6)], now=0.0)
        await settle(d)
        d.dispatch([pin(6, category=POLICY)], now=0.0)
        await settle(d)
        await d.stop()
        return d, rec.seen

    d, seen = asyncio.run(main())
    assert seen == [0, 1, 2, 3, 4, 5, 6]
    assert d.stats()[POLICY] == outcome(received=7, delivered=5, error=2)
    assert "failed on a packet-in" in caplog.text


# --- subscribe / stop ------------------------------------------------------------------


def test_subscribing_a_category_twice_raises():
    d = Demux()
    d.subscribe(POLICY, Recorder(), **ROOMY, name="first")
    with pytest.raises(ValueError, match="first"):
        d.subscribe(POLICY, Recorder(), **ROOMY)
    d.subscribe(TRACEFLOW, Recorder(), **ROOMY)  # another category is fine


def test_queue_size_must_be_positive():
    with pytest.raises(ValueError):
        Demux().subscribe(POLICY, Recorder(), rate=1, burst=1, queue_size=0, now=0.0)


def test_stop_drain_delivers_everything_queued():
    async def main(drain: bool):
        policy, trace, d = Recorder(), Recorder(), Demux()
        d.subscribe(POLICY, policy, **ROOMY)
        d.subscribe(TRACEFLOW, trace, **ROOMY)
        d.start()
        d.dispatch([pin(i, category=i % 2) for i in range(1500)], now=0.0)
        await asyncio.sleep(0)  # let consumers run one slice, then stop mid-way
        await d.stop(drain=drain)
        return d, policy.seen, trace.seen

    d, policy, trace = asyncio.run(main(drain=True))
    assert policy == list(range(0, 1500, 2))
    assert trace == list(range(1, 1500, 2))
    assert d.queue_depths() == {POLICY: 0, TRACEFLOW: 0}
    assert_accounting(d)

    d, policy, trace = asyncio.run(main(drain=False))
    assert len(policy) + d.queue_depths()[POLICY] == 750
    assert d.queue_depths()[POLICY] > 0  # without drain, something is left behind


def test_stop_drain_without_start():
    async def main():
        rec, d = Recorder(), Demux()
        d.subscribe(POLICY, rec, **ROOMY)
        d.dispatch([pin(i, category=POLICY) for i in range(5)], now=0.0)
        await d.stop(drain=True)
        return rec.seen

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


def test_subscribing_while_running_starts_a_consumer():
    async def main():
        rec, d = Recorder(), Demux()
        d.start()
        d.subscribe(POLICY, rec, **ROOMY)
        d.dispatch([pin(1, category=POLICY)], now=0.0)
        await settle(d)
        seen = list(rec.seen)  # before stop, so stop's drain cannot be what delivered it
        await d.stop()
        return seen

    assert asyncio.run(main()) == [1]


# --- accounting identity ----------------------------------------------------------------

ROUTES = st.sampled_from([
    dict(category=POLICY), dict(category=TRACEFLOW), dict(reason=0), dict(reason=1),
    dict(reason=7), dict(category=9), dict(userdata=b"\x05junkjunk"),
])


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(
        st.tuples(st.lists(ROUTES, max_size=12), st.floats(0.0, 0.5), st.booleans()),
        max_size=12,
    ),
    failing=st.frozensets(st.integers(0, 150), max_size=10),
    policy_queue=st.integers(1, 6),
)
def test_accounting_identity(batches, failing, policy_queue):
    async def main():
        policy, trace, d = Recorder(failing), Recorder(failing), Demux()
        d.subscribe(POLICY, policy, rate=5, burst=4, queue_size=policy_queue, now=0.0)
        d.subscribe(TRACEFLOW, trace, rate=20, burst=2, queue_size=3, now=0.0)
        d.start()
        dispatched, now, seq = [], 0.0, 0
        for routes, dt, yield_after in batches:
            now += dt
            batch = []
            for route in routes:
                batch.append(pin(seq, **route))
                seq += 1
            d.dispatch(batch, now)
            dispatched += batch
            if yield_after:
                await asyncio.sleep(0)
        await d.stop(drain=True)
        return d, dispatched, policy.seen, trace.seen

    d, dispatched, policy, trace = asyncio.run(main())
    stats = d.stats()
    assert_accounting(d)
    # Every packet-in is received by one category or counted unroutable.
    assert sum(c[dm.RECEIVED] for c in stats.values()) + sum(d.unroutable.values()) == len(dispatched)
    for category, seen in ((POLICY, policy), (TRACEFLOW, trace)):
        counts = stats[category]
        # The handler saw exactly the delivered + failed packet-ins, in dispatch order,
        # and only ones of its own category.
        assert len(seen) == counts[dm.DELIVERED] + counts[dm.HANDLER_ERROR]
        assert seen == sorted(seen)
        assert all(dispatched[s].category == category for s in seen)
        assert counts[dm.HANDLER_ERROR] == len(set(seen) & failing)
    assert d.queue_depths() == {POLICY: 0, TRACEFLOW: 0}
