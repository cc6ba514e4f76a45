"""After ovs-vswitchd restarts, the channel's replay of its flows is one atomic bundle: an
independent observer (its own OpenFlow connection) sees the empty table or the whole table, never part of it."""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
import struct
import time

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import messages
from packetin.messages import CODEC
from tests.integration.conftest import OvsEnv
from tests.support.background import Background
from tests.support.packetin_ovs import connected
from tests.support.waiting import eventually

FLOWS = 10_000  # enough that a flow-by-flow replay spans many of vswitchd's main-loop iterations


def many_flows(n: int) -> list[messages.FlowSpec]:
    """n flows in one table, each for its own source address."""
    return [messages.FlowSpec.make(1, 100, {"eth_type": 0x0800, "ipv4_src": str(ipaddress.IPv4Address(0x0A000000 + i))},
                                   [messages.Output(1)]) for i in range(n)]


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("switch closed the connection")
        data += chunk
    return data


def _message(sock: socket.socket) -> bytes:
    head = _recv(sock, 8)
    return head + _recv(sock, struct.unpack_from("!H", head, 2)[0] - 8)


_AGGREGATE = messages.serialize(parser.OFPAggregateStatsRequest(
    CODEC, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, 0, 0, parser.OFPMatch()), 7)


class FlowCountObserver(Background):
    """Asks OVS for its flow count back to back, on its own OpenFlow connection to the
    bridge's management socket (independent of the channel under test), in a thread."""

    def __init__(self, env: OvsEnv) -> None:
        super().__init__()
        self._path = env.mgmt[len("unix:"):]
        self.counts: list[int] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with socket.socket(socket.AF_UNIX) as sock:
                    sock.settimeout(5)
                    sock.connect(self._path)
                    sock.sendall(messages.serialize(messages.hello(), 1))
                    while not self.stopping.is_set():
                        sock.sendall(_AGGREGATE)
                        while (raw := _message(sock))[1] != ofp.OFPT_MULTIPART_REPLY:
                            pass  # the switch's HELLO
                        self.counts.append(messages.parse(raw).body.stats["flow_count"])
            except OSError:  # vswitchd is down: look again
                time.sleep(0.001)


def test_the_replay_after_a_vswitchd_restart_is_all_or_nothing(ovs_env: OvsEnv) -> None:
    flows = many_flows(FLOWS)

    async def scenario() -> list[int]:
        async with connected(ovs_env.target, {}) as (channel, _):
            await channel.commit_flows(flows, [])
            connects = channel.connects
            with FlowCountObserver(ovs_env) as observer:
                await asyncio.to_thread(ovs_env.ovs.stop_daemon, "ovs-vswitchd", signal.SIGKILL)
                await asyncio.to_thread(ovs_env.ovs.up)
                await eventually(lambda: channel.connects > connects and channel.ready, timeout=30)
                await eventually(lambda: bool(observer.counts) and observer.counts[-1] == FLOWS, timeout=10,
                                   what=lambda: str(observer.counts[-5:]))
            return observer.counts

    counts = asyncio.run(scenario())
    partial = sorted({c for c in counts if c not in (0, FLOWS)})
    assert not partial, \
        f"an observer saw a partly replayed table: {partial[:10]} flows (of {FLOWS}) in {len(counts)} looks"
    assert 0 in counts  # it did look while the table was empty, before the replay
