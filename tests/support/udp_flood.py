"""The fast flood sender of the flood benches and tests: unpaced UDP from a Pod's own stack (so its
packets are ones conntrack accepts), counting only datagrams that left."""

from __future__ import annotations

import subprocess
import sys

# Sends UDP to ip, datagram n to port first + n % ports, round robin over `keys` source ports
# (sockets), unpaced, for `seconds`; prints the count.
SENDER = r"""
import socket, sys, time
ip, first, ports, keys, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
dests = [(ip, first + i) for i in range(ports)]
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(keys)]
end, sent, payload = time.monotonic() + seconds, 0, b"soak" * 8
while time.monotonic() < end:
    for _ in range(256 // keys + 1):
        for s in socks:
            try:
                s.sendto(payload, dests[sent % ports]); sent += 1
            except OSError:  # a full socket buffer: the datagram never left, it is not counted
                pass
print(sent, flush=True)
"""


def send_flood(netns: str, ip: str, seconds: float, *, port: int, ports: int = 1, keys: int = 1,
               cpus: str = "") -> int:
    """SENDER in `netns` for `seconds` to ports port..port+ports-1 from `keys` source ports: datagrams sent.
    `cpus` (taskset's list, e.g. "1"): the CPUs the sender may run on; "" = any."""
    return int(subprocess.run((["taskset", "-c", cpus] if cpus else []) + [
                               "ip", "netns", "exec", netns, sys.executable, "-c", SENDER, ip,
                               str(port), str(ports), str(keys), str(seconds)],
                              capture_output=True, text=True, check=True, timeout=seconds + 120).stdout)
