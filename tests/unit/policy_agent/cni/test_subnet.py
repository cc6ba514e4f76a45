"""The node's Pod subnet: host-local's range comes from it, never from a shipped constant."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from policy_agent.cni.ipam import Ipam
from policy_agent.cni.subnet import BAD_POD_CIDR, NO_POD_CIDR, OUTSIDE, NodeSubnet, SubnetCollector, node_pod_cidr
from policy_agent.cni.wire import ERR_TRY_AGAIN_LATER, CniError

CONFLIST = Path(__file__).resolve().parents[4] / "config" / "deploy" / "cni" / "10-npaudit.conflist"


def _shipped_netconf() -> dict[str, object]:
    return json.loads(CONFLIST.read_text())["plugins"][0]


def test_the_shipped_conflist_names_no_subnet() -> None:
    ipam = _shipped_netconf()["ipam"]
    assert isinstance(ipam, dict) and "ranges" not in ipam and "subnet" not in ipam
    assert "10.244" not in CONFLIST.read_text()


def test_the_ipam_range_is_the_node_subnet() -> None:
    for cidr, gateway in (("10.244.3.0/24", "10.244.3.1"), ("10.245.0.0/25", "10.245.0.1")):
        conf = Ipam(Path("/usr/lib/cni"), Path("/tmp/ipam"), NodeSubnet(cidr)).netconf(_shipped_netconf())
        assert conf["ipam"]["ranges"] == [[{"subnet": cidr, "gateway": gateway}]]
        assert conf["ipam"]["routes"] == [{"dst": "0.0.0.0/0"}]


def test_a_netconf_naming_its_own_range_keeps_it() -> None:
    netconf = {**_shipped_netconf(), "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.9.0.0/24"}]]}}
    conf = Ipam(Path("/usr/lib/cni"), Path("/tmp/ipam"), NodeSubnet("10.244.3.0/24")).netconf(netconf)
    assert conf["ipam"]["ranges"] == [[{"subnet": "10.9.0.0/24"}]]


def test_no_subnet_yet_is_try_again_later() -> None:
    with pytest.raises(CniError) as err:
        Ipam(Path("/usr/lib/cni"), Path("/tmp/ipam"), NodeSubnet()).netconf(_shipped_netconf())
    assert err.value.code == ERR_TRY_AGAIN_LATER and "no Pod subnet" in str(err.value)


def test_node_pod_cidrs() -> None:
    assert node_pod_cidr({"spec": {"podCIDRs": ["fd00::/64", "10.244.2.0/24"]}}) == "10.244.2.0/24"
    assert node_pod_cidr({"spec": {"podCIDR": "10.244.1.0/24"}}) == "10.244.1.0/24"
    assert node_pod_cidr({"spec": {}}) is None and node_pod_cidr({}) is None
    for bad in ({"podCIDR": "10.244.1.1/24"}, {"podCIDRs": ["fd00::/64"]}, {"podCIDR": "10.0.0.0/31"}):
        with pytest.raises(ValueError):
            node_pod_cidr({"spec": bad})


def test_bad_node_input_is_a_log_line_and_a_metric(caplog: pytest.LogCaptureFixture) -> None:
    subnet = NodeSubnet()
    with caplog.at_level(logging.ERROR):
        subnet.from_node("node-a", {"metadata": {"name": "node-a"}, "spec": {}})
        subnet.from_node("node-a", {"spec": {"podCIDR": "bogus"}})
    assert subnet.cidr == "" and subnet.problems[NO_POD_CIDR] == 1 and subnet.problems[BAD_POD_CIDR] == 1
    assert "Node node-a has no spec.podCIDR" in caplog.text and "Traceback" not in caplog.text
    subnet.from_node("node-a", {"spec": {"podCIDR": "10.244.7.0/24"}})
    assert (subnet.cidr, subnet.gateway) == ("10.244.7.0/24", "10.244.7.1")
    subnet.from_node("node-a", {"spec": {}})  # a later bad version keeps the last good subnet
    assert subnet.cidr == "10.244.7.0/24"
    subnet.check_address("x/a", "10.244.7.9")
    assert subnet.problems[OUTSIDE] == 0
    with caplog.at_level(logging.ERROR):
        subnet.check_address("x/a", "10.9.0.3")
    assert subnet.problems[OUTSIDE] == 1 and "Pod x/a got address 10.9.0.3 outside" in caplog.text
    metrics = {m.name: m for m in SubnetCollector(subnet).collect()}
    samples = {s.labels.get("reason"): s.value for s in metrics["npaudit_node_subnet_problems"].samples}
    assert samples == {BAD_POD_CIDR: 1, NO_POD_CIDR: 2, OUTSIDE: 1}
    assert metrics["npaudit_node_subnet_known"].samples[0].value == 1


def test_a_configured_subnet_is_not_replaced_by_a_different_node_cidr() -> None:
    subnet = NodeSubnet("10.246.0.0/24")
    subnet.from_node("node-a", {"spec": {"podCIDR": "10.244.0.0/24"}})
    assert subnet.cidr == "10.246.0.0/24" and subnet.problems[BAD_POD_CIDR] == 1
    subnet.from_node("node-a", {"spec": {"podCIDR": "10.246.0.0/24"}})
    assert subnet.problems[BAD_POD_CIDR] == 1
