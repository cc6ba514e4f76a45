"""packetin.gctune: the heap start-up built is frozen, young collections are rarer."""

from __future__ import annotations

import gc

from packetin import gctune


def test_settle_heap_freezes_and_raises_thresholds() -> None:
    before = gc.get_threshold()
    try:
        gc.unfreeze()
        gc.set_threshold(700, 10, 10)
        built_at_start = [[] for _ in range(10)]  # tracked containers alive across the freeze
        gctune.settle_heap()
        assert gc.get_freeze_count() >= len(built_at_start)
        assert gc.get_threshold() == (gctune.GEN0, gctune.GEN1, gctune.GEN2)
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
