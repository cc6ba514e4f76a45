"""auditlog.syslog.forwarder: batches in seq order, checkpoint only after success, backoff, restart, stats."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from auditlog.syslog.checkpoint import load_checkpoint
from auditlog.syslog.errors import SyslogConfigError, SyslogTransportError
from auditlog.syslog.destination import checkpoint_name, make_destination
from auditlog.syslog.forwarder import ACK_IDLE, Forwarder
from auditlog.syslog.framer import Framer
from auditlog.syslog.rfc5424 import Framing
from auditlog.syslog.transport import ACK_POLL, Endpoint, TlsOptions
from auditlog import record_fast
from auditlog.chain import RecordText
from auditlog.writer import AuditWriter
from tests.support.syslog_parse import parse_message, split_octet_counted


class FakeSender:
    """Keeps what it was sent; fails while `down` is set. Acknowledges at once, or, if `lazy`, only what
    `ack` allows; `drop` resets the connection as a receiver's crash would."""

    def __init__(self, lazy: bool = False) -> None:
        self.frames: list[bytes] = []  # every frame sent, over all connections
        self.on_connection: list[bytes] = []  # the frames sent on the current connection
        self.acked_frames = 0  # of those, how many the receiver acknowledged
        self.connected = False
        self.down = False
        self.lazy = lazy
        self.connects = 0
        self.sends: list[int] = []  # frames per send call

    def connect(self) -> None:
        self.connects += 1
        if self.down:
            raise SyslogTransportError("tcp://fake:1: cannot connect: refused")
        self.connected = True
        self.on_connection, self.acked_frames = [], 0

    def send(self, frames: Sequence[bytes]) -> None:
        if self.down or not self.connected:
            self.connected = False
            raise SyslogTransportError("tcp://fake:1: send failed")
        self.frames += frames
        self.on_connection += frames
        self.sends.append(len(frames))

    def unacked(self) -> int:
        if self.down or not self.connected:
            self.connected = False
            raise SyslogTransportError("tcp://fake:1: the receiver closed the connection")
        acked = self.acked_frames if self.lazy else len(self.on_connection)
        return sum(len(f) for f in self.on_connection[acked:])

    def ack(self, frames: int) -> None:
        """The receiver's TCP acknowledges the first `frames` frames of this connection."""
        self.acked_frames = frames

    def drop(self) -> None:
        self.connected = False

    def finish(self, timeout: float) -> bool:
        """A lazy receiver does not read to the end of the stream in time; an eager one does."""
        self.connected = False
        return not self.lazy

    def close(self) -> None:
        self.connected = False

    def seqs(self, frames: list[bytes] | None = None) -> list[int]:
        """The seqs of `frames` (default: every frame sent)."""
        out = []
        for f in self.frames if frames is None else frames:
            (msg,), _ = split_octet_counted(f) if f[:1].isdigit() else ([f], b"")
            out.append(json.loads(parse_message(msg).msg)["npaudit"]["seq"])
        return out


def record(i: int, size: int = 0) -> dict[str, Any]:
    return {"@timestamp": "2026-11-30T02:14:03.512Z", "event": {"action": "allowed", "id": f"e{i}"},
            "labels": {"log_label": "L" * size}, "npaudit": {"disposition": "Allow"}}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "log" / "audit.jsonl"


def write(live: Path, first: int, count: int, size: int = 0) -> None:
    with AuditWriter(live, max_bytes=8192, backup_count=100, max_age_days=0) as w:
        for i in range(first, first + count):
            w.submit(RecordText.of(record(i, size)))
        assert w.flush_wait()


def forwarder(live: Path, sender: FakeSender, url: str = "tcp://fake:1", burst: bool = False,
              **kw: Any) -> Forwarder:
    """A forwarder sending one batch per step (burst=False), so a test can walk the window batch by batch
    (the burst the agent uses, several batches in one send when behind, has tests of its own)."""
    kw.setdefault("receive_buffer_bytes", 0)  # the fake receiver reads what its TCP acknowledges
    dest = make_destination(url, node_name="node-a", batch_records=10, **kw)
    return Forwarder(dest, live=live, checkpoint=live.parent.parent / "state" / "ckpt.json", sender=sender,
                     rand=lambda: 1.0, backoff_base=1.0, backoff_cap=8.0, burst=burst)


def run(fwd: Forwarder, now: float = 0.0, steps: int = 100) -> float:
    """Step until the forwarder waits; returns the wait."""
    for _ in range(steps):
        delay = fwd.step(now)
        if delay > 0:
            return delay
    raise AssertionError("forwarder never waited")


def test_every_record_is_sent_in_seq_order_and_the_checkpoint_follows(live: Path) -> None:
    write(live, 1, 35)
    sender = FakeSender()
    fwd = forwarder(live, sender)
    assert run(fwd) == 0.25  # caught up: poll again later
    assert sender.seqs() == list(range(1, 36))
    ckpt = load_checkpoint(fwd.checkpoint)
    assert ckpt is not None and ckpt.seq == 35
    stats = fwd.stats()
    assert (stats.sent, stats.last_seq_sent, stats.connected, stats.errors, stats.lost) == (35, 35, True, 0, 0)
    msg = parse_message(split_octet_counted(sender.frames[0])[0][0])
    assert (msg.hostname, msg.msgid, msg.severity, msg.facility) == ("node-a", "ALLOW", 6, 16)


def test_an_outage_holds_the_batch_backs_off_and_loses_nothing(live: Path) -> None:
    write(live, 1, 25)
    sender = FakeSender()
    fwd = forwarder(live, sender)
    fwd.step(0.0)
    assert sender.seqs() == list(range(1, 11))
    sender.down = True
    sender.connected = False
    waits = [run(fwd, now=t) for t in (0.0, 1.0, 3.0, 7.0)]
    assert waits == [1.0, 2.0, 4.0, 8.0]  # rand 1.0: the top of each doubling window
    assert run(fwd, now=7.5) == pytest.approx(7.5)  # not yet time: nothing tried
    assert sender.connects == 1 + 4  # the first connection, then one attempt per wait
    assert load_checkpoint(fwd.checkpoint).seq == 10  # type: ignore[union-attr]
    stats = fwd.stats()
    assert stats.errors == 4 and "cannot connect" in (stats.last_error or "") and not stats.connected
    sender.down = False
    run(fwd, now=15.0)
    assert sender.seqs() == list(range(1, 26))
    assert load_checkpoint(fwd.checkpoint).seq == 25  # type: ignore[union-attr]


def test_a_restarted_forwarder_resumes_from_its_checkpoint_with_nothing_missing_or_repeated(live: Path) -> None:
    write(live, 1, 12)
    first = FakeSender()
    fwd = forwarder(live, first)
    fwd.step(0.0)
    fwd.stop()
    write(live, 13, 30)  # the writer restarts too: rotations meanwhile
    second = FakeSender()
    run(forwarder(live, second))
    assert first.seqs() + second.seqs() == list(range(1, 43))


def test_records_removed_by_retention_before_sending_are_counted_lost(live: Path) -> None:
    write(live, 1, 3)
    sender = FakeSender()
    fwd = forwarder(live, sender)
    run(fwd)
    fwd.stop()
    with AuditWriter(live, max_bytes=4096, backup_count=1, max_age_days=0) as w:
        for i in range(4, 200):
            w.submit(RecordText.of(record(i)))
        assert w.flush_wait() and w.wait_compressed()
    sender = FakeSender()
    fwd = forwarder(live, sender)
    run(fwd)
    seqs = sender.seqs()
    assert seqs[-1] == 199 and fwd.stats().lost == seqs[0] - 4 > 0


def test_udp_datagrams_over_the_cap_are_sent_shortened_and_counted(live: Path) -> None:
    write(live, 1, 4, size=3000)
    write(live, 5, 2)
    sender = FakeSender()
    fwd = forwarder(live, sender, "udp://fake:1")
    run(fwd)
    assert all(len(f) <= 2048 for f in sender.frames) and sender.seqs() == [1, 2, 3, 4, 5, 6]
    assert fwd.stats().truncated == 4
    stub = json.loads(parse_message(sender.frames[0]).msg)
    assert stub["npaudit"]["truncated"] is True and stub["npaudit"]["original_bytes"] > 3000


def test_the_thread_forwards_until_stopped(live: Path) -> None:
    write(live, 1, 5)
    sender = FakeSender()
    fwd = forwarder(live, sender)
    fwd.start()
    for _ in range(500):
        if fwd.stats().last_seq_sent == 5:
            break
        time.sleep(0.01)
    assert fwd.stop()
    assert sender.seqs() == [1, 2, 3, 4, 5] and not sender.connected


def test_the_checkpoint_is_saved_every_n_records_not_after_every_batch(live: Path) -> None:
    write(live, 1, 45)
    sender = FakeSender()
    fwd = forwarder(live, sender, checkpoint_records=20, checkpoint_interval=3600)
    saved = []
    for _ in range(4):
        assert fwd.step(0.0) == 0.0
        ckpt = load_checkpoint(fwd.checkpoint)
        saved.append(None if ckpt is None else ckpt.seq)
    assert sender.seqs() == list(range(1, 41)) and saved == [None, 20, 20, 40]
    run(fwd)  # caught up: saved at once
    assert load_checkpoint(fwd.checkpoint).seq == 45  # type: ignore[union-attr]


def test_the_checkpoint_is_saved_once_the_interval_has_passed(live: Path) -> None:
    write(live, 1, 45)
    sender = FakeSender()
    fwd = forwarder(live, sender, checkpoint_interval=2.0)
    saved = []
    for now in (0.0, 1.0, 2.5, 3.0):
        fwd.step(now)
        ckpt = load_checkpoint(fwd.checkpoint)
        saved.append(None if ckpt is None else ckpt.seq)
    assert saved == [None, None, 30, 30]


def test_a_crash_sends_the_unsaved_batches_again_and_loses_nothing(live: Path) -> None:
    write(live, 1, 65)
    first = FakeSender()
    fwd = forwarder(live, first, checkpoint_records=20, checkpoint_interval=3600)
    for _ in range(3):
        fwd.step(0.0)
    assert first.seqs() == list(range(1, 31)) and load_checkpoint(fwd.checkpoint).seq == 20  # type: ignore
    del fwd  # the agent dies: no stop, no last save
    second = FakeSender()
    run(forwarder(live, second))
    assert second.seqs() == list(range(21, 66))  # 21..30 twice, nothing missing


def test_a_clean_stop_saves_what_was_delivered(live: Path) -> None:
    write(live, 1, 25)
    first = FakeSender()
    fwd = forwarder(live, first, checkpoint_records=1000, checkpoint_interval=3600)
    fwd.step(0.0)
    assert load_checkpoint(fwd.checkpoint) is None
    assert fwd.stop()
    assert load_checkpoint(fwd.checkpoint).seq == 10  # type: ignore[union-attr]
    second = FakeSender()
    run(forwarder(live, second))
    assert second.seqs() == list(range(11, 26))


def saved_seq(fwd: Forwarder) -> int | None:
    ckpt = load_checkpoint(fwd.checkpoint)
    return None if ckpt is None else ckpt.seq


def test_batches_are_sent_ahead_of_acknowledgements_until_the_window_is_full(live: Path) -> None:
    write(live, 1, 100)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, window_batches=3, checkpoint_records=1)
    assert [fwd.step(0.0) for _ in range(4)] == [0.0, 0.0, 0.0, ACK_POLL]  # the fourth batch waits
    assert sender.seqs() == list(range(1, 31))
    assert (fwd.stats().sent, fwd.stats().last_seq_sent, saved_seq(fwd)) == (0, None, None)
    sender.ack(15)  # the first batch and half of the second
    assert fwd.step(0.1) == 0.0
    assert (fwd.stats().sent, fwd.stats().last_seq_sent, saved_seq(fwd)) == (10, 10, 10)
    assert sender.seqs() == list(range(1, 41)) and fwd.step(0.1) == ACK_POLL  # one in, one out
    sender.ack(40)
    run(fwd, now=0.2)
    assert saved_seq(fwd) == 40 and sender.seqs() == list(range(1, 71))


def test_the_window_holds_about_window_bytes_but_always_one_batch(live: Path) -> None:
    write(live, 1, 40, size=500)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, window_bytes=8000)  # one batch of 10 records is over 5 kB
    assert [fwd.step(0.0), fwd.step(0.0)] == [0.0, ACK_POLL]
    assert sender.seqs() == list(range(1, 11))
    sender.ack(10)
    assert fwd.step(0.0) == 0.0 and sender.seqs() == list(range(1, 21))


def test_time_with_a_full_window_is_counted_as_waiting_for_the_receiver(live: Path) -> None:
    write(live, 1, 100)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, window_batches=2)
    assert [fwd.step(0.0), fwd.step(0.0)] == [0.0, 0.0] and fwd.stats().receiver_wait_s == 0.0
    assert fwd.step(1.0) == ACK_POLL  # full: held by the receiver from here
    assert fwd.step(1.5) == ACK_POLL and fwd.stats().receiver_wait_s == pytest.approx(0.5)
    assert fwd.step(3.0) == ACK_POLL and fwd.stats().receiver_wait_s == pytest.approx(2.0)
    sender.ack(20)
    assert fwd.step(3.25) == 0.0  # room again: the wait ends at this step
    assert fwd.stats().receiver_wait_s == pytest.approx(2.25)
    sender.lazy = False
    run(fwd, now=10.0)  # a receiver that keeps up: no more waiting counted
    assert fwd.stats().receiver_wait_s == pytest.approx(2.25) and sender.seqs() == list(range(1, 101))


def four_batches_in_flight(live: Path) -> tuple[Forwarder, FakeSender]:
    """Records 1..60 on disk, 1..40 sent in four batches of 10 (the default window), none acknowledged."""
    write(live, 1, 60)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, checkpoint_records=1)
    for _ in range(4):
        fwd.step(0.0)
    return fwd, sender


def test_a_dropped_connection_sends_again_exactly_the_batches_not_acknowledged(live: Path) -> None:
    fwd, sender = four_batches_in_flight(live)
    sender.ack(15)  # batch 1 and half of batch 2
    sender.drop()
    assert fwd.step(0.0) == 1.0  # the drop is seen first: batch 1 is not known delivered either
    assert saved_seq(fwd) is None and fwd.stats().errors == 1
    sender.lazy = False
    run(fwd, now=1.0)
    assert sender.seqs(sender.on_connection) == list(range(1, 61))
    assert saved_seq(fwd) == 60


def test_acknowledged_batches_are_delivered_before_a_later_drop_resends_the_rest(live: Path) -> None:
    fwd, sender = four_batches_in_flight(live)
    assert sender.seqs() == list(range(1, 41))
    sender.ack(25)  # batches 1 and 2, half of batch 3
    fwd.step(0.0)
    assert saved_seq(fwd) == 20 and sender.seqs() == list(range(1, 51))
    sender.drop()
    assert fwd.step(0.0) == 1.0 and saved_seq(fwd) == 20
    sender.lazy = False
    run(fwd, now=1.0)
    assert sender.seqs(sender.on_connection) == list(range(21, 61))  # 21..50 again, nothing else
    assert sorted(set(sender.seqs())) == list(range(1, 61)) and saved_seq(fwd) == 60


def test_a_receiver_that_acknowledges_nothing_for_ack_timeout_is_dropped_and_sent_to_again(live: Path) -> None:
    write(live, 1, 30)
    sender = FakeSender(lazy=True)
    dest = make_destination("tcp://fake:1", node_name="node-a", batch_records=10, receive_buffer_bytes=0)
    fwd = Forwarder(dest, live=live, checkpoint=live.parent.parent / "state" / "ckpt.json", sender=sender,
                    rand=lambda: 1.0, backoff_base=1.0, ack_timeout=5.0)
    assert run(fwd, now=0.0) == ACK_IDLE  # all three batches in flight, the window not full, nothing new
    sender.ack(5)
    assert fwd.step(4.0) == ACK_IDLE  # some progress: the timeout starts again
    assert fwd.step(8.9) == ACK_IDLE
    assert fwd.step(9.0) == 1.0
    assert fwd.stats().errors == 1 and "acknowledged nothing for 5 s" in (fwd.stats().last_error or "")
    sender.lazy = False
    run(fwd, now=10.0)
    assert sender.seqs(sender.on_connection) == list(range(1, 31)) and saved_seq(fwd) == 30


def test_stop_saves_what_was_acknowledged_and_the_next_start_sends_only_the_rest(live: Path) -> None:
    write(live, 1, 30)
    sender = FakeSender(lazy=True)
    ticks = iter(range(1000))
    dest = make_destination("tcp://fake:1", node_name="node-a", batch_records=10, checkpoint_records=1000,
                            receive_buffer_bytes=0)
    fwd = Forwarder(dest, live=live, checkpoint=live.parent.parent / "state" / "ckpt.json", sender=sender,
                    clock=lambda: float(next(ticks)))
    for _ in range(3):
        fwd.step(0.0)
    sender.ack(20)
    assert fwd.stop() and saved_seq(fwd) == 20  # batch 3 never acknowledged: not saved
    second = FakeSender()
    run(forwarder(live, second))
    assert second.seqs() == list(range(21, 31))


@pytest.mark.parametrize("url,kw,field", [
    ("udp://h:1", {"framing": "lf"}, "framing"),
    ("tcp://h:1", {"framing": "newline"}, "framing"),
    ("udp://h:1", {"udp_max_bytes": 100}, "udp_max_bytes"),
    ("tcp://h:1", {"tls": TlsOptions()}, "tls://"),
    ("tcp://h:1", {"facility": "local9"}, "facility"),
    ("tcp://h:1", {"batch_records": 0}, "batch_records"),
    ("tcp://h:1", {"batch_bytes": 0}, "batch_bytes"),
    ("tcp://h:1", {"checkpoint_interval": -1.0}, "checkpoint_interval"),
    ("tcp://h:1", {"checkpoint_records": 0}, "checkpoint_records"),
    ("tcp://h:1", {"window_batches": 0}, "window_batches"),
    ("tcp://h:1", {"window_bytes": 0}, "window_bytes"),
])
def test_a_bad_destination_setting_names_its_field(url: str, kw: dict[str, Any], field: str) -> None:
    with pytest.raises(SyslogConfigError, match=field):
        make_destination(url, node_name="n", **kw)


def test_stream_destinations_default_to_octet_counting_and_name_their_checkpoint() -> None:
    dest = make_destination("tls://[::1]:6514", node_name="n", framing="lf", tls=TlsOptions())
    assert dest.framing is Framing.LF and dest.tls == TlsOptions()
    assert make_destination("tcp://h", node_name="n").framing is Framing.OCTET_COUNTING
    assert checkpoint_name(Endpoint("tls", "::1", 6514)) == "tls___1_6514.json"


def test_a_drop_resends_from_the_newest_batch_read_by_the_receiver_and_counts_nothing_twice(live: Path) -> None:
    with AuditWriter(live, max_bytes=0) as w:  # one file, so a line can be put between records 15 and 16
        for i in range(1, 61):
            w.submit(RecordText.of(record(i)))
        assert w.flush_wait()
    lines = live.read_bytes().splitlines(keepends=True)
    live.write_bytes(b"".join(lines[:15] + [b"not a record\n"] + lines[15:]))
    sender = FakeSender(lazy=True)
    # Frames are a few hundred bytes: 1500 bytes is more than 2 frames and less than a batch of 10.
    fwd = forwarder(live, sender, checkpoint_records=1, receive_buffer_bytes=1500)
    for _ in range(4):
        fwd.step(0.0)
    sender.ack(22)  # batches 1 and 2, two frames of batch 3: batch 2 may still be unread
    fwd.step(0.0)
    assert (fwd.stats().sent, fwd.stats().last_seq_sent, saved_seq(fwd), fwd.stats().skipped) == (20, 20, 10, 1)
    sender.drop()
    assert fwd.step(0.0) == 1.0 and saved_seq(fwd) == 10
    sender.lazy = False
    run(fwd, now=1.0)
    assert sender.seqs(sender.on_connection) == list(range(11, 61))  # batch 2 again, and what was not acknowledged
    stats = fwd.stats()
    assert (stats.sent, stats.last_seq_sent, stats.skipped, stats.errors) == (60, 60, 1, 1)
    assert saved_seq(fwd) == 50  # the last batch: nothing acknowledged after it yet, so it may be unread


def test_behind_a_send_takes_every_batch_the_window_has_room_for_in_one_call(live: Path) -> None:
    write(live, 1, 95)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, burst=True, checkpoint_records=1)  # batches of 10, a window of 4
    assert fwd.step(0.0) == 0.0
    assert sender.sends == [40] and sender.seqs() == list(range(1, 41))
    assert fwd.step(0.0) == ACK_POLL  # the window is full
    sender.ack(25)  # batches 1 and 2, half of batch 3
    assert fwd.step(0.1) == 0.0
    assert sender.sends == [40, 20] and saved_seq(fwd) == 20  # room for two more, sent together
    sender.lazy = False
    run(fwd, now=0.2)
    assert sender.seqs() == list(range(1, 96)) and saved_seq(fwd) == 95 and fwd.stats().sent == 95
    assert sender.sends == [40, 20, 35]  # a batch short of full: caught up, the burst ends there


def test_caught_up_each_step_sends_what_is_new_without_reading_ahead(live: Path) -> None:
    write(live, 1, 5)
    sender = FakeSender()
    fwd = forwarder(live, sender, burst=True)
    assert run(fwd) > 0 and sender.sends == [5]
    write(live, 6, 3)
    assert run(fwd) > 0 and sender.sends == [5, 3] and sender.seqs() == list(range(1, 9))


def test_a_burst_the_connection_drops_under_is_sent_again_whole_and_counted_once(live: Path) -> None:
    write(live, 1, 95)
    sender = FakeSender(lazy=True)
    fwd = forwarder(live, sender, burst=True, checkpoint_records=1)
    fwd.step(0.0)
    sender.ack(15)  # batch 1, half of batch 2
    sender.drop()
    assert fwd.step(0.0) == 1.0 and saved_seq(fwd) is None  # the drop is seen first
    sender.lazy = False
    run(fwd, now=1.0)
    assert sender.seqs(sender.on_connection) == list(range(1, 96))
    assert saved_seq(fwd) == 95 and fwd.stats().sent == 95 and fwd.stats().errors == 1


def test_a_stream_forwarder_frames_runs_of_records_in_c_into_the_bytes_python_makes(
        live: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(live, 1, 35)
    taken: list[int] = []
    take = Framer.take

    def counting(self: Framer, *args: Any) -> tuple[int, int, str | None]:
        result = take(self, *args)
        taken.append(result[0])
        return result
    monkeypatch.setattr(Framer, "take", counting)
    framed = FakeSender()
    run(forwarder(live, framed))
    assert sum(taken) > 0  # the forwarder hands runs to the framer
    (live.parent.parent / "state" / "ckpt.json").unlink()
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")  # no C part: every record framed in Python
    plain = FakeSender()
    run(forwarder(live, plain))
    assert plain.frames == framed.frames and plain.seqs() == list(range(1, 36))
