"""The agent survives an ovs-vswitchd restart, runs from the CLI, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from packetin import messages
from packetin.model import Category, PacketIn
from tests.support.podnet import set_neighbor

from tests.integration.conftest import BRIDGE, OvsEnv, PodFactory
from tests.support.packetin_ovs import METER_POLICY, connected, logged_rule, send_udp
from packetin.model import Disposition
from tests.support.ports import free_port
from tests.support.waiting import eventually


def dump(env: OvsEnv, what: str) -> str:
    """What OVS itself holds, asked through an independent client (ovs-ofctl)."""
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", what, env.mgmt],
                          capture_output=True, text=True).stdout


def test_flows_and_meters_come_back_after_vswitchd_restart(ovs_env: OvsEnv, make_pod: PodFactory) -> None:
    a, b = make_pod("a", 1), make_pod("b", 2)
    set_neighbor(a, b)
    got: dict[int, list[PacketIn]] = {Category.POLICY: []}
    rule = logged_rule(a, b, Disposition.DROP, {"ip_proto": 17})

    async def scenario() -> float:
        async with connected(ovs_env.target, got) as (channel, _):
            await channel.install_meters([messages.MeterSpec(METER_POLICY, rate_pps=1000, burst=100)])
            await channel.install_flows([rule])
            assert "reg6" in dump(ovs_env, "dump-flows")
            connects = channel.connects

            # ovs-vswitchd dies hard and is started again: it comes back with an empty table.
            await asyncio.to_thread(ovs_env.ovs.stop_daemon, "ovs-vswitchd", signal.SIGKILL)
            t0 = time.monotonic()
            await asyncio.to_thread(ovs_env.ovs.up)
            await eventually(lambda: channel.connects > connects and channel.ready, timeout=5)
            recovered = time.monotonic() - t0
            flows = dump(ovs_env, "dump-flows")
            meters = dump(ovs_env, "dump-meters")
            assert "set_field:0xc0ffee01->reg6" in flows and "meter_id=7" in flows, flows
            assert "meter=7" in meters and "pktps" in meters and "rate=1000" in meters, meters

            # And the datapath works again end to end: packets become packet-ins.
            await asyncio.to_thread(send_udp, a, b, 4000, 3)
            await eventually(lambda: len(got[Category.POLICY]) >= 3, 5.0)
            return recovered

    recovered = asyncio.run(scenario())
    assert recovered < 5.0
    assert all(p.rule_id == 0xC0FFEE01 for p in got[Category.POLICY])


def test_agent_cli_runs_exports_metrics_and_stops_on_sigterm(ovs_env: OvsEnv, tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"ovs:\n  run_dir: {ovs_env.ovs.run_dir}\n  netns: {ovs_env.netns}\n  bridge: {BRIDGE}\n"
        f"metrics:\n  listen: 127.0.0.1:{port}\n"
        f"packetin:\n  tap: {tmp_path / 'tap.jsonl'}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        f"audit:\n  path: {tmp_path / 'audit' / 'audit.jsonl'}\n")
    check = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "check-config", str(cfg)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(tmp_path / "agent.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "agent", "--config", str(cfg)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        body = ""
        while time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                if "npaudit_openflow_connected 1.0" in body:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            time.sleep(0.1)
        assert "npaudit_openflow_connected 1.0" in body, body
        assert "npaudit_datapath_meters_supported 1.0" in body
        assert 'npaudit_packetin_total{category="policy",outcome="received"} 0.0' in body
        # OVS-side losses are exported from vswitchd's own coverage counters.
        assert 'npaudit_ovs_packetin_lost_total{counter="rconn_overflow"}' in body, body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "agent.log").read_text()
    assert "stopped cleanly" in text, text
    assert "Traceback" not in text, text
    # The agent leaves OVS running (fail_mode=secure keeps enforcing): the daemons are still ours.
    assert ovs_env.ovs.pid("ovs-vswitchd") is not None
    assert os.path.exists(ovs_env.target)
