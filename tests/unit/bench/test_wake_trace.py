"""bench/_wake_trace.py: wake-ups cut into episodes (read, then a line written) and their timeline, from
hand-made event streams and from a real thread traced through bcc."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
from pathlib import Path

from tests.support.bench_modules import load_bench

wt = load_bench("_wake_trace")
E = wt.Event
EPOLL_WAIT = 232


def agent_like(t0: int, *, read_at: int = 130, write_at: int = 430) -> list:
    """An event loop's wake-up (µs after t0): woken, running, epoll_wait returns, recvfrom, write, sleeps again."""
    us = 1000
    return [E(t0, wt.WAKE), E(t0 + 70 * us, wt.SWITCH_IN),
            E(t0 + 95 * us, wt.EXIT, EPOLL_WAIT, 1),
            E(t0 + (read_at - 10) * us, wt.ENTER, wt.RECVFROM), E(t0 + read_at * us, wt.EXIT, wt.RECVFROM, 240),
            E(t0 + write_at * us, wt.ENTER, wt.WRITE), E(t0 + (write_at + 60) * us, wt.EXIT, wt.WRITE, 1500),
            E(t0 + (write_at + 61) * us, wt.ENTER, EPOLL_WAIT), E(t0 + (write_at + 62) * us, wt.SWITCH_OUT)]


def test_an_event_loops_wake_up_is_one_episode_with_each_step_stamped() -> None:
    found = wt.episodes(agent_like(1_000_000))
    assert len(found) == 1
    e = found[0]
    assert (e["on_cpu"] - e["wake"], e["wait_return"] - e["on_cpu"], e["read_return"] - e["wait_return"],
            e["write_enter"] - e["read_return"], e["written"] - e["write_enter"]) == (70_000, 25_000, 35_000,
                                                                                     300_000, 60_000)
    assert e["calls"] == ["recvfrom", "write"]  # the epoll_wait it slept in was entered before its wake-up
    line = wt.timeline(found)
    assert line["wake_to_cpu_us"]["p50"] == 70.0 and line["read_to_write_us"]["p50"] == 300.0
    assert line["cpu_to_written_us"]["p50"] == 420.0 and line["syscalls"] == [{"calls": ["recvfrom", "write"],
                                                                              "episodes": 1}]


def test_a_bare_reader_sleeps_in_its_read_so_no_loop_turn_comes_between() -> None:
    us = 1000
    events = [E(0, wt.WAKE), E(40 * us, wt.SWITCH_IN), E(80 * us, wt.EXIT, wt.RECVFROM, 240),
              E(100 * us, wt.ENTER, wt.WRITE), E(150 * us, wt.EXIT, wt.WRITE, 6)]
    line = wt.timeline(wt.episodes(events))
    assert line["episodes"] == 1
    assert line["cpu_to_wait_return_us"]["p50"] == 40.0 and line["wait_return_to_read_return_us"]["p50"] == 0.0
    assert line["read_to_write_us"]["p50"] == 20.0 and line["write_us"]["p50"] == 50.0


def test_wake_ups_that_read_nothing_or_write_nothing_are_not_episodes() -> None:
    us = 1000
    def back_to_wait(t: int) -> list:  # the thread goes back to waiting for its next message, and sleeps
        return [E(t * us, wt.ENTER, EPOLL_WAIT), E((t + 1) * us, wt.SWITCH_OUT)]

    timer_only = [E(0, wt.WAKE), E(10 * us, wt.SWITCH_IN), E(20 * us, wt.EXIT, EPOLL_WAIT, 0),
                  E(30 * us, wt.ENTER, wt.WRITE), E(40 * us, wt.EXIT, wt.WRITE, 8),  # a log line, no read before
                  *back_to_wait(50)]
    read_failed_write = [E(100 * us, wt.WAKE), E(110 * us, wt.SWITCH_IN), E(115 * us, wt.EXIT, EPOLL_WAIT, 1),
                         E(120 * us, wt.ENTER, wt.RECVFROM), E(121 * us, wt.EXIT, wt.RECVFROM, 240),
                         E(130 * us, wt.ENTER, wt.WRITE), E(140 * us, wt.EXIT, wt.WRITE, -11),  # EAGAIN
                         *back_to_wait(150)]
    empty_read = [E(200 * us, wt.WAKE), E(210 * us, wt.SWITCH_IN), E(220 * us, wt.EXIT, wt.RECVFROM, 0),
                  E(230 * us, wt.ENTER, wt.WRITE), E(240 * us, wt.EXIT, wt.WRITE, 8), *back_to_wait(250)]
    assert wt.episodes(timer_only + read_failed_write + empty_read) == []
    # ...and the next wake-up that reads and writes is one, stamped from its own wake-up.
    found = wt.episodes(timer_only + read_failed_write + agent_like(1_000_000))
    assert [e["wake"] for e in found] == [1_000_000]


def test_a_thread_woken_again_between_its_read_and_its_write_stays_in_its_episode() -> None:
    us = 1000
    events = agent_like(0)
    events.insert(5, E(200 * us, wt.SWITCH_OUT))  # after the read: waits for the GIL
    events.insert(6, E(250 * us, wt.WAKE))
    events.insert(7, E(260 * us, wt.SWITCH_IN))
    found = wt.episodes(events)
    assert len(found) == 1 and found[0]["wake"] == 0 and found[0]["on_cpu"] == 70 * us
    assert found[0]["woken_again"] == 1 and wt.timeline(found)["episodes_woken_again"] == 1


def test_events_are_taken_in_time_order_whatever_order_they_came_in() -> None:
    events = agent_like(0) + agent_like(5_000_000, write_at=600)
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)  # per-CPU perf buffers deliver out of order
    assert wt.episodes(shuffled) == wt.episodes(events)
    line = wt.timeline(wt.episodes(shuffled))
    assert line["episodes"] == 2 and line["read_to_write_us"]["p50"] == (300 + 470) / 2


def test_a_thread_never_seen_running_since_its_wake_up_has_no_episode() -> None:
    events = [e for e in agent_like(0) if e.kind != wt.SWITCH_IN]  # the tracer started while it ran
    assert wt.episodes(events) == []


def _voluntary_switches(tid: int) -> int:
    status = Path(f"/proc/self/task/{tid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


def trace_a_reader(n: int, gap: float) -> tuple[list, wt.WakeTrace, int]:
    """bcc on the live tracepoints (root, python3-bpfcc): a thread blocked in recv, woken by a datagram every `gap`
    seconds, appending a line to a file, `n` times. Its events, the tracer, and how often the tracer's own reading
    thread slept and was woken meanwhile."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ready = threading.Event()
    tid: list[int] = []
    with tempfile.TemporaryDirectory() as tmp:
        fd = os.open(os.path.join(tmp, "lines"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def reader() -> None:
            tid.append(threading.get_native_id())
            ready.set()
            for _ in range(n):
                os.write(fd, b.recv(64) + b"\n")

        thread = threading.Thread(target=reader)
        thread.start()
        ready.wait()
        tracer = wt.WakeTrace(tid[0])
        poller = tracer._thread.native_id
        assert poller is not None
        switches0 = _voluntary_switches(poller)
        try:
            for i in range(n):
                threading.Event().wait(gap)  # it sleeps in recv before each
                a.send(b"%d" % i)
            thread.join(5)
            woken = _voluntary_switches(poller) - switches0
        finally:
            events = tracer.stop()
            os.close(fd)
            a.close()
            b.close()
    return events, tracer, woken


def test_a_real_thread_reading_a_socket_and_writing_a_file_is_traced() -> None:
    events, _, _ = trace_a_reader(5, 0.05)
    found = wt.episodes(events)
    assert len(found) == 5
    assert all(e["calls"][-1] == "write" and e["read_return"] <= e["write_enter"] for e in found)
    line = wt.timeline(found)
    assert line["episodes"] == 5 and line["cpu_to_written_us"]["p50"] > 0


def test_the_tracers_own_thread_is_not_woken_per_event_and_loses_none() -> None:
    """Woken per event (bcc's default), the tracer's reading thread ran Python for every event of the traced
    thread and, sharing its CPU, preempted it again and again: the tracer bent what it measured. It is woken once
    per WAKEUP_EVENTS a CPU now, and stop() still hands over every event."""
    n = 60
    events, tracer, woken = trace_a_reader(n, 0.002)
    # Each episode is ~8 events (wake, switches, two syscalls in and out): per event that was ~500 wake-ups. The
    # thread still wakes when its 100 ms poll times out, a few times over the ~0.2 s the episodes take.
    assert len(events) >= 5 * n
    assert woken < n // 4, (woken, len(events))
    assert len(wt.episodes(events)) == n and tracer.lost == 0
