"""Overload mode: detail degrades (ports, then peers), counts never do; hysteresis; records say so.

The backlog and the clock are numbers the test sets; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)


from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.jcs import canonical  # noqa: E402
from auditlog.overload import FULL, PEERS, PORTS, Overload  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from packetin.model import PacketIn  # noqa: E402
from packetin.reader import InputPressure  # noqa: E402
from policy_agent.config.loader import ConfigError, loads  # noqa: E402
from tests.support.audit_pipeline import Writer  # noqa: E402
from tests.support.audit_overload import Backlog, DROP, context, overload, pin  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
VALIDATOR = jsonschema.Draft202012Validator(json.loads((ROOT / "config" / "audit-record.schema.json").read_text()))
ALLOW = 0
def test_overload_enters_above_the_high_mark_and_leaves_only_below_the_low_mark() -> None:
    backlog = Backlog()
    ov = overload(backlog)
    levels = []
    for t, fill in enumerate([0.0, 0.4, 0.5, 0.3, 0.9, 0.6, 0.3, 0.11, 0.1, 0.4, 0.49, 0.85, 0.05]):
        backlog.fill = fill
        levels.append(ov.update(float(t)))
    assert levels == [FULL, FULL, PORTS, PORTS, PEERS, PEERS, PORTS, PORTS, FULL, FULL, FULL, PEERS, FULL]
    stats = ov.stats(12.0)
    # Coarsened from t=2 to t=8, and from t=11 to t=12.
    assert (stats.entered, stats.seconds, stats.level) == (2, 7.0, FULL)
    backlog.fill = 0.6
    ov.update(20.0)
    assert ov.stats(21.5).seconds == 8.5  # an ongoing spell counts up to now


def test_marks_out_of_order_are_refused_at_load_and_by_the_class() -> None:
    with pytest.raises(ConfigError, match="audit.overload: needs low_mark < high_mark <= peers_mark"):
        loads("audit:\n  overload: {high_mark: 0.1, low_mark: 0.2}\n", environ={})
    with pytest.raises(ConfigError, match=r"audit.overload.high_mark: must be > 0 and <= 1"):
        loads("audit:\n  overload: {high_mark: 1.5}\n", environ={})
    with pytest.raises(ValueError):
        Overload(Backlog(), high_mark=0.9, peers_mark=0.5, low_mark=0.1)


def run_flood(pipeline: AuditPipeline, backlog: Backlog, n: int, *, coarse_from: int, coarse_to: int,
              fill: float = 0.6) -> list[PacketIn]:
    """n Drop packet-ins, each a new key (source port and destination port vary), 1 ms apart;
    the backlog is at `fill` for packet-ins coarse_from..coarse_to-1 and empty otherwise."""
    sent = []
    for i in range(n):
        backlog.fill = fill if coarse_from <= i < coarse_to else 0.0
        p = pin(f"10.1.{i % 3}.1", 1000 + i, 2000 + i, 100.0 + i / 1000)
        sent.append(p)
        pipeline(p)
    return sent


def records(writer: Writer) -> list[dict]:
    out = []
    for text in writer.records:
        record = text.record()
        VALIDATOR.validate(record)
        out.append(record)
    return out


def test_in_overload_every_packet_is_counted_in_fewer_records_marked_coarsened() -> None:
    backlog = Backlog()
    writer = Writer()
    clock = [0.0]
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: clock[0],
                             overload=overload(backlog))
    # 3000 new keys: full detail, then 2000 while the queue is past the high mark, then full again.
    run_flood(pipeline, backlog, 3000, coarse_from=500, coarse_to=2500)
    clock[0] = 200.0
    asyncio.run(pipeline.close())
    recs = records(writer)
    aggregate = [r["npaudit"]["aggregate"] for r in recs]
    assert sum(a["packets"] for a in aggregate) == 3000 == pipeline.stats["packet_ins"]
    coarse = [r for r in recs if "coarsened" in r["npaudit"]["aggregate"]]
    full = [r for r in recs if "coarsened" not in r["npaudit"]["aggregate"]]
    # Full detail: one record per key. Overload only switches over at the next look at the
    # backlog (every 64 packet-ins at full detail), and comes back at once.
    assert 500 <= len(full) <= 500 + 64 + 500
    assert len(coarse) <= 2 * 3 * 3  # per source address, a "first" and an aggregate per 1 s window
    assert pipeline.stats["coarsened"] == len(coarse) and pipeline.stats["records"] == len(recs)
    coarse_packets = sum(r["npaudit"]["aggregate"]["packets"] for r in coarse)
    assert sum(r["npaudit"]["aggregate"]["keys"] for r in coarse) == coarse_packets  # every key was new
    assert coarse_packets == 3000 - len(full)
    for r in coarse:
        assert r["npaudit"]["aggregate"]["coarsened"] == "ports"
        assert "port" not in r["source"] and "port" not in r["destination"]
        assert r["destination"]["ip"] == "10.0.0.2" and r["source"]["ip"].startswith("10.1.")
        assert r["network"]["packets"] == r["npaudit"]["aggregate"]["packets"]
    stats = pipeline.snapshot()
    assert stats.overload is not None and stats.overload.entered == 1 and stats.overload.level == FULL
    assert stats.overload.seconds == pytest.approx(2.0 - 0.064, abs=0.07)


def test_the_distinct_key_count_counts_keys_not_packets() -> None:
    backlog = Backlog()
    backlog.fill = 0.6
    writer = Writer()
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload(backlog))
    for i in range(100):  # 100 packets of 10 keys, then 1 packet of an 11th
        pipeline(pin("10.1.0.1", 5000, 80 + i % 10, 100.0 + i / 1000))
    pipeline(pin("10.1.0.1", 5000, 99, 100.2))
    asyncio.run(pipeline.close())
    recs = records(writer)
    assert [(r["npaudit"]["aggregate"]["packets"], r["npaudit"]["aggregate"]["keys"]) for r in recs] == \
        [(1, 1), (100, 11)]


def test_past_the_peers_mark_the_peer_goes_and_the_applied_to_pod_stays() -> None:
    backlog = Backlog()
    writer = Writer()
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload(backlog))
    backlog.fill = 0.9
    for i in range(50):  # five senders, Drop and Allow: the ingress rule protects 10.0.0.2
        pipeline(pin(f"10.1.0.{i % 5 + 1}", 1000 + i, 80, 100.0 + i / 1000, disposition=DROP if i % 2 else ALLOW,
                      tcp=True))
    asyncio.run(pipeline.close())
    recs = records(writer)
    assert sum(r["npaudit"]["aggregate"]["packets"] for r in recs) == 50
    assert {r["npaudit"]["aggregate"]["coarsened"] for r in recs} == {"peers"}
    assert {r["npaudit"]["disposition"] for r in recs} == {"Allow", "Drop"}  # Allow is aggregated too
    assert len(recs) == 4  # per disposition: the first packet, then the rest
    for r in recs:
        assert "source" not in r and r["destination"] == {"ip": "10.0.0.2"}
        assert r["npaudit"]["destination"]["pod"] == {"namespace": "backend", "name": "db"}
    assert sorted(r["npaudit"]["aggregate"]["keys"] for r in recs) == [1, 1, 5, 5]  # the source port is no part of a key


def test_coarsened_records_seal_verify_and_read_back_with_npaudit_logs(tmp_path: Path) -> None:
    backlog = Backlog()
    writer = AuditWriter(tmp_path / "audit.jsonl")
    writer.start()
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload(backlog))
    run_flood(pipeline, backlog, 400, coarse_from=100, coarse_to=400)
    asyncio.run(pipeline.close())
    writer.flush_wait(10)
    writer.close()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    for line in lines:
        record = json.loads(line)
        body = {**record, "npaudit": {k: v for k, v in record["npaudit"].items() if k != "chain"}}
        assert canonical(body)  # plain JSON, nothing a re-encoder would change
    assert sum(json.loads(line)["npaudit"]["aggregate"]["packets"] for line in lines) == 400
    cli = [sys.executable, "-m", "policy_agent.cli.main"]
    verify = subprocess.run([*cli, "verify", str(tmp_path)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    logs = subprocess.run([*cli, "logs", str(tmp_path), "--to-pod", "backend/db", "-o", "compact"],
                          capture_output=True, text=True)
    assert logs.returncode == 0, logs.stderr
    coarse = [line for line in logs.stdout.splitlines() if "keys" in line]
    assert coarse and all("coarsened" in line for line in coarse)
    ported = subprocess.run([*cli, "logs", str(tmp_path), "--port", "2000", "-o", "json"], capture_output=True,
                            text=True)
    assert ported.returncode == 0 and len(ported.stdout.splitlines()) == 1  # a coarse record has no port


def test_the_schema_wants_coarsened_and_keys_together() -> None:
    backlog = Backlog()
    backlog.fill = 0.6
    writer = Writer()
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), overload=overload(backlog))
    pipeline(pin("10.1.0.1", 1, 2, 100.0))
    (record,) = records(writer)
    for member in ("coarsened", "keys"):
        broken = json.loads(json.dumps(record))
        del broken["npaudit"]["aggregate"][member]
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(broken)


def test_stays_full_says_what_update_would_keep_without_its_side_effects() -> None:
    """Overload.stays_full (the lone path's record made before a look at the backlog is due): True only at full
    detail, the backlog under the high mark, and no input pressure that can say so without side effects."""
    fill, reads_full, drops = [0.1], [False], [0]
    pressure = InputPressure(lambda: reads_full[0], lambda: drops[0])
    overload = Overload(lambda: fill[0], high_mark=0.5, peers_mark=0.9, low_mark=0.2, pressed=pressure)
    assert overload.stays_full() and overload.update(1.0) == FULL
    reads_full[0] = True  # reads coming back full: the pressure may hold the level up
    assert not overload.stays_full() and overload.pressed_updates == 0  # asked, nothing counted
    reads_full[0] = False
    fill[0] = 0.6
    assert not overload.stays_full() and overload.update(2.0) != FULL
    fill[0] = 0.1
    assert not overload.stays_full()  # coarse: update would bring full detail back, a level change
    assert overload.update(3.0) == FULL and overload.stays_full()
    assert not Overload(lambda: 0.0, high_mark=0.5, peers_mark=0.9, low_mark=0.2, pressed=lambda: False).stays_full()
    assert Overload(lambda: 0.0, high_mark=0.5, peers_mark=0.9, low_mark=0.2).stays_full()
