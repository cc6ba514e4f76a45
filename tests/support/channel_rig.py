"""An OpenFlowChannel connected to a fake OpenFlow 1.5 switch over a unix socket, for the tests
that drive a channel."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from typing import Any, AsyncIterator, Callable, Coroutine

import pytest
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import messages
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.model import PacketIn
from tests.support.clock import FixedJitter, ManualSleep
from tests.support.fake_switch import FakeSwitch

DPID = 0x00000A0B0C0D0E0F
WALL = 1_700_000_000.25


@pytest.fixture
def sock_path() -> Any:
    d = tempfile.mkdtemp(prefix="fsw", dir="/tmp")  # AF_UNIX paths are limited to 108 bytes
    yield os.path.join(d, "br-int.mgmt")
    shutil.rmtree(d, ignore_errors=True)


def run(coro: Coroutine[Any, Any, Any], timeout: float = 4.0) -> Any:
    """asyncio.run with a hard cap, so a hang fails the test instead of the suite."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Rig:
    """A fake switch, a channel connected to it, and what the channel delivered."""

    def __init__(self, path: str, fake: FakeSwitch, chan: OpenFlowChannel, sleep: ManualSleep) -> None:
        self.path = path
        self.fake = fake
        self.chan = chan
        self.sleep = sleep  # every wait of the channel: backoffs pass at once, keepalive ticks on `wake`
        self.fakes = [fake]
        self.batches: list[list[PacketIn]] = []
        self.malformed_calls: list[int] = []

    @property
    def packet_ins(self) -> list[PacketIn]:
        return [p for b in self.batches for p in b]

    async def restart_switch(self, **fake_kw: Any) -> FakeSwitch:
        """ovs-vswitchd dies and comes back on the same socket with an empty table."""
        await self.fake.stop()
        self.fake = FakeSwitch(self.path, datapath_id=DPID, **fake_kw)
        self.fakes.append(self.fake)
        await self.fake.start()
        return self.fake


@contextlib.asynccontextmanager
async def rig(path: str, *, wait: bool = True, fake_kw: dict[str, Any] | None = None,
              mono_clock: Callable[[], float] = time.monotonic, sleep: ManualSleep | None = None,
              **settings: Any) -> AsyncIterator[Rig]:
    """The channel's sleeps take no wall time: with the jitter fixed at its middle, every reconnect
    backoff (at most reconnect_max) passes at once; a keepalive interval (longer) waits for the test.
    A test that wants to hold the channel in its backoff passes its own `sleep`."""
    fake = FakeSwitch(path, datapath_id=DPID, **(fake_kw or {}))
    await fake.start()
    settings.setdefault("request_timeout", 2.0)
    settings.setdefault("reconnect_max", 0.2)
    sleep = sleep or ManualSleep(instant=settings["reconnect_max"])
    r: Rig
    chan = OpenFlowChannel(ChannelSettings(target=path, **settings),
                           lambda batch, mono: r.batches.append(batch),
                           on_malformed=lambda n: r.malformed_calls.append(n),
                           mono_clock=mono_clock, wall_clock=lambda: WALL, sleep=sleep, rng=FixedJitter(0.5))
    r = Rig(path, fake, chan, sleep)
    chan.start()
    try:
        if wait:
            await chan.wait_ready(2.0)
        yield r
    finally:
        await chan.close()
        for f in r.fakes:
            await f.stop()


def flow(table: int, priority: int, port: int, **match: Any) -> messages.FlowSpec:
    return messages.FlowSpec.make(table, priority, match, [messages.Output(port)])


def ports(actions: list[Any]) -> list[int]:
    return [a.port for a in actions if isinstance(a, parser.OFPActionOutput)]
