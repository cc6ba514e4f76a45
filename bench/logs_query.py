#!/usr/bin/env python3
"""`npaudit logs` filtering speed over a 200 MB+ audit file set, against reading the same files. Prints JSON.

The set is written by the real AuditWriter (rotating at 32 MiB, the rotated files
gzipped by its compressor). Baseline, same run: reading every file of the set
(gzip decompress for the rotated ones) and splitting it into lines, nothing else.
Then the query path (auditlog.logread + auditlog.query, as `npaudit logs` runs it):
- selective: `--pod rare-job` (one record in 1000) — the block pre-check skips
  most of the data without splitting it into lines;
- non-selective: `--not --disposition pass` (3 records in 4 shown): every line
  parsed (a negated filter has no pre-check) and tested;
- the same non-selective query through run_logs with json output to /dev/null.
MB/s are uncompressed bytes per second; files are in the page cache (CPU, not disk).
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from auditlog.fileset import audit_files, open_audit_file  # noqa: E402
from auditlog.logread import LogReader, line_blocks  # noqa: E402
from auditlog.logs_command import LogsRequest, run_logs  # noqa: E402
from auditlog.query import Filter, Query  # noqa: E402
from tests.support.audit_records import sample_record, write_set  # noqa: E402

MiB = 1 << 20


def records(total_bytes: int):  # type: ignore[no-untyped-def]
    """sample_record(i), with one in 1000 from a rare Pod, until about `total_bytes` are made."""
    made, i = 0, 0
    while made < total_bytes:
        r = sample_record(i, step=0.001)
        if i % 1000 == 999:
            r["npaudit"]["source"]["pod"]["name"] = f"rare-job-{i}"
        made += 700  # about one written line
        i += 1
        yield r


def baseline(live: Path) -> tuple[int, int]:
    """(bytes, lines): decompress and split every file, nothing else."""
    size = lines = 0
    for _, path in audit_files(live):
        with open_audit_file(path) as f:
            for block in line_blocks(f):
                size += len(block)
                lines += len(block.split(b"\n")) - 1
    return size, lines


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    best, result = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=220, help="size of the file set to write (uncompressed MB)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per figure; the best counts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="npaudit-logs-bench-") as tmp:
        live = Path(tmp) / "audit.jsonl"
        t0 = time.perf_counter()
        write_set(live, records(args.mb * 1000 * 1000), max_bytes=32 * MiB)
        written_s = time.perf_counter() - t0
        files = audit_files(live)
        size, total = baseline(live)

        def query_count(query: Query) -> Callable[[], int]:
            def run() -> int:
                with LogReader([Path(tmp)]) as reader:
                    return sum(1 for _ in reader.select(query))
            return run

        def cli_json() -> int:
            with open("/dev/null", "wb") as null:
                req = LogsRequest(paths=[Path(tmp)], filters=[Filter("disposition", "pass", negated=True)],
                                  output="json")
                run_logs(req, out=null, err=io.StringIO(), now=dt.datetime.now(dt.timezone.utc), tty=False,
                         colour=False)
            return -1

        cases = {
            "baseline_read_and_split": lambda: baseline(live)[1],
            "selective --pod rare-job": query_count(Query([Filter("pod", "rare-job")])),
            "non_selective --not --disposition pass": query_count(Query([Filter("disposition", "pass",
                                                                                negated=True)])),
            "non_selective, json to /dev/null (run_logs)": cli_json,
        }
        results = {}
        for name, fn in cases.items():
            seconds, matched = timed(fn, args.repeat)
            results[name] = {"seconds": round(seconds, 3), "MB_per_s": round(size / 1e6 / seconds, 1),
                             "records_per_s": round(total / seconds), **({"matched": matched} if matched >= 0 else {})}
        base = results["baseline_read_and_split"]["seconds"]
        for r in results.values():
            r["vs_baseline"] = round(base / r["seconds"], 3)
        print(json.dumps({
            "file_set": {"bytes_uncompressed": size, "records": total, "files": len(files),
                         "gzip_files": sum(p.name.endswith(".gz") for _, p in files),
                         "write_seconds": round(written_s, 1)},
            "results": results,
        }, indent=2))


if __name__ == "__main__":
    main()
