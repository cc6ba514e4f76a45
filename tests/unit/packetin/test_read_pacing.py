"""Read pacing: in a flood the stream reads in batches; a lone packet-in, and any reply the agent
waits for, is read at once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from packetin import connect
from packetin.read_pacing import (READ_BATCH, READ_BATCH_TCP, READ_BIG, READ_DELAY_MIN, READ_TRICKLE, ReadPacer,
                                  read_batch)
from tests.support.channel_rig import Rig, flow, rig, run, sock_path  # noqa: F401 (fixture)
from tests.support.clock import ManualClock
from tests.support.fake_switch import packet_in2
from tests.support.waiting import eventually


class Reads:
    """The reader's running packet-in count and the pacer asked after each read."""

    def __init__(self, batch: int = 64, delay_max: float = 0.02) -> None:
        self.count = 0
        self.clock = ManualClock(100.0)
        self.pacer = ReadPacer(lambda: self.count, batch=batch, delay_max=delay_max, mono_clock=self.clock)

    def read(self, packet_ins: int, nbytes: int, after: float = 0.0) -> float:
        self.clock.advance(after)
        self.count += packet_ins
        return self.pacer.after_read(nbytes)


def test_a_read_after_a_quiet_spell_is_never_followed_by_a_pause() -> None:
    r = Reads()
    assert r.read(1, 200) == 0.0  # the first read ever
    assert r.read(1, 200, after=0.5) == 0.0  # 17 pps: every packet-in read as it comes
    assert r.read(1, 200, after=0.021) == 0.0
    assert r.read(2, 400, after=0.041) == 0.0  # a trickle: each a longest pause apart or more
    assert r.pacer.paced_reads == 0


def test_a_flood_is_read_in_batches_sized_from_its_rate_and_capped() -> None:
    r = Reads()
    r.read(1, 200)
    assert r.read(1, 200, after=0.001) == 0.02  # 1k/s: 64 would take 64 ms, capped at 20
    assert r.read(20, 4000, after=0.02) == 0.02
    assert r.read(20, 4000, after=0.0215) == 0.02  # the pause and the read's own time: still a flood
    assert abs(r.read(100, 24_000, after=0.0025) - 0.0016) < 1e-9  # 40k/s: 64 take 1.6 ms
    assert abs(r.read(64, 15_000, after=0.0016) - 0.0016) < 1e-9
    assert r.pacer.paced_reads == 5


def test_a_trickle_is_read_as_it_comes_however_long_the_longest_pause() -> None:
    # The agent's default: pauses of up to 200 ms, yet packet-ins 20 ms apart or more are never paced.
    assert READ_TRICKLE == 0.02
    r = Reads(delay_max=0.2)
    assert r.read(1, 200) == 0.0
    assert r.read(1, 200, after=0.08) == 0.0  # 12.5 pps: closer than the longest pause, read at once
    assert r.read(1, 200, after=0.15) == 0.0
    assert r.read(1, 200, after=0.03) == 0.0
    assert r.read(1, 200, after=0.021) == 0.0  # 47 pps
    assert r.read(3, 600, after=0.061) == 0.0
    assert r.pacer.paced_reads == 0
    assert r.read(1, 200, after=0.019) == 0.2  # over 50 pps: a flood; 64 would take 1.2 s, capped at 200 ms
    assert abs(r.read(100, 24_000, after=0.1) - 0.064) < 1e-9  # 1k/s: 64 take 64 ms
    assert r.read(3, 600, after=0.064) == 0.0  # 3 in the 64 ms pause, 47 a second: a trickle again
    assert r.pacer.paced_reads == 2


def test_the_batch_a_pause_aims_for_depends_on_the_socket() -> None:
    assert read_batch("tcp:127.0.0.1:6653") == READ_BATCH_TCP == 256  # TCP buffers grow to megabytes
    assert read_batch("/run/openvswitch/br-int.npaudit") == read_batch("unix:/x.mgmt") == READ_BATCH == 64
    r = Reads(batch=READ_BATCH_TCP, delay_max=0.2)
    r.read(1, 200)
    assert r.read(200, 48_000, after=0.2) == 0.2  # 1k/s: 256 would take 256 ms, capped at 200
    assert abs(r.read(100, 24_000, after=0.01) - 0.0256) < 1e-9  # 10k/s: 256 take 25.6 ms
    assert r.read(511, 60_000, after=0.0256) > 0  # under twice the batch: still kept up with
    assert r.read(512, 60_000, after=0.0256) == 0.0  # twice the batch: near capacity, read at once


def test_reads_without_packet_ins_neither_start_nor_size_a_pause() -> None:
    r = Reads()
    r.read(1, 200)
    assert r.read(0, 40, after=0.001) == 0.0  # a barrier reply: no pause
    assert r.read(0, 40, after=0.001) == 0.0
    assert r.read(1, 200, after=0.001) == 0.02  # sized from the packet-in read 3 ms before
    assert r.pacer.paced_reads == 1


def test_a_big_read_or_a_tiny_pause_means_read_again_at_once() -> None:
    r = Reads()
    r.read(1, 200)
    assert r.read(400, READ_BIG, after=0.001) == 0.0  # behind: no pause
    assert r.read(128, 30_000, after=0.001) == 0.0  # twice the batch: near capacity, no pause
    assert r.read(64, 10_000, after=READ_DELAY_MIN / 100) == 0.0  # the pause would cost more than it saves
    assert r.pacer.paced_reads == 0


def _packet_in(i: int) -> bytes:
    return packet_in2(xid=i, packet=bytes([i]) * 60, rule_id=7, reg7=1, userdata=bytes([1, 0, 0, 0, 0, 0, 7]))


def test_the_stream_pauses_in_a_flood_and_delivers_every_packet_in(sock_path: str) -> None:  # noqa: F811
    async def main() -> None:
        # A pause of up to 0.5 s: longer than any scheduling hiccup, so the batches are known.
        async with rig(sock_path, read_pace_max=0.5, read_trickle=0.5) as r:
            r.fake.send(_packet_in(0))
            await eventually(lambda: len(r.packet_ins) == 1, 1.0, "the first packet-in, read at once")
            await asyncio.sleep(0.02)  # 1 packet-in in 20 ms: a pause of 64 * 20 ms, capped at 0.5 s
            r.fake.send(_packet_in(1))  # within the pause's reach of the first read: read, then pause
            await eventually(lambda: len(r.packet_ins) == 2, 1.0, "the second packet-in")
            paused_at = time.monotonic()
            for i in range(2, 12):
                r.fake.send(_packet_in(i))
                await asyncio.sleep(0.005)
            assert len(r.packet_ins) == 2  # nothing read during the pause
            await eventually(lambda: len(r.packet_ins) == 12, 2.0, "the paused packet-ins")
            assert time.monotonic() - paused_at >= 0.05  # they waited for the pause to end
            assert [len(b) for b in r.batches] == [1, 1, 10]  # one wake-up for the ten
            assert [p.packet[0] for p in r.packet_ins] == list(range(12))
    run(main())


def test_a_request_during_a_pause_is_answered_at_once(sock_path: str) -> None:  # noqa: F811
    async def main() -> None:
        # A pause far longer than the request is allowed to take (the rig's request_timeout is 2 s).
        async with rig(sock_path, read_pace_max=30.0, read_trickle=30.0) as r:
            r.fake.send(_packet_in(0))
            await eventually(lambda: len(r.packet_ins) == 1, 1.0, "the first packet-in")
            await asyncio.sleep(0.5)  # a pause of 64 * 0.5 s, capped at 30 s: far beyond the request's 2 s
            r.fake.send(_packet_in(1))
            await eventually(lambda: len(r.packet_ins) == 2, 1.0, "the second packet-in, then a pause")
            r.fake.send(_packet_in(2))  # waits in the socket during the pause
            await asyncio.sleep(0.05)
            assert len(r.packet_ins) == 2
            await r.chan.install_flows([flow(0, 10, 1, in_port=5)])  # the barrier reply is read now
            assert len(r.packet_ins) == 3  # and so is what came before it
    run(main())


def test_while_someone_waits_for_packet_ins_a_flood_is_read_as_it_comes(sock_path: str) -> None:  # noqa: F811
    """A trace waits for its packet's copies: in a flood they must not sit out a pause behind it (issue 11:
    traces under a flood), so while the channel's read_urgent says so no read is followed by a pause; once it
    no longer does, the flood is paced again."""
    async def main() -> None:
        # Pauses of up to 30 s: a packet-in that waits out one never arrives within the test's waits.
        async with rig(sock_path, read_pace_max=30.0, read_trickle=30.0) as r:
            waiting = [False]
            r.chan.read_urgent = lambda: waiting[0]
            r.fake.send(_packet_in(0))
            await eventually(lambda: len(r.packet_ins) == 1, 1.0, "the first packet-in")
            await asyncio.sleep(0.5)
            r.fake.send(_packet_in(1))
            await eventually(lambda: len(r.packet_ins) == 2, 1.0, "the second packet-in, then a pause")
            waiting[0] = True  # a trace begins: its flows go in (the barrier's reply ends the pause)
            await r.chan.install_flows([flow(0, 10, 1, in_port=5)])
            for i in (2, 3, 4):  # its copies, and the flood's packet-ins among them
                await asyncio.sleep(0.01)
                r.fake.send(_packet_in(i))
                await eventually(lambda: len(r.packet_ins) == i + 1, 1.0, f"packet-in {i}, read as it came")
            assert r.chan.paced_reads == 1 and r.chan.urgent_reads >= 2  # the reads a pause would have followed
            waiting[0] = False  # the trace is over: the flood is paced again
            r.fake.send(_packet_in(5))
            await eventually(lambda: len(r.packet_ins) == 6, 1.0, "packet-in 5, then a pause")
            r.fake.send(_packet_in(6))
            await asyncio.sleep(0.3)
            assert len(r.packet_ins) == 6 and r.chan.paced_reads == 2
            assert [p.packet[0] for p in r.packet_ins] == list(range(6))
    run(main())


def test_without_pacing_every_read_is_handed_over_as_it_comes(sock_path: str) -> None:  # noqa: F811
    async def main() -> None:
        async with rig(sock_path) as r:  # read_pace_max 0: the channel's default outside the agent
            for i in range(5):
                r.fake.send(_packet_in(i))
                await eventually(lambda: len(r.packet_ins) == i + 1, 1.0, f"packet-in {i}")
            assert [len(b) for b in r.batches] == [1] * 5
    run(main(), timeout=6.0)


class _Registrations:
    """Counts the stream's transport leaving and rejoining the event loop's poll set (epoll_ctl each)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.pauses = self.resumes = 0
        pause, resume = transport.pause_reading, transport.resume_reading

        def counted_pause() -> None:
            self.pauses += transport.is_reading()
            pause()

        def counted_resume() -> None:
            self.resumes += not transport.is_reading()
            resume()

        transport.pause_reading = counted_pause  # type: ignore[method-assign]
        transport.resume_reading = counted_resume  # type: ignore[method-assign]


def _transport(r: Rig) -> asyncio.Transport:
    proto = r.chan._proto
    assert proto is not None and proto.transport is not None
    return proto.transport


async def _lone_then_paced(r: Rig, paced_batches: int = 0) -> None:
    """Packet-in 0 (read at once), packet-in 1 20 ms later (read, then a pause: 64 * 20 ms, capped by the
    rig's read_pace_max), then `paced_batches` batches of 10 sent together, each read after a pause."""
    r.fake.send(_packet_in(0))
    await eventually(lambda: len(r.packet_ins) == 1, 1.0, "the first packet-in, read at once")
    await asyncio.sleep(0.02)
    r.fake.send(_packet_in(1))
    await eventually(lambda: len(r.packet_ins) == 2, 1.0, "the second packet-in, then a pause")
    for batch in range(paced_batches):
        for i in range(10):
            r.fake.send(_packet_in(2 + 10 * batch + i))
        await eventually(lambda: len(r.packet_ins) == 12 + 10 * batch, 2.0, f"paced batch {batch}")


def test_paced_reads_in_a_row_read_from_the_timer_and_leave_the_poll_set_once(sock_path: str) -> None:  # noqa: F811
    async def main() -> None:
        async with rig(sock_path, read_pace_max=0.2, read_trickle=0.2) as r:
            reg = _Registrations(_transport(r))
            await _lone_then_paced(r, paced_batches=2)  # two paced reads in a row after the first pause
            assert reg.pauses == 1  # the paced reads after the first came from the timer: no epoll_ctl between
            assert reg.resumes == 0
            await eventually(lambda: reg.resumes == 1, 2.0, "the poll set again once a pause brought nothing")
            r.fake.send(_packet_in(22))
            await eventually(lambda: len(r.packet_ins) == 23, 0.15, "a packet-in after the flood, read at once")
            assert [len(b) for b in r.batches] == [1, 1, 10, 10, 1]
            assert [p.packet[0] for p in r.packet_ins] == list(range(23))
            assert reg.pauses == 1
    run(main())


def test_a_stream_that_ends_during_a_pause_is_seen_lost_when_the_pause_ends(sock_path: str) -> None:  # noqa: F811
    async def main() -> None:
        async with rig(sock_path, read_pace_max=0.2, read_trickle=0.2) as r:
            first = r.chan._proto
            await _lone_then_paced(r)
            r.fake.send(_packet_in(2))
            await r.restart_switch()  # the switch goes away mid-pause (its last packet-in sent) and comes back
            assert first is not None
            await asyncio.wait_for(asyncio.shield(first.closed), 1.0)  # the timer's read saw the end
            await r.chan.wait_ready(2.0)
            assert [p.packet[0] for p in r.packet_ins] == [0, 1, 2]  # what it sent before it went: read
    run(main())


def test_without_a_timer_read_each_paced_read_rejoins_the_poll_set_and_nothing_is_lost(
        sock_path: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The degraded path (a transport without asyncio's _read_ready): the pause's end resumes reading,
    one epoll_ctl pair a paced read, the same reads and packet-ins."""
    monkeypatch.setattr(connect, "timer_reader", lambda transport: None)

    async def main() -> None:
        async with rig(sock_path, read_pace_max=0.2, read_trickle=0.2) as r:
            reg = _Registrations(_transport(r))
            await _lone_then_paced(r, paced_batches=2)
            assert reg.pauses == 3 and reg.resumes >= 2  # out of the poll set and back, each paced read
            assert [len(b) for b in r.batches] == [1, 1, 10, 10]
            assert [p.packet[0] for p in r.packet_ins] == list(range(22))
    run(main())


def test_a_transport_without_a_timer_read_is_said_once(caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "_NO_TIMER_READ", [])

    class Bare(asyncio.Transport):
        pass

    with caplog.at_level(logging.WARNING, logger="packetin.connect"):
        assert connect.timer_reader(Bare()) is None
        assert connect.timer_reader(Bare()) is None
    said = [r for r in caplog.records if "no _read_ready" in r.getMessage()]
    assert len(said) == 1 and "Bare" in said[0].getMessage()
