"""A lone UDP query (a DNS lookup) to a Pod on another node right after the tunnel's neighbour cache was
emptied: answered, and how fast, with OVS left to resolve the peer itself vs with the agent's resolution.

Two nodes (tests/support/multinode.py, Geneve, cluster.underlay_refresh 1 s). Each trial empties both
nodes' OVS tunnel neighbour caches (`tnl/neigh/flush`), then either (A, "ovs_resolves") sends the query at
once, as OVS was before the agent resolved peers' next hops (OVS drops it and sends an ARP instead), or
(B, "agent_resolved") waits until the agent's refresh has set the peers again and sends it. A and B
alternate. The client waits 5 s for the answer (glibc's resolver timeout) and sends nothing else.

    sudo .venv/bin/python bench/tunnel_first_packet.py [trials]   # prints one JSON object
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.multinode import MultiNode  # noqa: E402

TIMEOUT = 5.0
# One query, one wait: prints the answer's delay in ms, or -1 when none came within argv[3] seconds.
QUERY = r"""
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(float(sys.argv[3]))
t0 = time.monotonic(); s.sendto(b"query", (sys.argv[1], int(sys.argv[2])))
try:
    s.recvfrom(64); print((time.monotonic() - t0) * 1000)
except socket.timeout:
    print(-1)
"""


def query(netns: str, ip: str) -> float | None:
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", QUERY, ip, "53", str(TIMEOUT)],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    ms = float(out)
    return None if ms < 0 else ms


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    got: dict[str, list[float | None]] = {"ovs_resolves": [], "agent_resolved": []}
    with MultiNode(2, "geneve", cluster_settings="underlay_refresh: 1") as m:
        n1, n2 = m.nodes[1], m.nodes[2]
        a = n1.add_pod("x", "client", server=False)
        b = n2.add_pod("y", "dns")
        query(a.netns, b.ip)  # both agents have resolved their peer by now (or this warms them)
        for i in range(2 * trials):
            kind = "ovs_resolves" if i % 2 == 0 else "agent_resolved"
            for c in (n1, n2):
                c.ovs_appctl("tnl/neigh/flush")
            if kind == "agent_resolved":
                deadline = time.monotonic() + 10
                while not all("198.51.100." + str(3 - j) + " " in c.ovs_appctl("tnl/neigh/show")
                              for j, c in ((1, n1), (2, n2))):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            got[kind].append(query(a.netns, b.ip))
            time.sleep(TIMEOUT / 2)  # the OVS-resolved case's entries are flushed again next trial
    out = {"trials": trials, "client_timeout_s": TIMEOUT, "loadavg": os.getloadavg()[0]}
    for kind, ms in got.items():
        answered = [x for x in ms if x is not None]
        out[kind] = {"answered": len(answered), "lost": len(ms) - len(answered),
                     "answer_ms_median": round(statistics.median(answered), 2) if answered else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
