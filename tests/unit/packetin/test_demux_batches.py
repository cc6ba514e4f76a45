"""Demux batches: a small read into an empty channel handled within `dispatch` (inline_max), and a
handler told where each batch starts and ends (begin_batch / end_batch), with every count kept."""

from __future__ import annotations

import asyncio

from packetin import demux as dm
from packetin.demux import Demux, FairShareSettings
from packetin.model import Category, PacketIn, Userdata

POLICY = int(Category.POLICY)
ROOMY = dict(rate=1e6, burst=1e6, queue_size=10_000, now=0.0)  # never limits


def pin(seq: int) -> PacketIn:
    return PacketIn(reason=0, table_id=0, cookie=0, in_port=1, rule_id=seq, reg7=0,
                    userdata=Userdata(category=POLICY, rule_id=seq).encode(), packet=b"", total_len=0,
                    received_at=0.0)


class BatchRecorder:
    """A handler that logs "begin", each packet-in's rule id, "end"; raises on `fail_on`."""

    def __init__(self, fail_on: frozenset[int] = frozenset()) -> None:
        self.log: list[object] = []
        self.fail_on = fail_on

    def __call__(self, p: PacketIn) -> None:
        self.log.append(p.rule_id)
        if p.rule_id in self.fail_on:
            raise RuntimeError(f"handler failed on {p.rule_id}")

    def begin_batch(self) -> None:
        self.log.append("begin")

    def end_batch(self) -> None:
        self.log.append("end")


def test_a_small_read_into_an_empty_channel_is_handled_within_dispatch_as_one_batch():
    async def main() -> tuple[list[object], list[object], dict[str, int]]:
        rec, d = BatchRecorder(fail_on=frozenset({2})), Demux(inline_max=4)
        d.subscribe(POLICY, rec, **ROOMY)
        d.start()
        d.dispatch([pin(1), pin(2), pin(3)], now=0.0)
        during = list(rec.log)  # before any other task ran
        await d.stop()
        return during, rec.log, d.stats()[POLICY]

    during, after, counts = asyncio.run(main())
    assert during == ["begin", 1, 2, 3, "end"]  # the failing packet-in stopped neither the batch nor its end
    assert after == during
    assert counts[dm.RECEIVED] == 3 and counts[dm.DELIVERED] == 2 and counts[dm.HANDLER_ERROR] == 1


def test_with_fair_shares_too_a_small_read_is_handled_within_dispatch_and_the_share_still_holds():
    """The agent's default: fair shares on. A lone packet-in (a quiet node) is handled within the read that
    brought it, without waiting for the consumer task's turn; what a key's share turns away is counted."""
    async def main() -> tuple[list[object], list[object], dict[str, int]]:
        rec, d = BatchRecorder(), Demux(inline_max=4)
        share = FairShareSettings(lambda p: p.rule_id % 2, key_rate=1.0, key_burst=2.0, max_keys=16)
        d.subscribe(POLICY, rec, rate=1.0, burst=4.0, queue_size=10_000, now=0.0, fair=share)
        d.start()
        d.dispatch([pin(1)], now=0.0)
        d.dispatch([pin(3), pin(5), pin(2)], now=0.0)  # key 1 is past its share of 2 at pin 5: turned away
        during = list(rec.log)  # before any other task ran
        await d.stop()
        return during, rec.log, d.stats()[POLICY]

    during, after, counts = asyncio.run(main())
    assert during == ["begin", 1, "end", "begin", 3, 2, "end"]
    assert after == during
    assert counts[dm.RECEIVED] == 4 and counts[dm.DELIVERED] == 3 and counts[dm.DROPPED_FAIR] == 1


def test_a_larger_read_or_a_backlog_goes_through_the_consumer_in_order():
    async def main() -> tuple[list[object], list[object]]:
        rec, d = BatchRecorder(), Demux(inline_max=2)
        d.subscribe(POLICY, rec, **ROOMY)
        d.start()
        d.dispatch([pin(1), pin(2), pin(3)], now=0.0)  # more than inline_max: queued
        d.dispatch([pin(4)], now=0.0)  # small, but the channel holds a backlog: queued behind it
        during = list(rec.log)
        while any(d.queue_depths().values()):
            await asyncio.sleep(0)
        await d.stop()
        return during, rec.log

    during, after = asyncio.run(main())
    assert during == []
    assert after == ["begin", 1, 2, 3, 4, "end"]


def test_without_inline_max_or_before_start_dispatch_only_queues():
    async def main() -> list[object]:
        rec, d = BatchRecorder(), Demux()
        d.subscribe(POLICY, rec, **ROOMY)
        d.dispatch([pin(1)], now=0.0)  # not started: nothing runs the handler
        d.start()
        d.dispatch([pin(2)], now=0.0)
        during = list(rec.log)
        await d.stop()
        return during

    assert asyncio.run(main()) == []
