"""The CNI server on a private OVS with the real plugin and host-local IPAM, for the CNI
integration tests."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Coroutine, Iterator

import pytest

from policy_agent.cni.pod_interfaces import PodInterfaceInfo, PodInterfaces
from policy_agent.cni.server import CniServer
from policy_agent.ovs.embedded import netns_exists
from tests.support.bridge import BRIDGE
from tests.support.bridge import PrivateBridge as OvsEnv  # the ovs_env fixture's type

SUBNET = ipaddress.ip_network("10.245.0.0/24")
GATEWAY = "10.245.0.1"
HOOK_DELAY = 0.3  # a slow policy realisation: the plugin has to wait for it


class RecordingHooks:
    """The agent's side, recording what it was told and whether the plugin was still waiting."""

    def __init__(self) -> None:
        self.events: list[tuple[str, PodInterfaceInfo, float, bool | None]] = []
        self.plugin: subprocess.Popen[bytes] | None = None
        self.fail_add: Exception | None = None

    async def pod_added(self, info: PodInterfaceInfo) -> None:
        await asyncio.sleep(HOOK_DELAY)
        waiting = self.plugin is not None and self.plugin.poll() is None
        self.events.append(("added", info, time.monotonic(), waiting))
        if self.fail_add is not None:
            raise self.fail_add

    async def pod_deleted(self, info: PodInterfaceInfo) -> None:
        self.events.append(("deleted", info, time.monotonic(), None))

    def kinds(self) -> list[str]:
        return [e[0] for e in self.events]


class LoopThread:
    """The agent's event loop in a thread; the test drives the plugin synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 15.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@dataclass
class Call:
    rc: int
    out: dict[str, Any] | None
    stderr: str
    done: float


@dataclass
class Rig:
    ovs: OvsEnv
    hooks: RecordingHooks
    socket: Path
    ipam_dir: Path
    state_dir: Path
    tag: str
    loop: LoopThread
    netns: list[str] = field(default_factory=list)
    pods: PodInterfaces | None = None
    server: CniServer | None = None

    def start_agent(self) -> None:
        """The agent's CNI side as the composition root builds it; state survives restarts."""
        self.pods = PodInterfaces(self.ovs.db, BRIDGE, self.ovs.netns, self.state_dir, self.hooks)
        self.server = CniServer(self.socket, self.pods)
        self.loop.run(self.server.start())

    def stop_agent(self) -> None:
        if self.server is not None:
            self.loop.run(self.server.close(grace=5.0))
            self.server = None

    def make_netns(self, name: str) -> str:
        ns = f"npat-{self.tag}-{name}"
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
        self.netns.append(ns)
        return f"/run/netns/{ns}"

    def netconf(self) -> dict[str, Any]:
        return {"cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit", "agentSocket": str(self.socket),
                "ipam": {"type": "host-local", "ranges": [[{"subnet": str(SUBNET), "gateway": GATEWAY}]],
                         "dataDir": str(self.ipam_dir)}}

    def cni(self, command: str, container_id: str, netns: str, pod: str = "web-0") -> Call:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CNI_COMMAND": command,
               "CNI_CONTAINERID": container_id, "CNI_NETNS": netns, "CNI_IFNAME": "eth0",
               "CNI_PATH": "/usr/lib/cni",
               "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={pod}"}
        proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", "cni"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.hooks.plugin = proc
        out, err = proc.communicate(json.dumps(self.netconf()).encode(), timeout=30)
        done = time.monotonic()
        return Call(proc.returncode, json.loads(out) if out.strip() else None, err.decode(), done)

    def allocated(self) -> set[str]:
        """Addresses host-local holds (one file per address in its data dir)."""
        d = self.ipam_dir / "npaudit"
        return {p.name for p in d.iterdir() if _is_ip(p.name)} if d.exists() else set()

    def ports(self) -> set[str]:
        return set(self.ovs.db.api.list_ports(BRIDGE).execute(check_error=True))

    def ofport(self, port: str) -> int:
        got = self.ovs.db.api.db_get("Interface", port, "ofport").execute(check_error=True)
        return int(got[0] if isinstance(got, list) else got)

    def state_files(self) -> list[Path]:
        d = self.state_dir / "containers"
        return sorted(d.glob("*.json")) if d.exists() else []


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _link_exists(netns: str, ifname: str) -> bool:
    return subprocess.run(["ip", "-n", netns, "link", "show", ifname], capture_output=True).returncode == 0


@pytest.fixture
def rig(ovs_env: OvsEnv) -> Iterator[Rig]:
    tmp = Path(tempfile.mkdtemp(prefix=f"npc-{ovs_env.tag}-", dir="/tmp"))  # short AF_UNIX path
    r = Rig(ovs=ovs_env, hooks=RecordingHooks(), socket=tmp / "run" / "cni.sock", ipam_dir=tmp / "ipam",
            state_dir=tmp / "state", tag=secrets.token_hex(3), loop=LoopThread())
    try:
        r.start_agent()
        yield r
    finally:
        with_errors = []
        try:
            r.stop_agent()
        except Exception as exc:  # keep tearing down
            with_errors.append(exc)
        r.loop.stop()
        # Deleting a Pod namespace also deletes its veth pair; OVS goes with ovs_env.
        for ns in r.netns:
            if netns_exists(ns):
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not with_errors, with_errors
