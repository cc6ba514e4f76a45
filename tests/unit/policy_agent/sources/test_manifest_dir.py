"""ManifestDirectory against a sink that records: changes applied, bad edits rejected whole, removals deleted."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Iterable

from policy_agent.policy.model import Namespace, Pod, Policy, Tier
from policy_agent.sources.manifest_dir import ManifestDirectory


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None:
        self.calls.append(("apply", [o.name for o in [*namespaces, *pods, *tiers, *policies]]))

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = ()) -> None:
        self.calls.append(("delete", [o.name for o in [*namespaces, *pods, *tiers, *policies]]))


def acnp(name: str, action: str = "Drop") -> str:
    return textwrap.dedent(f"""\
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {{name: {name}}}
        spec:
          priority: 5
          appliedTo: [{{podSelector: {{}}}}]
          ingress: [{{action: {action}, from: [{{namespaceSelector: {{}}}}]}}]
        """)


def test_directory_changes_are_applied_and_bad_edits_keep_the_previous_set(tmp_path: Path) -> None:
    async def main() -> None:
        sink = RecordingSink()
        source = ManifestDirectory(tmp_path, sink, poll_interval=60.0)
        (tmp_path / "a.yaml").write_text(acnp("block-a"))
        (tmp_path / "b.yaml").write_text(acnp("block-b"))
        assert await source.sync()
        assert sink.calls == [("apply", ["block-a", "block-b"]), ("delete", [])]
        assert not await source.sync()  # nothing changed on disk: nothing re-read
        sink.calls.clear()
        (tmp_path / "b.yaml").write_text(acnp("block-b", action="Deny"))
        assert not await source.sync()
        assert sink.calls == [] and any("block-b" in e and "Deny" in e for e in source.errors)
        (tmp_path / "b.yaml").unlink()
        assert await source.sync()
        assert sink.calls == [("apply", ["block-a"]), ("delete", ["block-b"])] and source.errors == []

    asyncio.run(main())
