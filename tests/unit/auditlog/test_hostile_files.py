"""Hostile audit files and arguments (issue 24, finding 6): bounded memory, one-line errors, no tracebacks.

A rotated file (or a copy from another node) can be a gzip of 1 MB that inflates to 1 GiB without a
newline. `logs`, `stats` and `verify` answer it with bounded memory: the over-long line is skipped in
chunks, never held whole, and reported (verify: a break of its own kind naming file and line).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.audit_records import sample_record, write_set

INFLATED = 1 << 30          # the bomb's one line
MEMBER = 16 << 20           # inflated size of each of its gzip members (the same compressed bytes repeated)
RSS_BOUND_KB = 300 * 1024   # far below the GiB the line holds, far above what the commands need
CLI = [sys.executable, "-m", "policy_agent.cli.main"]


# The command runs as the grandchild of this process, spawned by a small Python: a child forked straight
# from pytest would report pytest's own resident set as its peak (Linux keeps the high-water mark of the
# memory image a process had before exec), which in a whole-suite run is already past the bound.
_SPAWN = ("import os, sys\n"
          "pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)\n"
          "_, status, usage = os.wait4(pid, 0)\n"
          "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
          "sys.exit(os.waitstatus_to_exitcode(status))\n")


def _run(*args: str) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in KiB) of one `npaudit` command, measured for that process
    alone (os.wait4 in the small parent that spawned it)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.Popen([sys.executable, "-c", _SPAWN, peak.name, *CLI, *args], stdout=out, stderr=err)
        try:
            proc.wait(timeout=600)  # a hang fails the test; speed itself is not asserted
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read().decode(), err.read().decode(), int(peak.read() or 0)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """audit.jsonl.1.gz: 3 records, a 1 GiB line without a newline inside ~1 MB of gzip, then 3 more records."""
    tmp = tmp_path_factory.mktemp("bomb")
    write_set(tmp / "src" / "audit.jsonl", (sample_record(i) for i in range(6)), max_bytes=1 << 30, compress=False)
    lines = (tmp / "src" / "audit.jsonl").read_bytes().splitlines(keepends=True)
    member = gzip.compress(b"x" * MEMBER, compresslevel=9, mtime=0)
    path = tmp / "set" / "audit.jsonl.1.gz"
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.write(gzip.compress(b"".join(lines[:3]), mtime=0))
        for _ in range(INFLATED // MEMBER):
            f.write(member)
        f.write(gzip.compress(b"\n" + b"".join(lines[3:]), mtime=0))
    assert path.stat().st_size < 2 << 20
    return path


def test_logs_skips_the_gzip_bomb_line_with_bounded_memory_and_says_so(bomb: Path) -> None:
    code, out, err, rss = _run("logs", "-o", "json", str(bomb))
    assert code == 0, err
    assert len(out.splitlines()) == 6  # the records before and after the over-long line
    assert rss < RSS_BOUND_KB, rss
    assert f"{bomb}: skipped 1 lines longer than 4194304 bytes (line 4)" in err, err


def test_stats_skips_the_gzip_bomb_line_with_bounded_memory_and_says_so(bomb: Path) -> None:
    code, out, err, rss = _run("stats", str(bomb))
    assert code == 0, err
    assert rss < RSS_BOUND_KB, rss
    assert "skipped 1 lines longer than" in err + out, err


def test_verify_reports_the_gzip_bomb_line_as_a_break_of_its_own_with_bounded_memory(bomb: Path) -> None:
    code, out, err, rss = _run("verify", str(bomb))
    assert code == 1, out + err
    assert rss < RSS_BOUND_KB, rss
    assert f"overlong: {bomb} line 4: a line longer than 4194304 bytes" in out + err, out + err
    assert "Traceback" not in err


def test_verify_of_a_deeply_nested_line_is_a_break_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"a":' * 200_000 + "1" + "}" * 200_000 + "\n")
    code, out, err, _ = _run("verify", str(path))
    assert code == 1, out + err
    assert "Traceback" not in err, err
    assert f"unparseable: {path} line 1: not an audit record (JSON nested too deeply to read)" in out + err


@pytest.mark.parametrize("since", ["99999999999999999999d", "1h30m99999999999s"])
@pytest.mark.parametrize("verb", ["logs", "stats"])
def test_a_since_before_the_year_1_is_a_one_line_usage_error(verb: str, since: str, tmp_path: Path) -> None:
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(3)), max_bytes=1 << 30, compress=False)
    code, out, err, _ = _run(verb, "--since", since, str(tmp_path))
    assert code == 2, out + err
    assert err.splitlines() == [f"npaudit {verb}: --since '{since}': reaches back before the year 1"], err


def test_a_last_beyond_any_count_shows_every_record(tmp_path: Path) -> None:
    write_set(tmp_path / "audit.jsonl", (sample_record(i) for i in range(3)), max_bytes=1 << 30, compress=False)
    code, out, err, _ = _run("logs", "-o", "json", "--last", str(10**30), str(tmp_path))
    assert code == 0, err
    assert len(out.splitlines()) == 3


@pytest.mark.parametrize("seed", range(30))
def test_the_block_reader_skips_exactly_the_lines_over_the_cap(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small blocks and a small cap, lines of every length around both: every line of at most the cap
    comes out whole and in order, every longer one is counted at its line number, none is held."""
    import io
    import random

    from auditlog import logread

    monkeypatch.setattr(logread, "BLOCK_BYTES", 7)
    monkeypatch.setattr(logread, "MAX_LINE_BYTES", 10)
    rng = random.Random(seed)
    lines = [bytes([97 + i % 26]) * rng.choice([0, 1, 6, 7, 9, 10, 11, 13, 20, 40]) for i in range(60)]
    tail = b"t" * rng.choice([0, 3, 10, 25])
    blocks = logread._Blocks(io.BytesIO(b"".join(line + b"\n" for line in lines) + tail))
    out = b"".join(blocks)
    assert out.split(b"\n")[:-1] == [line for line in lines if len(line) <= 10]
    long_at = [i + 1 for i, line in enumerate(lines) if len(line) > 10]
    assert blocks.overlong == len(long_at) + (len(tail) > 10)
    assert blocks.overlong_lines == (long_at + ([61] if len(tail) > 10 else []))[:5]
    assert blocks.pending == (tail if len(tail) <= 10 else b"")


def test_follow_skips_an_over_long_line_without_holding_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A followed live file that gains a line over the cap: the records around it come out, the line is
    dropped as it is read (never more than the cap held) and a note says so."""
    from auditlog import follow
    from auditlog.follow import Follower, position_at_end
    from auditlog.query import Query

    monkeypatch.setattr(follow, "BLOCK_BYTES", 64)
    monkeypatch.setattr(follow, "MAX_LINE_BYTES", 256)
    live = tmp_path / "audit.jsonl"
    live.write_bytes(b"")
    follower = Follower(live, Query(()), position_at_end(live))
    held: list[int] = []
    take = follower._take

    def spy(block: bytes, skip_seen: bool) -> list[tuple[bytes, object]]:
        held.append(len(follower._pending))
        return take(block, skip_seen)

    monkeypatch.setattr(follower, "_take", spy)
    records = [json.dumps({"npaudit": {"seq": i}}).encode() for i in (1, 2)]
    with open(live, "ab") as f:
        f.write(records[0] + b"\n" + b"x" * 5000)
        f.flush()
        assert [line for line, _ in follower.poll()] == [records[0]]
        f.write(b"y" * 5000 + b"\n" + records[1] + b"\n")
    assert [line for line, _ in follower.poll()] == [records[1]]
    assert max(held) <= 256 + 64
    assert follower.notes == ["skipped a line longer than 256 bytes: not an audit record"]
    follower.close()
