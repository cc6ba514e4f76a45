"""wait_event: a cancel is never swallowed, whatever the event does at the same moment; AgentThread's kernel name."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Awaitable, Callable

from packetin.tasks import AgentThread, cancel_and_wait, os_thread_name, wait_event


async def _wait_with_wait_for(event: asyncio.Event, timeout: float) -> bool:
    """What the audit window timer and the engine did before wait_event (Python 3.11's wait_for)."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


def _cancel_as_the_event_is_set(wait: Callable[[asyncio.Event, float], Awaitable[bool]]) -> bool:
    """True when a loop around `wait` stops on a cancel that arrives together with a set()."""
    async def run() -> bool:
        event = asyncio.Event()

        async def timer_loop() -> None:  # the shape of AuditPipeline._timer
            while True:
                if await wait(event, 5.0):
                    event.clear()

        task = asyncio.create_task(timer_loop())
        await asyncio.sleep(0.01)  # the loop now waits on the event
        event.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1.0)
        stopped = task in done
        if not stopped:  # swallowed: stop the runaway loop so the test itself ends
            while not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=0.1)
        return stopped

    return asyncio.run(run())


def test_a_cancel_arriving_as_the_event_is_set_stops_the_loop():
    assert _cancel_as_the_event_is_set(wait_event)


def test_the_race_is_real_with_wait_for_on_this_python():
    # Documents why wait_event exists: if a future Python fixes wait_for, this test says so.
    assert not _cancel_as_the_event_is_set(_wait_with_wait_for)


def test_wait_event_says_whether_the_event_came():
    async def run() -> tuple[bool, bool]:
        event = asyncio.Event()
        timed_out = await wait_event(event, 0.01)
        asyncio.get_running_loop().call_soon(event.set)
        return timed_out, await wait_event(event, 5.0)

    assert asyncio.run(run()) == (False, True)


def test_an_ordinary_cancel_of_a_waiting_task_still_cancels():
    async def run() -> None:
        task = asyncio.create_task(wait_event(asyncio.Event(), 5.0))
        await asyncio.sleep(0.01)
        await cancel_and_wait(task)
        assert task.cancelled()

    asyncio.run(run())


def test_the_window_timer_stops_at_close_right_after_its_first_packet():
    """The hang a full unit run met: close() right after the first packet-in woke the timer."""
    from auditlog.aggregate import Aggregator
    from auditlog.pipeline import AuditPipeline
    from tests.support.audit_pipeline import Writer, context, pin, udp_to

    async def run() -> bool:
        pipeline = AuditPipeline(context(), Writer(), Aggregator(window=1.0), wall_clock=lambda: 100.0)
        pipeline.start()
        pipeline(pin(udp_to(5353), 100.0))  # sets the wake event before the timer ever ran
        await asyncio.sleep(0)  # the timer starts waiting with the event already set
        closing = asyncio.create_task(pipeline.close())
        done, _ = await asyncio.wait({closing}, timeout=3.0)
        timer = pipeline._task
        while timer is not None and not timer.done():  # a swallowed cancel: stop the runaway loop
            timer.cancel()
            await asyncio.wait({timer}, timeout=0.1)
        await closing
        return closing in done

    assert asyncio.run(run()), "close() hung: the window timer swallowed its cancel"


def _kernel_names() -> dict[int, str]:
    return {int(t): (Path("/proc/self/task") / t / "comm").read_text().strip() for t in os.listdir("/proc/self/task")}


def test_an_agent_thread_is_known_to_the_kernel_by_its_name_without_the_prefix() -> None:
    seen: dict[str, str] = {}
    for name in ("npaudit-audit-gzip", "npaudit-syslog-siem-eu-west-primary", "k8s-watch-pods"):
        def look(name: str = name) -> None:
            seen[name] = _kernel_names()[threading.get_native_id()]
        thread = AgentThread(target=look, name=name)
        thread.start()
        thread.join(10)
    assert seen == {"npaudit-audit-gzip": "audit-gzip", "npaudit-syslog-siem-eu-west-primary": "syslog-siem-eu-",
                    "k8s-watch-pods": "k8s-watch-pods"}
    assert os_thread_name("npaudit-syslog-\u00e9t\u00e9") == "syslog-?t?"  # ASCII only, as the kernel shows it


def test_the_writer_and_compressor_threads_carry_their_names(tmp_path) -> None:
    from auditlog.writer import AuditWriter

    writer = AuditWriter(tmp_path / "audit.jsonl")
    writer.start()
    try:  # each thread names itself as it begins to run, which may be just after start() returned
        deadline = time.monotonic() + 10
        while not {"audit-writer", "audit-gzip"} <= (names := set(_kernel_names().values())):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        writer.close()
    assert {"audit-writer", "audit-gzip"} <= names
