#!/usr/bin/env python3
"""What CNI ADD waits for to record a container's state, before and after issue 9's cut. Prints JSON.

baseline  the record as ADD wrote it before: an unfinished record, then the final one, each
          write-to-temp + fsync + rename + directory fsync (four fsyncs, all waited for)
current   what ADD waits for now (policy_agent/cni/pod_interfaces.py): the unfinished record
          without fsync, the final one staged (written + fsynced while the hook runs, so not
          counted here), then its rename + directory fsync (one fsync)

Both on the same directory, interleaved, in this run. `--dir` picks the filesystem (default
/tmp; the agent's is state_dir). Sizes are those of a real record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy_agent.cni.state import ATTACHED, READY, ContainerState, ContainerStates, PodInterfaceInfo  # noqa: E402


def pct(values: list[float]) -> dict[str, Any]:
    s = sorted(values)
    return {"n": len(s), "p50": round(statistics.median(s), 2), "p90": round(s[int(0.9 * (len(s) - 1))], 2),
            "p99": round(s[int(0.99 * (len(s) - 1))], 2), "max": round(s[-1], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="ADDs recorded per variant")
    ap.add_argument("--dir", default="/tmp", help="parent of the scratch state directory")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="cni-state-bench-", dir=args.dir))
    states = ContainerStates(scratch)
    baseline: list[float] = []
    current: list[float] = []
    staged_ms: list[float] = []
    try:
        for i in range(args.n):
            cid = f"bench-{i:05d}"
            info = PodInterfaceInfo("bench", f"p{i}", cid, f"/run/netns/bench-{i}", "eth0", "10.244.0.2", 24,
                                    "02:00:0a:f4:00:02", "10.244.0.1", "np0123456789a", i + 1)
            intent = ContainerState(ATTACHED, info, "aa:bb:cc:dd:ee:ff",
                                    {"cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit",
                                     "ipam": {"type": "host-local", "dataDir": "/var/lib/cni/networks",
                                              "ranges": [[{"subnet": "10.244.0.0/24"}]]}})
            final = dataclasses.replace(intent, phase=READY, result={
                "cniVersion": "1.0.0", "interfaces": [{"name": info.host_ifname, "mac": intent.host_mac},
                                                      {"name": "eth0", "mac": info.mac, "sandbox": info.netns}],
                "ips": [{"address": "10.244.0.2/24", "gateway": "10.244.0.1", "interface": 1}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.0.1"}], "dns": {}})
            t0 = time.perf_counter()
            states.save(intent)
            states.save(final)
            baseline.append((time.perf_counter() - t0) * 1000)
            states.remove(cid)
            t0 = time.perf_counter()
            states.save(intent, durable=False)
            t1 = time.perf_counter()
            staged = states.stage(final)
            t2 = time.perf_counter()
            states.commit(cid, staged)
            t3 = time.perf_counter()
            current.append(((t1 - t0) + (t3 - t2)) * 1000)
            staged_ms.append((t2 - t1) * 1000)
            states.remove(cid)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    b, c = pct(baseline), pct(current)
    print(json.dumps({
        "benchmark": "cni_state_fsync", "dir": args.dir, "load_avg_at_start": os.getloadavg()[0],
        "baseline_two_durable_saves_ms": b,
        "current_waited_for_ms": c,
        "current_staged_during_hook_ms": pct(staged_ms),
        "ratio_current_to_baseline": {"p50": round(c["p50"] / b["p50"], 3), "p99": round(c["p99"] / b["p99"], 3)},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
