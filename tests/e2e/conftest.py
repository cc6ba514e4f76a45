"""End-to-end fixtures: the agent as a process, Pods through CNI (root; never skipped)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()
