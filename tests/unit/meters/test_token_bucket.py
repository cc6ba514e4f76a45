"""meters.token_bucket.TokenBucket: rate/burst semantics, every call given `now`."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meters.token_bucket import TokenBucket


def take_all(bucket: TokenBucket, now: float, limit: int = 10_000) -> int:
    """How many single tokens the bucket hands out at `now` before refusing."""
    n = 0
    while n < limit and bucket.take(now):
        n += 1
    return n


def test_starts_full_and_admits_exactly_burst_at_once():
    bucket = TokenBucket(rate=2, burst=5, now=100.0)
    assert bucket.tokens(100.0) == 5
    assert take_all(bucket, 100.0) == 5
    assert not bucket.take(100.0)
    assert bucket.tokens(100.0) == 0


def test_fractional_burst_admits_its_whole_part():
    assert take_all(TokenBucket(rate=1, burst=2.5, now=0.0), 0.0) == 2


def test_refills_at_rate():
    bucket = TokenBucket(rate=4, burst=10, now=0.0)
    take_all(bucket, 0.0)
    assert bucket.tokens(0.5) == pytest.approx(2.0)
    assert take_all(bucket, 0.5) == 2
    assert not bucket.take(0.625)  # half a token: not enough
    assert bucket.take(0.75)  # a whole token
    assert take_all(bucket, 1.75) == 4


def test_slow_rate_needs_the_whole_interval():
    bucket = TokenBucket(rate=0.5, burst=1, now=0.0)
    assert bucket.take(0.0)
    assert not bucket.take(1.9)
    assert bucket.take(2.0)


def test_never_refills_above_burst():
    bucket = TokenBucket(rate=1000, burst=3, now=0.0)
    take_all(bucket, 0.0)
    assert bucket.tokens(1e6) == 3
    assert take_all(bucket, 1e6) == 3


def test_idle_full_bucket_stays_at_burst():
    bucket = TokenBucket(rate=10, burst=3, now=0.0)
    assert bucket.tokens(50.0) == 3
    assert take_all(bucket, 50.0) == 3


def test_take_n_tokens_is_all_or_nothing():
    bucket = TokenBucket(rate=1, burst=5, now=0.0)
    assert bucket.take(0.0, n=3)
    assert not bucket.take(0.0, n=3)
    assert bucket.tokens(0.0) == 2
    assert bucket.take(0.0, n=2)


def test_tokens_does_not_consume():
    bucket = TokenBucket(rate=1, burst=2, now=0.0)
    for _ in range(3):
        assert bucket.tokens(0.0) == 2
    assert take_all(bucket, 0.0) == 2


def test_clock_going_backwards_adds_nothing():
    bucket = TokenBucket(rate=1, burst=5, now=100.0)
    take_all(bucket, 100.0)
    assert bucket.tokens(40.0) == 0
    assert not bucket.take(40.0)
    assert not bucket.take(99.0)
    # Refill resumes from the latest time seen, not from the backwards reading.
    assert take_all(bucket, 102.0) == 2


def test_clock_going_backwards_takes_nothing_away():
    bucket = TokenBucket(rate=1, burst=3, now=100.0)
    assert bucket.tokens(10.0) == 3
    assert take_all(bucket, 10.0) == 3


def test_backwards_clock_then_forward_does_not_double_count():
    bucket = TokenBucket(rate=1, burst=10, now=0.0)
    take_all(bucket, 0.0)
    assert take_all(bucket, 3.0) == 3
    assert take_all(bucket, 1.0) == 0
    assert take_all(bucket, 3.0) == 0  # 1.0 -> 3.0 was already counted
    assert take_all(bucket, 4.0) == 1


# NaN compares False to everything, so a check written as `rate <= 0` lets it
# through; a NaN rate would then refill to burst on every clock step.
@pytest.mark.parametrize("rate", [0, -1, -0.001, math.nan, math.inf])
def test_invalid_rate_raises(rate):
    with pytest.raises(ValueError):
        TokenBucket(rate=rate, burst=1, now=0.0)


@pytest.mark.parametrize("burst", [0, 0.5, -3, math.nan, math.inf])
def test_invalid_burst_raises(burst):
    with pytest.raises(ValueError):
        TokenBucket(rate=1, burst=burst, now=0.0)


# A non-decreasing clock: a start time and steps of 0 (same instant) or more.
steps = st.lists(
    st.one_of(st.just(0.0), st.floats(0.0, 5.0, allow_nan=False, allow_infinity=False)),
    min_size=1, max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    rate=st.floats(0.01, 50.0),
    burst=st.floats(1.0, 20.0),
    start=st.floats(-1e6, 1e6),
    deltas=steps,
    sizes=st.lists(st.sampled_from([1.0, 1.0, 2.0, 0.5]), min_size=120, max_size=120),
)
def test_admitted_in_any_window_is_bounded(rate, burst, start, deltas, sizes):
    bucket = TokenBucket(rate, burst, start)
    times, admitted, t = [], [], start
    for delta, n in zip(deltas, sizes):
        t += delta
        times.append(t)
        admitted.append(n if bucket.take(t, n) else 0.0)
        assert 0.0 <= bucket.tokens(t) <= burst
    # Tokens admitted by calls whose times lie in [t0, t1], for every window.
    for i in range(len(times)):
        total = 0.0
        for j in range(i, len(times)):
            total += admitted[j]
            bound = burst + rate * (times[j] - times[i])
            assert total <= bound + 1e-9 * max(1.0, bound), (i, j, total, bound)


@settings(max_examples=200, deadline=None)
@given(rate=st.floats(0.1, 100.0), burst=st.integers(1, 50), idle=st.floats(0.0, 1e3))
def test_a_burst_is_available_after_enough_idle_time(rate, burst, idle):
    bucket = TokenBucket(rate, burst, 0.0)
    assert take_all(bucket, 0.0) == burst
    later = burst / rate + idle + 1e-6  # margin for float rounding of burst/rate*rate
    assert take_all(bucket, later) == burst
