"""An agent SIGKILLed at each step of a CNI ADD: what it leaves is found and removed, never a Pod
answered without its record.

The dying agent is a child process running PodInterfaces on the rig's OVS and state directory,
stopped at one step and killed there (SIGKILL, by pid). The rig's own agent, started on the same
state directory, plays the restarted agent; the runtime then does what it does after a failed ADD:
DEL through the real plugin.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from policy_agent.cni.netdev import host_ifname

from tests.integration.conftest import BRIDGE
from tests.support.cni_rig import Rig, _link_exists, rig  # noqa: F401  (rig: the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Using fork:DeprecationWarning")

# Runs PodInterfaces.add and stops at argv[5], announcing it on stdout, until it is killed.
DYING_AGENT = r"""
import asyncio, json, sys, time
from pathlib import Path
from policy_agent.cni.pod_interfaces import PodInterfaces
from policy_agent.cni.wire import CniRequest
from policy_agent.ovs.bridge import Ovsdb

remote, bridge, ovs_netns, state_dir, step, req = sys.argv[1:7]

def stop(where):
    print(where, flush=True)
    time.sleep(3600)

class Hooks:
    async def pod_added(self, info):
        if step == "hook":
            stop(step)
        # From here on commit() is the final record's (the intent's went through save()).
        if step == "staged":  # hook done, the final record staged but not in force
            states.commit = lambda *a: stop(step)
        elif step == "committed":  # the final record in force, the runtime not yet answered
            real_commit = states.commit
            states.commit = lambda *a: (real_commit(*a), stop(step))
    async def pod_deleted(self, info):
        pass

pods = PodInterfaces(Ovsdb(remote), bridge, ovs_netns, Path(state_dir), Hooks())
states = pods._states
if step == "unrecorded":  # the lease and the veth made, the port and the Pod end maybe, nothing recorded
    states.save = lambda *a: stop(step)
elif step == "intent":  # the unfinished record written, the hook not yet called
    real_save = states.save
    states.save = lambda *a: (real_save(*a), stop(step))
asyncio.run(pods.add(CniRequest.from_wire(json.loads(req))))
print("answered", flush=True)
"""

def _state_dir_entries(rig: Rig) -> list[str]:
    d = rig.state_dir / "containers"
    return sorted(os.listdir(d)) if d.exists() else []


STEPS = ["unrecorded", "intent", "hook", "staged", "committed"]


def _die_at(rig: Rig, step: str, container_id: str, netns: str) -> None:
    req: dict[str, Any] = {"command": "ADD", "container_id": container_id, "netns": netns, "ifname": "eth0",
                           "args": {"K8S_POD_NAMESPACE": "shop", "K8S_POD_NAME": "web-0"},
                           "netconf": rig.netconf()}
    child = subprocess.Popen([sys.executable, "-c", DYING_AGENT, rig.ovs.db.remote, BRIDGE, rig.ovs.netns, str(rig.state_dir), step, json.dumps(req)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().decode().strip()
        assert line == step, (line, child.stderr.read().decode() if child.poll() is not None else "")
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("step", STEPS)
def test_agent_killed_inside_add_leaves_nothing_after_the_runtimes_del(rig: Rig, step: str) -> None:
    netns = rig.make_netns("k")
    host_if = host_ifname("ctr-k")
    _die_at(rig, step, "ctr-k", netns)
    # What the dead agent left: a lease and the veth at every step; the port is attached while
    # the record is written and the hook runs, so it is there for sure only once the hook is done.
    assert len(rig.allocated()) == 1 and _link_exists(rig.ovs.netns, host_if)
    assert step not in ("staged", "committed") or host_if in rig.ports()
    assert rig.pods is not None
    # The restarted agent brings back (realises policy for) exactly the Pods whose ADD completed.
    assert [p.container_id for p in rig.pods.pods()] == (["ctr-k"] if step == "committed" else [])

    assert rig.cni("DEL", "ctr-k", netns).rc == 0
    # The hook's flows are removed whenever the hook may have run.
    assert rig.hooks.kinds() == ([] if step == "unrecorded" else ["deleted"])
    assert host_if not in rig.ports() and not _link_exists(rig.ovs.netns, host_if)
    assert rig.allocated() == set()
    assert _state_dir_entries(rig) == []  # no record, nothing staged

    # The Pod can then be made afresh in the same namespace.
    add = rig.cni("ADD", "ctr-k", netns)
    assert add.rc == 0, add.out
    assert rig.cni("DEL", "ctr-k", netns).rc == 0
    assert rig.allocated() == set() and host_if not in rig.ports()


@pytest.mark.parametrize("step", ["intent", "hook", "staged", "committed"])
def test_add_retried_after_the_agent_died_inside_it_answers_one_pod(rig: Rig, step: str) -> None:
    netns = rig.make_netns("r")
    _die_at(rig, step, "ctr-r", netns)
    add = rig.cni("ADD", "ctr-r", netns)
    assert add.rc == 0, add.out
    assert add.out is not None and len(rig.allocated()) == 1
    assert add.out["ips"][0]["address"].split("/")[0] in rig.allocated()
    assert [p.container_id for p in rig.pods.pods()] == ["ctr-r"]  # type: ignore[union-attr]
    assert rig.cni("DEL", "ctr-r", netns).rc == 0
    assert rig.allocated() == set() and _state_dir_entries(rig) == []
