"""Garbage-collector settings for a process that allocates objects per packet-in."""

from __future__ import annotations

import gc

# Young-generation threshold: CPython's 700 means a gen-0 collection every ~100
# packet-ins on the audit path (each makes a few tuples and objects), and every
# tenth of those walks gen 1, every hundredth everything start-up loaded (os-ken,
# ovsdbapp, the Kubernetes client). These settings, after a freeze, keep the
# collector a small share of the audit path's time (bench/auditlog_throughput.py,
# pipeline_capacity).
GEN0 = 20_000
GEN1 = 50
GEN2 = 50


def settle_heap() -> None:
    """Call once start-up is done: move what exists into the permanent generation
    (never scanned again) and make collections of what packets create rarer.

    Objects made per packet-in are short-lived and acyclic, so reference counting
    frees them; the collector is only for the rare cycle, which can wait.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
