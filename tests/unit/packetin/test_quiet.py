"""The event loop's quiet wait (packetin/quiet.py) as a selector: it arms only once its source has been quiet, it
hands every other event on as asyncio's own selector does and keeps the timeout; without the C module the loop is
asyncio's own and says so. And the writer's side: what the wait wrote of a line is not written twice, the rest is."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import selectors
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from auditlog.chain import RecordText
from auditlog.verify import verify
from auditlog.writer import AuditWriter
from packetin import quiet

pytestmark = pytest.mark.skipif(quiet.QUIET != "c", reason="never: make setup builds packetin/_quiet_fast.c")


class Source:
    """A source whose arm is never taken (None from encode_raw: the wait reads nothing itself)."""

    def __init__(self, fd: int, last_read: float, may: bool = True) -> None:
        self.fd = fd
        self._last = last_read
        self._may = may
        self.arms: list[float] = []
        self.reads: list[Any] = []

    def may_arm(self) -> bool:
        return self._may

    def last_read(self) -> float:
        return self._last

    def arm(self) -> tuple[Any, ...]:
        self.arms.append(time.monotonic())
        return (lambda early: None, lambda *a: None, {}, {}, None, 1, 1, 2, None)

    def quiet_read(self, early: Any) -> None:
        self.reads.append(early)


def test_it_arms_once_the_source_has_been_quiet_and_hands_other_events_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "QUIET_AFTER", 0.05)
    selector = quiet.QuietSelector()
    ours, theirs = socket.socketpair()
    other_r, other_w = socket.socketpair()
    try:
        selector.register(ours, selectors.EVENT_READ, "openflow")
        selector.register(other_r, selectors.EVENT_READ, "other")
        start = time.monotonic()
        source = Source(ours.fileno(), last_read=start)
        selector.source = source
        assert selector.select(0.02) == [] and source.arms == []  # read lately: not armed within QUIET_AFTER
        assert selector.select(0) == [] and source.arms == []  # asyncio's "callbacks ready": never armed
        assert selector.select(0.1) == []
        assert time.monotonic() - start >= 0.12 and len(source.arms) == 1  # armed once quiet, the timeout kept
        armed_at = source.arms[0]
        assert armed_at - start >= 0.05
        other_w.send(b"x")
        ready = selector.select(None)  # armed at once now: quiet since long enough
        assert [(key.data, mask) for key, mask in ready] == [("other", selectors.EVENT_READ)]
        assert len(source.arms) == 2 and selector.armed_waits == 2
        theirs.send(b"not an OpenFlow message")  # the wait declines it: the loop reads it as ever
        ready = selector.select(None)
        assert [(key.data, mask) for key, mask in ready] == [("other", selectors.EVENT_READ), ("openflow", 1)] \
            or [(key.data, mask) for key, mask in ready] == [("openflow", 1), ("other", selectors.EVENT_READ)]
        assert source.reads == [] and selector.quiet_reads == 0 and ours.recv(100) == b"not an OpenFlow message"
        assert other_r.recv(10) == b"x" and selector.armed_waits == 3
        selector.source = Source(ours.fileno(), last_read=0.0, may=False)  # its socket out of the poll set
        theirs.send(b"y")
        assert [key.data for key, _ in selector.select(0.01)] == ["openflow"] and selector.armed_waits == 3
    finally:
        selector.close()
        for s in (ours, theirs, other_r, other_w):
            s.close()


def test_a_loop_not_made_here_is_not_armed_and_without_the_c_module_it_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    async def which() -> Any:
        return quiet.selector_of(asyncio.get_running_loop())

    assert asyncio.run(which()) is None
    with asyncio.Runner(loop_factory=quiet.new_event_loop) as runner:
        assert isinstance(runner.run(which()), quiet.QuietSelector)
    monkeypatch.setattr(quiet, "_quiet_fast", None)
    with caplog.at_level(logging.WARNING, logger="packetin.quiet"):
        with asyncio.Runner(loop_factory=quiet.new_event_loop) as runner:
            assert runner.run(which()) is None
    assert "packetin._quiet_fast is not built" in caplog.text


def test_what_the_wait_wrote_of_a_line_is_not_written_again_and_the_rest_is(tmp_path: Path) -> None:
    """lone_written after a write the wait left short (a signal, the disk's last block): the rest is written, the
    line is in the file once, the chain holds."""
    writer = AuditWriter(tmp_path / "audit.jsonl", compress=False)
    writer.start()
    try:
        assert writer.submit(RecordText.of({"message": "first", "event": {"kind": "state"}}))
        assert writer.flush_wait(5)  # the handler knows the file's size: inline writes from now on
        time.sleep(0.002)
        arm = writer.lone_arm()
        assert arm is not None
        lock, _, seq, chain, fd, seal_run, key, _, _, _ = arm
        assert lock.acquire(blocking=False)
        record = RecordText.of({"message": "second", "event": {"kind": "state"}})
        lines: list[str] = []
        assert seal_run([record], 0, seq, chain, key, lines)[0] == 1
        os.write(fd, lines[0][:10].encode())
        assert writer.lone_written([record], lines[0], 10, errno.EIO)
        assert not lock.locked()
        writer._queue.append(RecordText.of({"message": "held", "event": {"kind": "state"}}))
        assert writer.lone_arm() is None  # something queued: the wait is not armed to write
        writer._queue.clear()
    finally:
        writer.close()
    text = (tmp_path / "audit.jsonl").read_text()
    assert text.count('"second"') == 1 and text.endswith(lines[0] + "\n")
    result = verify([tmp_path])
    assert result.ok and result.records == 2
