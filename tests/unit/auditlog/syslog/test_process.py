"""ProcessForwarder: the Forwarder in a supervised child process, against a TCP receiver on loopback."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from auditlog.syslog.checkpoint import load_checkpoint
from auditlog.syslog.errors import SyslogError
from auditlog.syslog.destination import make_destination
from auditlog.syslog.forwarder import ForwarderStats
from auditlog.syslog.process import ProcessForwarder
from auditlog.syslog.status import SyslogStatus
from auditlog.syslog.transport import TlsOptions
from tests.support.processes import alive, state
from tests.support.syslog_receiver import TcpReceiver, write_records
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def receiver() -> Iterator[TcpReceiver]:
    rx = TcpReceiver()
    yield rx
    rx.close()


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def make(receiver: TcpReceiver, tmp_path: Path, **kw: Any) -> ProcessForwarder:
    dest = make_destination(receiver.url, node_name="node-a", batch_records=50, receive_buffer_bytes=0)
    return ProcessForwarder(dest, live=tmp_path / "log" / "audit.jsonl", checkpoint=tmp_path / "ck.json",
                            poll_interval=0.05, backoff_base=0.1, backoff_cap=0.5, **kw)


def test_start_stats_and_stop_go_through_the_child_and_a_restart_resumes_from_its_checkpoint(
        receiver: TcpReceiver, tmp_path: Path) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 300)
    fwd = make(receiver, tmp_path)
    fwd.start()
    try:
        pid = fwd.pid
        assert pid is not None and pid != os.getpid() and parent_of(pid) == os.getpid()
        wait_for(lambda: fwd.stats().last_seq_sent == 300)
        st = fwd.stats()
        assert (st.destination, st.connected, st.sent, st.errors, st.restarts) == (receiver.url, True, 300, 0, 0)
    finally:
        assert fwd.stop()
    assert not alive(pid) and fwd.pid is None
    assert load_checkpoint(tmp_path / "ck.json").seq == 300  # saved by the child's stop
    assert fwd.stats().sent == 300 and not fwd.stats().connected  # the child's last counters
    # As after an agent restart: a new forwarder on the same checkpoint sends only what followed.
    write_records(live, 301, 100)
    again = make(receiver, tmp_path)
    again.start()
    try:
        wait_for(lambda: again.stats().last_seq_sent == 400)
        assert again.stats().sent == 100
    finally:
        again.stop()
    wait_for(lambda: len(receiver.seqs) >= 400)  # acknowledged by its TCP, maybe not yet parsed by its thread
    assert sorted(receiver.seqs) == list(range(1, 401))


def test_a_child_killed_mid_stream_is_restarted_counted_and_loses_nothing(
        receiver: TcpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 2000)
    fwd = make(receiver, tmp_path, restart_base=0.2)
    fwd.start()
    try:
        wait_for(lambda: (fwd.stats().last_seq_sent or 0) >= 100)
        first = fwd.pid
        assert first is not None
        os.kill(first, signal.SIGSTOP)  # held still: what it saved is what it had saved when killed
        wait_for(lambda: state(first) == "T")
        saved = load_checkpoint(tmp_path / "ck.json")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: not alive(first))
        write_records(live, 2001, 1000)  # records keep coming while it is down
        wait_for(lambda: fwd.pid not in (None, first))
        wait_for(lambda: fwd.stats().last_seq_sent == 3000)
        st = fwd.stats()
        assert st.restarts == 1 and st.connected, st
    finally:
        assert fwd.stop()
    # Acknowledged by the receiver's TCP (receive_buffer_bytes: 0) is not yet parsed by its thread.
    wait_for(lambda: set(receiver.seqs) >= set(range(1, 3001)),  # every record arrived
             what=lambda: receiver.missing(1, 3000))
    counts = Counter(receiver.seqs)
    assert sorted(counts) == list(range(1, 3001))
    repeated = sorted(seq for seq, n in counts.items() if n > 1)
    assert all(seq > (saved.seq if saved else 0) for seq in repeated)  # only what followed the checkpoint
    assert sum(counts.values()) - 3000 == len(repeated) <= 3000 - (saved.seq if saved else 0)
    assert any("died" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from auditlog.syslog.destination import make_destination
    from auditlog.syslog.process import ProcessForwarder
    fwd = ProcessForwarder(make_destination(sys.argv[1], node_name="n"), live=Path(sys.argv[2]),
                           checkpoint=Path(sys.argv[3]))
    fwd.start()
    print(fwd.pid, flush=True)
    time.sleep(600)
""")


def test_the_child_exits_when_its_parent_is_killed(receiver: TcpReceiver, tmp_path: Path) -> None:
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 50)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, receiver.url, str(live), str(tmp_path / "ck.json")],
                              stdout=subprocess.PIPE, env=env)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert alive(child) and parent_of(child) == parent.pid
        wait_for(lambda: sorted(set(receiver.seqs)) == list(range(1, 51)))
        parent.kill()
        parent.wait()
        wait_for(lambda: not alive(child), timeout=10)  # the end of its request pipe stopped it
        assert load_checkpoint(tmp_path / "ck.json").seq == 50  # ... in order: it saved what was delivered
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_child_that_does_not_answer_leaves_stats_at_its_last_snapshot_within_the_timeout(
        receiver: TcpReceiver, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_records(tmp_path / "log" / "audit.jsonl", 1, 10)
    fwd = make(receiver, tmp_path, stats_timeout=0.3)
    fwd.start()
    try:
        wait_for(lambda: fwd.stats().last_seq_sent == 10)
        pid = fwd.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.WARNING, logger="auditlog.syslog.process"):
                st = fwd.stats()
            assert (st.last_seq_sent, st.sent, st.connected) == (10, 10, False)
            # It waited its own stats_timeout for the stopped child, no longer, and said so.
            assert {r.getMessage() for r in caplog.records if r.name == "auditlog.syslog.process"} == {
                f"syslog {fwd.destination.name}: forwarder process {pid} did not answer a stats request in 0.3 s"}
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: fwd.stats().connected)  # answers again; the late reply was not taken for this one
        assert fwd.stats().sent == 10
    finally:
        assert fwd.stop()


def test_a_tls_file_that_cannot_be_read_fails_at_construction_as_in_process(tmp_path: Path) -> None:
    dest = make_destination("tls://127.0.0.1:6514", node_name="n", tls=TlsOptions(ca=tmp_path / "missing.pem"))
    with pytest.raises(SyslogError, match="missing.pem"):
        ProcessForwarder(dest, live=tmp_path / "audit.jsonl", checkpoint=tmp_path / "ck.json")


def test_status_json_carries_restarts_and_waits_and_reads_an_older_agents_reply_without_them() -> None:
    st = ForwarderStats("tcp://h:514", True, 7, 0, None, 7, 0, 0, 0, 0, restarts=2, receiver_wait_s=3.25)
    assert SyslogStatus.from_json(SyslogStatus(7, (st,)).to_json()).destinations == (st,)
    older = SyslogStatus(7, (st,)).to_json()
    del older["destinations"][0]["restarts"], older["destinations"][0]["receiver_wait_s"]
    parsed = SyslogStatus.from_json(older).destinations[0]
    assert (parsed.restarts, parsed.receiver_wait_s) == (0, 0.0)
    wrong = SyslogStatus(7, (st,)).to_json()
    wrong["destinations"][0]["receiver_wait_s"] = "3"
    with pytest.raises(SyslogError, match="receiver_wait_s"):
        SyslogStatus.from_json(wrong)
