"""A run of packet-ins taken in one call (AuditPipeline.take_run, the aggregator's add_run) gives what __call__ gives
one by one: the same records in the same order, the same counts per rule, the same overload looks at the backlog."""

from __future__ import annotations

from typing import Any

import pytest

from auditlog.aggregate import Aggregator
from auditlog.overload import FULL, PORTS
from auditlog.pipeline import _CHECK_EVERY, AuditPipeline
from auditlog.record_fast import aggregator, built
from packetin.model import PacketIn
from tests.support.audit_overload import Backlog, context, overload, pin
from tests.support.audit_pipeline import Writer

assert built(), "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev)"

ALLOW, DROP = 0, 1


def stream(n: int, t0: float = 100.0) -> list[PacketIn]:
    """New keys, repeats of recent ones (aggregated), an Allow now and then, a cut frame, a second client."""
    pins = []
    for i in range(n):
        at = t0 + i * 0.001
        if i % 7 == 3:
            pins.append(pin("10.0.0.1", 1000, 2000 + i - 3, at))  # a repeat of a key four packet-ins back
        elif i % 11 == 5:
            pins.append(pin("10.0.0.1", 1000, 2000 + i, at, disposition=ALLOW))
        elif i % 13 == 6:
            p = pin("10.0.0.3", 1000, 2000 + i, at)
            pins.append(p._replace(packet=p.packet[:40]))  # cut inside the UDP header: truncated
        else:
            pins.append(pin("10.0.0.1" if i % 2 else "10.0.0.5", 1000, 2000 + i, at, tcp=i % 5 == 0))
    return pins


def records(writer: Writer) -> list[dict[str, Any]]:
    out = []
    for seq, text in enumerate(writer.records, 1):
        text.seal("0" * 64, seq)
        r = text.record()
        r["event"]["id"] = r["event"]["id"][16:]  # the per-process random half differs; the counter must not
        out.append(r)
    return out


def take_in_runs(p: AuditPipeline, pins: list[PacketIn], step: int) -> list[int]:
    """pins as the demux hands a read's slice to PolicyPacketIns.handle_run: runs where the pipeline takes them,
    the rest to __call__. The indexes that went to __call__."""
    one_by_one = []
    for start in range(0, len(pins), step):
        end = min(len(pins), start + step)
        i = start
        while i < end:
            k = p.take_run(pins, i, end) if p.takes_runs else i
            if k >= end:
                break
            one_by_one.append(k)
            try:
                p(pins[k])
            except TypeError:
                pass
            i = k + 1
    return one_by_one


def pipelines(backlog: Backlog | None = None) -> tuple[tuple[AuditPipeline, Writer, Backlog], ...]:
    out = []
    for _ in range(2):
        b = Backlog()
        w = Writer()
        out.append((AuditPipeline(context(), w, aggregator(window=0.05), wall_clock=lambda: 100.0,
                                  overload=overload(b) if backlog is not None else None), w, b))
    return tuple(out)


@pytest.mark.parametrize("step", [1, 5, 64, 255, 1000])
def test_a_run_gives_the_records_and_counts_of_one_by_one(step: int) -> None:
    pins = stream(700)
    (one, w1, _), (runs, w2, _) = pipelines()
    for p in pins:
        one(p)
    assert take_in_runs(runs, pins, step) == []  # every packet-in in a run: none needed __call__
    assert len(w1.records) > 500 and records(w2) == records(w1)
    assert runs.stats == one.stats and runs.stats["decode_truncated"] > 0
    assert runs.rule_packet_ins == one.rule_packet_ins == {7: 700}
    assert runs._agg.stats == one._agg.stats
    assert runs._decoded == one._decoded
    assert runs.encoder.counts() == one.encoder.counts()
    t = 101.0  # what is still open closes the same way
    assert [e.key for e in runs._agg.flush(t)] == [e.key for e in one._agg.flush(t)]


def test_the_backlog_is_looked_at_on_the_same_packet_ins_and_a_coarse_level_ends_the_runs() -> None:
    pins = stream(600)
    (one, w1, b1), (runs, w2, b2) = pipelines(Backlog())
    looked: dict[str, list[float]] = {"one": [], "runs": []}
    for name, p in (("one", one), ("runs", runs)):
        ov = p._overload
        assert ov is not None
        real = ov.update
        ov.update = lambda now, real=real, name=name: (looked[name].append(now), real(now))[1]  # type: ignore[method-assign]
    for i, p in enumerate(pins):
        b1.fill = 0.6 if 300 <= i < 420 else 0.0  # coarse from the first look past 300, full below the low mark
        one(p)
    went_alone = []
    i = 0
    while i < len(pins):  # the backlog as the stream goes, the same for both
        b2.fill = 0.6 if 300 <= i < 420 else 0.0
        end = min(len(pins), i + 100)
        k = runs.take_run(pins, i, end) if runs.takes_runs else i
        if k < end:
            went_alone.append(k)
            b2.fill = 0.6 if 300 <= k < 420 else 0.0
            runs(pins[k])
            k += 1
        i = k
    assert looked["runs"] == looked["one"] and len(looked["one"]) > 100  # every 64th, then every one while coarse
    assert went_alone[:5] == [0, _CHECK_EVERY, 2 * _CHECK_EVERY, 3 * _CHECK_EVERY, 4 * _CHECK_EVERY]  # the looks
    assert set(range(5 * _CHECK_EVERY, 421)) <= set(went_alone)  # coarse from the look at 320: one by one
    assert 421 not in went_alone and 420 + _CHECK_EVERY in went_alone  # full again at 420: runs again
    assert records(w2) == records(w1)
    assert runs.stats == one.stats and runs.stats["coarsened"] > 0
    assert runs.rule_packet_ins == one.rule_packet_ins
    assert runs._overload is not None and one._overload is not None
    assert runs._overload.stats(200.0) == one._overload.stats(200.0)
    assert runs._overload.level == FULL


def test_a_packet_in_the_aggregator_does_not_take_stops_the_run_for_call_to_say_what_is_wrong() -> None:
    pins = stream(50)
    pins[20] = pins[20]._replace(total_len="sixty")  # type: ignore[arg-type]
    pins[30] = pins[30]._replace(rule_id=None)  # type: ignore[arg-type]
    (one, w1, _), (runs, w2, _) = pipelines()
    failed = []
    for i, p in enumerate(pins):
        try:
            one(p)
        except TypeError:
            failed.append(i)
    assert failed == [20]  # a rule id None is __call__'s to take (no rule)
    assert runs.take_run(pins, 0, 50) == 20
    with pytest.raises(TypeError):
        runs(pins[20])
    assert runs.take_run(pins, 21, 50) == 30
    runs(pins[30])
    assert runs.take_run(pins, 31, 50) == 50
    assert records(w2) == records(w1)
    assert runs.stats == one.stats and runs.rule_packet_ins == one.rule_packet_ins


def test_add_run_emits_what_add_emits_packet_in_by_packet_in() -> None:
    pins = stream(400)
    p = AuditPipeline(context(), Writer(), aggregator(window=0.05), wall_clock=lambda: 100.0)
    from auditlog.pipeline import _RUN_LAYOUT

    decode = p._decode_frame
    by_run: dict[int, int] = {}
    one, runs = aggregator(window=0.05), aggregator(window=0.05)
    out: list[Any] = []
    assert runs.add_run(pins, 0, 400, decode, _RUN_LAYOUT, by_run, out)[0] == 400  # type: ignore[attr-defined]
    expected = []
    for q in pins:
        s = decode(q.packet)
        disposition = q.reg7 & 0xF
        key = (q.rule_id, disposition, s.src_ip, s.dst_ip, s.protocol,
               s.dst_port if s.dst_port is not None else s.icmp_type)
        expected += one.add(key, (q, s), q.total_len, q.received_at, disposition != ALLOW)
    assert out == expected and len(out) > 300
    assert by_run == {7: 400} and runs.stats == one.stats
    assert isinstance(Aggregator(), Aggregator) and not hasattr(Aggregator, "add_run")  # Python's: __call__ only
    assert not AuditPipeline(context(), Writer(), Aggregator(window=0.05)).takes_runs


def test_add_run_refuses_a_layout_out_of_its_tuples_and_bounds_out_of_the_list() -> None:
    agg = aggregator()
    with pytest.raises(ValueError, match="layout"):
        agg.add_run([], 0, 0, len, (10, 7, 4, 5, 8, 99, 14, 13, 3, 4, 5, 8, 9, 15, 0), {}, [])  # type: ignore[attr-defined]
    from auditlog.pipeline import _RUN_LAYOUT

    with pytest.raises(IndexError):
        agg.add_run([], 0, 1, len, _RUN_LAYOUT, {}, [])  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        agg.add_run((), 0, 0, len, _RUN_LAYOUT, {}, [])  # type: ignore[attr-defined]


def test_a_run_level_stays_full_only_while_full() -> None:
    (p, _, b), _ = pipelines(Backlog())
    assert p.takes_runs
    b.fill = 0.6
    p(pin("10.0.0.1", 1, 2, 100.0))  # the first packet-in looks at the backlog
    assert p._level == PORTS and not p.takes_runs
    assert p.take_run([pin("10.0.0.1", 1, 3, 100.0)], 0, 1) == 0  # nothing taken while coarse


def test_add_run_holds_its_packet_in_and_rereads_the_list_when_the_decoder_changes_it() -> None:
    from auditlog.pipeline import _RUN_LAYOUT
    from auditlog.record_fast import frame_decoder

    pins = stream(10)
    real, calls = frame_decoder(), []

    def decode(frame: bytes) -> Any:
        calls.append(frame)
        if len(calls) == 3:
            pins.clear()  # the third packet-in's only reference is now add_run's own
        return real(frame)

    stop, _, last = aggregator().add_run(pins, 0, 10, decode, _RUN_LAYOUT, {}, out := [])  # type: ignore[attr-defined]
    assert stop == 3 and len(out) == 3 and last is not None and last[0].packet == calls[2]
