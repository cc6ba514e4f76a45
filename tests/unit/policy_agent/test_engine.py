"""The engine's ordering and incrementality, against a channel that records what it is sent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from packetin import messages
from policy_agent.ovs import tables
from policy_agent.engine import PodUnknown, PolicyEngine
from policy_agent.errors import OvsError
from policy_agent.ovs.megaflows import MegaflowCache
from policy_agent.policy.model import (
    Namespace, Pod,
)
from policy_agent.policy.rules import RuleRegistry
from tests.support.engine_doubles import Info, RecordingChannel, drop_web


def engine(pod_wait: float | None = None) -> tuple[PolicyEngine, RecordingChannel]:
    ch = RecordingChannel()
    return PolicyEngine(ch, RuleRegistry(), round_=3, meters=lambda: True, pod_wait=pod_wait), ch


def is_pod_flow(f: messages.FlowSpec) -> bool:
    return f.cookie == tables.cookie(3, tables.COOKIE_KIND_POD)


def test_pod_policy_and_forwarding_flows_go_in_one_bundle_policy_first() -> None:
    async def main() -> None:
        eng, ch = engine()
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
        ch.calls.clear()
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        assert [op for op, _ in ch.calls] == ["commit"]  # one round trip: one atomic bundle
        (installed, deleted), = ch.commits[-1:]
        kinds = ["pod" if is_pod_flow(f) else "policy" for f in installed]
        assert not deleted and kinds.count("pod") == 3 and kinds.index("pod") > 0
        assert kinds == sorted(kinds, key=lambda k: k == "pod")  # every policy flow before any pod flow
        assert any(("ipv4_dst", "10.0.0.2") in f.match for f in installed if not is_pod_flow(f))
    asyncio.run(main())


def test_pod_deleted_removes_forwarding_and_policy_flows_in_one_bundle() -> None:
    async def main() -> None:
        eng, ch = engine()
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        (added, _), = ch.commits[-1:]
        ch.calls.clear()
        await eng.pod_deleted(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        assert [op for op, _ in ch.calls] == ["commit"]
        (installed, deleted), = ch.commits[-1:]
        assert not installed and {f.key for f in deleted} == {f.key for f in added}
    asyncio.run(main())


def test_without_policy_flow_changes_a_pods_flows_go_in_one_plain_confirmed_batch() -> None:
    async def main() -> None:
        eng, ch = engine()
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))])
        ch.calls.clear()
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        forwarding = tables.pod_flows(3, ip="10.0.0.2", mac="02:00:0a:00:00:02", ofport=5)
        assert ch.calls == [("install", forwarding)]  # no bundle: one round trip instead of two
        ch.calls.clear()
        await eng.pod_deleted(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        assert ch.calls == [("delete", forwarding)]
    asyncio.run(main())


def test_adding_a_policy_sends_only_its_flows() -> None:
    async def main() -> None:
        eng, ch = engine()
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),)),
                                                           Pod("x", "b", (("app", "db"),))], policies=[drop_web()])
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        await eng.pod_added(Info("x", "b", "10.0.0.3", "02:00:0a:00:00:03", 6))
        ch.commits.clear()
        await eng.apply(policies=[drop_web("drop-db", "db")])
        (flows, deleted), = ch.commits
        # b's class flows (its class now includes drop-db's group) and the rule matching that class.
        klass, = {a.value for f in flows for a in f.actions if getattr(a, "name", "") == "reg5"}
        assert flows and not deleted and all(("ipv4_dst", "10.0.0.3") in f.match or ("in_port", 6) in f.match
                                             or ("reg5", klass) in f.match for f in flows)
        ch.commits.clear()
        await eng.delete(policies=[drop_web("drop-db", "db")])
        (added, deleted), = ch.commits
        assert not added and {f.key for f in deleted} == {f.key for f in flows}
    asyncio.run(main())


def test_with_a_kubernetes_source_cni_waits_for_the_pods_labels() -> None:
    async def main() -> None:
        eng, ch = engine(pod_wait=2.0)
        await eng.apply(namespaces=[Namespace("x")], policies=[drop_web()])
        add = asyncio.create_task(eng.pod_added(Info("x", "late", "10.0.0.9", "02:00:0a:00:00:09", 7)))
        await asyncio.sleep(0.1)
        assert not add.done()  # no labels yet: no policy decision, no forwarding
        await eng.apply(pods=[Pod("x", "late", (("app", "web"),))])
        await asyncio.wait_for(add, 1.0)
        installed = [f for op, flows in ch.calls if op in ("install", "commit") for f in flows]
        assert any(("ipv4_dst", "10.0.0.9") in f.match and not is_pod_flow(f) for f in installed)
    asyncio.run(main())


def test_a_pod_that_never_arrives_gets_no_network() -> None:
    async def main() -> None:
        eng, ch = engine(pod_wait=0.2)
        with pytest.raises(PodUnknown):
            await eng.pod_added(Info("x", "ghost", "10.0.0.8", "02:00:0a:00:00:08", 8))
        assert not any(is_pod_flow(f) for _, flows in ch.calls for f in flows)
        assert eng.by_ip("10.0.0.8") is None
    asyncio.run(main())


class CountingCache:
    """A DatapathCache that counts purges, or fails them with `error`."""

    def __init__(self, error: Exception | None = None) -> None:
        self.purges = 0
        self.error = error

    def purge(self) -> None:
        if self.error is not None:
            raise self.error
        self.purges += 1


def test_every_committed_policy_change_purges_the_datapath_cache_once_flows_are_in() -> None:
    async def main() -> None:
        ch = RecordingChannel()
        cache = CountingCache()
        eng = PolicyEngine(ch, RuleRegistry(), round_=3, meters=lambda: True, datapath=cache)
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))])
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        before = cache.purges
        await eng.apply(policies=[drop_web()])
        assert cache.purges == before + 1 and ch.commits[-1][0]  # the bundle went in, then the purge
        await eng.apply(policies=[drop_web()])  # the same policy again: no flow changed, nothing to purge
        assert cache.purges == before + 1
        await eng.delete(policies=[drop_web()])
        assert cache.purges == before + 2
    asyncio.run(main())


def test_a_failed_purge_is_counted_and_the_change_stands() -> None:
    async def main() -> None:
        ch = RecordingChannel()
        eng = PolicyEngine(ch, RuleRegistry(), round_=3, meters=lambda: True,
                           datapath=CountingCache(OvsError("cannot open /x/ovs-vswitchd.ctl")))
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", (("app", "web"),))], policies=[drop_web()])
        await eng.pod_added(Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5))
        assert eng.purge_failures == 1 and ("", "drop-web") in {(p.namespace, p.name) for p in eng.policies.values()}
    asyncio.run(main())


def test_a_vswitchd_that_cannot_be_reached_fails_the_purge_naming_its_socket(tmp_path: Path) -> None:
    with pytest.raises(OvsError, match=f"{tmp_path}/ovs-vswitchd.ctl"):
        MegaflowCache(tmp_path).purge()
