"""A read of one packet-in taken by the lone path (PacketInReader.lone -> Demux.lone -> PolicyPacketIns.lone ->
AuditPipeline.lone -> RecordOut.first -> AuditWriter.write_now), its record written before the read's bookkeeping,
ends exactly as the read taken by on_messages: the same audit file byte for byte, and the same counts in the
reader, the demux, the fair shares, the pipeline and the writer, whatever came (plain logged Drops new and
repeated, Allows, Rejects, unlogged, malformed, windows falling due) and whatever the state (a trace packet
lately, the offload active, admission short of tokens, the writer's thread busy)."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from auditlog.aggregate import Aggregator
from auditlog import pipeline as pipeline_module
from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import EventIds, RecordContext
from auditlog.record_fast import aggregator
from auditlog.writer import AuditWriter
from packetin.demux import Demux, FairShareSettings
from packetin.model import Category
from packetin.reader import PacketInReader
from policy_agent.policy_packetins import PolicyPacketIns
from tests.support.audit_pipeline import RULE
from tests.support.fast_records import Pods
from policy_agent.policy.rules import RuleRegistry
from tests.support.packet_ins import lone_message as msg

POLICY = int(Category.POLICY)
KINDS = ("drop", "drop", "drop", "drop", "cut", "allow", "reject", "unlogged", "malformed", "tick", "trace", "offload",
         "busy", "starve", "overload")


class Offload:
    """The XDP offload's face to the dispatcher: `active`, and the packet-ins it is given while it is."""

    def __init__(self) -> None:
        self.active = False
        self.seen: list[int] = []

    def __call__(self, pin: Any) -> None:
        self.seen.append(pin.total_len)


def run_stack(steps: list[tuple[str, int, float]], tmp: Path, lone: bool, fair: bool) -> dict[str, Any]:
    """The agent's path for policy packet-ins on fake clocks, each step one read of one message (or a change of
    state); with `lone`, each read first offered to the reader's lone, as OpenFlowStream.data_received offers it."""
    wall, mono = [1_700_000_000.0], [50.0]
    state = {"trace": False, "backlog": 0.0}
    offload = Offload()

    async def run() -> dict[str, Any]:
        writer = AuditWriter(tmp / "audit.jsonl", compress=False, clock=lambda: wall[0], monotonic=lambda: mono[0])
        writer.start()
        ids = EventIds()
        ids._prefix = "0" * 16
        rules = RuleRegistry()
        rules.replace({RULE.rule_id: RULE})
        ctx = RecordContext(node="n", rules=rules, pods=Pods(), new_event_id=ids)
        agg = aggregator(window=1.0) if aggregator is not None else Aggregator(window=1.0)
        overload = Overload(lambda: state["backlog"], high_mark=0.5, peers_mark=0.9, low_mark=0.2)
        pipeline = AuditPipeline(ctx, writer, agg, wall_clock=lambda: wall[0], overload=overload)
        dispatcher = PolicyPacketIns(lambda m: 0, audit=pipeline, offload=offload, suppress=lambda pin: state["trace"],
                                     may_suppress=lambda: state["trace"])
        demux = Demux(inline_max=64)
        share = FairShareSettings(key=lambda p: p.in_port, key_rate=1.0, key_burst=2.0, max_keys=4) if fair else None
        demux.subscribe(POLICY, dispatcher, rate=5.0, burst=6.0, queue_size=100, now=mono[0], fair=share)
        demux.start()
        reader = PacketInReader(demux.dispatch, lambda raw: None, on_malformed=demux.count_malformed,
                                mono_clock=lambda: mono[0], wall_clock=lambda: wall[0],
                                lone_sink=demux.lone if lone else None, early_sink=demux if lone else None)
        for kind, port, step in steps:
            wall[0] += step
            mono[0] += step
            if kind == "trace":
                state["trace"] = not state["trace"]
                continue
            if kind == "offload":
                offload.active = not offload.active
                continue
            if kind == "overload":  # the pipeline's backlog crosses the marks: coarse records, or back to full
                state["backlog"] = 0.95 - state["backlog"]
                continue
            raw = msg(kind, port)
            busy = writer._io_lock if kind == "busy" else None  # the writer's thread writing: records queue
            if busy is not None:
                busy.acquire()
            try:
                if kind == "starve":  # the channel's tokens spent: admission not certain
                    for _ in range(8):
                        demux.dispatch([reader._decode(msg("drop", port), wall[0])], mono[0])
                if not (lone and reader.lone(raw)):  # as OpenFlowStream.data_received
                    reader.on_messages([raw])
            finally:
                if busy is not None:
                    busy.release()
        await pipeline.close()
        await demux.stop()
        assert writer.flush_wait(10)
        writer.close()
        sub = demux._subs[POLICY]
        return {
            "lines": [p.read_bytes() for p in sorted(tmp.glob("audit.jsonl*"))],
            "demux": demux.stats(), "unroutable": dict(demux.unroutable),
            "fair": None if sub.fair is None else (list(sub.fair._keys.items()), sub.fair._tokens, sub.fair._last,
                                                   sub.fair.evicted, sub.fair.borrowed),
            "bucket": (sub.bucket._tokens, sub.bucket._last),
            "reader": (reader.reads, reader.packet_ins, reader.malformed, reader.last_rx),
            "pipeline": (dict(pipeline.stats), dict(pipeline.rule_packet_ins), overload.level, overload.entered),
            "writer": {k: v for k, v in writer.stats.items() if k != "batches"},
            "dispatcher": (dispatcher.answered, dispatcher.unanswerable), "offload": list(offload.seen),
            "taken": reader.lone_reads, "early": pipeline._out.early_records,
        }

    return asyncio.run(run())


def test_a_lone_read_ends_as_a_read_taken_by_on_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline_module, "_CHECK_EVERY", 3)  # the backlog looked at every 3rd packet-in, not 64th
    taken = declined = early = 0
    for seed in range(30):
        rng = random.Random(seed)
        steps = [(rng.choice(KINDS), rng.choice((7, 8, 9, 10, 11, 12)), rng.choice((0.0, 0.001, 0.05, 0.3, 1.2)))
                 for _ in range(rng.randrange(10, 60))]
        fair = seed % 3 != 0
        for side in ("lone", "read"):
            (tmp_path / str(seed) / side).mkdir(parents=True)
        lone = run_stack(steps, tmp_path / str(seed) / "lone", True, fair)
        read = run_stack(steps, tmp_path / str(seed) / "read", False, fair)
        assert read.pop("taken") == 0 and read.pop("early") == 0
        n = lone.pop("taken")
        early += lone.pop("early")
        assert lone == read, f"seed {seed}"
        taken += n
        declined += sum(1 for kind, _, _ in steps if kind not in ("trace", "offload", "overload")) - n
    # Both ways were taken: the lone path wrote records (and the batch path the rest)
    assert taken > 50 and declined > 100, (taken, declined)
    assert early > 20, (early, taken)  # records made from the bytes before the decode (early)


def test_a_lone_plain_drop_is_written_before_its_reads_counts(tmp_path: Path) -> None:
    """The point of the lone path: the record is in the file before the demux counts the read (which it does
    in a batch of one only after the write)."""
    seen: list[tuple[int, int]] = []

    async def run() -> None:
        writer = AuditWriter(tmp_path / "audit.jsonl", compress=False)
        writer.start()
        pipeline = AuditPipeline(RecordContext(node="n", rules=_rules(), pods=Pods()), writer,
                                 aggregator(window=1.0), wall_clock=lambda: 1e9)
        demux = Demux(inline_max=64)
        demux.subscribe(POLICY, PolicyPacketIns(lambda m: 0, audit=pipeline), rate=1e6, burst=1e6, queue_size=10,
                        now=0.0)
        demux.start()
        reader = PacketInReader(demux.dispatch, lambda raw: None, lone_sink=demux.lone)
        assert reader.lone(msg("drop", 8))  # the writer's thread writes the first record: it learns the file's size
        assert writer.flush_wait(5)
        real = writer._handler.do_write  # type: ignore[union-attr]

        def noted(text: str) -> None:
            seen.append((demux.stats()[POLICY]["received"], threading.get_ident()))
            real(text)
        writer._handler.do_write = noted  # type: ignore[union-attr,method-assign]
        assert reader.lone(msg("drop", 9))
        assert demux.stats()[POLICY]["received"] == 2 and reader.packet_ins == 2
        await demux.stop()
        writer.close()

    asyncio.run(run())
    assert seen == [(1, threading.get_ident())]  # written on this thread, before the demux counted the read


def _rules() -> RuleRegistry:
    rules = RuleRegistry()
    rules.replace({RULE.rule_id: RULE})
    return rules
