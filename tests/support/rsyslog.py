"""A private rsyslogd for tests: its own config, pid file, work directory and loopback ports; stopped by its pid."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from tests.support.certs import Pki
from tests.support.ports import free_port

# One JSON object per received message, the RFC 5424 fields as rsyslog parsed them.
_TEMPLATE = """template(name="npaudit_fields" type="list" option.jsonf="on") {
  property(outname="pri" name="pri" format="jsonf")
  property(outname="timestamp" name="timereported" dateFormat="rfc3339" format="jsonf")
  property(outname="hostname" name="hostname" format="jsonf")
  property(outname="app_name" name="app-name" format="jsonf")
  property(outname="procid" name="procid" format="jsonf")
  property(outname="msgid" name="msgid" format="jsonf")
  property(outname="sd" name="structured-data" format="jsonf")
  property(outname="msg" name="msg" format="jsonf")
}
"""
SHIPPED = Path(__file__).resolve().parents[2] / "config" / "syslog"
INPUTS = ("udp", "tcp", "tls")  # "tls": imtcp with the ossl stream driver (rsyslog-openssl)


class RsyslogDaemon:
    """rsyslogd -n with the config file `conf`; started once each TCP port in `tcp_ports` accepts (else the pid file)."""

    def __init__(self, workdir: Path, conf: Path, tcp_ports: Sequence[int] = ()) -> None:
        self.dir = workdir
        self.conf = conf
        self.tcp_ports = tuple(tcp_ports)
        self.pidfile = self.dir / "rsyslogd.pid"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.dir / "rsyslogd.log", "ab")
        self.proc = subprocess.Popen(["rsyslogd", "-n", "-f", str(self.conf), "-i", str(self.pidfile)],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rsyslogd exited: {(self.dir / 'rsyslogd.log').read_text()}")
            try:
                for port in self.tcp_ports:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                if self.tcp_ports or self.pidfile.exists():
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("rsyslogd did not start within 10 s")

    def stop(self) -> None:
        """SIGTERM by pid (rsyslog finishes its queue and closes the files), SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


class Rsyslog(RsyslogDaemon):
    """rsyslogd -n with imudp, imtcp and imtcp over TLS (server certificate `pki`) on 127.0.0.1;
    each input writes what it received to <input>.out."""

    def __init__(self, workdir: Path, pki: Pki) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ports = {"udp": free_port(socket.SOCK_DGRAM), "tcp": free_port(), "tls": free_port()}
        super().__init__(workdir, workdir / "rsyslog.conf", (self.ports["tls"], self.ports["tcp"]))
        rulesets = "".join(
            f'ruleset(name="{name}") {{ action(type="omfile" file="{self.out(name)}" template="npaudit_fields") }}\n'
            for name in INPUTS)
        self.conf.write_text(
            f'global(workDirectory="{self.dir}" maxMessageSize="128k" '
            f'defaultNetstreamDriverCAFile="{pki.ca}" defaultNetstreamDriverCertFile="{pki.cert}" '
            f'defaultNetstreamDriverKeyFile="{pki.key}")\n'
            'module(load="imudp")\nmodule(load="imtcp")\n' + _TEMPLATE + rulesets
            + f'input(type="imudp" address="127.0.0.1" port="{self.ports["udp"]}" ruleset="udp")\n'
            + f'input(type="imtcp" address="127.0.0.1" port="{self.ports["tcp"]}" ruleset="tcp")\n'
            + f'input(type="imtcp" address="127.0.0.1" port="{self.ports["tls"]}" ruleset="tls" '
              'streamDriver.name="ossl" streamDriver.mode="1" streamDriver.authMode="anon")\n')

    def out(self, name: str) -> Path:
        return self.dir / f"{name}.out"

    def received(self, name: str) -> list[dict[str, Any]]:
        """What the input `name` wrote, one dict per message (complete lines only)."""
        try:
            data = self.out(name).read_bytes()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in data.split(b"\n")[:-1]]


def templated(name: str, target: Path, swaps: dict[str, str]) -> Path:
    """The shipped file `name` (config/syslog/) with each key replaced by its value, written to `target`."""
    text = (SHIPPED / name).read_text()
    for old, new in swaps.items():
        if old not in text:
            raise AssertionError(f"{name} no longer contains {old!r}: update this test with the file")
        text = text.replace(old, new)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


class Receiver:
    """config/syslog/rsyslog-receiver.conf, as shipped, in a private rsyslogd on loopback ports (only its
    paths and ports swapped)."""

    def __init__(self, workdir: Path, pki: Pki) -> None:
        self.out = workdir / "out"
        tls_dir = workdir / "tls"
        tls_dir.mkdir(parents=True)
        for src, dst in ((pki.ca, "ca.pem"), (pki.cert, "server.pem"), (pki.key, "server.key")):
            shutil.copy(src, tls_dir / dst)
        self.ports = {"udp": free_port(socket.SOCK_DGRAM), "tcp": free_port(), "tls": free_port(),
                      "relp": free_port(), "relp+tls": free_port()}
        conf = templated("rsyslog-receiver.conf", workdir / "rsyslog.conf", {
            "/var/log/npaudit-siem/": f"{self.out}/",
            "/etc/rsyslog.d/npaudit-tls/": f"{tls_dir}/",
            'input(type="imudp" port="514"': f'input(type="imudp" address="127.0.0.1" port="{self.ports["udp"]}"',
            'input(type="imtcp" port="514"': f'input(type="imtcp" address="127.0.0.1" port="{self.ports["tcp"]}"',
            'input(type="imtcp" port="6514"': f'input(type="imtcp" address="127.0.0.1" port="{self.ports["tls"]}"',
            'input(type="imrelp" port="2514"': f'input(type="imrelp" address="127.0.0.1" port="{self.ports["relp"]}"',
            'input(type="imrelp" port="2515"':
                f'input(type="imrelp" address="127.0.0.1" port="{self.ports["relp+tls"]}"',
        })
        self.daemon = RsyslogDaemon(workdir, conf, (self.ports["tcp"], self.ports["tls"], self.ports["relp"],
                                                    self.ports["relp+tls"]))

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.ports[scheme]}"

    @property
    def nodes_dir(self) -> Path:
        """Where the config writes each node's verbatim copy: nodes/<HOSTNAME>/audit.jsonl."""
        return self.out / "nodes"

    def node_copy(self, node: str) -> str:
        """The output file name (for lines / count) of `node`'s verbatim copy."""
        return f"nodes/{node}/audit.jsonl"

    def lines(self, name: str) -> list[bytes]:
        try:
            return (self.out / name).read_bytes().split(b"\n")[:-1]
        except FileNotFoundError:
            return []

    def count(self, name: str) -> int:
        """Complete lines in the output file `name`, read a block at a time (it may be large)."""
        n = 0
        try:
            with open(self.out / name, "rb") as f:
                while block := f.read(1 << 20):
                    n += block.count(b"\n")
        except FileNotFoundError:
            pass
        return n


class ForwardedCopies:
    """rsyslogd -n with imrelp and imtcp on 127.0.0.1, each writing every message it received as an RFC 5424
    line (RSYSLOG_SyslogProtocol23Format) into <input>.log: the forwarded copies `npaudit verify --from-syslog`
    reads."""

    INPUTS = ("relp", "tcp")

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.dir = workdir
        self.ports = {name: free_port() for name in self.INPUTS}
        conf = workdir / "rsyslog.conf"
        conf.write_text(
            f'global(workDirectory="{workdir}" maxMessageSize="128k")\n'
            'module(load="imrelp")\nmodule(load="imtcp")\n'
            + "".join(f'ruleset(name="{name}") {{ action(type="omfile" file="{self.path(name)}" '
                      'template="RSYSLOG_SyslogProtocol23Format") }\n' for name in self.INPUTS)
            + "".join(f'input(type="im{name}" address="127.0.0.1" port="{self.ports[name]}" ruleset="{name}")\n'
                      for name in self.INPUTS))
        self.daemon = RsyslogDaemon(workdir, conf, tuple(self.ports.values()))

    def url(self, name: str) -> str:
        return f"{name}://127.0.0.1:{self.ports[name]}"

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.log"
