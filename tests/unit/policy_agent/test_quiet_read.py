"""A read the event loop's quiet wait makes (packetin/quiet.py: the OpenFlow socket read from inside the wait, a lone
packet-in's record made, sealed and appended in C before any Python runs, then the read handled as a lone read)
ends exactly as the same read taken by the loop (OpenFlowStream.data_received: PacketInReader.lone, else
on_messages): the same audit file byte for byte and the same counts in the reader, the demux, the pipeline and the
writer, over a real socket and the agent's own event loop, whatever came (plain logged Drops new and repeated,
Allows, Rejects, unlogged, malformed, two messages in one read) and whatever the writer's thread was doing (its lock
held)."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from auditlog.chain import RecordText
from auditlog.pipeline import AuditPipeline
from auditlog.record import EventIds, RecordContext
from auditlog.record_fast import aggregator
from auditlog.verify import verify
from auditlog.writer import AuditWriter
from packetin import quiet
from packetin.connect import OpenFlowStream
from packetin.demux import Demux, FairShareSettings
from packetin.model import Category
from packetin.reader import PacketInReader
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy_packetins import PolicyPacketIns
from tests.support.audit_pipeline import RULE
from tests.support.fast_records import Pods
from tests.support.packet_ins import lone_message as msg

pytestmark = pytest.mark.skipif(quiet.QUIET != "c", reason="never: make setup builds packetin/_quiet_fast.c")

POLICY = int(Category.POLICY)
KINDS = ("drop", "drop", "drop", "drop", "drop", "repeat", "allow", "reject", "unlogged", "malformed", "two", "busy")


class Clock:
    """The reader's clocks: real time noted per read (`reads`), or the values noted replayed read by read."""

    def __init__(self, replay: list[list[float]] | None = None) -> None:
        self.reads: list[list[float]] = [[]]
        self._replay = replay
        self._at: list[float] = []

    def step(self, i: int) -> None:
        if self._replay is not None:
            self._at = list(self._replay[i])

    def _read(self, real: Callable[[], float]) -> float:
        value = self._at.pop(0) if self._replay is not None else real()
        self.reads[-1].append(value)
        return value

    def mono(self) -> float:
        return self._read(time.monotonic)

    def wall(self) -> float:
        return self._read(time.time)


def stack(tmp: Path, clock: Clock, start: tuple[float, float], fair: bool) -> tuple[Any, ...]:
    writer = AuditWriter(tmp / "audit.jsonl", compress=False)
    writer.start()
    ids = EventIds()
    ids._prefix = "0" * 16
    rules = RuleRegistry()
    rules.replace({RULE.rule_id: RULE})
    pipeline = AuditPipeline(RecordContext(node="n", rules=rules, pods=Pods(), new_event_id=ids), writer,
                             aggregator(window=60.0), wall_clock=lambda: start[1])  # no window falls due here
    demux = Demux(inline_max=64)
    share = FairShareSettings(key=lambda p: p.in_port, key_rate=1.0, key_burst=2.0, max_keys=4) if fair else None
    demux.subscribe(POLICY, PolicyPacketIns(lambda m: 0, audit=pipeline), rate=50.0, burst=12.0, queue_size=100,
                    now=start[0], fair=share)
    demux.start()
    reader = PacketInReader(demux.dispatch, lambda raw: None, on_malformed=demux.count_malformed,
                            mono_clock=clock.mono, wall_clock=clock.wall, lone_sink=demux.lone, early_sink=demux)
    return writer, pipeline, demux, reader


def sent(kind: str, port: int) -> bytes:
    if kind == "two":
        return msg("drop", port) + msg("drop", port + 1000)
    return msg("drop" if kind in ("repeat", "busy") else kind, port)


async def finish(writer: AuditWriter, pipeline: AuditPipeline, demux: Demux, reader: PacketInReader) -> dict[str, Any]:
    await pipeline.close()
    await demux.stop()
    assert writer.flush_wait(10)
    writer.close()
    return {"lines": [p.read_bytes() for p in sorted(writer.path.parent.glob("audit.jsonl*"))],
            "demux": demux.stats(), "pipeline": (dict(pipeline.stats), dict(pipeline.rule_packet_ins)),
            "writer": {k: v for k, v in writer.stats.items() if k != "batches"},
            "reader": (reader.reads, reader.packet_ins, reader.malformed, reader.lone_reads, reader.last_rx)}


def run_quiet(steps: list[tuple[str, int]], tmp: Path, fair: bool) -> tuple[dict[str, Any], Clock, tuple, int]:
    """The steps through the agent's event loop (quiet.new_event_loop) and a socket pair, one send each, once the
    loop has waited long enough to arm."""
    clock = Clock()
    start = (time.monotonic(), time.time())

    async def run() -> tuple[dict[str, Any], int]:
        writer, pipeline, demux, reader = stack(tmp, clock, start, fair)
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        selector = quiet.selector_of(loop)
        assert selector is not None
        quiet_at: dict[int, tuple[float, float]] = {}

        def lone(raw: bytes, read_at: tuple[float, float] | None) -> bool:
            if read_at is not None:
                quiet_at[reader.reads] = read_at  # the read's own times, as the wait read it
            return reader.lone(raw, read_at)

        transport, _ = await loop.create_connection(
            lambda: OpenFlowStream("test", reader.on_messages, lambda s: None, None, lone, reader),
            sock=ours)

        def send() -> None:
            for i, (kind, port) in enumerate(steps):
                time.sleep(0.012)  # more than QUIET_AFTER: the wait is armed when the message comes
                clock.reads.append([])
                busy = writer._io_lock if kind == "busy" else None  # the writer's thread writing
                if busy is not None:
                    busy.acquire()
                try:
                    theirs.sendall(sent(kind, port))
                    deadline = time.monotonic() + 5
                    while reader.reads < i + 1 and time.monotonic() < deadline:
                        time.sleep(0.001)
                    assert reader.reads == i + 1, "the loop did not read the message"
                finally:
                    if busy is not None:
                        busy.release()
        await asyncio.to_thread(send)
        transport.close()
        theirs.close()
        for i, at in quiet_at.items():  # the reader's clocks were not asked: what the replay gives it
            clock.reads[i + 1] = [at[0], at[1]]
        return await finish(writer, pipeline, demux, reader), selector.quiet_reads

    with asyncio.Runner(loop_factory=quiet.new_event_loop) as runner:
        out, quiet_reads = runner.run(run())
    return out, clock, start, quiet_reads


def run_loop(steps: list[tuple[str, int]], tmp: Path, fair: bool, clock: Clock, start: tuple) -> dict[str, Any]:
    """The same reads as the loop takes them (OpenFlowStream.data_received), at the times the quiet run read them."""

    async def run() -> dict[str, Any]:
        writer, pipeline, demux, reader = stack(tmp, clock, start, fair)
        for i, (kind, port) in enumerate(steps):
            clock.step(i + 1)
            raw = sent(kind, port)
            busy = writer._io_lock if kind == "busy" else None
            if busy is not None:
                busy.acquire()
            try:
                if kind == "two" or not reader.lone(raw):
                    reader.on_messages([raw[:len(raw) // 2], raw[len(raw) // 2:]] if kind == "two" else [raw])
            finally:
                if busy is not None:
                    busy.release()
        return await finish(writer, pipeline, demux, reader)

    return asyncio.run(run())


@pytest.mark.parametrize("fair", [False, True])
def test_a_read_the_quiet_wait_makes_ends_as_the_loops_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            fair: bool) -> None:
    monkeypatch.setattr(quiet, "QUIET_AFTER", 0.002)
    quiet_reads = 0
    for seed in range(3):
        rng = random.Random(seed)
        ports = iter(range(7000, 8000))
        steps: list[tuple[str, int]] = []
        for _ in range(rng.randrange(18, 30)):
            kind = rng.choice(KINDS)
            steps.append((kind, steps[-1][1] if kind == "repeat" and steps else next(ports)))
        (tmp_path / str(seed) / "quiet").mkdir(parents=True)
        (tmp_path / str(seed) / "loop").mkdir(parents=True)
        got, clock, start, n = run_quiet(steps, tmp_path / str(seed) / "quiet", fair)
        want = run_loop(steps, tmp_path / str(seed) / "loop", fair, Clock(clock.reads), start)
        assert got == want, f"seed {seed}"
        quiet_reads += n
    # The wait made reads (where admission was certain: the fair shares hold the category down to its reserve
    # sooner), and wrote their records (the next test: whole, once).
    assert quiet_reads > (5 if fair else 20), quiet_reads


def test_the_wait_writes_the_record_itself_and_nothing_when_the_writer_moved_on(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The record is appended from inside the wait (the writer's lone_written then finds the line written and writes
    nothing twice). When, while the loop waited armed, another thread's record was written (the chain's head moved)
    or queued, the writer's thread holds its lock, or the live file's stream was opened anew, the wait writes
    nothing: the record follows as it would have, and the chain holds."""
    monkeypatch.setattr(quiet, "QUIET_AFTER", 0.002)
    clock = Clock()
    start = (time.monotonic(), time.time())
    finished: list[tuple[str, int, int]] = []

    async def run() -> tuple[dict[str, Any], int]:
        writer, pipeline, demux, reader = stack(tmp_path, clock, start, False)
        real = writer.lone_written

        def lone_written(records: list[Any], line: str, written: int, errno: int) -> bool:
            finished.append((line, written, errno))
            return real(records, line, written, errno)
        writer.lone_written = lone_written  # type: ignore[method-assign]
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        selector = quiet.selector_of(loop)
        assert selector is not None
        transport, _ = await loop.create_connection(
            lambda: OpenFlowStream("test", reader.on_messages, lambda s: None, None, reader.lone, reader),
            sock=ours)

        def send() -> None:
            for i, case in enumerate(("teach", "teach", "quiet", "moved", "queued", "busy", "reopened")):
                time.sleep(0.012)  # the loop waits armed now
                if case == "moved":  # written by this thread meanwhile (inline): seq and chain moved
                    assert writer.submit(RecordText.of({"message": "moved", "event": {"kind": "state"}}))
                    assert writer.head[0] == 4
                elif case == "queued":  # queued meanwhile, not yet taken by the writer's thread
                    writer._queue.append(RecordText.of({"message": "queued", "event": {"kind": "state"}}))
                elif case == "busy":
                    writer._io_lock.acquire()
                elif case == "reopened":  # the live file's stream opened anew (as after a failed write), seq as it was
                    with writer._io_lock:
                        handler = writer._handler
                        assert handler is not None and handler.stream is not None
                        handler.stream.close()
                        handler.stream = handler.do_open()
                theirs.sendall(msg("drop", 100 + i))
                deadline = time.monotonic() + 5
                while reader.reads < i + 1 and time.monotonic() < deadline:
                    time.sleep(0.001)
                if case == "busy":
                    writer._io_lock.release()
        await asyncio.to_thread(send)
        transport.close()
        theirs.close()
        return await finish(writer, pipeline, demux, reader), selector.quiet_reads

    with asyncio.Runner(loop_factory=quiet.new_event_loop) as runner:
        out, quiet_reads = runner.run(run())
    lines = out["lines"][0].decode().splitlines()
    # The first two reads teach the encoders (Python's caches, then the C encoder's texts); the wait made the rest.
    assert quiet_reads == 5
    assert finished == [(lines[2], len(lines[2]) + 1, 0)]  # written whole from inside the wait, and once
    order = ['"port":100', '"port":101', '"port":102', '"moved"', '"port":103', '"queued"', '"port":104', '"port":105',
             '"port":106']
    assert [next(m for m in order if m in line) for line in lines] == order
    result = verify([tmp_path])
    assert result.ok and (result.records, result.first_seq, result.last_seq) == (9, 1, 9)
