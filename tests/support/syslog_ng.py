"""A private syslog-ng for tests, from Debian's packages unpacked beside the tree (never installed).

Debian's syslog-ng-core conflicts with rsyslog (both provide system-log-daemon),
and the tests need both. So `fetch` downloads the .debs with `apt-get download`
(syslog-ng-core and the libraries it needs that rsyslog's machine lacks:
`apt-cache depends syslog-ng-core`) into a cache directory and unpacks them with
`dpkg-deb -x` into a private root; `make setup` runs it (`python -m
tests.support.syslog_ng`), and it does nothing once the root is there. The
daemon runs that binary with its own config, persist file, pid file and control
socket in a temporary directory, on loopback ports, and is stopped by its pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from tests.support.certs import Pki
from tests.support.debs import unpacked
from tests.support.rsyslog import free_port, templated

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "syslog-ng"
VERSION = "3.38"  # Debian 12's; the module directory is named after it
# syslog-ng-core and what it needs beyond a machine with rsyslog (apt-cache depends syslog-ng-core).
PACKAGES = ("syslog-ng-core", "libivykis0", "libnet1", "libpcre3", "libwrap0")


def fetch(cache: Path = CACHE) -> Path:
    """The private root holding usr/sbin/syslog-ng: downloaded and unpacked once, then reused."""
    return unpacked(cache, PACKAGES, "usr/sbin/syslog-ng")


def environment(root: Path) -> dict[str, str]:
    libs = [root / "usr/lib/syslog-ng", root / "usr/lib/x86_64-linux-gnu", root / "lib/x86_64-linux-gnu"]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(map(str, libs))}


def command(root: Path, conf: Path, *extra: str) -> list[str]:
    return [str(root / "usr/sbin/syslog-ng"), f"--module-path={root / 'usr/lib/syslog-ng' / VERSION}",
            "-f", str(conf), *extra]


class SyslogNgDaemon:
    """syslog-ng -F with the config file `conf`; started once each TCP port in `tcp_ports` accepts."""

    def __init__(self, root: Path, workdir: Path, conf: Path, tcp_ports: Sequence[int]) -> None:
        self.root, self.dir, self.conf, self.tcp_ports = root, workdir, conf, tuple(tcp_ports)
        self.proc: subprocess.Popen[bytes] | None = None

    def syntax_check(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command(self.root, self.conf, "--syntax-only"), env=environment(self.root),
                              capture_output=True, text=True)

    def start(self) -> None:
        log = open(self.dir / "syslog-ng.log", "ab")
        self.proc = subprocess.Popen(
            command(self.root, self.conf, "-F", "--no-caps", "-R", str(self.dir / "syslog-ng.persist"),
                    "-p", str(self.dir / "syslog-ng.pid"), "-c", str(self.dir / "syslog-ng.ctl")),
            env=environment(self.root), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"syslog-ng exited: {(self.dir / 'syslog-ng.log').read_text()}")
            try:
                for port in self.tcp_ports:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("syslog-ng did not start within 15 s")

    def stop(self) -> None:
        """SIGTERM by pid (syslog-ng flushes and closes its files), SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


class SyslogNgReceiver:
    """config/syslog/syslog-ng-receiver.conf, as shipped, in a private syslog-ng on loopback ports (only its paths
    and ports swapped)."""

    def __init__(self, root: Path, workdir: Path, pki: Pki) -> None:
        self.out = workdir / "out"
        tls_dir = workdir / "tls"
        tls_dir.mkdir(parents=True)
        for src, dst in ((pki.cert, "server.pem"), (pki.key, "server.key")):
            shutil.copy(src, tls_dir / dst)
        self.ports = {"udp": free_port(socket.SOCK_DGRAM), "tcp": free_port(), "tls": free_port()}
        conf = templated("syslog-ng-receiver.conf", workdir / "syslog-ng.conf", {
            "/var/log/npaudit-siem/": f"{self.out}/",
            "/etc/syslog-ng/npaudit-tls/": f"{tls_dir}/",
            'ip("0.0.0.0") port(514) transport("udp")': f'ip("127.0.0.1") port({self.ports["udp"]}) transport("udp")',
            'ip("0.0.0.0") port(514) transport("tcp")': f'ip("127.0.0.1") port({self.ports["tcp"]}) transport("tcp")',
            'ip("0.0.0.0") port(6514)': f'ip("127.0.0.1") port({self.ports["tls"]})',
        })
        self.daemon = SyslogNgDaemon(root, workdir, conf, (self.ports["tcp"], self.ports["tls"]))

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.ports[scheme]}"

    @property
    def nodes_dir(self) -> Path:
        return self.out / "nodes"

    def count(self, name: str) -> int:
        try:
            return (self.out / name).read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0


if __name__ == "__main__":
    print(fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else CACHE))
