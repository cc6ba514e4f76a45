#!/usr/bin/env python3
"""The hostile-input fuzz targets (tests/support/fuzz_targets.py) at >= 100k cases each. Prints JSON.

Targets: the manifest loader (arbitrary data in any field, arbitrary and non-UTF-8
text, YAML anchors and aliases), the CNI request handler, the config loader and the
local API framing. A case passes when the parser accepts the input or refuses it
with its own one-line error; anything else is a failure, reported with hypothesis's
shrunk example on stderr. `make test` runs the same targets at a small sample
(tests/unit/project/test_fuzz_targets.py). No baseline: this is a count, not a speed.
Run: `.venv/bin/python bench/fuzz.py [--examples 100000] [--targets manifests,config]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.fuzz_targets import TARGETS, run_target  # noqa: E402

MIN_CASES = 100_000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=MIN_CASES, help="cases per target")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, from: " + ", ".join(TARGETS))
    ap.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    args = ap.parse_args()
    chosen = [t for t in args.targets.split(",") if t]
    unknown = [t for t in chosen if t not in TARGETS]
    if unknown:
        print(f"fuzz: unknown target {', '.join(unknown)} (have: {', '.join(TARGETS)})", file=sys.stderr)
        return 2
    results = {}
    for name in chosen:
        started = time.monotonic()
        failure = None
        cases = 0
        try:
            with contextlib.redirect_stdout(sys.stderr):  # hypothesis reports a falsifying example here
                cases = run_target(name, args.examples, seed=args.seed)
        except Exception as exc:  # the target's finding: one line in the JSON, the example on stderr
            failure = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        seconds = time.monotonic() - started
        results[name] = {"cases": cases, "seconds": round(seconds, 1),
                         "cases_per_s": round(cases / seconds) if seconds else None, "failure": failure}
        print(f"fuzz: {name}: {cases} cases in {seconds:.0f}s{', FAILED: ' + failure if failure else ''}",
              file=sys.stderr, flush=True)
    ok = all(r["failure"] is None for r in results.values())
    print(json.dumps({
        "benchmark": "fuzz",
        "examples_per_target": args.examples,
        "targets": results,
        "target": f">= {MIN_CASES} cases per target, no uncaught exception",
        "target_met": ok and all(r["cases"] >= MIN_CASES for r in results.values()),
    }, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
