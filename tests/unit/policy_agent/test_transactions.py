"""An apply or delete is all or nothing: the engine, the (fake) switch and the applied store
change together or not at all, and nothing a change does can wedge the engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp

from policy_agent.engine import PolicyRejected
from policy_agent.ovs import tables
from policy_agent.policy.model import (
    Action, AppliedTo, Direction, LabelSelector, Namespace, Pod, Policy, PolicyKind, PortSpec, Rule,
)
from tests.support.channel_rig import run, sock_path  # noqa: F401 (fixtures)
from tests.support.engine_doubles import Info
from tests.support.policy_node import node, state_dir  # noqa: F401 (fixtures)

NS_AND_POD = """
apiVersion: v1
kind: Namespace
metadata: {name: x}
---
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: x, labels: {app: web}}
"""
DROP_81 = """
apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: drop-81}
spec:
  priority: 1
  appliedTo: [{podSelector: {matchLabels: {app: web}}}]
  ingress: [{action: Drop, ports: [{protocol: TCP, port: 81}]}]
"""


POD_A = Info("x", "a", "10.0.0.2", "02:00:0a:00:00:02", 5)


def test_a_set_whose_store_write_fails_is_not_enforced(sock_path: str, state_dir: Path) -> None:
    """Reported: an ACNP dropping TCP 81, applied with an object that fails later (the store
    write), got rc 1 and yet 81 was blocked; now nothing of the set is in force anywhere."""
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            assert (await n.request("apply", NS_AND_POD))["ok"]
            await n.engine.pod_added(POD_A)
            before, stored = n.switch_table(), n.store_path.read_text()
            n.store_path.unlink()
            n.store_path.mkdir()  # os.replace onto a directory fails: the write is refused
            reply = await n.request("apply", DROP_81)
            assert not reply["ok"] and len(reply["errors"]) == 1 and "nothing was applied" in reply["errors"][0]
            assert not n.blocks_81() and n.switch_table() == before
            assert not n.engine.policies
            n.store_path.rmdir()
            n.store_path.write_text(stored)
            assert (await n.request("apply", DROP_81))["ok"]  # not wedged: the same set goes in now
            assert n.blocks_81() and "drop-81" in n.store_path.read_text()
    run(main(), timeout=20)


def test_a_set_the_switch_refuses_changes_nothing(sock_path: str, state_dir: Path) -> None:
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            assert (await n.request("apply", NS_AND_POD))["ok"]
            await n.engine.pod_added(POD_A)
            before, stored = n.switch_table(), n.store_path.read_text()
            n.r.fake.refuse_table = tables.T_INGRESS
            reply = await n.request("apply", DROP_81)
            assert not reply["ok"] and "switch did not take the change" in reply["errors"][0]
            assert n.switch_table() == before and not n.engine.policies
            assert n.store_path.read_text() == stored
            n.r.fake.refuse_table = None
            assert (await n.request("apply", DROP_81))["ok"] and n.blocks_81()
    run(main(), timeout=20)


def test_a_policy_that_cannot_compile_never_wedges_the_engine(sock_path: str, state_dir: Path) -> None:
    """Reported: a rule name with lone surrogates was stored, then every apply and CNI ADD failed."""
    bad = Policy(PolicyKind.ACNP, "fire", tier="application", priority=1,
                 applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "web"),))),),
                 rules=(Rule(Direction.INGRESS, Action.DROP, ports=(PortSpec("TCP", 9),), name="fire-\ud83d\udd25"),))

    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            await n.engine.apply([Namespace("x")], [Pod("x", "a", (("app", "web"),))])
            with pytest.raises(PolicyRejected, match="ClusterNetworkPolicy/fire: cannot be compiled"):
                await n.engine.apply(policies=[bad])
            assert not n.engine.policies
            await n.engine.pod_added(POD_A)  # CNI ADD still works
            assert (await n.request("apply", DROP_81))["ok"] and n.blocks_81()
    run(main(), timeout=20)


def big_policy(rules: int) -> Policy:
    return Policy(PolicyKind.ACNP, "big", tier="application", priority=2,
                  applied_to=(AppliedTo(pod_selector=LabelSelector((("app", "web"),))),),
                  rules=tuple(Rule(Direction.INGRESS, Action.DROP, ports=(PortSpec("TCP", 1000 + i),), name=f"r{i}")
                              for i in range(rules)))


def test_a_10000_rule_apply_and_delete_keep_answering_echo(sock_path: str, state_dir: Path) -> None:
    """Reported: a ~10,000-rule apply or delete blocked the event loop until OVS dropped the
    connection for want of echo replies. The switch's echo requests sent after the change
    starts are answered before any of the change reaches the switch (it compiles and
    encodes off the loop), and the channel never reconnects."""
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            await n.engine.apply([Namespace("x")], [Pod("x", "a", (("app", "web"),))])
            await n.engine.pod_added(POD_A)

            async def echoes() -> None:
                while True:
                    n.r.fake.send(bytes.fromhex("0602000800000000"))  # OFPT_ECHO_REQUEST
                    await asyncio.sleep(0.001)

            for change in (lambda: n.engine.apply(policies=[big_policy(10_000)]),
                           lambda: n.engine.delete(policies=[big_policy(10_000)])):
                start = len(n.r.fake.received)
                pinger = asyncio.create_task(echoes())
                try:
                    await change()
                finally:
                    pinger.cancel()
                sent = [t for t, _ in n.r.fake.received[start:]]
                first_change = min(sent.index(t) for t in (ofp.OFPT_FLOW_MOD, ofp.OFPT_BUNDLE_CONTROL) if t in sent)
                assert ofp.OFPT_ECHO_REPLY in sent[:first_change]
            assert n.r.chan.connects == 1
            assert not any(("tcp_dst", 1000) in f.match.items() for f in n.r.fake.flows.values())
    run(main(), timeout=120)


# --- Tiers across applies -----------------------------------------------------------------

TIER_OPS = """
apiVersion: crd.antrea.io/v1beta1
kind: Tier
metadata: {name: ops}
spec: {priority: 10}
"""
OPS_POLICY = """
apiVersion: crd.antrea.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  priority: 1
  tier: ops
  appliedTo: [{podSelector: {}}]
  ingress: [{action: Drop, ports: [{protocol: TCP, port: 81}]}]
"""


def test_a_policy_may_name_a_tier_applied_earlier(sock_path: str, state_dir: Path) -> None:
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            assert (await n.request("apply", TIER_OPS))["ok"]
            reply = await n.request("apply", OPS_POLICY % "freeze")
            assert reply["ok"], reply
            assert n.engine.policies[("ClusterNetworkPolicy", "", "freeze")].tier == "ops"
            assert (await n.request("delete", OPS_POLICY % "freeze"))["ok"]  # alone, naming the Tier
    run(main(), timeout=20)


def test_a_second_tier_with_a_taken_priority_is_rejected(sock_path: str, state_dir: Path) -> None:
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            assert (await n.request("apply", TIER_OPS))["ok"]
            reply = await n.request("apply", TIER_OPS.replace("name: ops", "name: sec"))
            assert reply == {"ok": False, "errors": ["Tier/sec: spec.priority: 10 is already used by Tier/ops"]}
            assert set(n.engine.tiers) == {"ops"} and "sec" not in n.store_path.read_text()
    run(main(), timeout=20)


def test_deleting_a_tier_in_use_is_rejected_naming_its_policies(sock_path: str, state_dir: Path) -> None:
    async def main() -> None:
        async with node(sock_path, state_dir) as n:
            assert (await n.request("apply", TIER_OPS + "---" + OPS_POLICY % "b" + "---" + OPS_POLICY % "a"))["ok"]
            reply = await n.request("delete", TIER_OPS)
            assert reply == {"ok": False, "errors": [
                "Tier/ops: cannot be deleted: used by ClusterNetworkPolicy/a, ClusterNetworkPolicy/b"]}
            assert set(n.engine.tiers) == {"ops"} and len(n.engine.policies) == 2
            assert (await n.request("delete", TIER_OPS + "---" + OPS_POLICY % "a" + "---" + OPS_POLICY % "b"))["ok"]
            assert not n.engine.tiers and not n.engine.policies
    run(main(), timeout=20)
