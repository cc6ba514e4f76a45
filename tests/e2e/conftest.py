"""End-to-end fixtures: the agent as a process, Pods through CNI (root; never skipped)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.cluster import Cluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("end-to-end tests need root (network namespaces, OVS); run `make test` as root")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.start()
        yield c
    finally:
        c.close()
