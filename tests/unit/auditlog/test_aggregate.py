"""auditlog.aggregate.Aggregator and its C twin (auditlog._record_fast.Aggregator, what record_fast.aggregator()
gives the agent): windows, exact counts, offloaded folding, eviction, with an explicit clock. Every test runs on
both classes; a state machine runs them side by side on random calls and wants the same emissions and counts."""

from __future__ import annotations

import gc
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from auditlog import record_fast
from auditlog.aggregate import Aggregation, Aggregator, Emission


def _c_class() -> Callable[..., Aggregation]:
    assert record_fast.built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"
    return record_fast._FastAggregator


Make = Callable[..., Aggregation]
IMPLEMENTATIONS: dict[str, Callable[[], Make]] = {"python": lambda: Aggregator, "c": _c_class}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> Make:
    """The class under test: Python's, then C's."""
    return IMPLEMENTATIONS[request.param]()


DROP_A = (7, 1, "ingress", "10.0.0.1", "10.0.0.2", 6, 80)
DROP_B = (7, 1, "ingress", "10.0.0.3", "10.0.0.2", 6, 80)
ALLOW = (9, 0, "egress", "10.0.0.1", "10.0.0.9", 17, 53)


def conserved(agg: Aggregation) -> bool:
    s = agg.stats
    return s["packets_in"] == s["packets_out"] + agg.packets_held()


def test_first_packet_at_once_then_one_aggregate_at_window_close(impl: Make) -> None:
    agg = impl(window=1.0)
    [first] = agg.add(DROP_A, "p0", 100, 10.0, True)
    assert first == Emission(DROP_A, "p0", 1, 100, 10.0, 10.0, 0, 0, "first")
    assert agg.add(DROP_A, "p1", 200, 10.25, True) == []
    assert agg.add(DROP_A, "p2", 300, 10.5, True) == []
    assert agg.packets_held() == 2
    assert agg.next_deadline() == 11.0
    assert agg.tick(10.999) == []
    [agg_rec] = agg.tick(11.0)
    # The aggregate stands for p1 and p2 only: p0 already has its own record.
    assert agg_rec == Emission(DROP_A, "p1", 2, 500, 10.25, 10.5, 0, 0, "aggregate")
    assert agg.packets_held() == 0 and agg.next_deadline() is None
    assert agg.stats["records_out"] == 2 and agg.stats["packets_out"] == 3 and conserved(agg)


def test_packet_at_window_end_belongs_to_a_new_window(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "p0", 1, 0.0, True)
    agg.add(DROP_A, "p1", 1, 0.5, True)
    # No tick in between: add itself closes the stale window before opening the next.
    out = agg.add(DROP_A, "p2", 1, 1.0, True)
    assert [(e.kind, e.packets, e.sample) for e in out] == [("aggregate", 1, "p1"), ("first", 1, "p2")]
    assert agg.next_deadline() == 2.0


def test_burst_of_1000_one_key_is_exactly_two_records(impl: Make) -> None:
    agg = impl(window=1.0)
    out: list[Emission] = []
    for i in range(1000):
        out += agg.add(DROP_A, i, 64, 5.0 + i * 0.0005, True)
    out += agg.tick(6.0)
    assert [e.kind for e in out] == ["first", "aggregate"]
    assert sum(e.packets for e in out) == 1000
    assert sum(e.bytes for e in out) == 64_000
    assert out[1].first == pytest.approx(5.0005) and out[1].last == pytest.approx(5.0 + 999 * 0.0005)


def test_empty_window_closes_silently_and_next_packet_is_first_again(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "p0", 1, 0.0, True)
    assert agg.tick(1.0) == []
    assert agg.next_deadline() is None
    assert [e.kind for e in agg.add(DROP_A, "p1", 1, 1.5, True)] == ["first"]


def test_many_keys_interleaved_keep_separate_exact_counts(impl: Make) -> None:
    agg = impl(window=1.0)
    keys = [(1, 1, "ingress", f"10.0.1.{i}", "10.0.0.2", 6, 443) for i in range(50)]
    out: list[Emission] = []
    t = 0.0
    for rnd in range(20):
        for k in keys:
            out += agg.add(k, (k, rnd), 10, t, True)
            t += 0.0005
    out += agg.tick(t + 1.0)
    assert len(out) == 100  # one first + one aggregate per key
    per_key: dict[object, list[Emission]] = defaultdict(list)
    for e in out:
        per_key[e.key].append(e)
    for k in keys:
        first, rest = per_key[k]
        assert (first.kind, first.packets, rest.kind, rest.packets, rest.bytes) == ("first", 1, "aggregate", 19, 190)
        assert rest.sample == (k, 1)
    assert conserved(agg)


def test_allow_is_immediate_and_never_held(impl: Make) -> None:
    agg = impl(window=1.0)
    for i in range(3):
        [e] = agg.add(ALLOW, i, 60, float(i) / 10, False)
        assert (e.kind, e.packets, e.bytes, e.sample) == ("immediate", 1, 60, i)
    assert agg.packets_held() == 0 and agg.next_deadline() is None
    assert agg.stats["records_out"] == 3


def test_window_zero_disables_aggregation(impl: Make) -> None:
    agg = impl(window=0)
    out = [e for i in range(5) for e in agg.add(DROP_A, i, 10, 1.0, True)]
    assert [(e.kind, e.packets) for e in out] == [("immediate", 1)] * 5
    [off] = agg.add_offloaded(DROP_A, 40, 4000, 1.0, sample="s")
    assert (off.kind, off.packets, off.offloaded_packets, off.offloaded_bytes) == ("aggregate", 0, 40, 4000)
    assert agg.next_deadline() is None and agg.packets_held() == 0 and agg.tick(9.0) == []


def test_offloaded_counts_fold_into_the_open_window(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "p0", 100, 0.0, True)
    agg.add(DROP_A, "p1", 100, 0.2, True)
    assert agg.add_offloaded(DROP_A, 5000, 500_000, 0.6) == []
    [e] = agg.tick(1.0)
    assert (e.packets, e.bytes, e.offloaded_packets, e.offloaded_bytes) == (1, 100, 5000, 500_000)
    assert (e.first, e.last, e.sample) == (0.2, 0.6, "p1")


def test_offloaded_only_in_a_window_opened_by_a_packet_uses_that_packets_sample(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "p0", 100, 0.0, True)
    agg.add_offloaded(DROP_A, 7, 700, 0.5)
    [e] = agg.tick(1.0)
    assert (e.kind, e.packets, e.offloaded_packets, e.sample, e.first, e.last) == ("aggregate", 0, 7, "p0", 0.5, 0.5)


def test_offloaded_without_ovs_packets_opens_a_window_of_its_own(impl: Make) -> None:
    agg = impl(window=1.0)
    assert agg.add_offloaded(DROP_A, 300, 30_000, 4.0, sample="cached") == []
    assert agg.add_offloaded(DROP_A, 0, 0, 4.1) == []  # a counter that did not move
    assert agg.add_offloaded(DROP_A, 20, 2000, 4.5) == []
    assert agg.next_deadline() == 5.0 and agg.packets_held() == 0
    [e] = agg.tick(5.0)
    assert e == Emission(DROP_A, "cached", 0, 0, 4.0, 4.5, 320, 32_000, "aggregate")
    assert agg.stats["offloaded_packets_in"] == agg.stats["offloaded_packets_out"] == 320


def test_packet_in_a_window_opened_by_offload_is_still_written_at_once(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add_offloaded(DROP_A, 3, 300, 0.0)
    [first] = agg.add(DROP_A, "p0", 100, 0.3, True)
    assert (first.kind, first.packets) == ("first", 1)
    agg.add(DROP_A, "p1", 100, 0.4, True)
    [e] = agg.tick(1.0)
    assert (e.packets, e.offloaded_packets, e.sample, e.first, e.last) == (1, 3, "p1", 0.0, 0.4)


def test_negative_offloaded_counts_are_refused(impl: Make) -> None:
    with pytest.raises(ValueError, match="offloaded"):
        impl().add_offloaded(DROP_A, -1, 0, 0.0)


def test_eviction_at_max_keys_writes_the_soonest_window_early_and_keeps_counts(impl: Make) -> None:
    agg = impl(window=1.0, max_keys=2)
    agg.add(DROP_A, "a0", 1, 0.0, True)
    agg.add(DROP_A, "a1", 1, 0.1, True)
    agg.add(DROP_B, "b0", 1, 0.2, True)
    agg.add(DROP_B, "b1", 1, 0.3, True)
    third = (7, 1, "ingress", "10.0.0.4", "10.0.0.2", 6, 80)
    out = agg.add(third, "c0", 1, 0.4, True)
    assert [(e.key, e.kind, e.packets) for e in out] == [(DROP_A, "aggregate", 1), (third, "first", 1)]
    assert agg.stats["evicted_early"] == 1 and agg.stats["open_windows"] == 2
    assert agg.next_deadline() == pytest.approx(1.2)
    # DROP_A's window is gone: its next packet is a "first" again (and evicts DROP_B).
    out = agg.add(DROP_A, "a2", 1, 0.5, True)
    assert [(e.key, e.kind) for e in out] == [(DROP_B, "aggregate"), (DROP_A, "first")]
    assert conserved(agg)
    assert agg.flush(0.6) == []  # both open windows hold only their "first"
    assert agg.stats["packets_out"] == agg.stats["packets_in"] == 6


def test_expired_windows_are_closed_before_anything_is_evicted(impl: Make) -> None:
    agg = impl(window=1.0, max_keys=1)
    agg.add(DROP_A, "a0", 1, 0.0, True)
    agg.add(DROP_A, "a1", 1, 0.5, True)
    out = agg.add(DROP_B, "b0", 1, 2.0, True)  # DROP_A's window closed at 1.0
    assert [(e.key, e.kind) for e in out] == [(DROP_A, "aggregate"), (DROP_B, "first")]
    assert agg.stats["evicted_early"] == 0


def test_flush_writes_everything_held(impl: Make) -> None:
    agg = impl(window=10.0)
    for i in range(4):
        agg.add(DROP_A, i, 1, float(i), True)
        agg.add(DROP_B, i, 2, float(i), True)
    agg.add_offloaded((0, 1, "x"), 9, 90, 3.5)
    out = agg.flush(4.0)
    assert sorted((e.key, e.packets, e.offloaded_packets) for e in out) == sorted(
        [(DROP_A, 3, 0), (DROP_B, 3, 0), ((0, 1, "x"), 0, 9)])
    assert agg.packets_held() == 0 and agg.offloaded_held() == 0 and agg.next_deadline() is None
    assert agg.flush(5.0) == []
    assert conserved(agg)


def test_next_deadline_follows_the_soonest_open_window(impl: Make) -> None:
    agg = impl(window=2.0)
    assert agg.next_deadline() is None
    agg.add(DROP_A, "a", 1, 1.0, True)
    agg.add(DROP_B, "b", 1, 1.5, True)
    assert agg.next_deadline() == 3.0
    agg.tick(3.0)
    assert agg.next_deadline() == 3.5
    agg.tick(3.5)
    assert agg.next_deadline() is None


def test_small_clock_jitter_is_clamped(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "a0", 1, 10.0, True)
    agg.add(DROP_A, "a1", 1, 10.4, True)
    agg.add(DROP_A, "a2", 1, 10.3, True)  # stamped a little earlier by another clock
    [e] = agg.tick(11.0)
    assert (e.packets, e.first, e.last) == (2, 10.4, 10.4)
    assert agg.stats["clock_steps"] == 0


def test_clock_stepped_back_closes_old_windows_at_once(impl: Make) -> None:
    agg = impl(window=1.0)
    agg.add(DROP_A, "a0", 1, 1000.0, True)
    agg.add(DROP_A, "a1", 1, 1000.5, True)
    agg.add(DROP_B, "b0", 1, 1000.6, True)
    out = agg.add(DROP_B, "b1", 1, 400.0, True)  # wall clock reset by 10 minutes
    assert [(e.key, e.kind, e.packets) for e in out] == [(DROP_A, "aggregate", 1), (DROP_B, "first", 1)]
    assert agg.next_deadline() == 401.0 and agg.stats["clock_steps"] == 1
    assert conserved(agg)


def test_bad_configuration_is_refused(impl: Make) -> None:
    with pytest.raises(ValueError, match="window"):
        impl(window=-1)
    with pytest.raises(ValueError, match="window"):
        impl(window=float("nan"))
    with pytest.raises(ValueError, match="max_keys"):
        impl(max_keys=0)


# --- state machine: random add / add_offloaded / tick / flush, non-decreasing times ------------

N_KEYS = 4
# Skewed towards key 0 and small steps, so that long runs within one window are common.
KEYS = st.one_of(st.just(0), st.integers(0, N_KEYS - 1))


class AggregatorMachine(RuleBasedStateMachine):
    """Samples are (key, seq, t): each packet's per-key sequence number lets every record be
    checked against exactly the packets it claims to stand for."""

    implementation = "python"

    @initialize(window=st.sampled_from([0.0, 0.5, 1.0, 2.5]), max_keys=st.integers(1, N_KEYS + 1))
    def setup(self, window: float, max_keys: int) -> None:
        self.window = window
        self.agg = IMPLEMENTATIONS[self.implementation]()(window=window, max_keys=max_keys)
        self.now = 0.0
        self.added = 0
        self.offloaded = 0
        self.times: dict[object, list[float]] = defaultdict(list)  # key -> time of packet seq
        self.sizes: dict[object, list[int]] = defaultdict(list)
        self.covered: dict[object, set[int]] = defaultdict(set)
        self.first_seen: dict[tuple[object, int], int] = {}  # (key, seq) of a "first" -> its position
        self.emitted: list[Emission] = []

    def take(self, out: list[Emission]) -> None:
        for e in out:
            pos = len(self.emitted)
            self.emitted.append(e)
            assert e.packets >= 0 and e.bytes >= 0 and e.offloaded_packets >= 0
            assert e.first <= e.last
            if e.kind != "aggregate":
                assert e.packets == 1
            assert e.offloaded_bytes == 100 * e.offloaded_packets
            if e.packets == 0:
                assert e.kind == "aggregate" and e.offloaded_packets > 0 and e.bytes == 0
                continue
            key, seq, _t = e.sample
            assert key == e.key
            assert e.bytes == sum(self.sizes[key][seq: seq + e.packets])
            run = range(seq, seq + e.packets)
            assert self.covered[key].isdisjoint(run), "a packet in two records"
            self.covered[key].update(run)
            if e.kind == "first":
                self.first_seen[(key, seq)] = pos
            if e.kind == "aggregate":
                # Its window was opened by (or announced with) the packet just before the run.
                assert (key, seq - 1) in self.first_seen, "aggregate without a first"
                assert self.first_seen[(key, seq - 1)] < pos
                start = self.times[key][seq - 1]
                ts = self.times[key][seq: seq + e.packets]
                assert all(start <= t < start + self.window for t in ts), "packet from outside the window"
                assert e.first <= ts[0] and e.last >= ts[-1] and e.last - e.first < self.window
                assert e.first >= start - self.window  # offloaded counts folded before that first

    @rule(dt=st.sampled_from([0.0, 0.0, 0.0, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5]), k=KEYS,
          size=st.integers(0, 1500), allow=st.booleans())
    def add(self, dt: float, k: int, size: int, allow: bool) -> None:
        self.now += dt
        key = ("allow", k) if allow else ("drop", k)
        seq = len(self.times[key])
        self.times[key].append(self.now)
        self.sizes[key].append(size)
        self.added += 1
        self.take(self.agg.add(key, (key, seq, self.now), size, self.now, not allow))

    @rule(dt=st.sampled_from([0.0, 0.2, 0.7]), k=KEYS, packets=st.integers(0, 50))
    def add_offloaded(self, dt: float, k: int, packets: int) -> None:
        self.now += dt
        self.offloaded += packets
        self.take(self.agg.add_offloaded(("drop", k), packets, packets * 100, self.now))

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.take(self.agg.tick(self.now))
        deadline = self.agg.next_deadline()
        assert deadline is None or deadline > self.now

    @precondition(lambda self: self.added > 0)
    @rule(dt=st.sampled_from([0.0, 0.5]))
    def flush(self, dt: float) -> None:
        self.now += dt
        self.take(self.agg.flush(self.now))
        assert self.agg.packets_held() == 0 and self.agg.offloaded_held() == 0
        assert self.agg.next_deadline() is None
        self.check_every_packet_in_one_record()

    def check_every_packet_in_one_record(self) -> None:
        for key, times in self.times.items():
            assert self.covered[key] == set(range(len(times)))

    @invariant()
    def counts_are_exact(self) -> None:
        if not hasattr(self, "agg"):
            return
        s = self.agg.stats
        out = sum(e.packets for e in self.emitted)
        assert out == s["packets_out"]
        assert out + self.agg.packets_held() == self.added == s["packets_in"]
        off = sum(e.offloaded_packets for e in self.emitted)
        assert off + self.agg.offloaded_held() == self.offloaded
        assert s["records_out"] == len(self.emitted)

    def teardown(self) -> None:
        if hasattr(self, "agg"):
            self.take(self.agg.flush(self.now))
            assert self.agg.packets_held() == 0
            self.check_every_packet_in_one_record()


class CAggregatorMachine(AggregatorMachine):
    implementation = "c"


TestAggregatorMachine = AggregatorMachine.TestCase
TestAggregatorMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestCAggregatorMachine = CAggregatorMachine.TestCase
TestCAggregatorMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# --- side by side: the same calls to both classes, the same answers -------------------------------

class SideBySide(RuleBasedStateMachine):
    """Every call goes to Python's Aggregator and to C's, with the same objects; each answer, counter and
    deadline must be the same, emission for emission and sample for sample (the very object). The clock
    also jitters back (clamped) and steps back (every window closes), and add_many is called, which
    the machine above does not do."""

    @initialize(window=st.sampled_from([0.0, 0.5, 1.0, 2.5]), max_keys=st.integers(1, N_KEYS + 1))
    def setup(self, window: float, max_keys: int) -> None:
        self.py: Any = Aggregator(window=window, max_keys=max_keys)
        self.c: Any = _c_class()(window=window, max_keys=max_keys)
        self.now = 100.0
        self.samples = 0

    def sample(self) -> tuple[str, int]:
        self.samples += 1
        return ("sample", self.samples)

    def same(self, call: Callable[[Any], Any]) -> None:
        a, b = call(self.py), call(self.c)
        assert a == b
        if isinstance(a, list):
            assert [type(e) for e in a] == [type(e) for e in b] == [Emission] * len(a)
            assert all(x.sample is y.sample and x.key is y.key for x, y in zip(a, b))

    @rule(dt=st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0, 2.5, -0.2, -0.01, -5.0]), k=KEYS,
          size=st.integers(0, 1500), aggregate=st.booleans())
    def add(self, dt: float, k: int, size: int, aggregate: bool) -> None:
        self.now += dt
        key, sample, now = ("k", k), self.sample(), self.now
        self.same(lambda agg: agg.add(key, sample, size, now, aggregate))

    @rule(dt=st.sampled_from([0.0, 0.3, -0.1, -4.0]), k=KEYS, count=st.integers(0, 40), size=st.integers(0, 1500),
          with_second=st.booleans())
    def add_many(self, dt: float, k: int, count: int, size: int, with_second: bool) -> None:
        self.now += dt
        key, sample, second_sample, now = ("k", k), self.sample(), self.sample(), self.now
        second = (lambda: second_sample) if with_second else None
        self.same(lambda agg: agg.add_many(key, sample, count, size, now, second))

    @rule(dt=st.sampled_from([0.0, 0.2, 0.7, -0.1]), k=KEYS, packets=st.integers(0, 50),
          with_sample=st.booleans())
    def add_offloaded(self, dt: float, k: int, packets: int, with_sample: bool) -> None:
        self.now += dt
        key, now = ("k", k), self.now
        sample = self.sample() if with_sample else None
        self.same(lambda agg: agg.add_offloaded(key, packets, packets * 100, now, sample))

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0, -0.3, -6.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        now = self.now
        self.same(lambda agg: agg.tick(now))

    @rule(dt=st.sampled_from([0.0, 0.5]))
    def flush(self, dt: float) -> None:
        self.now += dt
        now = self.now
        self.same(lambda agg: agg.flush(now))

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "py"):
            for look in (lambda agg: agg.stats, lambda agg: agg.packets_held(), lambda agg: agg.offloaded_held(),
                         lambda agg: agg.next_deadline(), lambda agg: agg.snapshot(), lambda agg: agg.window):
                self.same(look)


TestSideBySide = SideBySide.TestCase
TestSideBySide.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


# --- C only: references and the cycle collector ------------------------------------------------------

def test_c_aggregator_lets_go_of_every_sample_and_key() -> None:
    """What the C class holds it gives back: after a flood, a flush and the emissions let go, every
    sample and key is referenced as before it started (a missing decref would show as a count too high)."""
    agg = _c_class()(window=1.0, max_keys=8)
    samples = [object() for _ in range(3)]
    keys = [("k", i) for i in range(20)]
    before = [sys.getrefcount(x) for x in samples + keys]
    out: list[Emission] = []
    for i in range(2000):
        now = 10.0 + i * 0.01
        out += agg.add(keys[i % 20], samples[i % 3], 60, now, True)
        out += agg.add_many(keys[i % 7], samples[(i + 1) % 3], 3, 60, now, lambda: samples[2])
        out += agg.add_offloaded(keys[i % 5], 2, 120, now, samples[0])
        if i % 50 == 0:
            out += agg.tick(now)
    out += agg.flush(40.0)
    assert agg.packets_held() == 0 and agg.offloaded_held() == 0 and agg.stats["open_windows"] == 0
    assert sum(e.packets for e in out) == agg.stats["packets_in"] == 2000 * 4
    del out
    assert [sys.getrefcount(x) for x in samples + keys] == before


def test_c_aggregator_in_a_cycle_is_collected() -> None:
    """A sample that refers back to the aggregator makes a cycle through the C object: the collector must see
    what its windows hold (tp_traverse) to free it."""
    import weakref

    class Box:
        agg: Any = None

    box = Box()
    box.agg = _c_class()(window=1.0)
    box.agg.add(("k", 1), box, 60, 1.0, True)  # the window holds the box, the box the aggregator
    gone = weakref.ref(box)
    del box
    gc.collect()
    assert gone() is None


def test_the_agent_aggregates_in_c_and_in_pure_python_under_the_switch(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from policy_agent.audit_trail import build_audit
    from policy_agent.config.loader import loads
    from policy_agent.policy.rules import RuleRegistry

    config = loads(f"audit:\n  path: {tmp_path / 'audit.jsonl'}\n  window: 2.5\n")

    def agents() -> Aggregation:
        pipeline, writer = build_audit(config, RuleRegistry(), lambda: None, lambda: 0.0, lambda: False)
        writer.close()
        return pipeline.aggregator

    fast = agents()
    assert isinstance(fast, _c_class()) and fast.window == 2.5
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert type(agents()) is Aggregator
    monkeypatch.setattr(record_fast, "_record_fast", None)  # a machine without the module
    monkeypatch.delenv(record_fast.PURE_PYTHON_ENV)
    assert type(agents()) is Aggregator and agents().window == 2.5
