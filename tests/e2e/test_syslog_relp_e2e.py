"""RELP to a real rsyslog imrelp: the forwarder child SIGKILLed mid-stream re-sends at most one window, and the copy
misses nothing; the same crash over TCP re-sends everything since the start (its checkpoint cannot advance).

The forwarder runs as the agent runs it (auditlog.syslog.process: a supervised child process), the records are
written by the real writer while it forwards, and the receiver's copy is checked by `npaudit verify --from-syslog`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

from auditlog.syslog.checkpoint import load_checkpoint
from auditlog.syslog.destination import make_destination
from auditlog.syslog.process import ProcessForwarder
from policy_agent.cli.main import main
from tests.support.rsyslog import ForwardedCopies
from tests.support.syslog_forwarders import NODE, write_records
from tests.support.processes import alive, state
from tests.support.waiting import wait_for

RECORDS = 1500
BATCH = 50
WINDOW_BATCHES = 4
WINDOW = BATCH * WINDOW_BATCHES  # records one window holds at most
KILL_AFTER = 300  # records the receiver acknowledged (or the forwarder sent, for TCP) before the kill
_SEQ = re.compile(rb'\[npaudit@32473 seq="(\d+)"')


@pytest.fixture
def copies(tmp_path: Path) -> Iterator[ForwardedCopies]:
    rx = ForwardedCopies(tmp_path / "receiver")
    rx.daemon.start()
    yield rx
    rx.daemon.stop()


def crash_mid_stream(scheme: str, rx: ForwardedCopies, tmp_path: Path) -> dict[str, Any]:
    """Forward RECORDS records (written while forwarding) to `scheme`, SIGKILL the child once KILL_AFTER were
    sent, let the supervisor start another, and count what the receiver got more than once."""
    live = tmp_path / scheme / "audit.jsonl"
    checkpoint = tmp_path / scheme / "ck.json"
    writer = threading.Thread(target=write_records, args=(live, 1, RECORDS, 600.0), daemon=True)
    writer.start()
    dest = make_destination(rx.url(scheme), node_name=NODE, batch_records=BATCH, window_batches=WINDOW_BATCHES)
    fwd = ProcessForwarder(dest, live=live, checkpoint=checkpoint, poll_interval=0.05, backoff_base=0.1,
                           backoff_cap=0.5)
    fwd.start()
    try:
        wait_for(lambda: (fwd.stats().last_seq_sent or 0) >= KILL_AFTER, 60, f"{scheme}: {KILL_AFTER} sent")
        child = fwd.pid
        assert child is not None
        os.kill(child, signal.SIGSTOP)  # held still: its checkpoint is what it had saved when killed
        wait_for(lambda: state(child) == "T")
        saved = load_checkpoint(checkpoint)
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: not alive(child))
        writer.join(120)
        wait_for(lambda: fwd.pid not in (None, child), 30, "a new child")
        wait_for(lambda: fwd.stats().last_seq_sent == RECORDS, 60, f"{scheme}: all {RECORDS} sent")
        restarts = fwd.stats().restarts
    finally:
        assert fwd.stop()
    copy = rx.path(scheme)
    wait_for(lambda: len(set(seqs(copy))) >= RECORDS, 30, f"{scheme}: the receiver wrote every record")
    counts = Counter(seqs(copy))
    return {"saved": saved.seq if saved else 0, "restarts": restarts, "missing": set(range(1, RECORDS + 1)) - set(counts),
            "resent": sum(counts.values()) - len(counts), "copy": copy}


def seqs(copy: Path) -> list[int]:
    try:
        data = copy.read_bytes()
    except FileNotFoundError:
        return []
    return [int(m.group(1)) for m in _SEQ.finditer(data)]


def test_a_forwarder_killed_mid_stream_resends_at_most_its_window_over_relp(
        copies: ForwardedCopies, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    relp = crash_mid_stream("relp", copies, tmp_path)
    tcp = crash_mid_stream("tcp", copies, tmp_path)
    copies.daemon.stop()  # flushes its files
    figures = (f"re-sent after the crash: relp {relp['resent']} (window {WINDOW}, checkpoint at seq {relp['saved']}), "
               f"tcp {tcp['resent']} (checkpoint at seq {tcp['saved']})")
    for run in (relp, tcp):
        assert run["restarts"] == 1 and not run["missing"], (run, figures)
        capsys.readouterr()
        assert main(["verify", "--from-syslog", "-o", "json", str(run["copy"])]) == 0, capsys.readouterr().out
        result = json.loads(capsys.readouterr().out)
        assert result["duplicates"] == run["resent"], (result, figures)
    assert relp["saved"] >= KILL_AFTER - WINDOW, figures  # the checkpoint followed the receiver's answers
    assert relp["resent"] <= WINDOW, figures
    # The same crash over TCP: nothing was confirmed (a receive buffer's worth of bytes never followed), so
    # everything sent before the kill came again; this is what RELP is for.
    assert tcp["saved"] == 0 and tcp["resent"] >= KILL_AFTER > WINDOW, figures
