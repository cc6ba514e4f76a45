"""The records of a run of emissions (the C encoder's encode_run, the writer's submit_many) are what the pipeline wrote
emission by emission: the same texts in the same order, the same `received`, the same refusals per rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from auditlog import record_fast
from auditlog.aggregate import Aggregator, Emission
from auditlog.chain import RecordText
from auditlog.packet import PacketSummary
from auditlog.pipeline import AuditPipeline
from auditlog.writer import AuditWriter
from packetin.model import PacketIn
from policy_agent.policy.rules import RuleRegistry
from tests.support.fast_records import RULES, T0, V4, Pods, encoder

assert record_fast.built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"


class HoldingWriter:
    """AuditWriter's producer side, in memory: submit, hold / release, submit_many (AuditWriter's own), room."""

    def __init__(self, room: int) -> None:
        self.queue_size, self._queue, self._pending = room, [], []  # type: ignore[var-annotated]
        self._holding, self._closing = 0, False
        self.refused = 0

    def submit(self, record: RecordText) -> bool:
        if len(self._queue) + len(self._pending) >= self.queue_size:
            self.refused += 1
            return False
        (self._pending if self._holding else self._queue).append(record)
        return True

    submit_many = AuditWriter.submit_many

    def hold(self) -> None:
        self._holding += 1

    def release(self) -> int:
        self._holding -= 1
        self._queue += self._pending
        self._pending = []
        return 0

    def texts(self) -> list[tuple[str, str, str, float]]:
        return [(r.head, r.mid, r.tail, r.received) for r in self._queue]


def emission(i: int) -> Emission:
    summary = PacketSummary(eth_type=0x800, ip_version=4, src_ip=V4[i % 2], dst_ip=V4[1], protocol=17, transport="udp",
                            src_port=1000 + i, dst_port=53 + i % 5, fragment=False, truncated=False, length=74)
    pin = PacketIn(reason=0, table_id=40, cookie=1, in_port=3, rule_id=0x1001 if i % 3 else 0x1003, reg7=1,
                   userdata=b"", packet=b"", total_len=74, received_at=T0 + i)
    kind = ("first", "aggregate", "immediate")[i % 3]
    if i % 10 == 7:  # a coarse key (overload): _emit's own part
        return Emission(("ports", pin.rule_id, 1, summary.src_ip, summary.dst_ip, 17), (pin, summary), 3, 222,
                        T0 + i, T0 + i + 0.5, 0, 0, kind)
    key = (pin.rule_id, 1, summary.src_ip, summary.dst_ip, 17, summary.dst_port)
    return Emission(key, (pin, summary), 1 + i % 4, 74 * (1 + i % 4), T0 + i, T0 + i + 0.25, i % 2, 74 * (i % 2), kind)


def pipeline(writer: Any, runs: bool) -> AuditPipeline:
    rules = RuleRegistry()
    rules.replace(dict(RULES))
    p = AuditPipeline(encoder(rules, Pods())._ctx, writer, Aggregator(window=1.0))
    assert p._out._run is not None
    if not runs:
        p._out._run = None  # every emission one by one, as before runs
    return p


def emit(p: AuditPipeline, writer: Any, emissions: list[Emission], hold: bool) -> None:
    if hold:
        writer.hold()
    p._emit(emissions)
    if hold:
        writer.release()


def test_a_run_of_emissions_gives_the_records_one_by_one_gives() -> None:
    emissions = [emission(i) for i in range(60)]
    for hold in (True, False):
        w1, w2 = HoldingWriter(10**6), HoldingWriter(10**6)
        one, runs = pipeline(w1, False), pipeline(w2, True)
        emit(one, w1, emissions, hold)
        emit(runs, w2, emissions, hold)
        ids = [t[0].split('"id":"')[1][16:32] for t in w1.texts()]
        assert [t[0].split('"id":"')[1][16:32] for t in w2.texts()] == ids == [f"{n:016x}" for n in range(60)]
        strip = [(h.split('"id":"')[0] + h.split('"id":"')[1][32:], m, t, r) for h, m, t, r in w1.texts()]
        assert [(h.split('"id":"')[0] + h.split('"id":"')[1][32:], m, t, r) for h, m, t, r in w2.texts()] == strip
        assert [r for *_, r in w2.texts()][:3] == [T0, 0.0, T0 + 2]  # an aggregate's latency is not its packet's
        assert runs.stats == one.stats and runs.stats["records"] == 60 and runs.stats["coarsened"] == 6
        assert runs.encoder.counts() == one.encoder.counts() and runs.encoder.counts()["fast"] > 40  # most in C


def test_records_the_writer_has_no_room_for_are_refused_per_rule_as_one_by_one() -> None:
    emissions = [emission(i) for i in range(40)]
    for hold in (True, False):
        w1, w2 = HoldingWriter(25), HoldingWriter(25)
        one, runs = pipeline(w1, False), pipeline(w2, True)
        emit(one, w1, emissions, hold)
        emit(runs, w2, emissions, hold)
        assert len(w2.texts()) == len(w1.texts()) == 25 and w2.refused == w1.refused == 15
        assert runs.stats == one.stats and runs.stats["writer_full"] == 15
        assert runs.rule_refused == one.rule_refused and sum(runs.rule_refused.values()) > 15


def test_an_encoder_error_stops_the_run_after_the_records_before_it_went_out() -> None:
    emissions = [emission(i) for i in range(8)]
    emissions[5] = emissions[5]._replace(first="late")  # not a time: the Python encoder raises, one by one too
    for runs in (False, True):
        w = HoldingWriter(10**6)
        p = pipeline(w, runs)
        try:
            p._emit(emissions)
        except (TypeError, ValueError):
            pass
        else:
            raise AssertionError("no error")
        assert len(w.texts()) == 5 and p.stats["records"] == 5


def test_submit_many_takes_what_submit_would_take_and_only_in_a_batch(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit.jsonl", queue_size=5, compress=False)
    records = [RecordText(f'{{"n":{n},', "", "}") for n in range(8)]
    assert writer.submit_many(records) == 0  # outside a batch: one by one (inline writes, wake-ups)
    writer.hold()
    assert writer.submit_many(records[:3]) == 3
    assert writer.submit_many(records[3:]) == 2  # the room left
    assert writer.submit(records[7]) is False
    writer.release()
    assert writer.queue_fill() == 1.0
    writer.hold()
    writer._closing = True
    assert writer.submit_many(records) == 0
