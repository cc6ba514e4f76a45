"""OVN's ovn-controller logging a Drop ACL, on a private OVS, for the benches to compare the agent with.

Debian 12's OVN (23.03: ovn-common, ovn-host, ovn-central) is downloaded and unpacked beside the tree, never
installed (installing ovn-host and ovn-central would enable and start their system services); `fetch` does it
once. `OvnStack` starts, in a work directory of its own: a private OVS (policy_agent/ovs/embedded.py: its
ovsdb-server, and ovs-vswitchd on the userspace datapath in a namespace of its own), OVN's northbound and
southbound ovsdb-servers, ovn-northd and ovn-controller (chassis `bench`, OVS_RUNDIR and OVN_RUNDIR in the work
directory, so it finds the bridge's .mgmt socket there). Two Pod-like namespaces `a` and `b` on veths,
bound to logical switch ports of one logical switch, and one ACL as an OVN user writes it:

    ovn-nbctl --log --name=flood --severity=info acl-add ls to-lport 1000 \
        'outport == "lsp-b" && udp && udp.dst >= 1024' drop

ovn-controller's pinctrl thread reads the packet-in over the bridge's .mgmt socket and writes an `acl_log` line
to ovn-controller's own log file (OVN's ACL logging as shipped: no meter unless asked for). Everything is stopped
by the pids in its pid files (SIGTERM, then SIGKILL), and the namespaces it made are deleted by name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from policy_agent.ovs.embedded import EmbeddedOvs, netns_exists
from policy_agent.ovs.pids import read_pid, stop_pid
from tests.support.cluster import coverage_total
from tests.support.debs import unpacked
from tests.support.podnet import PodNet, create_pod, set_neighbor

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "ovn"
PACKAGES = ("ovn-common", "ovn-host", "ovn-central")
BRIDGE = "br-int"
SUBNET = "10.250.0"  # inside the namespaces made here only
ACL_NAME = "flood"
ACL_MATCH = 'outport == "lsp-b" && udp && udp.dst >= 1024'
# The OVN daemons this stack starts, in the order they start (stopped in reverse).
DAEMONS = ("ovn-nb", "ovn-sb", "ovn-northd", "ovn-controller")
_ACL_LINE = re.compile(rb'\|acl_log\([^)]*\)\|[A-Z]+\|name="([^"]*)", verdict=drop,.*[ ,]tp_dst=(\d+)')


def fetch(cache: Path = CACHE) -> Path:
    """The private root holding usr/bin/ovn-controller: downloaded and unpacked once, then reused. OVN's
    binaries need only what openvswitch-switch brings (libssl, libcap-ng, libunbound)."""
    return unpacked(cache, PACKAGES, "usr/bin/ovn-controller")


def version(root: Path) -> str:
    """ovn-controller's own version line (e.g. 'ovn-controller 23.03.1')."""
    out = subprocess.run([str(root / "usr/bin/ovn-controller"), "--version"], capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()[0].strip()


def acl_drop_port(line: bytes, name: str = ACL_NAME) -> int | None:
    """The UDP destination port of ovn-controller's acl_log line for a drop by the ACL named `name`, else None."""
    got = _ACL_LINE.search(line)
    if got is None or got.group(1) != name.encode():
        return None
    return int(got.group(2))


class AclLines:
    """Counts the ACL drop lines appended to ovn-controller's log since the last count (a whole line at a time)."""

    def __init__(self, path: Path, name: str = ACL_NAME) -> None:
        self.path, self.name = path, name
        self._offset = path.stat().st_size if path.exists() else 0

    def new(self) -> int:
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        whole = data.rfind(b"\n") + 1
        self._offset += whole
        return sum(1 for line in data[:whole].splitlines() if acl_drop_port(line, self.name) is not None)


class OvnStack:
    """A private OVS with OVN's databases, northd and ovn-controller in `work`, namespaces named from `tag`."""

    def __init__(self, root: Path, work: Path, tag: str) -> None:
        self.root, self.work, self.tag = root, work, tag
        self.ovs = EmbeddedOvs(run_dir=work / "ovs", netns=f"{tag}-ovs")
        self.pods: list[PodNet] = []
        self._pod_netns: list[str] = []  # named before each is made, so a failed start deletes it too
        self._started: list[str] = []

    @property
    def log(self) -> Path:
        """ovn-controller's log file, where it writes its ACL log lines."""
        return self.work / "ovn-controller.log"

    def _env(self) -> dict[str, str]:
        ovs, ovn = str(self.ovs.run_dir), str(self.work)
        return dict(os.environ, OVS_RUNDIR=ovs, OVS_LOGDIR=ovs, OVS_DBDIR=ovs, OVS_SYSCONFDIR=ovs,
                    OVN_RUNDIR=ovn, OVN_LOGDIR=ovn, OVN_DBDIR=ovn, OVN_SYSCONFDIR=ovn)

    def _run(self, *cmd: str, timeout: float = 60) -> str:
        done = subprocess.run(list(cmd), capture_output=True, text=True, env=self._env(), timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def _bin(self, name: str) -> str:
        return str(self.root / "usr/bin" / name)

    def _pidfile(self, daemon: str) -> Path:
        return self.work / f"{daemon}.pid"

    def pid(self, daemon: str) -> int | None:
        """The pid of one of DAEMONS while it runs and holds its pid file's lock, else None."""
        return read_pid(self._pidfile(daemon))

    def nbctl(self, *args: str) -> str:
        return self._run(self._bin("ovn-nbctl"), f"--db=unix:{self.work / 'nb.sock'}", *args)

    def _vsctl(self, *args: str) -> str:
        return self._run("ovs-vsctl", f"--db={self.ovs.db_remote}", *args)

    def add_port(self, bridge: str, name: str, ofport: int) -> int:
        """create_pod's port: bound to the logical switch port lsp-<pod> by its iface-id."""
        self._vsctl("add-port", bridge, name, "--", "set", "interface", name, f"ofport_request={ofport}",
                    f"external_ids:iface-id=lsp-{name.rsplit('-', 1)[-1]}")
        return int(self._vsctl("get", "interface", name, "ofport").strip())

    def up(self, timeout: float = 60) -> None:
        """Start everything, bind the two Pods and install the logged Drop ACL; returns once ovn-controller has
        put it in OVS (`ovn-nbctl --wait=hv sync`). A start that fails part way stops what it started."""
        self.work.mkdir(parents=True, exist_ok=True)
        try:
            self.ovs.up(started=self._started)
            for db in ("nb", "sb"):
                self._run("ovsdb-tool", "create", str(self.work / f"{db}.db"),
                          str(self.root / f"usr/share/ovn/ovn-{db}.ovsschema"))
                self._daemon(f"ovn-{db}", "ovsdb-server", str(self.work / f"{db}.db"),
                             f"--remote=punix:{self.work / f'{db}.sock'}", f"--unixctl={self.work / f'{db}.ctl'}")
            self._daemon("ovn-northd", self._bin("ovn-northd"), f"--ovnnb-db=unix:{self.work / 'nb.sock'}",
                         f"--ovnsb-db=unix:{self.work / 'sb.sock'}", f"--unixctl={self.work / 'northd.ctl'}")
            self._vsctl("set", "open", ".", "external_ids:system-id=bench",
                        f"external_ids:ovn-remote=unix:{self.work / 'sb.sock'}", "external_ids:ovn-encap-type=geneve",
                        "external_ids:ovn-encap-ip=127.0.0.1", "external_ids:ovn-bridge-datapath-type=netdev")
            self._vsctl("add-br", BRIDGE, "--", "set", "bridge", BRIDGE, "datapath_type=netdev", "fail_mode=secure")
            self._daemon("ovn-controller", self._bin("ovn-controller"), self.ovs.db_remote)
            self.nbctl("ls-add", "ls")
            for i, name in enumerate(("a", "b"), start=1):
                mac = f"0a:00:00:00:00:{i:02x}"
                self.nbctl("lsp-add", "ls", f"lsp-{name}", "--", "lsp-set-addresses", f"lsp-{name}",
                           f"{mac} {SUBNET}.{i}")
                self._pod_netns.append(f"{self.tag}-{name}")
                self.pods.append(create_pod(self, BRIDGE, netns=f"{self.tag}-{name}",
                                            host_if=f"{self.tag[-10:]}-{name}", ip_cidr=f"{SUBNET}.{i}/24",
                                            mac=mac, ofport=i, ovs_netns=self.ovs.netns))
            set_neighbor(self.pods[0], self.pods[1])
            self.nbctl("--log", f"--name={ACL_NAME}", "--severity=info", "acl-add", "ls", "to-lport", "1000",
                       ACL_MATCH, "drop")
            self.nbctl("--wait=hv", f"--timeout={int(timeout)}", "sync")
        except BaseException:
            self.down()
            raise

    def _daemon(self, name: str, *cmd: str) -> None:
        pidfile = self._pidfile(name)
        self._run(*cmd, f"--pidfile={pidfile}", f"--log-file={self.work / (name + '.log')}", "--no-chdir",
                  "--detach")
        self._started.append(name)
        deadline = time.monotonic() + 15
        while self.pid(name) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start; see {self.work / (name + '.log')}")
            time.sleep(0.02)

    def sender(self) -> tuple[str, str]:
        """(the sending Pod's namespace, the address of the Pod whose ingress the ACL drops)."""
        return self.pods[0].netns, self.pods[1].ip

    def acl_log_flow_packets(self) -> int:
        """n_packets of the flows that send a packet to ovn-controller for an ACL log line (OVN's log action:
        controller(userdata=00.00.00.07...), opcode 7): the packet-ins OVS emitted for the ACL's log."""
        out = self._run("ovs-ofctl", "-O", "OpenFlow15", "dump-flows", f"unix:{self.ovs.run_dir / (BRIDGE + '.mgmt')}")
        return sum(int(m.group(1)) for line in out.splitlines() if "controller(userdata=00.00.00.07." in line
                   and (m := re.search(r"n_packets=(\d+)", line)) is not None)

    def rconn_overflow(self) -> int:
        """OVS's rconn_overflow coverage counter: packet-ins dropped because a controller's queue was full."""
        out = self._run("ovs-appctl", "-t", str(self.ovs.run_dir / "ovs-vswitchd.ctl"), "coverage/show")
        return coverage_total(out, "rconn_overflow")

    def pinctrl_tid(self) -> int | None:
        """ovn-controller's thread that reads packet-ins and writes the ACL log lines (ovn_pinctrl*)."""
        pid = self.pid("ovn-controller")
        if pid is None:
            return None
        for task in Path(f"/proc/{pid}/task").iterdir():
            if (task / "comm").read_text().startswith("ovn_pinctrl"):
                return int(task.name)
        return None

    def down(self) -> None:
        """Stop the OVN daemons this stack started (last first), delete its Pods' namespaces, stop its OVS."""
        for name in reversed(DAEMONS):
            pid = self.pid(name) if name in self._started else None
            if pid is not None:
                stop_pid(pid, lambda n=name, p=pid: self.pid(n) == p, 10)
        self._started = [s for s in self._started if s not in DAEMONS]
        for netns in self._pod_netns:
            if netns_exists(netns):
                subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        self.pods, self._pod_netns = [], []
        self.ovs.undo(self._started)
        self._started = []


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE))
