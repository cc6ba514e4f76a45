"""Read pacing: in a flood of packet-ins, wake up once per batch instead of once per packet-in.

A wake-up of the agent costs far more than a packet-in handled while awake: measured through the
real agent at 1k packet-ins/s (one per read), ~270 µs of CPU per read against ~30 µs per packet-in
when a read brings 20 (bench/agent_cpu.py). Most of it is the whole path run once with cold
caches, the event loop's turn and the syscalls. So while packet-ins keep coming, the stream stops
reading for a short while after each read, and the next read takes everything that came meanwhile.
That read is made from the pause's own timer, the socket left out of the event loop's poll set while
pauses follow each other (packetin/connect.py): a paced read costs its wake-up, a recv and the
records' write, not two epoll_ctl and a second loop turn as well (measured at 1k: 7 syscalls a read
before, 4 after).

The pause is sized from the arrival rate of the last read: long enough for about `batch` messages,
never more than `delay_max` (openflow.read_pace_max). Packet-ins READ_TRICKLE apart or more (a lone
one after a quiet spell, or a trickle: up to 50 a second) are never paced: each is read, recorded and
written at once, so the latency of the first packet of anything stays what it was, whatever the
longest pause. The two are apart on purpose: the longest pause sets what a flood costs (at 1k
packet-ins/s a pause of 20 ms meant 50 wake-ups a second, each on cold caches; 100 ms, 10), the
trickle gap what a quiet node's records wait (nothing). The default longest pause is 200 ms with
about 256 packet-ins a read over TCP: at 1k packet-ins/s, against 100 ms and 128, ~150 a read instead
of ~86 and 12.4-15.5 µs of agent CPU per packet-in over 7 runs instead of 15.8-18.5 over 4
(bench/agent_cpu.py; reads come sooner than the pause when the agent sends a request). On this project's machines a
wake-up after a sleep of 40 ms or more pays for lost caches across the whole batch it handles, yet
shorter pauses (25-30 ms) measured far dearer at 1k: it is the number of wake-ups that counts. A read
of READ_BIG bytes or of twice
`batch` packet-ins or more means we are behind (or near our capacity), and the next read comes at
once: so a full read keeps meaning what packetin/reader.py's input pressure takes it for, a queue we
do not keep up with, never a pause we chose.

`batch` depends on the socket (`read_batch`). While we do not read, OVS's messages wait in it. Over
a unix socket they are charged to ovs-vswitchd's send buffer (about 1 KB of it per packet-in, 208 KiB
by default), and behind that in its controller queue (100 packet-ins by default); a full queue drops
packet-ins: READ_BATCH, 64, stays well inside the socket alone. Over TCP (the embedded OVS in a
namespace of its own) the receiving side's buffer grows to megabytes under load: READ_BATCH_TCP, 256.

The price is stated: a packet-in is stamped when it is read, so in a flood a record's time can be
up to the longest pause later than the packet's. Anything the agent sends (a request whose reply it
waits for: barriers, bundles, statistics, echo) ends a pause at once (`hurry`). And while somebody
waits for packet-ins themselves (`urgent`: a trace for its packet's copies, which OVS sends some
milliseconds after the packet-out that ended the pause) no read is followed by a pause: in a flood
those copies would otherwise wait out one, and a trace its whole length (measured through the real
agent under a logged-Drop flood, bench/traceflow_latency.py: p50 116 ms, p99 232 ms, against issue
11's 100 ms).
"""

from __future__ import annotations

import time
from typing import Callable

READ_BATCH = 64  # packet-ins a paced read aims to bring over a unix socket
READ_BATCH_TCP = 256  # and over TCP
READ_DELAY_MAX = 0.2  # seconds: the longest pause (the agent's openflow.read_pace_max default)
READ_TRICKLE = 0.02  # seconds: packet-ins this far apart or more are read as they come, never paced
READ_DELAY_MIN = 0.0005  # a pause shorter than this is not worth its timer and two epoll_ctl calls
READ_BIG = 64 * 1024  # bytes: a read this big means we are behind; read again at once


def read_batch(target: str) -> int:
    """The packet-ins a paced read aims to bring from the OpenFlow `target` (tcp:HOST:PORT or a unix path)."""
    return READ_BATCH_TCP if target.startswith("tcp:") else READ_BATCH


class ReadPacer:
    """`after_read(nbytes)`: how long to wait before the next read (0: read at once). `count` is the
    running count of packet-ins read (the reader's): a read that brought none (a reply, an echo)
    neither starts nor sizes a pause. While `urgent()` is true a read that a pause would follow is
    not paced (`urgent_reads` counts them)."""

    def __init__(self, count: Callable[[], int], batch: int = READ_BATCH, delay_max: float = READ_DELAY_MAX,
                 mono_clock: Callable[[], float] = time.monotonic, trickle: float = READ_TRICKLE,
                 urgent: Callable[[], bool] = lambda: False) -> None:
        self._count = count
        self._urgent = urgent
        self._batch = batch
        self._delay_max = delay_max
        self._trickle = trickle
        self._mono = mono_clock
        self._last = -float("inf")
        self._seen = count()
        self.paced_reads = 0  # reads followed by a pause
        self.urgent_reads = 0  # reads a pause would have followed, not paced: somebody waited for packet-ins

    def after_read(self, nbytes: int) -> float:
        count = self._count()
        messages, self._seen = count - self._seen, count
        if messages <= 0:
            return 0.0
        now = self._mono()
        since, self._last = now - self._last, now
        # A trickle (packet-ins a trickle gap apart or more) is read as it comes.
        if since > self._trickle * messages or nbytes >= READ_BIG or messages >= 2 * self._batch:
            return 0.0
        # `messages` came in `since`: at that rate, `batch` take batch * since / messages.
        delay = min(self._delay_max, self._batch * since / messages)
        if delay < READ_DELAY_MIN:
            return 0.0
        if self._urgent():  # asked only here: never for a lone packet-in's read, nor for a read behind
            self.urgent_reads += 1
            return 0.0
        self.paced_reads += 1
        return delay
