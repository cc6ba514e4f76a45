"""Atomic flow changes (OpenFlow bundles): the bytes, and what a channel user sees against the fake switch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, strategies as st
from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import bundles, messages
from packetin.errors import ChannelClosed, OpenFlowError
from tests.support.waiting import eventually
from tests.support.channel_rig import flow, ports, rig, run, sock_path  # noqa: F401 (fixtures)

OLD = [flow(1, 100, 1, in_port=1), flow(1, 100, 2, in_port=2), flow(1, 90, 3, in_port=3)]
# One new flow, one overwrite of OLD[0] (same key, new output), one delete of OLD[2].
NEW, CHANGED = flow(1, 80, 4, in_port=4), flow(1, 100, 9, in_port=1)


# --- bytes -------------------------------------------------------------------------------


@given(bundle_id=st.integers(0, 0xFFFFFFFF), xid=st.integers(0, 0xFFFFFFFF), port=st.integers(1, 0xFFFFFF00))
def test_add_message_matches_os_ken_and_carries_the_outer_xid_inside(bundle_id: int, xid: int, port: int) -> None:
    inner = messages.flow_add(flow(3, 7, port, in_port=1))
    ours = bundles.add_message(bundle_id, messages.serialize(messages.flow_add(flow(3, 7, port, in_port=1)), 0), xid)
    theirs = parser.OFPBundleAddMsg(messages.CODEC, bundle_id, bundles.FLAGS, inner, [])
    assert ours == messages.serialize(theirs, xid)
    got_id, flags, got_inner = bundles.parse_add(ours)
    assert (got_id, flags, int.from_bytes(got_inner[4:8], "big")) == (bundle_id, bundles.FLAGS, xid)


def test_control_round_trips_through_parse_control() -> None:
    raw = messages.serialize(bundles.control(42, ofp.OFPBCT_COMMIT_REQUEST), 9)
    assert bundles.parse_control(raw) == (42, ofp.OFPBCT_COMMIT_REQUEST, ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED)


# --- the channel -------------------------------------------------------------------------


def table(r: Any) -> dict[Any, list[int]]:
    """The fake switch's flows as key -> output ports (os-ken actions compare by identity)."""
    return {k: ports(f.actions) for k, f in r.fake.flows.items()}


async def with_old(r: Any) -> None:
    await r.chan.install_flows(OLD)
    r.fake.mods.clear()


def test_commit_flows_changes_the_table_in_one_committed_bundle(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            await with_old(r)
            n_types = len(r.fake.received)
            await r.chan.commit_flows([NEW, CHANGED], [OLD[2]])
            assert r.fake.commits == 1
            sent = [t for t, _ in r.fake.received[n_types:]]
            assert ofp.OFPT_FLOW_MOD not in sent  # every change went inside the bundle
            assert sent.count(ofp.OFPT_BUNDLE_ADD_MESSAGE) == 3
            assert set(r.fake.flows) == {OLD[0].key, OLD[1].key, NEW.key}
            assert ports(r.fake.flows[OLD[0].key].actions) == [9]
            assert sorted(map(str, r.chan.desired_flows)) == sorted(map(str, [CHANGED, OLD[1], NEW]))
    run(main())


def test_a_bundle_costs_two_round_trips_to_the_switch(sock_path: str) -> None:
    """Open + adds + barrier go out together (the switch answers in order), then commit + barrier:
    a Pod's ADD waits for two answers, not four."""
    async def main() -> None:
        async with rig(sock_path) as r:
            await with_old(r)
            events: list[str] = []
            transport = r.chan._proto.transport
            write, on_control = transport.write, r.chan._reader._on_control

            def spy_write(data: bytes) -> None:
                events.append("send")
                write(data)

            def spy_control(raw: bytes) -> None:
                events.append("answer")
                on_control(raw)

            transport.write, r.chan._reader._on_control = spy_write, spy_control
            await r.chan.commit_flows([NEW, CHANGED], [OLD[2]])
            turns = [e for i, e in enumerate(events) if i == 0 or events[i - 1] != e]
            assert turns == ["send", "answer", "send", "answer"]
            assert r.fake.commits == 1 and set(r.fake.flows) == {OLD[0].key, OLD[1].key, NEW.key}
    run(main())


@pytest.mark.parametrize("on_add", [False, True], ids=["refused-at-commit", "refused-when-added"])
def test_a_refused_flow_leaves_the_switch_and_the_desired_state_unchanged(sock_path: str, on_add: bool) -> None:
    bad = flow(5, 10, 1, in_port=7)

    async def main() -> None:
        async with rig(sock_path) as r:
            await with_old(r)
            r.fake.refuse_on_add = on_add
            before = table(r)
            r.fake.refuse_table = 5
            with pytest.raises(OpenFlowError, match="table=5 priority=10"):
                await r.chan.commit_flows([NEW, CHANGED, bad], [OLD[2]])
            assert table(r) == before and r.fake.commits == 0
            assert sorted(map(str, r.chan.desired_flows)) == sorted(map(str, OLD))
            r.fake.refuse_table = None
            await r.chan.commit_flows([NEW], [])  # the channel is not wedged
            assert NEW.key in r.fake.flows
    run(main())


def test_connection_lost_before_the_commit_changes_nothing(sock_path: str) -> None:
    async def main() -> None:
        async with rig(sock_path) as r:
            await with_old(r)
            before = table(r)
            r.fake.drop_on_commit = "before"
            with pytest.raises(ChannelClosed):
                await r.chan.commit_flows([NEW, CHANGED], [OLD[2]])
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
            assert table(r) == before
    run(main())


def test_a_commit_whose_answer_was_lost_is_undone_by_the_reconnect(sock_path: str) -> None:
    """The switch carried the bundle out but the agent never heard: the agent reports failure,
    so the replay must bring back the old table, not leave the new flows in."""
    async def main() -> None:
        async with rig(sock_path) as r:
            await with_old(r)
            r.fake.drop_on_commit = "after"
            with pytest.raises(ChannelClosed, match="outcome unknown"):
                await r.chan.commit_flows([NEW, CHANGED], [OLD[2]])
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
            assert set(r.fake.flows) == {f.key for f in OLD}
            assert ports(r.fake.flows[OLD[0].key].actions) == [1]
            assert sorted(map(str, r.chan.desired_flows)) == sorted(map(str, OLD))
    run(main())


def test_echo_is_answered_while_a_big_bundle_is_encoded(sock_path: str) -> None:
    """Encoding 10,000 flow_mods runs off the event loop: the switch's echo requests sent
    meanwhile are answered before the bundle even opens."""
    many = [flow(2, 1000 + i, 1, in_port=i % 60000 + 1, ipv4_dst=f"10.{i >> 8 & 255}.{i & 255}.1",
                 eth_type=0x0800) for i in range(10_000)]

    async def main() -> None:
        async with rig(sock_path) as r:
            async def echoes() -> None:
                while True:
                    r.fake.send(bytes.fromhex("0602000800000000"))  # OFPT_ECHO_REQUEST, xid 0
                    await asyncio.sleep(0.001)
            pinger = asyncio.create_task(echoes())
            start = len(r.fake.received)
            try:
                await r.chan.commit_flows(many, [])
            finally:
                pinger.cancel()
            sent = [t for t, _ in r.fake.received[start:]]
            opened = sent.index(ofp.OFPT_BUNDLE_CONTROL)
            assert ofp.OFPT_ECHO_REPLY in sent[:opened]
            assert len(r.fake.flows) == 10_000 and r.fake.commits == 1
    run(main(), timeout=60)


# --- the replay after a reconnect --------------------------------------------------------


def test_the_replay_on_a_restarted_switch_installs_every_flow_at_once(sock_path: str) -> None:
    """ovs-vswitchd came back with an empty table: between nothing and every desired flow there
    is no table holding some of them (a packet there would meet half a policy)."""
    many = [flow(2, 100, 1, in_port=i + 1) for i in range(200)]

    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.commit_flows(many, [])
            fresh = await r.restart_switch(record_tables=True)
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 4.0, "reconnect")
            assert fresh.tables is not None
            sizes = [len(t) for t in fresh.tables]
            partial = sorted(set(sizes) - {0, len(many)})
            assert not partial, f"{len(partial)} partial tables seen during the replay, e.g. {partial[:5]} flows"
            assert fresh.commits == 1 and ofp.OFPT_FLOW_MOD not in fresh.types()
    run(main(), timeout=20)


def test_the_replay_after_a_lost_commit_answer_goes_back_to_the_old_table_at_once(sock_path: str) -> None:
    """The switch carried out a bundle whose answer was lost: the replay takes it from that new
    table straight back to the old one, with no table in between (new and old flows mixed)."""
    async def main() -> None:
        async with rig(sock_path, fake_kw={"record_tables": True}) as r:
            await with_old(r)
            old = r.fake.tables[-1]  # type: ignore[index]
            r.fake.drop_on_commit = "after"
            with pytest.raises(ChannelClosed, match="outcome unknown"):
                await r.chan.commit_flows([NEW, CHANGED], [OLD[2]])
            new = r.fake.tables[-1]  # type: ignore[index]
            assert new != old
            seen_from = len(r.fake.tables)  # type: ignore[arg-type]
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 2.0, "reconnect")
            seen = set(r.fake.tables[seen_from:])  # type: ignore[index]
            assert seen == {new, old}, f"{len(seen - {new, old})} mixed tables seen during the replay"
            assert r.fake.tables[-1] == old  # type: ignore[index]
    run(main(), timeout=20)


def test_a_flow_the_restarted_switch_refuses_is_dropped_and_the_rest_replayed(sock_path: str) -> None:
    keep, refused = flow(1, 100, 1, in_port=1), flow(5, 10, 1, in_port=7)

    async def main() -> None:
        async with rig(sock_path) as r:
            await r.chan.commit_flows([keep, refused], [])
            fresh = await r.restart_switch()
            fresh.refuse_table = 5  # the new switch refuses what the old one took
            await eventually(lambda: r.chan.connects == 2 and r.chan.ready, 4.0, "reconnect")
            assert set(fresh.flows) == {keep.key} and r.chan.desired_flows == [keep]
    run(main(), timeout=20)
