"""An agent killed (SIGKILL) in the middle of a large apply leaves OVS with the whole old or the
whole new policy while it is down, and the restarted agent keeps exactly that policy: the store
settles to what OVS enforced (rolled forward or back, logged, in `npaudit status`), so no change
is enforced and then reverted behind the operator's back."""

from __future__ import annotations

import json
import random
import re

import pytest
import subprocess
import sys
import time

from policy_agent.sources.apply_intent import INTENT_NAME, PAUSE_BEFORE_STORE_ENV
from tests.support.cluster import Cluster, _npaudit
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


def new_policy_in_ovs(cluster: Cluster) -> bool:
    """The big apply's commit is in OVS: its TCP 81 flow (the old state names no port 81) is there."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", f"unix:{cluster.dir / 'ovs' / 'br-int.mgmt'}",
                          "tcp,tp_dst=81"], capture_output=True, text=True)
    return "tp_dst=81" in out.stdout


def big_flows(cluster: Cluster) -> int:
    """How many of the big policy's port flows OVS holds (through ovs-ofctl)."""
    ports = (int(m.group(1)) for line in cluster.flows() if (m := re.search(r"tp_dst=(\d+)", line)))
    return sum(BIG_FIRST_PORT <= p < BIG_FIRST_PORT + BIG_RULES for p in ports)


# compiling: before the intent exists; intent-written: the intent is on disk, the commit maybe not yet;
# flows-in-ovs: the commit is in OVS, the store perhaps not yet (the reported case); store-paused: the
# same, with the agent told (test-only fault injection) to wait 5 s before the store write, so the kill
# lands between the commit and the store write every time; random: anywhere.
KILL_POINTS = ["compiling", "intent-written", "flows-in-ovs", "store-paused", "random"]


@pytest.mark.parametrize("kill_at", KILL_POINTS)
def test_sigkill_mid_apply_leaves_old_or_new_and_the_restart_keeps_what_ovs_enforced(
        cluster: Cluster, kill_at: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster.apply(namespaces_and_pods(logging_ns=""))
    server = cluster.add_pod("y", "a")
    client = cluster.add_pod("x", "a", server=False)
    cluster.apply(OLD)
    target = [f"{server.ip}:80/tcp", f"{server.ip}:81/tcp"]
    assert cluster.probe(client.ref, target) == {target[0]: "timeout", target[1]: "connected"}
    if kill_at == "store-paused":  # the agent again, with the pause (Popen copies the environment)
        cluster.stop_agent()
        monkeypatch.setenv(PAUSE_BEFORE_STORE_ENV, "5")
        cluster.start()
        monkeypatch.delenv(PAUSE_BEFORE_STORE_ENV)

    manifest = cluster.dir / "big.yaml"
    manifest.write_text(big_policy())
    client_cli = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "apply", "-f", str(manifest),
                                   "--config", str(cluster.config)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
    intent = cluster.state / INTENT_NAME
    deadline = time.monotonic() + 30
    if kill_at == "compiling":
        time.sleep(0.8)
    elif kill_at == "intent-written":
        while not intent.exists() and time.monotonic() < deadline and client_cli.poll() is None:
            time.sleep(0.002)
    elif kill_at in ("flows-in-ovs", "store-paused"):  # the apply's flows are visible: kill at once
        while not new_policy_in_ovs(cluster) and time.monotonic() < deadline and client_cli.poll() is None:
            time.sleep(0.01)
    else:
        time.sleep(random.uniform(0.3, 4.0))  # the apply takes ~3 s here: any point must be safe
    assert cluster.agent is not None
    cluster.agent.kill()
    cluster.agent.wait()
    out, err = client_cli.communicate(timeout=60)
    left_intent = intent.exists()

    # Agent down: OVS (fail_mode=secure) enforces exactly one of the two states.
    held = big_flows(cluster)
    assert held in (0, BIG_RULES), f"{held} of {BIG_RULES} flows of the apply in OVS: a half-applied change"
    enforced_while_down = {target[0]: "timeout", target[1]: "timeout" if held else "connected"}
    assert cluster.probe(client.ref, target) == enforced_while_down
    if client_cli.returncode == 0:
        assert held == BIG_RULES, "the client was told it succeeded, but OVS has the old state"
    elif client_cli.returncode == 1:  # killed before the request reached it: nothing happened
        assert "unreachable" in err and held == 0, (out, err)
    else:
        assert client_cli.returncode == 3 and "outcome unknown" in err, (client_cli.returncode, out, err)
    if kill_at == "store-paused":
        assert held and left_intent and client_cli.returncode == 3, "the kill did not land between commit and store"

    # Restart: the policy OVS enforced while the agent was down is what the agent keeps and the store holds.
    (cluster.state / "api.sock").unlink(missing_ok=True)  # SIGKILL left it behind
    cluster.start()  # returns once the API listens: the store is re-applied and the old round gone by then
    assert big_flows(cluster) == held, cluster.log()[-3000:]
    assert cluster.probe(client.ref, target) == enforced_while_down, "the restart changed the enforced policy"
    stored = "name: big" in (cluster.state / "applied.yaml").read_text()
    assert stored == bool(held), f"OVS enforced {'new' if held else 'old'}, the store holds {'new' if stored else 'old'}"
    assert not intent.exists()
    round_now = int((cluster.state / "round").read_text())
    rounds = {int(m.group(1), 16) >> 32 for line in cluster.flows() if (m := re.search(r"cookie=(0x[0-9a-f]+)", line))}
    assert rounds == {round_now}, rounds

    # What the start decided is in the log and in `npaudit status`.
    status = json.loads(_npaudit("status", "--config", str(cluster.config), "-o", "json", "--no-ebpf-probe").stdout)
    settlement = status["apply_settlement"]
    if left_intent:
        word = "rolled forward" if held else "rolled back"
        assert settlement["outcome"] == word.replace(" ", "-"), settlement
        assert re.search(rf"apply of generation \d+ interrupted by the agent's end: {word}", cluster.log())
    else:
        assert settlement["outcome"] == "nothing", settlement
