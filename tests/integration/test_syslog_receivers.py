"""The shipped receiver configs (config/syslog/) run in a real rsyslogd, and `npaudit syslog test` reaches it.

Each rsyslog file is used as shipped, only its paths and ports swapped for this
test's directory (every swapped string must be in the file, so an edit that
moves them fails here rather than silently testing something else).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from auditlog.fileset import audit_files
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.transport import TlsOptions
from auditlog.verify import verify
from policy_agent.cli.main import main
from tests.support.syslog_forwarders import HOSTILE, file_lines, forwarders, write_records  # noqa: F401
from tests.support.waiting import wait_for
from tests.support.certs import Pki, make_pki
from tests.support.rsyslog import Receiver, RsyslogDaemon, templated
from tests.support.syslog_parse import parse_message

NODE = "node-a.example"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", "good")


@pytest.fixture
def receiver(tmp_path: Path, pki: Pki) -> Iterator[Receiver]:
    rx = Receiver(tmp_path / "receiver", pki)
    rx.daemon.start()
    yield rx
    rx.daemon.stop()


def imfile_conf(tmp_path: Path, live: Path) -> Path:
    return templated("rsyslog-imfile.conf", tmp_path / "imfile" / "rsyslog.conf", {
        '"/var/spool/rsyslog"': f'"{tmp_path / "imfile"}"',
        "/var/log/npaudit-siem/": f"{tmp_path / 'imfile' / 'out'}/",
        "/var/log/npaudit/audit.jsonl": str(live),
    })


@pytest.mark.parametrize("name", ["rsyslog-receiver.conf", "rsyslog-imfile.conf"])
def test_each_shipped_rsyslog_config_passes_rsyslogs_own_validation(name: str, tmp_path: Path, pki: Pki) -> None:
    conf = (Receiver(tmp_path / "receiver", pki).daemon.conf if name == "rsyslog-receiver.conf"
            else imfile_conf(tmp_path, tmp_path / "log" / "audit.jsonl"))
    result = subprocess.run(["rsyslogd", "-N1", "-f", str(conf)], capture_output=True, text=True)
    assert result.returncode == 0 and "error" not in result.stderr.lower(), result.stderr


@pytest.mark.parametrize("scheme", ["tcp", "tls", "udp", "relp", "relp+tls"])
def test_the_receiver_config_writes_each_forwarded_record_as_the_node_wrote_it(
        scheme: str, receiver: Receiver, pki: Pki, tmp_path: Path, forwarders: Callable[..., Forwarder]) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    count = 2 * len(HOSTILE)
    write_records(live, 1, count)
    lines = file_lines(live)
    fwd = forwarders(receiver.url(scheme), live, tmp_path / "ck" / f"{scheme}.json",
                     tls=TlsOptions(ca=pki.ca) if scheme == "tls" else
                     TlsOptions(ca=pki.ca, cert=pki.client_cert, key=pki.client_key) if scheme == "relp+tls" else None)
    wait_for(lambda: len(receiver.lines("audit.json")) >= count)
    receiver.daemon.stop()  # flushes its files
    parsed = [json.loads(line) for line in receiver.lines("audit.json")]
    assert [r["npaudit"]["seq"] for r in parsed] == list(range(1, count + 1))
    stubs = 0
    for record in parsed:
        original = json.loads(lines[record["npaudit"]["seq"]])
        if scheme == "udp" and record["npaudit"].get("truncated") is True:
            stubs += 1
            assert record["npaudit"]["original_bytes"] == len(lines[record["npaudit"]["seq"]]) > 2048
            continue
        assert record == original  # no "metadata", no envelope: the record itself
    assert stubs == fwd.stats().truncated and (stubs > 0) == (scheme == "udp")
    assert receiver.lines("unparsed.log") == []
    verbatim = receiver.lines(receiver.node_copy(NODE))
    if scheme != "udp":  # the byte-for-byte copy is the node's chain
        assert verbatim == [lines[seq] for seq in range(1, count + 1)]
        copy = tmp_path / "copy" / "audit.jsonl"
        copy.parent.mkdir()
        copy.write_bytes(b"".join(line + b"\n" for line in verbatim))
        result = verify([copy])
        assert result.ok and (result.first_seq, result.last_seq) == (1, count)


@pytest.mark.parametrize("case", ["server not signed by our CA", "no client certificate"])
def test_relp_over_tls_delivers_nothing_to_a_receiver_it_cannot_trust_or_that_cannot_trust_it(
        case: str, receiver: Receiver, pki: Pki, tmp_path: Path, forwarders: Callable[..., Forwarder]) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 5)
    other = make_pki(tmp_path / "other", "other")
    tls = (TlsOptions(ca=other.ca, cert=pki.client_cert, key=pki.client_key) if case.startswith("server")
           else TlsOptions(ca=pki.ca))
    fwd = forwarders(receiver.url("relp+tls"), live, tmp_path / "ck" / "relp-tls.json", tls=tls)
    wait_for(lambda: fwd.stats().errors >= 2)
    stats = fwd.stats()
    assert stats.last_seq_sent is None and not stats.connected
    expected = "certificate not trusted" if case.startswith("server") else "relp"
    assert expected in (stats.last_error or ""), stats.last_error
    receiver.daemon.stop()
    assert receiver.lines("audit.json") == [] and receiver.lines(receiver.node_copy(NODE)) == []


def digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_syslog_test_reaches_every_destination_marked_and_leaves_the_chain_alone(
        receiver: Receiver, pki: Pki, tmp_path: Path, capsys: Any) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 5)
    before = digests(live.parent)
    wrong = make_pki(tmp_path / "other-pki", "other")
    config = tmp_path / "npaudit.yaml"
    config.write_text(
        f"node_name: {NODE}\nstate_dir: {tmp_path / 'state'}\naudit: {{path: {live}}}\nsyslog:\n  destinations:\n"
        f"    - {{url: '{receiver.url('udp')}'}}\n    - {{url: '{receiver.url('tcp')}'}}\n"
        f"    - {{url: '{receiver.url('tls')}', ca: '{pki.ca}'}}\n"
        f"    - {{url: 'tls://localhost:{receiver.ports['tls']}', ca: '{wrong.ca}'}}\n")
    assert main(["syslog", "test", "--config", str(config)]) == 1  # the wrong CA fails, the rest arrive
    header, *rows = capsys.readouterr().out.splitlines()
    test_id = header.split()[3]
    assert [row.split()[:2] for row in rows] == [
        [receiver.url("udp"), "ok"], [receiver.url("tcp"), "ok"], [receiver.url("tls"), "ok"],
        [f"tls://localhost:{receiver.ports['tls']}", "FAILED"]]
    assert "certificate" in rows[3]
    wait_for(lambda: len(receiver.lines("test.log")) >= 3)
    receiver.daemon.stop()
    messages = [parse_message(line) for line in receiver.lines("test.log")]
    assert len(messages) == 3
    for message in messages:
        assert (message.msgid, message.hostname, message.app_name) == ("TEST", NODE, "npaudit")
        assert message.sd == {"npaudit@32473": {"test": "true", "id": test_id}}
        assert json.loads(message.msg)["npaudit"] == {"test": True}
    # Not in the audit copy, not in the node's files, no checkpoint made.
    assert receiver.lines("audit.json") == [] and not receiver.nodes_dir.exists()
    assert digests(live.parent) == before and len(audit_files(live)) >= 1
    assert not (tmp_path / "state").exists()


def test_the_imfile_config_tails_the_audit_files_across_rotation_without_a_metadata_key(tmp_path: Path) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    live.parent.mkdir(parents=True)
    daemon = RsyslogDaemon(tmp_path / "imfile", imfile_conf(tmp_path, live))
    daemon.start()
    try:
        count = 3 * len(HOSTILE)
        write_records(live, 1, count)  # rotates every 64 KiB, gzips the rotated files
        lines = file_lines(live)
        out = tmp_path / "imfile" / "out" / "audit.json"
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= count)
    finally:
        daemon.stop()
    assert len(audit_files(live)) > 1  # the records span rotated files
    parsed = [json.loads(line) for line in out.read_bytes().split(b"\n")[:-1]]
    assert [r["npaudit"]["seq"] for r in parsed] == list(range(1, count + 1))
    for record in parsed:
        assert record == json.loads(lines[record["npaudit"]["seq"]])
