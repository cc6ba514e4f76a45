"""Where one thread's wake-ups go, from the kernel's side: a bcc program on the scheduler and syscall tracepoints.

For bench/agent_latency.py --trace. A packet-in read alone after a quiet spell costs the reader far more than
the same work back to back (caches gone cold while the vCPU was halted), and the end-to-end latency alone does not
say where. `WakeTrace(tid)` records, for that one thread: when it was woken (sched_wakeup), when it got a CPU
(sched_switch in), and the entry and return of every syscall it made. `episodes` cuts that into one episode per
wake-up that read something (read, recvfrom or recvmsg returning > 0) and then wrote to a file (write returning
> 0): a packet-in read and its line written (a thread that sleeps again in between, on a lock or the GIL, stays in
its episode: episodes_woken_again counts those). `timeline` gives, over the episodes, the median and p90 in µs of:

- wake_to_cpu: woken until running (the scheduler and, on a VM, the halted vCPU's wake-up);
- cpu_to_wait_return: running until the syscall it slept in returned (epoll_wait for an event loop, the
  blocking recv itself for a bare reader);
- wait_return_to_read_return: that return until the read returned (an event loop's own turn before it reads;
  0 for a bare reader, whose read is the wait);
- read_to_write: the read's return until the write began: the reader's work on the message;
- write: the write(2) itself;
- cpu_to_written: running until the write returned, the sum of the above but the first;

and the syscall sequences seen, most common first. The kernel's clock (bpf_ktime_get_ns) times everything, so
the figures carry no cost of the tracer's own user-space side; the tracer adds a perf event per syscall and
switch of that thread (a few µs an episode), to the reader and the floor alike. Its own thread that reads the perf
buffers is woken once per WAKEUP_EVENTS events of a CPU, not per event, and drains the rest at stop(): woken per
event (bcc's default), it ran ~20 µs of Python for each of the traced thread's events, on the traced thread's CPU
whenever the other was busy, and preempted it over and over (measured: a traced agent woken, switched in and out
~25 times in ~900 µs before its epoll_wait returned, in 1 wake in 10). Samples the buffer had no room for are
counted (`lost`).

Needs root, bcc (python3-bpfcc) and tracefs: if /sys/kernel/tracing has no events it is mounted there
(`mount -t tracefs`), and `mounted_tracefs` says so.
"""

from __future__ import annotations

import ctypes
import statistics
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

TRACEFS = Path("/sys/kernel/tracing")
# Events a CPU's perf buffer holds before it wakes the tracer's reading thread (the buffer, 256 pages, holds
# ~25,000): at 17 packet-ins/s about one wake-up every 5 s instead of one per event.
WAKEUP_EVENTS = 1024

WAKE, SWITCH_IN, SWITCH_OUT, ENTER, EXIT = 1, 2, 3, 4, 5
# x86_64 syscall numbers of what a reader does.
READ, WRITE, WRITEV, RECVFROM, RECVMSG = 0, 1, 20, 45, 47
NAMES = {0: "read", 1: "write", 7: "poll", 20: "writev", 9: "mmap", 11: "munmap", 23: "select", 25: "mremap", 44: "sendto",
         45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 202: "futex", 232: "epoll_wait", 281: "epoll_pwait",
         441: "epoll_pwait2"}
READS = (READ, RECVFROM, RECVMSG)
WRITES = (WRITE, WRITEV)  # writev: the agent's quiet wait (packetin/_quiet_fast.c) writes a line and its newline
WAITS = (*READS, 7, 23, 232, 281, 441)  # where a reader sleeps until its next message: a read, poll, select, epoll

_PROGRAM = r"""
struct ev { u64 ts; u32 kind; u32 nr; s64 ret; };
BPF_PERF_OUTPUT(out);
TRACEPOINT_PROBE(sched, sched_wakeup) {
    if (args->pid != TID) return 0;
    struct ev e = {}; e.ts = bpf_ktime_get_ns(); e.kind = 1;
    out.perf_submit(args, &e, sizeof(e)); return 0;
}
TRACEPOINT_PROBE(sched, sched_switch) {
    if (args->next_pid != TID && args->prev_pid != TID) return 0;
    struct ev e = {}; e.ts = bpf_ktime_get_ns(); e.kind = args->next_pid == TID ? 2 : 3;
    out.perf_submit(args, &e, sizeof(e)); return 0;
}
TRACEPOINT_PROBE(raw_syscalls, sys_enter) {
    if ((u32)bpf_get_current_pid_tgid() != TID) return 0;
    struct ev e = {}; e.ts = bpf_ktime_get_ns(); e.kind = 4; e.nr = args->id;
    out.perf_submit(args, &e, sizeof(e)); return 0;
}
TRACEPOINT_PROBE(raw_syscalls, sys_exit) {
    if ((u32)bpf_get_current_pid_tgid() != TID) return 0;
    struct ev e = {}; e.ts = bpf_ktime_get_ns(); e.kind = 5; e.nr = args->id; e.ret = args->ret;
    out.perf_submit(args, &e, sizeof(e)); return 0;
}
"""


class Event(NamedTuple):
    ts: int    # ns, the kernel's monotonic clock
    kind: int  # WAKE, SWITCH_IN, SWITCH_OUT, ENTER or EXIT
    nr: int = -1   # the syscall (ENTER, EXIT)
    ret: int = 0   # its return value (EXIT)


class _Raw(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_uint64), ("kind", ctypes.c_uint32), ("nr", ctypes.c_uint32),
                ("ret", ctypes.c_int64)]


def ensure_tracefs() -> bool:
    """Mount tracefs where bcc reads the tracepoints' formats, unless it is there; True if it was mounted now."""
    if (TRACEFS / "events").is_dir():
        return False
    subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
    if not (TRACEFS / "events").is_dir():
        raise RuntimeError(f"tracefs mounted on {TRACEFS} has no events: the kernel has no tracepoints")
    return True


class WakeTrace:
    """The events of thread `tid` from now until `stop()`, collected on a thread of this process."""

    def __init__(self, tid: int) -> None:
        from bcc import BPF  # python3-bpfcc (the venv sees the system's site packages)

        self.mounted_tracefs = ensure_tracefs()
        self.events: list[Event] = []
        self.lost = 0  # samples the perf buffers had no room for
        self._bpf: Any = BPF(text=_PROGRAM.replace("TID", str(int(tid))).encode())  # bcc wants bytes
        self._bpf[b"out"].open_perf_buffer(self._on_event, page_cnt=256, lost_cb=self._on_lost,
                                           wakeup_events=WAKEUP_EVENTS)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="wake-trace", daemon=True)
        self._thread.start()

    def _on_event(self, cpu: int, data: Any, size: int) -> None:
        e = ctypes.cast(data, ctypes.POINTER(_Raw)).contents
        self.events.append(Event(e.ts, e.kind, e.nr, e.ret))

    def _on_lost(self, count: int) -> None:
        self.lost += count

    def _poll(self) -> None:
        while not self._stopping.is_set():
            self._bpf.perf_buffer_poll(timeout=100)

    def stop(self) -> list[Event]:
        self._stopping.set()
        self._thread.join()
        self._bpf.perf_buffer_consume()  # what is still in the buffers, fewer than WAKEUP_EVENTS a CPU
        self._bpf.cleanup()
        return self.events


def episodes(events: list[Event]) -> list[dict[str, Any]]:
    """One per wake-up that read something and then wrote: its stamps (ns) and its syscalls' names in order.
    A wake-up that did not (a timer's, a keepalive's, a read whose write failed: the thread went back to waiting for
    its next message), or whose thread was never seen running, is left out."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for e in sorted(events, key=lambda e: e.ts):
        if e.kind == WAKE:
            if current is not None and "read_return" in current:  # woken again while at work (a lock, the GIL)
                current["woken_again"] += 1
                continue
            current = {"wake": e.ts, "calls": [], "woken_again": 0}
            continue
        if current is None:
            continue
        if e.kind == SWITCH_IN:
            current.setdefault("on_cpu", e.ts)
        elif "on_cpu" not in current:
            continue
        elif e.kind == SWITCH_OUT:
            if current.get("in") in WAITS:  # back to waiting for a message, nothing written: not an episode
                current = None
        elif e.kind == ENTER:
            current["in"] = e.nr
            current["calls"].append(NAMES.get(e.nr, str(e.nr)))
            if e.nr in WRITES and "read_return" in current:
                current["write_enter"] = e.ts
        elif e.kind == EXIT:
            current["in"] = None
            current.setdefault("wait_return", e.ts)  # the first return running: the call it slept in
            if e.nr in READS and e.ret > 0:
                current.setdefault("read_return", e.ts)
            elif e.nr in WRITES and e.ret > 0 and "write_enter" in current:
                current["written"] = e.ts
                out.append(current)
                current = None
    return out


def _us(values: list[int]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None}
    p90 = statistics.quantiles(values, n=10)[-1] if len(values) >= 10 else max(values)
    return {"p50": round(statistics.median(values) / 1000, 1), "p90": round(p90 / 1000, 1)}


def timeline(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The episodes' intervals (µs, p50 and p90) and syscall sequences, as the module docstring says."""
    def spans(start: str, end: str) -> list[int]:
        return [e[end] - e[start] for e in found]

    return {
        "episodes": len(found),
        "wake_to_cpu_us": _us(spans("wake", "on_cpu")),
        "cpu_to_wait_return_us": _us(spans("on_cpu", "wait_return")),
        "wait_return_to_read_return_us": _us(spans("wait_return", "read_return")),
        "read_to_write_us": _us(spans("read_return", "write_enter")),
        "write_us": _us(spans("write_enter", "written")),
        "cpu_to_written_us": _us(spans("on_cpu", "written")),
        "episodes_woken_again": sum(1 for e in found if e["woken_again"]),  # slept between the read and the write
        "syscalls": [{"calls": list(calls), "episodes": n}
                     for calls, n in Counter(tuple(e["calls"]) for e in found).most_common(3)],
    }
