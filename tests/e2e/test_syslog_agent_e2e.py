"""The agent's syslog forwarder as it runs by default: a child process of the agent, seen from outside.

Status through the child, an agent restart resuming from the checkpoint, and an
agent killed with SIGKILL leaving no forwarder behind (checked by pid).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from auditlog.syslog.checkpoint import load_checkpoint
from tests.support.cluster import Cluster, _npaudit
from tests.support.processes import alive
from tests.support.syslog_receiver import TcpReceiver, write_records
from tests.support.waiting import wait_for


@pytest.fixture
def receiver() -> Iterator[TcpReceiver]:
    rx = TcpReceiver()
    yield rx
    rx.close()


@pytest.fixture
def cluster(receiver: TcpReceiver) -> Iterator[Cluster]:
    c = Cluster(extra_config=f"syslog:\n  destinations:\n    - {{url: '{receiver.url}', batch_records: 50}}\n")
    try:
        yield c
    finally:
        c.close()


def write(cluster: Cluster, first: int, count: int) -> None:
    """Records in the agent's audit files while it is down (the agent's writer goes on from their chain)."""
    write_records(cluster.dir / "audit" / "audit.jsonl", first, count)


def forwarder_children(agent_pid: int) -> list[int]:
    """Pids of the agent's child processes running auditlog.syslog.process."""
    found = []
    for children in Path(f"/proc/{agent_pid}/task").glob("*/children"):
        for pid in map(int, children.read_text().split()):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except FileNotFoundError:
                continue
            if b"auditlog.syslog.process" in cmdline:
                found.append(pid)
    return found


def status(cluster: Cluster) -> dict:
    done = _npaudit("syslog", "status", "--config", str(cluster.config), "-o", "json")
    assert done.returncode == 0, done.stderr
    [dest] = json.loads(done.stdout)["destinations"]
    return dest


def test_the_agents_forwarder_child_reports_status_resumes_after_a_restart_and_dies_with_the_agent(
        cluster: Cluster, receiver: TcpReceiver) -> None:
    write(cluster, 1, 200)
    cluster.start()
    assert cluster.agent is not None
    wait_for(lambda: set(range(1, 201)) <= set(receiver.seqs), timeout=30)
    [child] = forwarder_children(cluster.agent.pid)
    wait_for(lambda: (status(cluster)["last_seq_sent"] or 0) >= 200)
    st = status(cluster)
    assert st["destination"] == receiver.url and st["connected"] and st["sent"] >= 200 and st["restarts"] == 0

    # A clean stop: the child saves its checkpoint and exits with the agent.
    cluster.stop_agent()
    assert not alive(child)
    saved = load_checkpoint(cluster.state / "syslog" / f"tcp_127.0.0.1_{receiver.url.rsplit(':', 1)[1]}.json")
    assert saved is not None and saved.seq >= 200
    wait_for(lambda: set(range(1, saved.seq + 1)) <= set(receiver.seqs))  # parsed by the receiver's thread
    before = Counter(receiver.seqs)
    assert set(before) == set(range(1, saved.seq + 1))
    # Restarted: it resumes after the checkpoint, sending nothing already delivered again.
    write(cluster, 201, 100)
    last = saved.seq + 100
    cluster.start()
    wait_for(lambda: set(range(saved.seq + 1, last + 1)) <= set(receiver.seqs))
    assert Counter(receiver.seqs) - before == Counter(seq for seq in receiver.seqs if seq > saved.seq)
    assert all(n == 1 for n in Counter(receiver.seqs).values())

    # Killed with SIGKILL: the child sees the end of its request pipe and exits too (no orphan).
    [child] = forwarder_children(cluster.agent.pid)
    cluster.agent.kill()
    cluster.agent.wait()
    wait_for(lambda: not alive(child), timeout=15)
    (cluster.state / "api.sock").unlink(missing_ok=True)  # SIGKILL left it behind
