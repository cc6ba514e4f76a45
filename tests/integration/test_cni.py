"""The real `npaudit cni` plugin against a CniServer + PodInterfaces on a private OVS, host-local IPAM and netns."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

import pytest

from policy_agent.cni.netdev import host_ifname, mac_for_ip

from tests.support.cni_rig import GATEWAY, Rig, SUBNET, _link_exists, rig  # noqa: F401 (fixtures)

# pyroute2 forks a short-lived child to open a netlink socket inside a namespace;
# eventlet (imported by the ovs library's probe, never used) warns on every fork.
pytestmark = pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")


def _ip_json(netns: str, *args: str) -> Any:
    out = subprocess.run(["ip", "-j", "-n", netns, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout or "[]")


def test_add_realises_policy_first_is_idempotent_and_del_releases_everything(rig: Rig) -> None:
    netns = rig.make_netns("a")
    add = rig.cni("ADD", "ctr-a", netns)
    assert add.rc == 0, (add.out, add.stderr)
    res = add.out
    assert res is not None and res["cniVersion"] == "1.0.0"
    (ip,) = res["ips"]
    addr = ipaddress.ip_interface(ip["address"])
    assert addr.ip in SUBNET and str(addr.ip) != GATEWAY and addr.network == SUBNET
    assert ip["gateway"] == GATEWAY and ip["interface"] == 1
    host_if = host_ifname("ctr-a")
    assert res["interfaces"][0]["name"] == host_if
    assert res["interfaces"][1] == {"name": "eth0", "mac": mac_for_ip(str(addr.ip)), "sandbox": netns}
    assert {"dst": "0.0.0.0/0", "gw": GATEWAY} in res["routes"]

    # The agent's hook ran, with the port already on the bridge, while the plugin still waited.
    (kind, info, hook_done, plugin_waiting), = rig.hooks.events
    assert kind == "added" and plugin_waiting is True and hook_done < add.done
    assert (info.namespace, info.name, info.ip, info.prefix_len) == ("shop", "web-0", str(addr.ip), 24)
    assert info.host_ifname == host_if and info.ofport == rig.ofport(host_if) > 0

    # What a user sees in the Pod and on the bridge.
    ns = netns.rsplit("/", 1)[1]
    (link,) = _ip_json(ns, "addr", "show", "eth0")
    assert link["address"] == info.mac == "02:00:0a:f5:00:%02x" % addr.ip.packed[3]
    assert {(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"} == {(str(addr.ip), 24)}
    assert "UP" in link["flags"]
    assert any(r["dst"] == "default" and r["gateway"] == GATEWAY for r in _ip_json(ns, "route"))
    assert host_if in rig.ports() and _link_exists(rig.ovs.netns, host_if)
    for where, ifname in ((ns, "eth0"), (rig.ovs.netns, host_if)):
        offload = subprocess.run(["ip", "netns", "exec", where, "ethtool", "-k", ifname],
                                 capture_output=True, text=True)
        assert "tx-checksumming: off" in offload.stdout, (where, ifname)
    assert rig.allocated() == {str(addr.ip)}

    again = rig.cni("ADD", "ctr-a", netns)
    assert again.rc == 0 and again.out == res
    assert rig.hooks.kinds() == ["added"]  # nothing re-done

    check = rig.cni("CHECK", "ctr-a", netns)
    assert (check.rc, check.out) == (0, None), check.out

    # An agent restart in between: it knows the Pod from its state directory.
    rig.stop_agent()
    rig.start_agent()
    assert rig.pods is not None and [p.container_id for p in rig.pods.pods()] == ["ctr-a"]
    delete = rig.cni("DEL", "ctr-a", netns)
    assert (delete.rc, delete.out) == (0, None), delete.out
    assert rig.hooks.kinds() == ["added", "deleted"]
    assert host_if not in rig.ports()
    assert not _link_exists(rig.ovs.netns, host_if) and not _link_exists(ns, "eth0")
    assert rig.allocated() == set() and rig.state_files() == [] and rig.pods.pods() == []

    # Runtimes repeat DEL, also after the namespace is gone.
    assert (rig.cni("DEL", "ctr-a", netns).rc, rig.cni("DEL", "ctr-a", "").rc) == (0, 0)
    assert rig.hooks.kinds() == ["added", "deleted"]


def test_check_notices_a_missing_interface_and_pods_get_distinct_ips(rig: Rig) -> None:
    b, c = rig.make_netns("b"), rig.make_netns("c")
    add_b, add_c = rig.cni("ADD", "ctr-b", b, pod="b"), rig.cni("ADD", "ctr-c", c, pod="c")
    assert add_b.rc == 0 and add_c.rc == 0, (add_b.out, add_c.out)
    assert add_b.out is not None and add_c.out is not None
    ip_b, ip_c = add_b.out["ips"][0]["address"], add_c.out["ips"][0]["address"]
    assert ip_b != ip_c
    assert rig.allocated() == {ip_b.split("/")[0], ip_c.split("/")[0]}
    assert rig.cni("CHECK", "ctr-b", b).rc == 0

    subprocess.run(["ip", "-n", b.rsplit("/", 1)[1], "link", "del", "eth0"], check=True)
    check = rig.cni("CHECK", "ctr-b", b)
    assert check.rc == 1 and check.out is not None
    assert check.out["code"] == 999 and "eth0 is missing" in check.out["details"], check.out
    assert rig.cni("CHECK", "ctr-c", c).rc == 0  # the other Pod is unaffected

    # DEL still cleans up what is left (the port; the veth went with eth0).
    assert rig.cni("DEL", "ctr-b", b).rc == 0
    assert host_ifname("ctr-b") not in rig.ports() and host_ifname("ctr-c") in rig.ports()
    assert rig.allocated() == {ip_c.split("/")[0]}


def test_add_whose_hook_fails_leaves_nothing_behind(rig: Rig) -> None:
    netns = rig.make_netns("d")
    ns = netns.rsplit("/", 1)[1]
    host_if = host_ifname("ctr-d")
    rig.hooks.fail_add = RuntimeError("policy for shop/web-0 could not be realised")
    add = rig.cni("ADD", "ctr-d", netns)
    assert add.rc == 1 and add.out is not None
    assert add.out["code"] == 999 and "could not be realised" in add.out["details"], add.out
    # The hook's partial work is undone too.
    assert rig.hooks.kinds() == ["added", "deleted"]
    assert host_if not in rig.ports()
    assert not _link_exists(rig.ovs.netns, host_if) and not _link_exists(ns, "eth0")
    assert rig.allocated() == set() and rig.state_files() == []

    # The runtime's retry then succeeds on the same namespace.
    rig.hooks.fail_add = None
    retry = rig.cni("ADD", "ctr-d", netns)
    assert retry.rc == 0, retry.out
    assert rig.cni("DEL", "ctr-d", netns).rc == 0
    assert rig.allocated() == set()


def test_add_whose_ipam_fails_while_the_veth_is_made_leaves_nothing_behind(rig: Rig) -> None:
    # IPAM and the veth + port run at once: a failing IPAM must still find the veth and port
    # removed once both are done.
    netns = rig.make_netns("e")
    ns = netns.rsplit("/", 1)[1]
    host_if = host_ifname("ctr-e")
    blocker = rig.ipam_dir / "npaudit"  # host-local's directory for this network: a file, so it fails
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory\n")
    add = rig.cni("ADD", "ctr-e", netns)
    assert add.rc == 1 and add.out is not None and add.out["code"] == 999, add.out
    assert rig.hooks.kinds() == []
    assert host_if not in rig.ports()
    assert not _link_exists(rig.ovs.netns, host_if) and not _link_exists(ns, "eth0")
    assert rig.state_files() == []

    blocker.unlink()
    retry = rig.cni("ADD", "ctr-e", netns)
    assert retry.rc == 0, retry.out
    assert rig.cni("DEL", "ctr-e", netns).rc == 0
    assert rig.allocated() == set()
