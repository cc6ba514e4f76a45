"""wait_event and within: a cancel is never swallowed, whatever the awaited thing does at the same moment;
cancel_and_wait ends a task that swallowed one all the same; AgentThread's kernel name."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path
from typing import Awaitable, Callable

import pytest

from packetin.tasks import AgentThread, cancel_and_wait, os_thread_name, wait_event, within


async def _wait_with_wait_for(event: asyncio.Event, timeout: float) -> bool:
    """What the audit window timer and the engine did before wait_event (Python 3.11's wait_for)."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return False
    return True


async def _ended_by_cancel(task: "asyncio.Task[None]", within_s: float = 1.0) -> bool:
    """Cancel `task`: whether it ended within `within_s`. One that swallowed the cancel is cancelled again until it
    ends, so that the test itself ends."""
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=within_s)
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)
    return task in done


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
        return await _ended_by_cancel(task)  # the cancel in the same turn as the set

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


def _request_loop_stops_when_cancelled_as_its_reply_lands(wait: Callable[[asyncio.Future[str], float], Awaitable[str]]) -> bool:
    """True when a task looping around `wait(reply, timeout)` (the loss accounting's ticks, each a channel request)
    stops on a cancel that arrives in the same loop turn as a reply."""
    async def run() -> bool:
        replies: list[asyncio.Future[str]] = []

        async def ticks() -> None:
            while True:
                reply = asyncio.get_running_loop().create_future()
                replies.append(reply)
                await wait(reply, 5.0)

        task = asyncio.create_task(ticks())
        await asyncio.sleep(0.01)  # it waits for its first reply
        replies[-1].set_result("meter stats")  # the reply, as the channel's reader hands it over
        return await _ended_by_cancel(task)  # and the stop's cancel in the same turn

    return asyncio.run(run())


def test_a_cancel_arriving_with_a_reply_stops_a_loop_around_within():
    assert _request_loop_stops_when_cancelled_as_its_reply_lands(within)


def test_the_reply_race_is_real_with_wait_for_on_this_python():
    # Why within exists: the loss accounting task went on ticking after the agent's stop cancelled it.
    assert not _request_loop_stops_when_cancelled_as_its_reply_lands(asyncio.wait_for)


def test_within_returns_the_result_or_raises_timeout_and_cancels_what_it_waited_for():
    async def run() -> tuple[str, bool]:
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.call_soon(ready.set_result, "reply")
        got = await within(ready, 5.0)
        never = loop.create_future()
        with pytest.raises(TimeoutError):
            await within(never, 0.01)
        unbounded = loop.create_future()
        loop.call_later(0.01, unbounded.set_result, "late")
        assert await within(unbounded, None) == "late"
        return got, never.cancelled()

    assert asyncio.run(run()) == ("reply", True)


def test_cancel_and_wait_ends_a_task_that_swallowed_its_cancel_and_says_so(caplog):
    async def run() -> tuple[bool, int]:
        swallowed = 0

        async def stubborn() -> None:
            nonlocal swallowed
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if swallowed:  # the second cancel ends it
                        raise
                    swallowed += 1  # what wait_for did to the first

        task = asyncio.create_task(stubborn(), name="loss-accounting")
        await asyncio.sleep(0.01)
        ended = asyncio.create_task(cancel_and_wait(task, again_after=0.05))
        done, _ = await asyncio.wait({ended}, timeout=5.0)  # the test's own limit: a hang fails, not hangs
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        return ended in done and task.cancelled(), swallowed

    with caplog.at_level(logging.ERROR, logger="packetin.tasks"):
        assert asyncio.run(run()) == (True, 1)
    assert "task 'loss-accounting' still running 0.05 s after it was cancelled" in caplog.text, caplog.text


def test_cancel_and_wait_raises_what_the_task_failed_with():
    async def run() -> None:
        async def failing() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                raise OSError("socket gone")

        task = asyncio.create_task(failing())
        await asyncio.sleep(0.01)
        with pytest.raises(OSError, match="socket gone"):
            await cancel_and_wait(task)

    asyncio.run(run())


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
