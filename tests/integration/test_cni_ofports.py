"""The OpenFlow port number of a Pod's port is chosen by the agent (ofport_request) and honoured by
vswitchd; when another port has taken it, the Pod is realised again with the number it got."""

from __future__ import annotations

import json
import subprocess

import pytest

from policy_agent.cni.netdev import host_ifname
from tests.integration.conftest import BRIDGE
from tests.support.cni_rig import Rig, _link_exists, rig  # noqa: F401  (rig: the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")


def _requested(r: Rig, port: str) -> list[int]:
    got = r.ovs.db.api.db_get("Interface", port, "ofport_request").execute(check_error=True)
    return list(got) if isinstance(got, list) else [got]


def _recorded_ofport(r: Rig, container_id: str) -> int:
    return int(json.loads((r.state_dir / "containers" / f"{container_id}.json").read_text())["info"]["ofport"])


def test_requested_ofport_is_honoured_and_a_restarted_agent_avoids_recorded_numbers(rig: Rig) -> None:  # noqa: F811
    a, b = rig.make_netns("oa"), rig.make_netns("ob")
    assert rig.cni("ADD", "ctr-oa", a, pod="oa").rc == 0
    assert rig.cni("ADD", "ctr-ob", b, pod="ob").rc == 0
    numbers = {}
    for kind, info, _, _ in rig.hooks.events:
        assert kind == "added"
        # The hook had the number before vswitchd confirmed it: the one asked for, and given.
        assert _requested(rig, info.host_ifname) == [info.ofport] == [rig.ofport(info.host_ifname)]
        assert _recorded_ofport(rig, info.container_id) == info.ofport
        numbers[info.container_id] = info.ofport
    assert len(set(numbers.values())) == 2

    # A restarted agent starts a fresh pool: it must not hand out a number a Pod has.
    rig.stop_agent()
    rig.start_agent()
    c = rig.make_netns("oc")
    assert rig.cni("ADD", "ctr-oc", c, pod="oc").rc == 0
    kind, info, _, _ = rig.hooks.events[-1]
    assert (kind, info.container_id) == ("added", "ctr-oc") and len(rig.hooks.events) == 3
    assert info.ofport not in numbers.values()
    assert _requested(rig, info.host_ifname) == [info.ofport] == [rig.ofport(info.host_ifname)]
    for ctr, ns in (("ctr-oa", a), ("ctr-ob", b), ("ctr-oc", c)):
        assert rig.cni("CHECK", ctr, ns).rc == 0
        assert rig.cni("DEL", ctr, ns).rc == 0


def test_a_number_taken_by_another_port_moves_the_pods_flows_to_the_number_it_got(rig: Rig) -> None:  # noqa: F811
    a, b, c = rig.make_netns("pa"), rig.make_netns("pb"), rig.make_netns("pc")
    assert rig.cni("ADD", "ctr-pa", a, pod="pa").rc == 0
    first = rig.hooks.events[0][1].ofport
    # The pool hands numbers out round-robin: the next ADD asks for first + 1. A port the agent
    # does not know of takes it now, after the pool read OVSDB.
    taken, foreign = first + 1, f"npx{rig.tag}"
    api = rig.ovs.db.api
    with api.transaction(check_error=True) as txn:
        txn.add(api.add_port(BRIDGE, foreign))
        txn.add(api.db_set("Interface", foreign, ("type", "internal"), ("ofport_request", taken)))
    try:
        assert rig.ovs.db.add_port(BRIDGE, foreign, taken) == taken

        add = rig.cni("ADD", "ctr-pb", b, pod="pb")
        assert add.rc == 0, (add.out, add.stderr)
        host_b = host_ifname("ctr-pb")
        got = rig.ofport(host_b)
        assert got != taken and rig.ofport(foreign) == taken
        # Realised with the number asked for, undone, realised again with the one given.
        events = [(kind, info.ofport) for kind, info, _, _ in rig.hooks.events[1:]]
        assert events == [("added", taken), ("deleted", taken), ("added", got)]
        # The request is gone, so vswitchd will not renumber the port once `taken` is free.
        assert _requested(rig, host_b) == [] and _recorded_ofport(rig, "ctr-pb") == got
        assert list((rig.state_dir / "containers").glob(".ctr-pb.*")) == []  # nothing staged left
        assert rig.cni("CHECK", "ctr-pb", b).rc == 0

        # Neither number is asked for again.
        assert rig.cni("ADD", "ctr-pc", c, pod="pc").rc == 0
        kind, info, _, _ = rig.hooks.events[-1]
        assert kind == "added" and info.ofport not in (first, taken, got)
        assert rig.ofport(info.host_ifname) == info.ofport
    finally:
        rig.ovs.db.del_port(BRIDGE, foreign)
    for ctr, ns in (("ctr-pa", a), ("ctr-pb", b), ("ctr-pc", c)):
        assert rig.cni("DEL", ctr, ns).rc == 0
    assert rig.ports() == set()


def test_add_over_a_stale_veth_and_port_replaces_both_and_gets_its_number(rig: Rig) -> None:  # noqa: F811
    # An ADD that died before recording anything, retried by the runtime without a DEL: its veth
    # and its port (with a number of its own) are still there.
    netns = rig.make_netns("s")
    host_if = host_ifname("ctr-s")
    subprocess.run(["ip", "-n", rig.ovs.netns, "link", "add", host_if, "type", "veth", "peer", "name",
                    f"nps{rig.tag}"], check=True)
    stale = rig.ovs.db.add_port(BRIDGE, host_if, 9000)
    assert stale == 9000
    add = rig.cni("ADD", "ctr-s", netns, pod="s")
    assert add.rc == 0, (add.out, add.stderr)
    (kind, info, _, _), = rig.hooks.events
    assert info.ofport != 9000 and rig.ofport(host_if) == info.ofport
    assert not _link_exists(rig.ovs.netns, f"nps{rig.tag}")  # the stale veth is gone, ours in place
    assert _link_exists(netns.rsplit("/", 1)[1], "eth0")
    assert rig.cni("CHECK", "ctr-s", netns).rc == 0
    assert rig.cni("DEL", "ctr-s", netns).rc == 0
    assert rig.ports() == set()
