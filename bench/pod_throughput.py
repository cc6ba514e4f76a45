#!/usr/bin/env python3
"""TCP throughput between two Pods with audit logging on vs off, in one run. Prints JSON.

The real agent (`npaudit agent`, embedded OVS in its own namespace) and two
Pods made through `npaudit cni` (tests/support/cluster.py). One ClusterNetworkPolicy
allows x/a -> y/a on the bench port; the phases alternate between the same
policy with `enableLogging: false` (baseline) and `enableLogging: true`
(a metered controller copy of each new connection's first packet, an audit
record per connection). Each phase is one TCP stream with Python sockets,
the client sending 128 KiB writes for --seconds; the server counts the bytes it
received from the first to the last. The ratio on/off is taken per round
(the two phases of a round run back to back) and the median is reported.
Target: logging on >= 0.95 of logging off. Run as root: `make bench`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.cluster import Cluster  # noqa: E402

PORT = 5201
TARGET = 0.95
SERVER = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    buf = bytearray(1 << 20); n = 0; first = last = None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        last = time.monotonic(); first = first or last; n += k
    c.close()
    print(json.dumps({"bytes": n, "seconds": (last - first) if first else 0.0}), flush=True)
"""
CLIENT = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
chunk = b"\0" * (128 << 10); end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    s.sendall(chunk)
s.close()
"""


def policy(logging: bool) -> str:
    return textwrap.dedent(f"""
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {{name: bench-throughput}}
        spec:
          tier: securityops
          priority: 5
          appliedTo: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: y}}}}}}]
          ingress:
          - name: allow-stream
            action: Allow
            enableLogging: {'true' if logging else 'false'}
            logLabel: bench-stream
            from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
            ports: [{{protocol: TCP, port: {PORT}}}]
    """)


NAMESPACES = "---\n".join(
    f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    kubernetes.io/metadata.name: {ns}\n"
    f"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  namespace: {ns}\n  labels:\n    pod: a\n"
    for ns in ("x", "y"))


def stream(cluster: Cluster, server: subprocess.Popen[str], client_netns: str, ip: str, seconds: float
           ) -> dict[str, Any]:
    subprocess.run(["ip", "netns", "exec", client_netns, sys.executable, "-c", CLIENT, ip, str(PORT), str(seconds)],
                   check=True, timeout=seconds + 60)
    assert server.stdout is not None
    got = json.loads(server.stdout.readline())
    mbit = got["bytes"] * 8 / got["seconds"] / 1e6 if got["seconds"] else 0.0
    return {"bytes": got["bytes"], "seconds": round(got["seconds"], 3), "mbit_per_s": round(mbit, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each stream")
    ap.add_argument("--rounds", type=int, default=3, help="off/on pairs (who goes first alternates)")
    args = ap.parse_args()

    cluster = Cluster()
    phases: list[dict[str, Any]] = []
    server: subprocess.Popen[str] | None = None
    try:
        cluster.start()
        cluster.apply(NAMESPACES)
        dst = cluster.add_pod("y", "a", server=False)
        src = cluster.add_pod("x", "a", server=False)
        server = subprocess.Popen(["ip", "netns", "exec", dst.netns, sys.executable, "-c", SERVER, str(PORT)],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        records_before = 0
        for rnd in range(args.rounds):
            order = (False, True) if rnd % 2 == 0 else (True, False)
            for logging in order:
                cluster.apply(policy(logging))
                time.sleep(0.5)
                result = stream(cluster, server, src.netns, dst.ip, args.seconds)
                time.sleep(0.3)
                records = [r for r in cluster.audit_records() if r.get("labels", {}).get("log_label") == "bench-stream"]
                result.update(round=rnd, logging="on" if logging else "off",
                              audit_records=len(records) - records_before)
                records_before = len(records)
                phases.append(result)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        cluster.close()

    def rate(rnd: int, logging: str) -> float:
        return next(p["mbit_per_s"] for p in phases if p["round"] == rnd and p["logging"] == logging)

    ratios = [rate(r, "on") / rate(r, "off") for r in range(args.rounds) if rate(r, "off")]
    ratio = round(statistics.median(ratios), 3) if ratios else None
    print(json.dumps({
        "benchmark": "pod_throughput",
        "seconds_per_stream": args.seconds,
        "phases": phases,
        "mbit_per_s_median": {k: round(statistics.median(p["mbit_per_s"] for p in phases if p["logging"] == k), 1)
                              for k in ("off", "on")},
        "logging_on_vs_off_ratio": ratio,
        "ratio_per_round": [round(r, 3) for r in ratios],
        "target": f"logging on >= {TARGET} of logging off",
        "target_met": ratio is not None and ratio >= TARGET,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
