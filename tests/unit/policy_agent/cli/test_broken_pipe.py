"""Every verb stops quietly when its output's reader goes away (`npaudit … | head -1`): exit 0, no traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.audit_records import sample_record, write_set
from tests.support.fake_local_agent import fake_agent

REPO = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def audit_set() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-pipe-", dir="/tmp"))  # AF_UNIX paths are short
    (d / "logs").mkdir()
    # Over 64 KiB of output as JSON lines, so `logs` blocks on a full pipe before the reader stops.
    write_set(d / "logs" / "audit.jsonl", (sample_record(i) for i in range(600)), max_bytes=1 << 16)
    (d / "npaudit.yaml").write_text(f"state_dir: {d}\naudit:\n  path: {d / 'logs' / 'audit.jsonl'}\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def npaudit_to_closed_reader(argv: list[str], *, read_first_line: bool) -> tuple[int, str, bytes]:
    """Run npaudit with stdout a pipe whose reader closes: after the first line, or before any output
    (a verb whose whole output fits the pipe's buffer would otherwise never see the reader leave)."""
    read_end, write_end = os.pipe()
    if not read_first_line:
        os.close(read_end)
    proc = subprocess.Popen([sys.executable, "-m", "policy_agent.cli.main", *argv], stdout=write_end,
                            stderr=subprocess.PIPE, cwd=REPO)
    os.close(write_end)
    first = b""
    if read_first_line:
        with os.fdopen(read_end, "rb") as reader:
            first = reader.readline()
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err.decode(errors="replace"), first


CASES = {
    "logs": (["logs", "-o", "json"], True),
    "logs-compact": (["logs", "-o", "compact"], True),
    "stats": (["stats", "-o", "json"], False),
    "stats-table": (["stats"], False),
    "verify": (["verify"], False),
    "verify-json": (["verify", "--json"], False),
    "help": (["--help"], False),
    "verb-help": (["logs", "--help"], False),
    "version": (["--version"], False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_verb_whose_reader_went_away_exits_0_without_a_traceback(audit_set: Path, name: str) -> None:
    argv, read_first_line = CASES[name]
    paths = [str(audit_set / "logs")] if argv[0] in ("logs", "stats", "verify") and "--help" not in argv else []
    rc, err, first = npaudit_to_closed_reader(argv + paths, read_first_line=read_first_line)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert rc == 0, err
    if read_first_line:
        assert first.strip(), "the reader got its first line"


def test_status_whose_reader_went_away_exits_0(audit_set: Path) -> None:
    sock = audit_set / "api.sock"
    served = fake_agent(sock, {"ok": True, "status": {"agent": {"pid": 1}, "problems": []}})
    try:
        rc, err, _ = npaudit_to_closed_reader(["status", "-o", "json", "--config", str(audit_set / "npaudit.yaml"),
                                               "--no-ebpf-probe"], read_first_line=False)
    finally:
        served.close()
        sock.unlink(missing_ok=True)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert rc == 0, err


def test_a_verb_that_finished_keeps_its_status_when_the_reader_went_away(audit_set: Path, tmp_path: Path) -> None:
    broken = tmp_path / "audit.jsonl"
    lines = (audit_set / "logs" / "audit.jsonl").read_bytes().splitlines(keepends=True)
    broken.write_bytes(b"".join(lines[:3] + lines[4:]))  # one record missing: a break
    rc, err, _ = npaudit_to_closed_reader(["verify", str(broken)], read_first_line=False)
    assert "Traceback" not in err, err
    assert rc == 1, "a break is still a break when nobody reads the report"
