"""`npaudit demo`: the embedded default end to end, with real packets.

A private OVS in a namespace of its own; the sample policies in config/samples
(a logged securityops ClusterNetworkPolicy, a Kubernetes NetworkPolicy in the
logging-enabled Namespace z, a custom Tier); Pods created through the real
`npaudit cni` plugin; real TCP connections between them; the audit records
they produce printed live as they reach the audit file. It ends as an operator
would look at them: `npaudit logs` and `npaudit stats` over this run's records
(asking the still-running agent for its counters), then `npaudit verify` of the
file's hash chain after the agent stopped.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from packetin.quiet import new_event_loop
from policy_agent.config import loader as config_mod
from policy_agent.agent import Agent
from policy_agent.policy.manifests import load_path

log = logging.getLogger("npaudit.demo")

BASE = Path("/var/run/npaudit/demo")
OVS_NETNS = "npaudit-demo-ovs"
SAMPLES = Path(__file__).resolve().parent.parent / "config" / "samples"
SUBNET, GATEWAY = "10.247.0.0/24", "10.247.0.1"
PODS = (("x", "a"), ("x", "b"), ("y", "a"), ("z", "a"))
# (from, to, port, what the policies say)
PROBES = (
    ("x/a", "y/a", 80, "dropped: securityops ClusterNetworkPolicy drop-x-a-to-y-http (logged, label x-a-to-y-http)"),
    ("x/b", "y/a", 80, "allowed: the ClusterNetworkPolicy names x/a only"),
    ("x/a", "z/a", 80, "allowed: K8s NetworkPolicy z/allow-x-to-a (logged: Namespace z has logging on)"),
    ("y/a", "z/a", 80, "dropped: z/a is isolated by z/allow-x-to-a (logged)"),
)
SERVER = ("import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', 80)); s.listen(16)\nprint('ready', flush=True)\n"
          "while True:\n    c, _ = s.accept(); c.close()\n")


class FileTail:
    """Prints the lines added to the audit file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Records of earlier demo runs stay in the file (the chain continues): skip them.
        self._offset = path.stat().st_size if path.exists() else 0

    def show(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        complete = data[:data.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = complete.decode().splitlines()
        for line in lines:
            print(line, flush=True)
        return len(lines)


def _cni(command: str, netns: str, namespace: str, name: str, state: Path) -> dict[str, Any]:
    netconf = {"cniVersion": "1.0.0", "name": "npaudit-demo", "type": "npaudit",
               "agentSocket": str(state / "cni.sock"),
               "ipam": {"type": "host-local", "ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]],
                        "dataDir": str(BASE / "ipam")}}
    env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=f"demo-{namespace}-{name}",
               CNI_NETNS=f"/run/netns/{netns}", CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni",
               CNI_ARGS=f"K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}")
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "cni"], input=json.dumps(netconf).encode(),
                         env=env, capture_output=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"CNI {command} {namespace}/{name}: {res.stdout.decode()}")
    return json.loads(res.stdout) if res.stdout.strip() else {}


def _connect(netns: str, ip: str, port: int) -> str:
    code = (f"import socket\ns=socket.socket(); s.settimeout(1.0)\n"
            f"try:\n    s.connect(('{ip}', {port})); print('connected')\n"
            f"except ConnectionRefusedError: print('refused')\nexcept OSError: print('timed out')\n")
    res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=10)
    return res.stdout.strip()


def _write_config(state: Path, audit_path: Path) -> Path:
    """The demo's agent config as a file, so `npaudit logs|stats --config` find its audit file and agent."""
    path = BASE / "npaudit.yaml"
    BASE.mkdir(parents=True, exist_ok=True)
    path.write_text(f"state_dir: {state}\naudit:\n  path: {audit_path}\nmetrics:\n  listen: \"\"\n"
                    f"ovs:\n  run_dir: {BASE / 'ovs'}\n  netns: {OVS_NETNS}\n")
    return path


def show_command(*args: str) -> int:
    """Run `npaudit ARGS` as an operator would, its output interleaved with the demo's; its exit status."""
    print(f"$ npaudit {' '.join(args)}", flush=True)
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], timeout=60).returncode


def since_stamp(when: float) -> str:
    """RFC 3339 at millisecond resolution, rounded down (records carry millisecond times)."""
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def run_demo(duration: float = 0.0, keep: bool = False) -> int:
    state = BASE / "state"
    audit_path = BASE / "audit" / "audit.jsonl"
    config_path = _write_config(state, audit_path)
    cfg = config_mod.load(config_path)
    agent = Agent(cfg)
    since = since_stamp(time.time())
    tail = FileTail(audit_path)
    objs = load_path(SAMPLES)
    netns_made: list[str] = []
    failed: list[str] = []
    servers: list[subprocess.Popen[bytes]] = []

    async def main() -> None:
        await agent.start()
        if agent.engine is None:
            raise RuntimeError("the agent started without its policy engine")
        pods: dict[str, str] = {}
        try:
            await agent.engine.apply(objs.namespaces, objs.pods, objs.tiers, objs.policies)
            log.info("applied %s: %d policies, %d rules realised", SAMPLES, len(objs.policies), len(agent.rules))
            for ns, name in PODS:
                netns = f"npaudit-demo-{ns}-{name}"
                subprocess.run(["ip", "netns", "add", netns], check=True)
                netns_made.append(netns)
                result = await asyncio.to_thread(_cni, "ADD", netns, ns, name, state)
                pods[f"{ns}/{name}"] = result["ips"][0]["address"].split("/")[0]
                log.info("Pod %s/%s: %s (CNI ADD returned after its policy was in OVS)", ns, name,
                         pods[f"{ns}/{name}"])
            for ref in ("y/a", "z/a"):
                proc = subprocess.Popen(["ip", "netns", "exec", f"npaudit-demo-{ref.replace('/', '-')}",
                                         sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
                servers.append(proc)
                if proc.stdout is not None:
                    proc.stdout.readline()
            log.info("audit records (%s) follow, one JSON object per line", audit_path)
            for src, dst, port, why in PROBES:
                got = await asyncio.to_thread(_connect, f"npaudit-demo-{src.replace('/', '-')}", pods[dst], port)
                log.info("%s -> %s:%d %s (%s)", src, dst, port, got, why)
                await asyncio.sleep(0.2)
                tail.show()
            await asyncio.sleep(duration)
            await agent.demux.wait_idle()
            log.info("packet-ins per category: %s", json.dumps(agent.demux.stats()))
            log.info("this run's records as an operator sees them (earlier runs' records stay in the file)")
            for args in (("logs", "--config", str(config_path), "--since", since, "-o", "compact"),
                         ("stats", "--config", str(config_path), "--since", since)):
                if await asyncio.to_thread(show_command, *args) != 0:
                    failed.append(f"npaudit {args[0]}")
        finally:
            for proc in servers:
                proc.kill()
                proc.wait()
            if not keep:
                for ns, name in PODS:
                    if f"{ns}/{name}" in pods:
                        await asyncio.to_thread(_cni, "DEL", f"npaudit-demo-{ns}-{name}", ns, name, state)
            await agent.stop()
            tail.show()  # what the aggregation windows held until the stop

    start = time.monotonic()
    try:
        with asyncio.Runner(loop_factory=new_event_loop) as runner:  # the agent's own loop (packetin/quiet.py)
            runner.run(main())
        verdict = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "verify", str(audit_path.parent)],
                                 capture_output=True, text=True)
        log.info("npaudit verify %s: %s", audit_path.parent, verdict.stdout.strip().splitlines()[0]
                 if verdict.stdout.strip() else verdict.stderr.strip())
        if verdict.returncode != 0:
            failed.append("npaudit verify")
    finally:
        if not keep:
            for netns in netns_made:
                subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
            if agent.switch.embedded is not None:
                agent.switch.embedded.down()
    log.info("demo finished in %.1fs%s", time.monotonic() - start,
             f" (left running: npaudit ovs down --run-dir {BASE / 'ovs'} --netns {OVS_NETNS})" if keep else "")
    if failed:
        log.error("demo: %s failed (output above)", ", ".join(failed))
        return 1
    return 0
