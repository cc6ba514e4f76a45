"""Two nodes forward to one real rsyslog with the shipped receiver config; the receiver restarts mid-stream.

Issue 23 / issue 21 step 6: the copy of several nodes, with the duplicates
at-least-once delivery leaves after a receiver restart, must verify per node,
and `npaudit logs` / `stats` over it must give what they give over the nodes'
own files. Two forwarders from two audit file sets whose records carry
different observer.hostname stand in for two agents (each forwarder is the
agent's own code, tailing a real writer's files): node-a over TCP, node-b over
TLS.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.transport import TlsOptions
from auditlog.verify import verify
from policy_agent.cli.main import main
from tests.support.siem_nodes import by_node_seq, logs_json, stats_json, write_node
from tests.support.syslog_forwarders import forwarders, record  # noqa: F401 (fixture)
from tests.support.certs import Pki, make_pki
from tests.support.rsyslog import Receiver
from tests.support.waiting import wait_for

NODES = {"node-a": "tcp", "node-b": "tls"}
TOTAL = 600


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", "good")


@pytest.fixture
def receiver(tmp_path: Path, pki: Pki) -> Iterator[Receiver]:
    rx = Receiver(tmp_path / "receiver", pki)
    rx.daemon.start()
    yield rx
    rx.daemon.stop()


def test_two_nodes_and_a_receiver_restart_verify_per_node_with_the_duplicates_counted(
        receiver: Receiver, pki: Pki, tmp_path: Path, forwarders: Callable[..., Forwarder],
        capsysbinary: Any) -> None:
    lives = {node: tmp_path / node / "audit.jsonl" for node in NODES}
    progress = {node: [0] for node in NODES}
    writers = [threading.Thread(target=write_node, args=(lives[n], n, TOTAL, 60.0, progress[n])) for n in NODES]
    for w in writers:
        w.start()
    fwds = {node: forwarders(receiver.url(scheme), lives[node], tmp_path / "ck" / f"{node}.json",
                             node_name=node, batch_records=20,
                             tls=TlsOptions(ca=pki.ca) if scheme == "tls" else None)
            for node, scheme in NODES.items()}
    wait_for(lambda: all(receiver.count(receiver.node_copy(n)) >= 150 for n in NODES), timeout=60)
    receiver.daemon.stop()  # mid-stream: the writers go on, the forwarders meet the outage
    wait_for(lambda: all(f.stats().errors >= 1 for f in fwds.values()), timeout=30)
    time.sleep(1.0)
    assert all(p[0] < TOTAL for p in progress.values())
    receiver.daemon.start()
    for w in writers:
        w.join()
    wait_for(lambda: all(f.stats().last_seq_sent == TOTAL for f in fwds.values()), timeout=120)
    for fwd in fwds.values():
        assert fwd.stop()
    receiver.daemon.stop()  # flushes its files

    # One directory per node, named by the HOSTNAME the forwarder sends.
    assert sorted(p.name for p in receiver.nodes_dir.iterdir()) == sorted(NODES)
    result = verify([receiver.nodes_dir])
    assert result.ok, result.first_break
    nodes = {n.node: n for n in result.nodes}
    assert set(nodes) == set(NODES)
    for node in NODES:
        assert (nodes[node].records, nodes[node].first_seq, nodes[node].last_seq) == (TOTAL, 1, TOTAL)
        assert nodes[node].head_chain == verify([lives[node].parent]).head_chain
    assert result.duplicates > 0  # the restart made the forwarders send again what was not confirmed read
    assert main(["verify", str(receiver.nodes_dir)]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert f"OK: {2 * TOTAL} records" in out and f"{result.duplicates} duplicates" in out
    for node in NODES:
        assert f"node {node}: {TOTAL} records, seq 1..{TOTAL}" in out

    # The merged, parsed feed (all nodes in one file, re-encoded by mmjsonparse) verifies per node as well.
    merged = verify([receiver.out / "audit.json"])
    assert merged.ok and sorted((n.node, n.records) for n in merged.nodes) == [(n, TOTAL) for n in sorted(NODES)]
    assert merged.duplicates == result.duplicates

    # logs and stats: the same records and counts as over the nodes' own files.
    own = [lives[n].parent for n in NODES]
    expected = sorted(logs_json(*own, capsysbinary=capsysbinary), key=by_node_seq)
    assert len(expected) == 2 * TOTAL
    for copy in (receiver.nodes_dir, receiver.out / "audit.json"):
        assert sorted(logs_json(copy, capsysbinary=capsysbinary), key=by_node_seq) == expected, copy
        assert stats_json(copy) == stats_json(*own), copy


def test_a_hostile_hostname_cannot_name_a_file_outside_the_nodes_directory(
        receiver: Receiver, tmp_path: Path, forwarders: Callable[..., Forwarder]) -> None:
    live = tmp_path / "evil" / "audit.jsonl"
    progress = [0]
    write_node(live, "../../escaped", 5, 1000.0, progress)
    for n, name in enumerate(("../../escaped", "..", "not a hostname")):
        fwd = forwarders(receiver.url("tcp"), live, tmp_path / "ck" / f"{n}.json", node_name=name)
        wait_for(lambda: fwd.stats().last_seq_sent == 5)
        assert fwd.stop()
    receiver.daemon.stop()
    written = [p for p in receiver.out.rglob("*") if p.is_file() and p.name not in ("audit.json",)]
    assert written and all(receiver.nodes_dir in p.parents for p in written), written
    # A name that is no RFC 5424 HOSTNAME is sent as "-": such nodes share nodes/-/ (verify still tells
    # their chains apart by observer.hostname).
    assert sorted(str(p.relative_to(receiver.nodes_dir)) for p in written) == [
        "-/audit.jsonl", ".._.._escaped/audit.jsonl", "_./audit.jsonl"]
    assert verify([receiver.nodes_dir]).ok
