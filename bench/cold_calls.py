#!/usr/bin/env python3
"""What the steps of a lone record's write cost right after a quiet spell, against back to back. JSON.

At 17 packet-ins/s (issue 22's latency load) the agent sleeps ~58 ms between packet-ins, and on this
shared VM its caches are cold when the next comes: every syscall and C call on the way costs several
times what it costs warm. This times each step alone, in this process: sleep --gap-ms, run the step
once (cold), at once again (warm); --rounds times, medians in µs. An empty call is the timing's own
floor. The steps are the ones a lone record's append made or makes (auditlog/rotation.py,
auditlog/chain.py): stat(2) of the live file's path, fstat(2), write(2) of a record-sized line straight
to the file and through a text stream (encode, buffer, flush), SHA-256 of a record through OpenSSL
(hashlib) and through CPython's own (_sha256), and the ASCII encode alone; where auditlog._record_fast is built, the
digests and the second's text its records take (auditlog/_digest_fast.c: SHA-256 and SHA-1 on the CPU's SHA
extensions where it has them) against OpenSSL's and time.strftime, as the module took them before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from auditlog.chain import _sha256_lone  # noqa: E402  (the lone record's digest, as the writer takes it)


def steps(directory: Path) -> dict[str, Callable[[], object]]:
    live = directory / "a" / "b" / "audit.jsonl"
    live.parent.mkdir(parents=True)
    fd = os.open(live, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    stream = open(live, "a", encoding="ascii", newline="")  # noqa: SIM115 (kept open for the run)
    record = "x" * 600  # about a record's line
    line = (record + "\n").encode("ascii")
    out: dict[str, Callable[[], object]] = {
        "empty_call": lambda: None,
        "stat_live_path": lambda: os.stat(live),
        "fstat_open_file": lambda: os.fstat(fd),
        "write_straight": lambda: os.write(fd, line),
        "write_through_text_stream": lambda: (stream.write(record + "\n"), stream.flush()),
        "sha256_openssl": lambda: hashlib.sha256(record.encode("utf-8")).hexdigest(),
        "ascii_encode": lambda: record.encode("ascii"),
    }
    if _sha256_lone is not hashlib.sha256:  # CPython 3.11's own, where the writer has it
        out["sha256_cpython_own"] = lambda: _sha256_lone(record.encode("utf-8")).hexdigest()
    try:  # the C module's digests: what its seal_run and Community ID take (auditlog/_digest_fast.c), and OpenSSL's
        from auditlog import _record_fast
    except ImportError:
        return out
    data, flow = record.encode("ascii"), b"\0" * 40  # a record's line; the Community ID's 40-byte IPv4 tuple
    out.update({
        f"sha256_module_{_record_fast.digest_impl()}": lambda: _record_fast.sha256(data),
        "sha256_module_openssl": lambda: _record_fast.sha256(data, "openssl"),  # its seal's before 2026-12-05
        "sha1_module": lambda: _record_fast.sha1(flow),
        "sha1_openssl": lambda: hashlib.sha1(flow).digest(),  # the Community ID's before 2026-12-05
        "utc_second_module": lambda: _record_fast.utc_second(1764900000),
        "utc_second_strftime": lambda: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(1764900000)),
    })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gap-ms", type=float, default=58.0, help="the quiet spell before each cold call (17/s)")
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    clock = time.perf_counter_ns
    with tempfile.TemporaryDirectory(prefix="cold-calls-") as tmp:
        todo = steps(Path(tmp))
        cold: dict[str, list[float]] = {name: [] for name in todo}
        warm: dict[str, list[float]] = {name: [] for name in todo}
        for _ in range(args.rounds):
            for name, step in todo.items():
                time.sleep(args.gap_ms / 1000)
                a = clock()
                step()
                b = clock()
                step()
                c = clock()
                cold[name].append((b - a) / 1000)
                warm[name].append((c - b) / 1000)
    print(json.dumps({
        "benchmark": "cold_calls",
        "settings": {"gap_ms": args.gap_ms, "rounds": args.rounds, "python": sys.version.split()[0],
                     "cpus": os.cpu_count()},
        "median_us": {name: {"cold": round(statistics.median(cold[name]), 1),
                             "warm": round(statistics.median(warm[name]), 1)} for name in todo},
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
