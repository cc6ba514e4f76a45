"""A full list is let go of item by item as it is validated: with a cluster's 10,000 Pods, holding every listed
object while the models are made left that much heap scattered under the models (bench/kubernetes_pods_rss.py:
about 20 MB of the agent's RSS)."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from policy_agent.sources import kubernetes as source_module
from tests.support.fake_apiserver import PODS, FakeApiServer
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)
from tests.support.k8s_objects import pod
from tests.support.kubernetes_rig import Rig, run

COUNT = 40


def _alive(names: set[str], exclude: set[int]) -> int:
    """Top-level dicts of the Pods `names` still alive in this process, the server's own copies left out."""
    return sum(1 for o in gc.get_objects()
               if isinstance(o, dict) and id(o) not in exclude and isinstance(m := o.get("metadata"), dict)
               and m.get("name") in names)


def test_listed_objects_are_released_as_they_are_validated(server: FakeApiServer,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pods = [pod("web", f"bulk-{i}", "node-b", f"10.10.2.{i + 2}", {"app": "bulk"}) for i in range(COUNT)]
    server.set_items(PODS, pods, "50000")
    served = {id(p) for p in pods}
    alive: list[int] = []  # at each validation: how many of the items validated before it are still held
    done: set[str] = set()
    validate = source_module.load_documents

    def counting(docs: list[Any], source: str) -> Any:
        name = str(docs[0]["metadata"]["name"])
        if source == "k8s:pods" and name.startswith("bulk-"):
            alive.append(_alive(done, served))
            done.add(name)
        return validate(docs, source=source)

    monkeypatch.setattr(source_module, "load_documents", counting)

    async def body() -> None:
        async with Rig(server) as r:
            assert sum(1 for k in r.engine.pods if k[1].startswith("bulk-")) == COUNT

    run(body())
    assert len(alive) == COUNT
    # Before: every listed item and a copy of it stayed alive until the last was validated (2 * (COUNT - 1)).
    assert alive == [0] * COUNT, alive


def test_duplicate_key_in_a_list_later_item_wins(server: FakeApiServer) -> None:  # noqa: F811
    first = pod("web", "bulk-dup", "node-b", "10.10.2.2", {"v": "1"})
    second = pod("web", "bulk-dup", "node-b", "10.10.2.3", {"v": "2"})
    server.set_items(PODS, [first, second], "50001")

    async def body() -> None:
        async with Rig(server) as r:
            assert r.engine.pods[("web", "bulk-dup")].ips == ("10.10.2.3",)

    run(body())
