"""auditlog.verdicts.VerdictTally fed by the writer: verdicts of the records in the file, latency of those written
at once."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path
from typing import Any, Callable

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

from scapy.layers.inet import IP, TCP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.chain import RecordText  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from auditlog.verdicts import LATENCY_BUCKETS, VerdictTally  # noqa: E402
from auditlog.writer import AuditWriter  # noqa: E402
from tests.support.audit_pipeline import MAC, context, pin, udp_to  # noqa: E402
from tests.support.audit_writer import lines_of, live, make_writer  # noqa: E402, F401 (fixtures)


def _record(verdict: tuple[str, str, str] | None, received: float = 0.0) -> RecordText:
    text = RecordText("", "", "")
    text.verdict, text.received = verdict, received
    return text


def test_the_tally_counts_records_by_verdict_and_skips_the_writers_own_records() -> None:
    tally = VerdictTally()
    tally.written([_record(("Drop", "ingress", "t")), _record(("Drop", "ingress", "t")),
                   _record(("Allow", "egress", "")), _record(None)], now=10.0)
    tally.written([_record(("Drop", "ingress", "t"))], now=11.0)
    assert tally.verdicts() == {("Drop", "ingress", "t"): 3, ("Allow", "egress", ""): 1}


def test_records_of_one_read_are_counted_each_and_a_record_without_the_facts_is_not_counted() -> None:
    tally = VerdictTally()
    one_read = [_record(("Drop", "ingress", "t"), 99.9996) for _ in range(70)]  # one read: one received time
    tally.written([*one_read, _record(("Reject", "ingress", "t"), 99.9996), _record(None, 99.9996)], now=100.0)
    tally.written([object(), _record(("Drop", "ingress", "t"), 99.9992)], now=100.0)  # a caller's own type
    assert tally.verdicts() == {("Drop", "ingress", "t"): 71, ("Reject", "ingress", "t"): 1}
    lat = tally.latency()
    assert lat.count == 72 and lat.buckets[0] == 0 and lat.buckets[2] == 71 and lat.buckets[3] == 72
    assert abs(lat.sum - (71 * 0.0004 + 0.0008)) < 1e-9


def test_latency_buckets_are_cumulative_le_bounds_and_only_records_written_at_once_count() -> None:
    tally = VerdictTally()
    now = 1000.0
    tally.written([_record(("Drop", "", ""), now - 0.0001),   # exactly the first bound: in it (le)
                   _record(("Drop", "", ""), now - 0.003),    # in 0.005
                   _record(("Drop", "", ""), now - 2.0),      # beyond 1 s: +Inf only
                   _record(("Drop", "", ""), now + 1.0),      # the clock stepped back: 0
                   _record(("Drop", "", ""))], now)            # waited for its window: not observed
    lat = tally.latency()
    assert lat.count == 4 and len(lat.buckets) == len(LATENCY_BUCKETS) + 1
    by_bound = dict(zip((*LATENCY_BUCKETS, float("inf")), lat.buckets))
    assert by_bound[0.0001] == 2 and by_bound[0.0025] == 2 and by_bound[0.005] == 3 and by_bound[1.0] == 3
    assert by_bound[float("inf")] == 4
    assert abs(lat.sum - 2.0031) < 1e-6


TCP_FRAME = bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1000, dport=80))


def _feed(writer: AuditWriter, now: Callable[[], float]) -> None:
    """Allow (at once), Drop (first at once, the rest in one window) and Reject packet-ins through the pipeline."""
    async def run() -> None:
        pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=now)
        for i in range(5):
            pipeline(pin(udp_to(2000 + i), 100.0 + i * 0.01, disposition=0))  # five Allows
        for i in range(30):
            pipeline(pin(udp_to(53), 100.0 + i * 0.01, disposition=1))        # one dropped flow
        pipeline(pin(TCP_FRAME, 100.2, disposition=2))                          # one Reject
        await pipeline.close()
    asyncio.run(run())


def test_the_verdict_counts_equal_the_records_in_the_file_by_disposition(
        live: Path, make_writer: Callable[..., AuditWriter]) -> None:  # noqa: F811 (fixtures)
    tally = VerdictTally()
    writer = make_writer(live, on_written=tally.written, clock=lambda: 100.5)
    _feed(writer, lambda: 101.0)
    assert writer.flush_wait(10)
    records = lines_of(live)
    in_file = Counter((r["npaudit"]["disposition"], r["network"].get("direction", ""), r["rule"].get("category", ""))
                      for r in records)
    assert tally.verdicts() == dict(in_file) == {("Allow", "ingress", "securityops"): 5,
                                                  ("Drop", "ingress", "securityops"): 2,
                                                  ("Reject", "ingress", "securityops"): 1}
    # Observed: the five Allows, the Drop flow's first record and the Reject; not the Drop window's record.
    lat = tally.latency()
    assert lat.count == 7
    assert abs(lat.sum - sum(100.5 - t for t in (100.0, 100.01, 100.02, 100.03, 100.04, 100.0, 100.2))) < 1e-6


def test_a_failing_counter_never_costs_a_record(live: Path, make_writer: Callable[..., AuditWriter]) -> None:  # noqa: F811
    def broken(records: Any, now: float) -> None:
        raise RuntimeError("counting failed")

    writer = make_writer(live, on_written=broken)
    _feed(writer, lambda: 101.0)
    assert writer.flush_wait(10)
    assert len(lines_of(live)) == 8
    assert writer.snapshot().lost() == {}
