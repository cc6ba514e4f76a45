"""Fair admission between (rule, applied-to Pod) keys: meters.fair_share, its demux wiring and the key.

The clock is a number the test moves; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import pytest
from hypothesis import given, settings, strategies as st

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.l2 import Dot1Q, Ether  # noqa: E402

from meters.fair_share import ADMITTED, DROPPED_CATEGORY, DROPPED_FAIR_SHARE, FairShare  # noqa: E402
from packetin import demux as dm  # noqa: E402
from packetin.demux import Demux, FairShareSettings  # noqa: E402
from packetin.fair_key import applied_to_key, destination_address  # noqa: E402
from packetin.model import Category, PacketIn, Userdata  # noqa: E402

POLICY = int(Category.POLICY)


def share(**kw: float) -> FairShare:
    args = dict(rate=300.0, burst=300.0, key_rate=20.0, key_burst=40.0, max_keys=1000, now=0.0)
    args.update(kw)
    return FairShare(args.pop("rate"), args.pop("burst"), **args)  # type: ignore[arg-type]


def test_a_key_flooding_at_full_speed_does_not_starve_quiet_keys() -> None:
    fair = share()
    quiet_sent = quiet_admitted = flood_admitted = 0
    for ms in range(10_000):  # 10 s; the flood sends 20 packets every millisecond (20k/s)
        now = ms / 1000
        for _ in range(20):
            flood_admitted += fair.admit(("drop-flood", "pod-t"), now) == ADMITTED
        if ms % 250 == 0:  # five quiet keys, 4 packets/s each
            for q in range(5):
                quiet_sent += 1
                quiet_admitted += fair.admit((f"rule-{q}", f"pod-{q}"), now) == ADMITTED
    assert quiet_admitted == quiet_sent == 200
    # The flood still has everything the quiet keys leave (work-conserving), never more than the category.
    budget = 300 + 300 * 10
    assert budget - quiet_sent - 300 <= flood_admitted <= budget - quiet_sent


def test_without_fair_shares_the_same_flood_starves_the_quiet_keys() -> None:
    """The plain category bucket (what admission was before): the check above is not vacuous."""
    from meters.token_bucket import TokenBucket

    bucket = TokenBucket(300.0, 300.0, 0.0)
    quiet_admitted = 0
    for ms in range(10_000):
        now = ms / 1000
        for _ in range(20):
            bucket.take(now)
        if ms % 250 == 0:
            quiet_admitted += sum(bucket.take(now) for _ in range(5))
    assert quiet_admitted < 20


def test_a_lone_key_gets_the_whole_category_rate() -> None:
    fair = share()
    admitted = sum(fair.admit("only", ms / 1000) == ADMITTED for ms in range(10_000) for _ in range(5))
    assert 300 * 10 <= admitted <= 300 + 300 * 10
    # All but its own share (burst 40, then 20/s) was borrowed; only the reserve stays unused.
    assert admitted - 40 - 20 * 10 <= fair.borrowed <= admitted - 40 - 20 * 10 + 1
    assert admitted >= 300 + 300 * 10 - fair.reserve - 1


def test_drops_say_whether_the_key_was_past_its_share_or_the_category_was_empty() -> None:
    fair = share(rate=10.0, burst=10.0, key_rate=1.0, key_burst=4.0)
    # A key past its share stops where the category is down to its reserve (half the burst).
    outcomes = [fair.admit("flood", 0.0) for _ in range(10)]
    assert outcomes[:4] == [ADMITTED] * 4  # its own share
    assert outcomes.count(ADMITTED) == 5  # and one borrowed: 10 - 4 = 6 tokens, reserve 5
    assert set(outcomes[5:]) == {DROPPED_FAIR_SHARE}
    # Keys within their share use the reserve; when it is gone too, that is the category's limit.
    others = [fair.admit(f"k{i}", 0.0) for i in range(7)]
    assert others == [ADMITTED] * 5 + [DROPPED_CATEGORY] * 2


def test_keys_are_kept_in_an_lru_and_evictions_are_counted() -> None:
    fair = share(max_keys=3)
    for key in ("a", "b", "c", "a", "d", "e"):  # "a" seen again: "b" and "c" are the oldest
        fair.admit(key, 0.0)
    assert len(fair) == 3 and fair.evicted == 2
    # An evicted key starts again with a full bucket (its share, not the category's excess).
    assert fair.admit("b", 0.0) == ADMITTED and fair.evicted == 3


@pytest.mark.parametrize("kw", [dict(max_keys=0), dict(key_rate=0.0), dict(key_burst=0.5), dict(reserve=300.0)])
def test_nonsense_settings_are_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        share(**kw)


# --- the demux -------------------------------------------------------------------------


def packet_in(rule_id: int, in_port: int, frame: bytes = b"") -> PacketIn:
    return PacketIn(reason=0, table_id=0, cookie=0, in_port=in_port, rule_id=rule_id, reg7=1,
                    userdata=Userdata(category=POLICY, flags=1, rule_id=rule_id).encode(), packet=frame,
                    total_len=len(frame), received_at=0.0)


def test_the_demux_admits_fairly_and_counts_every_packet_in_once() -> None:
    seen: list[int] = []

    async def run() -> Demux:
        demux = Demux()
        demux.subscribe(POLICY, lambda p: seen.append(p.in_port), rate=100.0, burst=100.0, queue_size=1000, now=0.0,
                        fair=FairShareSettings(lambda p: (p.rule_id, p.in_port), key_rate=5.0, key_burst=10.0,
                                               max_keys=100))
        demux.start()
        for t in range(100):  # 1 s: port 1 floods (50 per 10 ms), ports 2..6 send one each per 100 ms
            now = t / 100
            batch = [packet_in(9, 1) for _ in range(50)]
            if t % 10 == 0:
                batch[25:25] = [packet_in(9, port) for port in range(2, 7)]
            demux.dispatch(batch, now)
            await asyncio.sleep(0)
        await demux.wait_idle()
        await demux.stop()
        return demux

    demux = asyncio.run(run())
    counts = demux.stats()[POLICY]
    assert [seen.count(port) for port in range(2, 7)] == [10] * 5
    assert counts[dm.RECEIVED] == 5050
    assert counts[dm.RECEIVED] == counts[dm.DELIVERED] + counts[dm.DROPPED_FAIR] + counts[dm.DROPPED_RATE] \
        + counts[dm.DROPPED_QUEUE]
    assert counts[dm.DROPPED_FAIR] > 4000 and counts[dm.DROPPED_QUEUE] == 0
    assert demux.fair_share_stats()[POLICY].keys == 6


def test_a_full_channel_still_counts_as_queue_full_with_fair_shares() -> None:
    demux = Demux()
    demux.subscribe(POLICY, lambda p: None, rate=1e6, burst=1e6, queue_size=3, now=0.0,
                    fair=FairShareSettings(lambda p: p.in_port, key_rate=1e6, key_burst=1e6, max_keys=10))
    demux.dispatch([packet_in(1, i) for i in range(10)], 0.0)
    counts = demux.stats()[POLICY]
    assert (counts[dm.DROPPED_QUEUE], demux.queue_depths()[POLICY], demux.queue_fill(POLICY)) == (7, 3, 1.0)


# --- the key -------------------------------------------------------------------------------

MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}


def test_the_applied_to_pod_is_the_sender_for_egress_and_the_receiver_for_ingress() -> None:
    directions = {1: "egress", 2: "ingress"}
    asked: list[int] = []

    def direction_of(rule_id: int) -> str | None:
        asked.append(rule_id)
        return directions.get(rule_id)

    key = applied_to_key(direction_of)
    to_b = bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(dport=53))
    to_c = bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.3") / UDP(dport=53))
    # egress: the sender's port, whatever the destination
    assert key(packet_in(1, 7, to_b)) == key(packet_in(1, 7, to_c)) == (1, 7)
    # ingress: the destination address, whichever port sent it
    assert key(packet_in(2, 7, to_b)) == key(packet_in(2, 8, to_b)) == (2, bytes([10, 0, 0, 2]))
    assert key(packet_in(2, 7, to_c)) != key(packet_in(2, 7, to_b))
    # unknown rule: both, and asked again next time (it may be known by then)
    assert key(packet_in(3, 7, to_b)) == (3, 7, bytes([10, 0, 0, 2]))
    key(packet_in(3, 7, to_b))
    assert asked.count(1) == 1 and asked.count(2) == 1 and asked.count(3) == 2


def test_the_destination_address_is_read_through_vlan_tags_and_for_ipv6() -> None:
    v4 = bytes(Ether(**MAC) / Dot1Q(vlan=5) / Dot1Q(vlan=6) / IP(src="10.0.0.1", dst="10.9.8.7") / UDP())
    v6 = bytes(Ether(**MAC) / IPv6(src="fd00::1", dst="fd00::2") / UDP())
    assert destination_address(v4) == bytes([10, 9, 8, 7])
    assert destination_address(v6) == ipaddress.IPv6Address("fd00::2").packed
    assert destination_address(b"\x00" * 12 + b"\x08\x06" + b"\x00" * 28) == b""  # ARP
    assert destination_address(b"") == b""


def test_fair_share_settings_are_checked_at_load_naming_the_field() -> None:
    from policy_agent.config.loader import ConfigError, loads

    config = loads("packetin:\n  fair_share: {key_rate: 5, key_burst: 10, max_keys: 100}\n", environ={})
    assert (config.packetin.fair_share.key_rate, config.packetin.fair_share.max_keys) == (5.0, 100)
    for bad, field in (("max_keys: 0", "max_keys"), ("key_rate: 0", "key_rate"), ("key_burst: 0.5", "key_burst")):
        with pytest.raises(ConfigError, match=rf"packetin\.fair_share\.{field}: must be"):
            loads(f"packetin:\n  fair_share: {{{bad}}}\n", environ={})


def _reference_admit(fs: FairShare, key: int, now: float) -> int:
    """FairShare.admit as it was before admit_read (one key at a time), kept here as the model."""
    keys = fs._keys
    own = keys.get(key)
    if own is None:
        if len(keys) >= fs.max_keys:
            keys.popitem(last=False)
            fs.evicted += 1
        own = keys[key] = [fs.key_burst, now]
    else:
        keys.move_to_end(key)
        elapsed = now - own[1]
        if elapsed > 0:
            tokens = own[0] + elapsed * fs.key_rate
            own[0] = tokens if tokens < fs.key_burst else fs.key_burst
            own[1] = now
    category = fs._tokens
    elapsed = now - fs._last
    if elapsed > 0:
        category += elapsed * fs.rate
        if category > fs.burst:
            category = fs.burst
        fs._tokens = category
        fs._last = now
    if own[0] >= 1:
        if category >= 1:
            fs._tokens = category - 1
            own[0] -= 1
            return ADMITTED
        return DROPPED_CATEGORY
    if category >= fs.reserve + 1:
        fs._tokens = category - 1
        fs.borrowed += 1
        return ADMITTED
    return DROPPED_FAIR_SHARE


def _admit_one_by_one(fs: FairShare, keys: list[int], now: float, room: int) -> tuple[list[int], int, int, int]:
    """What the demux did before admit_read: the old `admit` per key while the room lasts."""
    kept: list[int] = []
    judged = category_drops = fair_drops = 0
    for i, key in enumerate(keys):
        if room <= 0:
            break
        judged += 1
        outcome = _reference_admit(fs, key, now)
        if outcome == ADMITTED:
            kept.append(i)
            room -= 1
        elif outcome == DROPPED_CATEGORY:
            category_drops += 1
        else:
            fair_drops += 1
    return kept, judged, category_drops, fair_drops


def _state(fs: FairShare) -> tuple:
    return list(fs._keys.items()), fs._tokens, fs._last, fs.evicted, fs.borrowed, len(fs)


reads = st.lists(st.tuples(st.lists(st.integers(0, 6), max_size=40),  # the read's keys
                           st.floats(-0.05, 0.3),                      # clock step (backwards too)
                           st.integers(-1, 45)),                       # the channel's room
                 min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(reads=reads, rate=st.sampled_from([5.0, 50.0, 1e6]), burst=st.sampled_from([4.0, 30.0]),
       key_rate=st.sampled_from([1.0, 20.0]), key_burst=st.sampled_from([1.0, 3.0]), max_keys=st.integers(1, 8),
       reserve=st.sampled_from([None, 0.0, 2.5]))
def test_a_whole_read_is_admitted_as_one_by_one_admission_would(reads, rate, burst, key_rate, key_burst, max_keys,
                                                                 reserve) -> None:
    batch = FairShare(rate, burst, key_rate=key_rate, key_burst=key_burst, max_keys=max_keys, now=0.0,
                      reserve=reserve)
    single = FairShare(rate, burst, key_rate=key_rate, key_burst=key_burst, max_keys=max_keys, now=0.0,
                       reserve=reserve)
    now = 0.0
    for keys, step, room in reads:
        now += step
        assert batch.admit_read(iter(keys), now, room) == _admit_one_by_one(single, keys, now, room)
        assert _state(batch) == _state(single)


one_key_reads = st.lists(st.tuples(st.integers(0, 3),                        # the read's one key
                                   st.integers(1, 400),                      # how many packet-ins it brings (a
                                                                             # short read: key by key)
                                   st.floats(-0.05, 0.5),                    # clock step (backwards too)
                                   st.integers(-1, 450)),                    # the channel's room
                         min_size=1, max_size=25)


@settings(max_examples=400, deadline=None)
@given(reads=one_key_reads, rate=st.sampled_from([3.0, 77.7, 1e6]), burst=st.sampled_from([4.0, 30.5, 250.0]),
       key_rate=st.sampled_from([0.3, 20.0, 333.3]), key_burst=st.sampled_from([1.0, 2.75, 120.0]),
       max_keys=st.integers(1, 3), reserve=st.sampled_from([None, 0.0, 2.5, 0.1]))
def test_a_read_of_one_key_judged_at_once_is_judged_as_one_by_one(reads, rate, burst, key_rate, key_burst, max_keys,
                                                                   reserve) -> None:
    """A flood's read (a list of one key) takes _judge_run's one step: the same indexes, drops by reason,
    buckets, LRU and counters as the reference one key at a time, through every phase (within the share,
    the category empty, borrowing down to the reserve, fair-share drops, the room running out)."""
    from meters import fair_share

    judged_at_once = 0
    real = fair_share._judge_run

    def counted(*args):  # type: ignore[no-untyped-def]
        nonlocal judged_at_once
        judged_at_once += 1
        return real(*args)

    batch = FairShare(rate, burst, key_rate=key_rate, key_burst=key_burst, max_keys=max_keys, now=0.0,
                      reserve=reserve)
    single = FairShare(rate, burst, key_rate=key_rate, key_burst=key_burst, max_keys=max_keys, now=0.0,
                       reserve=reserve)
    now, expected_runs = 0.0, 0
    fair_share._judge_run = counted
    try:
        for key, n, step, room, in reads:
            now += step
            one = (key, "pod")  # one object, as the C keys give a run
            expected_runs += room > 0 and n >= fair_share._RUN_MIN
            assert batch.admit_read([one] * n, now, room) == _admit_one_by_one(single, [(key, "pod")] * n, now, room)
            assert _state(batch) == _state(single)
    finally:
        fair_share._judge_run = real
    assert judged_at_once == expected_runs  # every read with room took the one step


def test_a_read_of_one_key_steps_through_each_phase_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worked by hand: 3 tokens of the key's own, 10 in the category, reserve 4 (a key past its share borrows
    while the category holds reserve + 1 = 5 or more). Reads this short are judged at once here."""
    from meters import fair_share
    monkeypatch.setattr(fair_share, "_RUN_MIN", 1)
    fs = FairShare(1.0, 10.0, key_rate=1.0, key_burst=3.0, max_keys=4, now=0.0, reserve=4.0)
    key = (7, "pod")
    # 3 within the share (10 -> 7), 3 borrowed (at 7, 6 and 5: 5 -> 4), then the category is down to its
    # reserve: 3 fair drops.
    assert fs.admit_read([key] * 9, 0.0, 100) == ([0, 1, 2, 3, 4, 5], 9, 0, 3)
    assert fs._tokens == 4.0 and fs._keys[key][0] == 0.0 and fs.borrowed == 3
    # The room runs out after 2: the rest are not judged.
    fs2 = FairShare(1.0, 10.0, key_rate=1.0, key_burst=3.0, max_keys=4, now=0.0, reserve=4.0)
    assert fs2.admit_read([key] * 9, 0.0, 2) == ([0, 1], 2, 0, 0)
    # The category empties first, the key still within its share: category drops, nothing taken from the key.
    fs3 = FairShare(1.0, 2.0, key_rate=1.0, key_burst=3.0, max_keys=4, now=0.0, reserve=0.5)
    assert fs3.admit_read([key] * 5, 0.0, 100) == ([0, 1], 5, 3, 0)
    assert fs3._keys[key][0] == 1.0


def test_a_read_of_one_key_borrows_as_many_as_one_by_one_where_the_guess_rounds() -> None:
    """6.3 - 1.3 is 5.0 in floats, which would allow 6 borrowed packet-ins; one at a time the sixth finds
    6.3 - 5 = 1.2999999999999998 < 1.3 left and is dropped. The one step borrows 5, as one by one does."""
    from meters import fair_share
    assert 20 >= fair_share._RUN_MIN  # judged at once
    def twin() -> FairShare:
        fs = FairShare(1.0, 10.0, key_rate=1.0, key_burst=1.0, max_keys=4, now=0.0, reserve=0.3)
        fs._tokens = 7.3  # the key's one token takes it to 6.3
        return fs

    batch, single = twin(), twin()
    key = (1, "pod")
    out = batch.admit_read([key] * 20, 0.0, 100)
    assert out == _admit_one_by_one(single, [key] * 20, 0.0, 100)
    assert out == (list(range(6)), 20, 0, 14) and batch.borrowed == 5
    assert _state(batch) == _state(single)


def test_a_short_read_of_one_key_is_judged_key_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below _RUN_MIN keys (a lone packet-in's read above all) the one step would cost more than it saves."""
    from meters import fair_share

    def must_not_run(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("a short read was judged as a run")

    monkeypatch.setattr(fair_share, "_judge_run", must_not_run)
    fs = FairShare(10.0, 10.0, key_rate=1.0, key_burst=3.0, max_keys=4, now=0.0)
    assert fs.admit_read([(1, "pod")] * (fair_share._RUN_MIN - 1), 0.0, 100)[1] == fair_share._RUN_MIN - 1
    assert fs.admit_read([(1, "pod")], 0.0, 100)[1] == 1
