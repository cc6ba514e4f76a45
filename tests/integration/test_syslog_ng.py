"""config/syslog/syslog-ng-receiver.conf in a real syslog-ng (Debian 12's 3.38, unpacked privately, not installed).

Two nodes forward into it (TCP and TLS), it is restarted mid-stream, and the
copy it writes verifies per node with the re-sent duplicates counted; `logs`
and `stats` over it give what they give over the nodes' own files. The MSG is
written through unparsed: syslog-ng's json-parser would turn numbers into
strings and the copy would no longer verify.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.transport import TlsOptions
from auditlog.verify import verify
from tests.support.siem_nodes import by_node_seq, logs_json, stats_json, write_node
from tests.support.syslog_forwarders import forwarders  # noqa: F401 (fixture)
from tests.support.certs import Pki, make_pki
from tests.support.syslog_ng import SyslogNgReceiver, fetch
from tests.support.waiting import wait_for

NODES = {"node-a": "tcp", "node-b": "tls"}
TOTAL = 400


@pytest.fixture(scope="session")
def syslog_ng_root() -> Path:
    return fetch()


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", "good")


@pytest.fixture
def receiver(syslog_ng_root: Path, tmp_path: Path, pki: Pki) -> Iterator[SyslogNgReceiver]:
    rx = SyslogNgReceiver(syslog_ng_root, tmp_path / "syslog-ng", pki)
    yield rx
    rx.daemon.stop()


def test_the_shipped_snippet_passes_syslog_ngs_own_syntax_check(receiver: SyslogNgReceiver) -> None:
    result = receiver.daemon.syntax_check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_two_nodes_and_a_restart_the_syslog_ng_copy_verifies_per_node(
        receiver: SyslogNgReceiver, pki: Pki, tmp_path: Path, forwarders: Callable[..., Forwarder],
        capsysbinary: Any) -> None:
    receiver.daemon.start()
    lives = {node: tmp_path / node / "audit.jsonl" for node in NODES}
    progress = {node: [0] for node in NODES}
    writers = [threading.Thread(target=write_node, args=(lives[n], n, TOTAL, 60.0, progress[n])) for n in NODES]
    for w in writers:
        w.start()
    fwds = {node: forwarders(receiver.url(scheme), lives[node], tmp_path / "ck" / f"{node}.json",
                             node_name=node, batch_records=20,
                             tls=TlsOptions(ca=pki.ca) if scheme == "tls" else None)
            for node, scheme in NODES.items()}
    wait_for(lambda: all(receiver.count(f"nodes/{n}/audit.jsonl") >= 100 for n in NODES), timeout=60)
    receiver.daemon.stop()
    wait_for(lambda: all(f.stats().errors >= 1 for f in fwds.values()), timeout=30)
    time.sleep(1.0)
    assert all(p[0] < TOTAL for p in progress.values())
    receiver.daemon.start()
    for w in writers:
        w.join()
    wait_for(lambda: all(f.stats().last_seq_sent == TOTAL for f in fwds.values()), timeout=120)
    for fwd in fwds.values():
        assert fwd.stop()
    receiver.daemon.stop()
    log = (receiver.daemon.dir / "syslog-ng.log").read_text()
    assert "WARNING" not in log and "ERROR" not in log, log  # e.g. no window too small for flow control

    assert sorted(p.name for p in receiver.nodes_dir.iterdir()) == sorted(NODES)
    result = verify([receiver.nodes_dir])
    assert result.ok, result.first_break
    assert sorted((n.node, n.records, n.first_seq, n.last_seq) for n in result.nodes) == [
        (n, TOTAL, 1, TOTAL) for n in sorted(NODES)]
    assert result.duplicates > 0
    merged = verify([receiver.out / "audit.json"])
    assert merged.ok and merged.records == 2 * TOTAL and merged.duplicates == result.duplicates
    # Numbers stayed numbers: the record is the node's, byte for byte.
    first = json.loads((receiver.nodes_dir / "node-a" / "audit.jsonl").read_bytes().split(b"\n")[0])
    assert first["npaudit"]["priority"] == 10.0 and isinstance(first["source"]["port"], int)

    own = [lives[n].parent for n in NODES]
    expected = sorted(logs_json(*own, capsysbinary=capsysbinary), key=by_node_seq)
    assert sorted(logs_json(receiver.nodes_dir, capsysbinary=capsysbinary), key=by_node_seq) == expected
    assert stats_json(receiver.nodes_dir) == stats_json(*own)


def test_a_hostile_hostname_stays_inside_the_nodes_directory(
        receiver: SyslogNgReceiver, tmp_path: Path, forwarders: Callable[..., Forwarder]) -> None:
    receiver.daemon.start()
    live = tmp_path / "evil" / "audit.jsonl"
    write_node(live, "../../escaped", 5, 1000.0, [0])
    for name in ("../../escaped", ".."):
        fwd = forwarders(receiver.url("tcp"), live, tmp_path / "ck" / f"{len(name)}.json", node_name=name)
        wait_for(lambda: fwd.stats().last_seq_sent == 5)
        assert fwd.stop()
    receiver.daemon.stop()
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file() and receiver.out in p.parents)
    nodes = [p.relative_to(receiver.nodes_dir) for p in written if receiver.nodes_dir in p.parents]
    assert [p.relative_to(receiver.out) for p in written if receiver.nodes_dir not in p.parents] == [
        Path("audit.json")]
    assert len(nodes) == 2 and all(len(p.parts) == 2 and p.name == "audit.jsonl" for p in nodes), nodes
    assert not (tmp_path / "escaped").exists() and not (receiver.out / "audit.jsonl").exists()
