"""End-to-end fixtures: the agent as a process, Pods through CNI (root; never skipped)."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.cluster import Cluster


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The agent and its embedded OVS, started; a module's `pytestmark = pytest.mark.cluster(**kwargs)`
    passes Cluster its keyword arguments (e.g. gateway=True)."""
    marker = request.node.get_closest_marker("cluster")
    with Cluster(**(marker.kwargs if marker is not None else {})) as c:
        yield c
