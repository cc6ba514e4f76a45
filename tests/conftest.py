"""Suite-wide: tests under integration/ and e2e/ are marked and need root; they never skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_ROOT_DIRS = tuple(Path(__file__).parent / d for d in ("integration", "e2e"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(d in Path(item.fspath).parents for d in _ROOT_DIRS):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _require_root(request: pytest.FixtureRequest) -> None:
    # Without root these fail rather than skip, so CI can never count them as passing.
    if request.node.get_closest_marker("integration") and os.geteuid() != 0:
        pytest.fail("integration and end-to-end tests need root (network namespaces, OVS); "
                    "run `make test` as root")
