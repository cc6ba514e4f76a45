"""An agent killed (SIGKILL) in the middle of a large apply leaves OVS with the whole old or the
whole new policy while it is down, and the restarted agent brings OVS back to what the store says."""

from __future__ import annotations

import random
import re

import pytest
import subprocess
import sys
import time

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import NO_80_TO_Y
from tests.support.e2e_scenarios import namespaces_and_pods

BIG_FIRST_PORT, BIG_RULES = 2000, 3000  # the reported run: 3,001 rules, killed 2.4 s into a 2.9 s apply

OLD = NO_80_TO_Y  # the state before the big apply


def big_policy() -> str:
    """3,000 Drop rules on unused ports, then one that drops TCP 81: the new state blocks 81."""
    rules = [f"  - {{action: Drop, name: p{p}, ports: [{{protocol: TCP, port: {p}}}]}}"
             for p in range(BIG_FIRST_PORT, BIG_FIRST_PORT + BIG_RULES)]
    rules.append("  - {action: Drop, name: p81, ports: [{protocol: TCP, port: 81}]}")
    return ("apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {name: big}\nspec:\n"
            "  priority: 2\n  appliedTo: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]\n"
            "  ingress:\n" + "\n".join(rules) + "\n")


def big_flows(cluster: Cluster) -> int:
    """How many of the big policy's port flows OVS holds (through ovs-ofctl)."""
    ports = (int(m.group(1)) for line in cluster.flows() if (m := re.search(r"tp_dst=(\d+)", line)))
    return sum(BIG_FIRST_PORT <= p < BIG_FIRST_PORT + BIG_RULES for p in ports)


@pytest.mark.parametrize("kill_at", ["compiling", "flows-in-ovs", "random"])
def test_sigkill_mid_apply_leaves_old_or_new_and_restart_reconciles_to_the_store(cluster: Cluster, kill_at: str) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))
    server = cluster.add_pod("y", "a")
    client = cluster.add_pod("x", "a", server=False)
    cluster.apply(OLD)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}

    manifest = cluster.dir / "big.yaml"
    manifest.write_text(big_policy())
    client_cli = subprocess.Popen([sys.executable, "-m", "policy_agent.cli", "apply", "-f", str(manifest),
                                   "--config", str(cluster.config)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    if kill_at == "compiling":
        time.sleep(0.8)
    elif kill_at == "flows-in-ovs":  # the first of the apply's flows is visible: kill at once
        deadline = time.monotonic() + 30
        while not big_flows(cluster) and time.monotonic() < deadline and client_cli.poll() is None:
            time.sleep(0.01)
    else:
        time.sleep(random.uniform(0.3, 4.0))  # the apply takes ~3 s here: any point must be safe
    assert cluster.agent is not None
    cluster.agent.kill()
    cluster.agent.wait()
    out, err = client_cli.communicate(timeout=60)

    # Agent down: OVS (fail_mode=secure) enforces exactly one of the two states.
    held = big_flows(cluster)
    assert held in (0, BIG_RULES), f"{held} of {BIG_RULES} flows of the apply in OVS: a half-applied change"
    expect_81 = "timeout" if held else "connected"
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: expect_81}
    if client_cli.returncode == 0:
        assert held == BIG_RULES, "the client was told it succeeded, but OVS has the old state"
    elif client_cli.returncode == 1:  # killed before the request reached it: nothing happened
        assert "unreachable" in err and held == 0, (out, err)
    else:
        assert client_cli.returncode == 3 and "outcome unknown" in err, (client_cli.returncode, out, err)

    # Restart: OVS == compile(store), whatever the kill left behind.
    stored = "name: big" in (cluster.state / "applied.yaml").read_text()
    (cluster.state / "api.sock").unlink(missing_ok=True)  # SIGKILL left it behind
    cluster.start()
    deadline = time.monotonic() + 30
    while big_flows(cluster) != (BIG_RULES if stored else 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert big_flows(cluster) == (BIG_RULES if stored else 0), cluster.log()[-3000:]
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "timeout" if stored else "connected"}
    round_now = int((cluster.state / "round").read_text())
    rounds = {int(m.group(1), 16) >> 32 for line in cluster.flows() if (m := re.search(r"cookie=(0x[0-9a-f]+)", line))}
    assert rounds == {round_now}, rounds
