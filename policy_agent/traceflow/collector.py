"""Prometheus export of the trace service's counters (read at scrape time)."""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from policy_agent.traceflow.service import TraceStats


class TraceCollector:
    def __init__(self, stats: TraceStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily("npaudit_traceflow", "Traces run (npaudit trace), by outcome",
                                    labels=["outcome"])
        for outcome, n in self._stats.outcomes.items():
            total.add_metric([outcome], n)
        yield total
        yield CounterMetricFamily("npaudit_traceflow_suppressed",
                                  "Policy packet-ins of trace packets, neither audited nor answered",
                                  value=self._stats.suppressed)
        yield CounterMetricFamily("npaudit_traceflow_received", "Other nodes' trace packets traced here (their "
                                  "destination) and reported back", value=self._stats.received)
