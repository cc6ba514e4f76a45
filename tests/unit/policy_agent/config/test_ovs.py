"""Where the agent finds the switch's run dir (pid files, control socket, its controller socket)."""

from __future__ import annotations

from pathlib import Path

from policy_agent.config.loader import loads


def test_embedded_uses_its_run_dir() -> None:
    cfg = loads("ovs: {run_dir: /tmp/x/ovs}\nopenflow: {transport: unix}\n")
    assert cfg.ovs.ovs_rundir == Path("/tmp/x/ovs") and cfg.ovs.db_remote == "unix:/tmp/x/ovs/db.sock"
    assert cfg.openflow_target == "/tmp/x/ovs/br-int.npaudit"


def test_external_defaults_to_the_system_run_dir() -> None:
    cfg = loads("ovs: {mode: external, run_dir: /tmp/x/ovs}\n")
    assert cfg.ovs.db_remote == "unix:/var/run/openvswitch/db.sock"
    assert cfg.ovs.ovs_rundir == Path("/var/run/openvswitch")
    assert cfg.openflow_target == "/var/run/openvswitch/br-int.npaudit"
    assert cfg.controller_target == "punix:/var/run/openvswitch/br-int.npaudit"


def test_external_with_its_own_run_dir_is_found_beside_its_db_socket() -> None:
    # An OVS started with OVS_RUNDIR=/srv/ovs: its pid files, ovs-vswitchd.<pid>.ctl and our controller
    # socket are there, not in /var/run/openvswitch (which may not even exist).
    cfg = loads("ovs: {mode: external, db: 'unix:/srv/ovs/db.sock'}\n")
    assert cfg.ovs.ovs_rundir == Path("/srv/ovs")
    assert cfg.controller_target == "punix:/srv/ovs/br-int.npaudit"


def test_external_over_tcp_keeps_the_system_run_dir() -> None:
    cfg = loads("ovs: {mode: external, db: 'tcp:127.0.0.1:6640'}\n")
    assert cfg.ovs.ovs_rundir == Path("/var/run/openvswitch")
