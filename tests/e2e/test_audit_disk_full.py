"""A real full disk under the running agent (issue 14): the audit directory is a small tmpfs the test fills.

While running: records made while the disk is full are held by the writer and written, each once and in
order, when space returns. At shutdown on a full disk: the records that could not be written are
counted and named in the agent's last log line (exit 1, never "stopped cleanly"), kept in the loss note,
and the next start writes the chain-restart record with that count; `npaudit verify` says so.

The tmpfs is mounted on the cluster's audit directory before the agent starts and unmounted by the
fixture (by path, after the cluster stopped what it started).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.cluster import Cluster, logged_udp_drop
from tests.support.e2e_scenarios import namespaces_and_pods

TMPFS_BYTES = 1 << 20
DROP_UDP = logged_udp_drop("disk-full-drop", to_ns="y", from_ns="x", label="disk-full")
# One datagram from each given source port: one flow, one packet, one record each.
SENDER = ("import socket, sys, time\nip = sys.argv[1]\nfor port in map(int, sys.argv[2:]):\n"
          "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.bind(('0.0.0.0', port))\n"
          "    s.sendto(b'disk-full', (ip, 53)); s.close(); time.sleep(0.01)\n")


@pytest.fixture
def disk_cluster() -> Iterator[tuple[Cluster, Path]]:
    c = Cluster()
    # A record per packet (no aggregation window): each datagram the test sends is one record.
    c.config.write_text(c.config.read_text().replace("audit:\n", "audit:\n  window: 0\n"))
    audit_dir = c.dir / "audit"
    audit_dir.mkdir(mode=0o750)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0750", "npaudit-test-audit",
                    str(audit_dir)], check=True)
    try:
        c.start()
        yield c, audit_dir
    finally:
        try:
            c.close()  # its rmtree cannot remove the mount point: done below
        finally:
            subprocess.run(["umount", str(audit_dir)], check=True)
            shutil.rmtree(c.dir, ignore_errors=True)


def _fill(audit_dir: Path) -> Path:
    """Fill the file system with one file until it refuses another byte."""
    filler = audit_dir / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def _lines(audit_dir: Path) -> tuple[list[dict], int]:
    """The complete JSON records in the live file, and how many lines are not (a write cut short)."""
    records, junk = [], 0
    for line in (audit_dir / "audit.jsonl").read_bytes().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            junk += 1
    return records, junk


def _ports(records: list[dict]) -> list[int]:
    return [r["source"]["port"] for r in records if r.get("labels", {}).get("log_label") == "disk-full"]


def _send(cluster: Cluster, dst_ip: str, ports: range) -> None:
    subprocess.run(["ip", "netns", "exec", cluster.pods["x/a"].netns, sys.executable, "-c", SENDER, dst_ip,
                    *map(str, ports)], check=True, timeout=60)


def _wait(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _verify(audit_dir: Path) -> tuple[int, dict]:
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "verify", "--json", str(audit_dir)],
                         capture_output=True, text=True, timeout=60)
    return res.returncode, json.loads(res.stdout)


def test_full_audit_disk_while_running_and_at_shutdown(disk_cluster: tuple[Cluster, Path]) -> None:
    cluster, audit_dir = disk_cluster
    cluster.apply(namespaces_and_pods(logging_ns=""))
    server = cluster.add_pod("y", "a")
    cluster.add_pod("x", "a", server=False)
    cluster.apply(DROP_UDP)
    first, held, at_stop = range(20000, 20010), range(21000, 21020), range(22000, 22015)

    _send(cluster, server.ip, first)
    assert _wait(lambda: _ports(_lines(audit_dir)[0]) == list(first), 10), _lines(audit_dir)

    # --- full while running: held, then written once space returns ---
    filler = _fill(audit_dir)
    _send(cluster, server.ip, held)
    assert _wait(lambda: "write failed" in cluster.log() and "records held, retrying" in cluster.log(), 10), \
        cluster.log()
    # A write may still fill the slack of the file's last page; the rest is held, not in the file.
    assert len(_ports(_lines(audit_dir)[0])) < len(first) + len(held)
    assert cluster.agent is not None and cluster.agent.poll() is None
    filler.unlink()
    # The writer retries with a backoff of at most 5 s.
    assert _wait(lambda: _ports(_lines(audit_dir)[0]) == list(first) + list(held), 15), _lines(audit_dir)
    records, _ = _lines(audit_dir)
    seqs = [r["npaudit"]["seq"] for r in records]
    assert seqs == list(range(1, len(seqs) + 1))
    code, result = _verify(audit_dir)
    assert code == 0 and result["ok"], result

    # --- full at shutdown: the loss is counted, named and carried into the chain ---
    filler = _fill(audit_dir)
    _send(cluster, server.ip, at_stop)
    # Every datagram reached the agent (its debug tap); give the audit pipeline a moment to hand them over.
    assert _wait(lambda: len(cluster.tap_lines()) >= len(first) + len(held) + len(at_stop), 10), \
        len(cluster.tap_lines())
    time.sleep(1.0)
    cluster.agent.send_signal(signal.SIGTERM)
    assert cluster.agent.wait(timeout=40) == 1, cluster.log()
    written_before_stop = _ports(_lines(audit_dir)[0])[len(first) + len(held):]
    lost = len(at_stop) - len(written_before_stop)
    assert lost >= 1, written_before_stop  # 15 records of ~1.4 kB never fit in one page's slack
    last = cluster.log().strip().splitlines()[-1]
    assert "stopped cleanly" not in cluster.log(), last
    assert f"stopped, {lost} audit records NOT written" in last and "lost_write_error" in last, last
    note = json.loads((audit_dir / ".audit.jsonl.lost").read_bytes().rstrip(b"\0"))
    assert note["records_lost"] == lost, note
    last_seq = note["after_seq"]
    assert last_seq == max(r["npaudit"]["seq"] for r in _lines(audit_dir)[0])

    # Before the next start, verify names the loss the note holds, and a last line the full disk cut short.
    code, result = _verify(audit_dir)
    torn = not (audit_dir / "audit.jsonl").read_bytes().endswith(b"\n")
    assert (code, result["ok"]) == ((1, False) if torn else (0, True)), result
    assert not torn or "cut short" in result["break"]["detail"], result
    assert [w for w in result["warnings"] if f"could not write {lost} audit records after seq {last_seq}" in w], \
        result

    filler.unlink()
    cluster.start()
    assert _wait(lambda: any(r["event"].get("reason") == "records-lost" for r in _lines(audit_dir)[0]), 10), \
        (audit_dir / "audit.jsonl").read_bytes()[-3000:]
    records, junk = _lines(audit_dir)
    restart = next(r for r in records if r["event"].get("reason") == "records-lost")
    # Right after the last record written: only the writer's own records (bytes cut short, the loss) first.
    between = [r for r in records if last_seq < r["npaudit"]["seq"] <= restart["npaudit"]["seq"]]
    assert [r["npaudit"]["seq"] for r in between] == list(range(last_seq + 1, restart["npaudit"]["seq"] + 1))
    assert all(r["event"]["action"] == "chain-restart" for r in between), between
    assert restart["npaudit"]["chain_restart"]["records_lost"] == lost
    assert restart["npaudit"]["chain_restart"]["after_seq"] == last_seq
    assert f"{lost} audit records" in restart["message"]
    # Every record the policy made is in the file once, or counted in the restart record.
    assert _ports(records) == list(first) + list(held) + written_before_stop
    code, result = _verify(audit_dir)
    assert code == 0 and result["ok"], result
    assert [w for w in result["warnings"] if "could not write" in w and f"{lost} audit records" in w], result
    # Bytes of a write the full disk cut short are named by verify, never passed over in silence.
    assert not junk or [w for w in result["warnings"] if "cut short" in w], result
    assert os.path.exists(audit_dir / "audit.jsonl")
