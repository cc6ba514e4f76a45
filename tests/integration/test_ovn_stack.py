"""tests/support/ovn.py, the OVN that bench/agent_latency.py --ovn measures the agent against: Debian's OVN 23.03
unpacked beside the tree, on a private OVS, logs each datagram its Drop ACL drops (and only those) with the port the
bench keys on, and stops everything it started."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy_agent.ovs.embedded import netns_exists
from tests.support.ovn import AclLines, OvnStack, acl_drop_port, fetch, version
from tests.support.processes import alive
from tests.support.waiting import wait_for

# Real lines of ovn-controller 23.03's ACL log (as this stack wrote them).
DROP = (b'2026-12-05T09:14:07.424Z|00006|acl_log(ovn_pinctrl0)|INFO|name="flood", verdict=drop, severity=info, '
        b'direction=to-lport: udp,vlan_tci=0x0000,dl_src=0a:00:00:00:00:01,dl_dst=0a:00:00:00:00:02,nw_src=10.250.0.1,'
        b'nw_dst=10.250.0.2,nw_tos=0,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=60869,tp_dst=20002')


def test_an_acl_log_line_gives_the_port_of_a_drop_by_the_named_acl_only() -> None:
    assert acl_drop_port(DROP) == 20002
    assert acl_drop_port(DROP.replace(b"verdict=drop", b"verdict=allow")) is None
    assert acl_drop_port(DROP.replace(b'name="flood"', b'name="other"')) is None
    assert acl_drop_port(DROP, name="other") is None
    assert acl_drop_port(DROP.replace(b"tp_dst=20002", b"tp_dst=")) is None
    assert acl_drop_port(b"2026-12-05T09:14:03.006Z|00001|vlog|INFO|opened log file tp_dst=5") is None
    # A later field after tp_dst (ICMP has none; newer OVN may add some) does not hide the port.
    assert acl_drop_port(DROP + b",tcp_flags=0") == 20002


def test_acl_lines_counts_whole_new_drop_lines_once(tmp_path: Path) -> None:
    log = tmp_path / "ovn-controller.log"
    log.write_bytes(DROP + b"\n")
    lines = AclLines(log)  # what was there before is not counted
    with open(log, "ab") as f:
        f.write(DROP + b"\n" + b"2026-12-05T09:14:03.006Z|00001|vlog|INFO|opened\n" + DROP[:60])
    assert lines.new() == 1
    with open(log, "ab") as f:
        f.write(DROP[60:] + b"\n" + DROP.replace(b"verdict=drop", b"verdict=allow") + b"\n")
    assert lines.new() == 1  # the line cut across the two writes, counted once it is whole
    assert lines.new() == 0


@pytest.fixture(scope="module")
def ovn_root() -> Path:
    return fetch()


def test_the_ovn_stack_logs_what_its_acl_drops_and_stops_all_it_started(ovn_root: Path, tmp_path: Path) -> None:
    assert version(ovn_root).startswith("ovn-controller 23.03")
    stack = OvnStack(ovn_root, tmp_path / "ovn", f"npt-ovn{os.getpid()}")
    stack.up()
    try:
        pids = {name: stack.pid(name) for name in ("ovn-nb", "ovn-sb", "ovn-northd", "ovn-controller")}
        pids.update(vswitchd=stack.ovs.pid("ovs-vswitchd"), ovsdb=stack.ovs.pid("ovsdb-server"))
        assert all(pids.values()), pids
        assert stack.pinctrl_tid() is not None
        netns, ip = stack.sender()
        lines, flows0, overflow0 = AclLines(stack.log), stack.acl_log_flow_packets(), stack.rconn_overflow()
        # 1000 is outside the ACL's udp.dst >= 1024: dropped by nothing, logged by nothing (Pod b has no listener).
        ports = (20001, 1000, 20002, 31337)
        sender = ("import socket, sys, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                  "for p in sys.argv[2:]:\n    s.sendto(b'x', (sys.argv[1], int(p)))\n    time.sleep(0.05)\n")
        subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", sender, ip, *map(str, ports)],
                       check=True, timeout=30)

        def logged() -> list[int]:
            return [p for line in stack.log.read_bytes().splitlines() if (p := acl_drop_port(line)) is not None]

        wait_for(lambda: len(logged()) >= 3, timeout=10, what="three ACL log lines")
        time.sleep(0.3)
        assert logged() == [20001, 20002, 31337]
        # What bench/agent_cpu.py --ovn counts: the packet-ins OVS emitted for the ACL's log, the lines written.
        assert (stack.acl_log_flow_packets() - flows0, lines.new(), stack.rconn_overflow() - overflow0) == (3, 3, 0)
        assert lines.new() == 0
        namespaces = [stack.ovs.netns, *(pod.netns for pod in stack.pods)]
    finally:
        stack.down()
    assert not any(alive(pid) for pid in pids.values() if pid is not None)
    assert not any(netns_exists(n) for n in namespaces)
