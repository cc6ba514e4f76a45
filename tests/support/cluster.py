"""A one-node cluster for end-to-end tests: the real agent process, Pods made through `npaudit cni`,
servers and probes inside the Pods' network namespaces.

Everything is named with a random tag and removed by that name (namespaces) or
pid (processes) at the end, even when a test fails. `with Cluster(...) as c` starts the agent
and closes everything at the end (the e2e `cluster` fixture, tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Iterable, Self

SUBNET = "10.246.0.0/24"
GATEWAY = "10.246.0.1"
SERVER_PORTS = (80, 81)
UDP_PORT = 53

# Listens on TCP 80, 81 and UDP 53 (echo) inside a Pod namespace until killed.
SERVER = r"""
import socket, threading
def tcp(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(128)
    while True:
        c, _ = s.accept(); c.close()
def udp(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(2048); s.sendto(data, peer)
for p in (80, 81):
    threading.Thread(target=tcp, args=(p,), daemon=True).start()
threading.Thread(target=udp, args=(53,), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""

# Probes targets concurrently; prints {"ip:port/proto": "connected"|"refused"|"timeout"|...}.
PROBER = r"""
import json, socket, sys, concurrent.futures as cf
timeout = float(sys.argv[1])
def probe(t):
    addr, proto = t.split("/"); ip, port = addr.rsplit(":", 1)
    if proto == "tcp":
        s = socket.socket(); s.settimeout(timeout)
        try:
            s.connect((ip, int(port))); return "connected"
        except ConnectionRefusedError: return "refused"
        except socket.timeout: return "timeout"
        except OSError as e: return "error:%d" % e.errno
        finally: s.close()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(timeout)
    try:
        s.sendto(b"probe", (ip, int(port))); s.recvfrom(64); return "connected"
    except socket.timeout: return "timeout"
    except OSError as e: return "refused" if e.errno in (111, 113) else "error:%d" % e.errno
    finally: s.close()
targets = sys.argv[2:]
with cf.ThreadPoolExecutor(32) as ex:
    print(json.dumps(dict(zip(targets, ex.map(probe, targets)))))
"""


# Accepts TCP on argv[1]:argv[2] and appends each client's address to the file argv[3].
PEER_LOGGER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
print("ready", flush=True)
while True:
    c, peer = s.accept(); c.close()
    with open(sys.argv[3], "a") as f:
        f.write(peer[0] + "\n")
"""


def logged_udp_drop(name: str, to_ns: str, from_ns: str, label: str, port: int = 53) -> str:
    """A securityops ClusterNetworkPolicy dropping UDP `port` from Namespace `from_ns` to `to_ns`, logged."""
    return (f"apiVersion: crd.antrea.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata: {{name: {name}}}\n"
            f"spec:\n  tier: securityops\n  priority: 3\n"
            f"  appliedTo: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {to_ns}}}}}}}]\n"
            f"  ingress:\n  - name: drop-udp\n    action: Drop\n    enableLogging: true\n    logLabel: {label}\n"
            f"    from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {from_ns}}}}}}}]\n"
            f"    ports: [{{protocol: UDP, port: {port}}}]\n")


def _npaudit(*args: str, env: dict[str, str] | None = None, stdin: bytes | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *args], input=stdin, env=env,
                          capture_output=True, timeout=timeout)



def coverage_total(coverage_show: str, counter: str) -> int:
    """A counter's total in `ovs-appctl coverage/show`'s text (0 when OVS has not counted it yet), read apart
    from the agent's own reader (policy_agent/ovs/coverage.py) so that a test can hold the agent to it."""
    got = re.search(rf"^{re.escape(counter)}\s.*total: (\d+)", coverage_show, re.M)
    return int(got.group(1)) if got else 0

@dataclass
class PodHandle:
    namespace: str
    name: str
    netns: str
    container_id: str
    ip: str
    mac: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class StartedInWith:
    """`with x:` runs x.start() and, at the end or when the start fails, x.close()."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Cluster(StartedInWith):
    """The agent (embedded OVS in its own namespace) plus Pods on it."""

    def __init__(self, extra_config: str = "", metrics_listen: str = "", gateway: bool = False,
                 subnet: str = SUBNET) -> None:
        """`extra_config`: YAML sections appended to the agent's config (e.g. `offload:`). `gateway`: the
        node gateway on `subnet` (node_network.pod_cidr) and the Pods' default route through it."""
        self.tag = secrets.token_hex(3)
        self.gateway = gateway
        if gateway:
            extra_config += f"node_network:\n  pod_cidr: {subnet}\n"
        self.dir = Path(tempfile.mkdtemp(prefix=f"npe-{self.tag}-", dir="/tmp"))
        self.state = self.dir / "state"
        self.tap = self.dir / "tap.jsonl"
        self.config = self.dir / "agent.yaml"
        self.config.write_text(
            f"state_dir: {self.state}\n"
            f"ovs:\n  run_dir: {self.dir / 'ovs'}\n  netns: npe-{self.tag}\n"
            f"metrics:\n  listen: '{metrics_listen}'\n"
            f"packetin:\n  tap: {self.tap}\n"
            f"audit:\n  path: {self.dir / 'audit' / 'audit.jsonl'}\n" + extra_config)
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_netns = ""  # where the agent runs ("" = here); with an external OVS, that OVS's namespace
        self.ovs_run_dir = self.dir / "ovs"  # the switch's run dir (br-int.mgmt)
        self.pods: dict[str, PodHandle] = {}
        self._servers: list[subprocess.Popen[bytes]] = []
        self._netns: list[str] = []
        self._log = open(self.dir / "agent.log", "wb")

    # --- agent -----------------------------------------------------------------------

    def start(self, timeout: float = 30) -> None:
        netns = ["ip", "netns", "exec", self.agent_netns] if self.agent_netns else []
        self.agent = subprocess.Popen([*netns, sys.executable, "-m", "policy_agent.cli.main", "agent", "--config",
                                       str(self.config)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not (self.state / "api.sock").exists():
            if self.agent.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"agent did not start:\n{self.log()}")
            time.sleep(0.05)

    def stop_agent(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                code = self.agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.agent.send_signal(signal.SIGUSR2)  # the agent writes every thread's stack to its log (if its loop turns)
                try:  # a stop that ends late names its slowest steps (policy_agent.agent.StopSteps): wait for that too
                    late = f"it exited with {self.agent.wait(timeout=20)} after"
                except subprocess.TimeoutExpired:
                    late = "still running 20 s after"
                raise AssertionError(f"agent still running 15 s after SIGTERM; {late} its stacks were asked "
                                     f"for:\n{self.log()[-20000:]}") from None
            if code != 0:
                raise AssertionError(f"agent exited with {code}:\n{self.log()}")

    def flows(self) -> list[str]:
        """What OVS holds, through an independent client (ovs-ofctl)."""
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows",
                              f"unix:{self.ovs_run_dir / 'br-int.mgmt'}"], capture_output=True, text=True)
        return [line for line in out.stdout.splitlines() if "cookie=" in line]

    def controller_flow_packets(self) -> int:
        """n_packets of every flow whose actions send to the controller (before any meter band drop)."""
        return sum(int(re.search(r"n_packets=(\d+)", line).group(1))  # type: ignore[union-attr]
                   for line in self.flows() if "controller" in line.split("actions=", 1)[-1])

    def meter_band_drops(self) -> int:
        """Packets every meter's bands dropped, from OVS (ovs-ofctl meter-stats)."""
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "meter-stats", f"unix:{self.dir / 'ovs' / 'br-int.mgmt'}"],
                             capture_output=True, text=True).stdout
        return sum(int(n) for n in re.findall(r"\d+: packet_count:(\d+)", out))

    def add_settings(self, section: str, yaml_lines: str) -> None:
        """Adds `yaml_lines` (unindented) to the config's top-level `section`, which it already has; before start()."""
        text, head = self.config.read_text(), f"\n{section}:\n"
        if head not in text:
            raise AssertionError(f"no {section}: section in {text}")
        self.config.write_text(text.replace(head, head + textwrap.indent(yaml_lines, "  "), 1))

    def log(self) -> str:
        self._log.flush()
        return (self.dir / "agent.log").read_text(errors="replace")

    def apply(self, manifests: str, op: str = "apply") -> None:
        path = self.dir / f"m-{secrets.token_hex(3)}.yaml"
        path.write_text(manifests)
        res = _npaudit(op, "-f", str(path), "--config", str(self.config))
        if res.returncode != 0:
            raise AssertionError(f"npaudit {op} failed: {res.stderr.decode()}")

    # --- Pods ------------------------------------------------------------------------

    def netconf(self) -> bytes:
        return json.dumps({
            "cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit",
            "agentSocket": str(self.state / "cni.sock"),
            # With the gateway the range is the agent's node_network.pod_cidr, handed to host-local as the shipped
            # conflist expects; without it the netconf names its own.
            "ipam": {"type": "host-local", "dataDir": str(self.dir / "ipam"),
                     **({"routes": [{"dst": "0.0.0.0/0"}]} if self.gateway else
                        {"ranges": [[{"subnet": SUBNET, "gateway": GATEWAY}]]})}
        }).encode()

    def cni(self, command: str, pod: PodHandle) -> subprocess.CompletedProcess[bytes]:
        env = dict(os.environ, CNI_COMMAND=command, CNI_CONTAINERID=pod.container_id,
                   CNI_NETNS=f"/run/netns/{pod.netns}", CNI_IFNAME="eth0", CNI_PATH="/usr/lib/cni",
                   CNI_ARGS=f"K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}")
        return _npaudit("cni", env=env, stdin=self.netconf())

    @property
    def node_netns(self) -> str:
        """The embedded OVS's namespace: the node's host side, where the gateway port is."""
        return f"npe-{self.tag}"

    def new_netns(self) -> str:
        netns = f"npe-{self.tag}-{len(self._netns)}"
        subprocess.run(["ip", "netns", "add", netns], check=True)
        subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)
        self._netns.append(netns)
        return netns

    def linked_netns(self, dev: str, node_side: str, far_side: str) -> str:
        """A new namespace joined to the node's (`node_netns`) by a veth: `dev` there holding the address
        `node_side` ("ip/prefix"), `eth0` in the new one holding `far_side`, both up; removed at close
        (the veth with it). Routes and more addresses are the caller's."""
        ns, node = self.new_netns(), self.node_netns
        for netns, args in ((node, ("link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", ns)),
                            (node, ("addr", "add", node_side, "dev", dev)), (node, ("link", "set", dev, "up")),
                            (ns, ("addr", "add", far_side, "dev", "eth0")), (ns, ("link", "set", "eth0", "up"))):
            subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True)
        return ns

    def add_pod(self, namespace: str, name: str, server: bool = True, netns: str | None = None) -> PodHandle:
        netns = netns or self.new_netns()
        pod = PodHandle(namespace, name, netns, f"c{self.tag}{len(self.pods)}", "")
        self.pods[pod.ref] = pod
        res = self.cni("ADD", pod)
        if res.returncode != 0:
            raise AssertionError(f"CNI ADD {pod.ref} failed: {res.stdout.decode()}\n{self.log()}")
        result = json.loads(res.stdout)
        pod.ip = result["ips"][0]["address"].split("/")[0]
        pod.mac = next(i["mac"] for i in result["interfaces"] if i.get("sandbox"))
        if server:
            self.serve(pod)
        return pod

    def serve(self, pod: PodHandle) -> None:
        proc = subprocess.Popen(["ip", "netns", "exec", pod.netns, sys.executable, "-c", SERVER],
                                stdout=subprocess.PIPE)
        self._servers.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            raise AssertionError(f"server in {pod.ref} did not start")

    def listen(self, netns: str, ip: str, port: int) -> Path:
        """A TCP listener on ip:port in `netns` (stopped at close); returns the file it appends each
        client's address to."""
        peers = self.dir / f"peers-{secrets.token_hex(3)}"
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", PEER_LOGGER, ip, str(port),
                                 str(peers)], stdout=subprocess.PIPE)
        self._servers.append(proc)
        if proc.stdout is None or proc.stdout.readline().strip() != b"ready":
            raise AssertionError(f"listener on {ip}:{port} in {netns} did not start")
        return peers

    def probe_from(self, netns: str, targets: Iterable[str], timeout: float = 1.0) -> dict[str, str]:
        """Probe from any namespace of this test (the node's, an outside one)."""
        res = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", PROBER, str(timeout), *targets],
                             capture_output=True, timeout=60)
        return json.loads(res.stdout)

    def probe(self, src: str, targets: Iterable[str], timeout: float = 1.0) -> dict[str, str]:
        pod = self.pods[src]
        res = subprocess.run(["ip", "netns", "exec", pod.netns, sys.executable, "-c", PROBER, str(timeout),
                              *targets], capture_output=True, timeout=60)
        return json.loads(res.stdout)

    def probe_concurrently(self, targets: dict[str, list[str]], timeout: float = 1.0) -> dict[str, dict[str, str]]:
        """Probe from several Pods at once, as the Kubernetes netpol e2e suite does:
        {src: [target, ...]} -> {src: {target: outcome}}."""
        procs = {src: subprocess.Popen(["ip", "netns", "exec", self.pods[src].netns, sys.executable, "-c", PROBER,
                                        str(timeout), *tgts], stdout=subprocess.PIPE)
                 for src, tgts in targets.items() if tgts}
        return {src: json.loads(proc.communicate(timeout=60)[0]) for src, proc in procs.items()}

    def rconn_overflow(self) -> int:
        """ovs-vswitchd's own count of the packet-ins it dropped from a full controller queue."""
        return coverage_total(self.ovs_appctl("coverage/show"), "rconn_overflow")

    def ovs_appctl(self, *args: str) -> str:
        """Ask the embedded ovs-vswitchd (e.g. dpctl/dump-conntrack) through its control socket."""
        out = subprocess.run(["ovs-appctl", "-t", str(self.dir / "ovs" / "ovs-vswitchd.ctl"), *args],
                             capture_output=True, text=True, timeout=30)
        return out.stdout + out.stderr

    def audit_records(self) -> list[dict]:
        path = self.dir / "audit" / "audit.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def tap_lines(self) -> list[dict]:
        if not self.tap.exists():
            return []
        return [json.loads(line) for line in self.tap.read_text().splitlines() if line.strip()]

    # --- teardown --------------------------------------------------------------------

    def close(self) -> None:
        for proc in self._servers:
            proc.kill()
            proc.wait()
        for pod in list(self.pods.values()):
            if self.agent is not None and self.agent.poll() is None:
                self.cni("DEL", pod)
        for netns in self._netns:
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        if self.agent is not None and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        _npaudit("ovs", "down", "--config", str(self.config))
        self._log.close()
        if not os.environ.get("NPAUDIT_KEEP_E2E"):
            shutil.rmtree(self.dir, ignore_errors=True)
