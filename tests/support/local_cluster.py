"""A cluster of N nodes on this machine for end-to-end tests, made and unmade by the real `npaudit cluster`
verb (policy_agent/cluster/local_run.py); servers and probes run in its Pods' namespaces.

Its directory is /tmp/npc-<random>; `close` stops the servers it started (by pid), runs `npaudit cluster
down` (which stops exactly what `up` recorded) and removes the directory (kept with NPAUDIT_KEEP_E2E).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

from tests.support.cluster import PROBER, SERVER


def npaudit(*args: str, timeout: float = 300, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, input=None if stdin is None else stdin.decode())


class LocalCluster:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"npc-{secrets.token_hex(2)}-", dir="/tmp"))
        self._servers: list[subprocess.Popen[bytes]] = []

    def cluster(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`npaudit cluster VERB --dir DIR ARGS...` (the first of `args` is the verb)."""
        return npaudit("cluster", args[0], "--dir", str(self.dir), *args[1:], timeout=timeout)

    def up(self, nodes: int, *extra: str) -> None:
        res = self.cluster("up", "--nodes", str(nodes), *extra)
        if res.returncode != 0:
            raise AssertionError(f"cluster up failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")

    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.dir / "cluster.json").read_text()))

    def status(self) -> dict[str, Any]:
        res = self.cluster("status", "-o", "json", timeout=120)
        if res.returncode not in (0, 1):
            raise AssertionError(f"cluster status failed:\n{res.stderr}")
        return dict(json.loads(res.stdout))

    def config(self, node: str) -> str:
        return str(self.dir / node / "npaudit.yaml")

    def node_status(self, node: str) -> dict[str, Any]:
        res = npaudit("status", "--config", self.config(node), "-o", "json", timeout=120)
        if res.returncode != 0:
            raise AssertionError(f"npaudit status of {node} failed:\n{res.stderr}")
        return dict(json.loads(res.stdout))

    def add_pod(self, node: str, ref: str, *labels: str, server: bool = True, ip: str = "") -> dict[str, str]:
        res = npaudit("cluster", "pod", "add", "--dir", str(self.dir), "--node", node, ref,
                      *(f"--label={label}" for label in labels), *(("--ip", ip) if ip else ()))
        if res.returncode != 0:
            raise AssertionError(f"cluster pod add {ref} failed:\n{res.stdout}\n{res.stderr}")
        pod = next(p for p in self.record()["pods"] if f"{p['namespace']}/{p['name']}" == ref)
        if server:
            self.serve(pod["netns"])
        return {"ip": pod["ip"], "netns": pod["netns"], "node": pod["node"]}

    def serve(self, netns: str) -> None:
        """TCP 80, 81 and UDP 53 (echo) in `netns` until close."""
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", SERVER], stdout=subprocess.PIPE)
        self._servers.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            raise AssertionError(f"server in {netns} did not start")

    def probe(self, netns: str, targets: Iterable[str], timeout: float = 2.0) -> dict[str, str]:
        res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", PROBER, str(timeout), *targets],
                             capture_output=True, timeout=120)
        return dict(json.loads(res.stdout))

    def diagnosis(self, lines: int = 15) -> str:
        """What a failed reachability wait shows of every node: its agent log's last warnings and errors,
        and its OVS's underlay routes and userspace tunnel neighbour cache (the next hops it knows)."""
        out = []
        for node in sorted(p.name for p in self.dir.iterdir() if (p / "npaudit.yaml").exists()):
            log = self.dir / node / "agent.log"
            text = log.read_text(errors="replace").splitlines() if log.exists() else []
            warned = [line for line in text if " WARNING " in line or " ERROR " in line][-lines:]
            out.append(f"--- {node}: agent log warnings and errors (last {lines}):\n" + "\n".join(warned))
            for command in ("ovs/route/show", "tnl/neigh/show"):
                res = subprocess.run(["ovs-appctl", "-t", str(self.dir / node / "ovs" / "ovs-vswitchd.ctl"), command],
                                     capture_output=True, text=True, timeout=30)
                out.append(f"--- {node}: {command}:\n{res.stdout}{res.stderr}")
        return "\n".join(out)

    def audit_records(self, node: str) -> list[dict[str, Any]]:
        path = self.dir / node / "audit" / "audit.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def close(self) -> None:
        for proc in self._servers:
            proc.kill()
            proc.wait()
        if (self.dir / "cluster.json").exists():
            res = self.cluster("down", timeout=300)
            if res.returncode != 0:
                raise AssertionError(f"cluster down failed:\n{res.stdout}\n{res.stderr}")
        if not os.environ.get("NPAUDIT_KEEP_E2E"):
            shutil.rmtree(self.dir, ignore_errors=True)
