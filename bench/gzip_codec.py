#!/usr/bin/env python3
"""CPU per audit record to gzip a rotated file, with ISA-L (the isal package) and with zlib. Prints JSON.

Every record the agent writes is gzipped once, when its file rotates (auditlog/compressor.py, a niced
thread of the agent): that is part of a record's cost. The records are the agent's own: bench/agent_path.py's
pipeline writes --records of them (every one a new key, as in bench/agent_cpu.py's flood) and this bench
compresses that file with the agent's `gzip_file` (level 1, 1 MiB reads), one codec then the other,
alternating which goes first, --rounds times. Per codec: the minimum thread CPU per record (other work on the
machine only ever makes a run slower), the median, and the compressed size against the plain file. zlib is
the baseline, measured in the same run: what the agent uses where isal is not installed, and used before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "bench"))
sys.path.insert(0, str(HERE))

from agent_path import measure  # noqa: E402

from auditlog.compressor import gzip_codec, gzip_file  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    name, isal = gzip_codec()
    if name != "isal":
        raise SystemExit("the isal package is not installed: `make setup` installs it (pyproject.toml)")
    codecs = {"isal": isal, "zlib": zlib}
    with tempfile.TemporaryDirectory(prefix="npab-gzip-") as tmp:
        work = Path(tmp)
        measure(HERE, args.records, 64, keep=work)
        plain = max(work.glob("audit.jsonl*"), key=lambda f: f.stat().st_size)
        records = plain.read_bytes().count(b"\n")
        size = plain.stat().st_size
        cpu: dict[str, list[float]] = {c: [] for c in codecs}
        out_size: dict[str, int] = {}
        for r in range(args.rounds):
            for codec in (list(codecs) if r % 2 == 0 else list(codecs)[::-1]):
                dst = work / f"out-{codec}.gz"
                with open(plain, "rb") as src:
                    t0 = time.thread_time()
                    gzip_file(src, dst, fsync=False, codec=codecs[codec])
                    cpu[codec].append(time.thread_time() - t0)
                out_size[codec] = dst.stat().st_size
                dst.unlink()
    per = {c: {"us_per_record_min": round(min(v) / records * 1e6, 3),
               "us_per_record_median": round(statistics.median(v) / records * 1e6, 3),
               "compressed_vs_plain": round(out_size[c] / size, 4)} for c, v in cpu.items()}
    print(json.dumps({
        "benchmark": "gzip_codec",
        "settings": {"records": records, "plain_bytes": size, "bytes_per_record": round(size / records),
                     "rounds": args.rounds, "level": 1, "read_size": "1 MiB",
                     "cpu": "thread CPU of the compressing thread (zlib and isal both compress without the GIL)"},
        "codecs": per,
        "summary": {"zlib_vs_isal_cpu_per_record": round(per["zlib"]["us_per_record_min"]
                                                         / per["isal"]["us_per_record_min"], 2)},
    }, indent=2))


if __name__ == "__main__":
    main()
