"""OpenFlowStream.data_received offers a read to `lone` (packetin/reader.py PacketInReader.lone) only when the read is
exactly one whole message with nothing of another buffered before it; whatever lone declines, and every other read,
goes to on_messages as before, framed the same."""

from __future__ import annotations

import asyncio
import struct

from packetin.connect import OpenFlowStream


def _message(xid: int, length: int = 24) -> bytes:
    return struct.pack("!BBHI", 6, 2, length, xid) + b"\0" * (length - 8)


def test_only_a_read_of_one_whole_message_is_offered_to_lone() -> None:
    async def run() -> tuple[list[bytes], list[list[bytes]]]:
        offered: list[bytes] = []
        reads: list[list[bytes]] = []

        def lone(raw: bytes, read_at: object = None) -> bool:
            offered.append(raw)
            return raw[7] % 2 == 1  # odd xids taken

        stream = OpenFlowStream("test", lambda msgs, backlog: reads.append(msgs), lambda s: None, lone=lone)
        one, two, three, four, five = (_message(i) for i in (1, 2, 3, 4, 5))
        stream.data_received(one)  # taken
        stream.data_received(two)  # declined: on_messages
        stream.data_received(three + four)  # two messages: not offered
        stream.data_received(five[:10])  # a part: not offered, buffered
        stream.data_received(five[10:])  # completes the buffered one: not offered
        stream.data_received(_message(7, 40)[:24])  # announces 40 bytes, brings 24: not offered
        return offered, reads

    offered, reads = asyncio.run(run())
    assert offered == [_message(1), _message(2)]
    assert reads == [[_message(2)], [_message(3), _message(4)], [], [_message(5)], []]


def test_without_lone_every_read_goes_to_on_messages() -> None:
    async def run() -> list[list[bytes]]:
        reads: list[list[bytes]] = []
        stream = OpenFlowStream("test", lambda msgs, backlog: reads.append(msgs), lambda s: None)
        stream.data_received(_message(1))
        return reads

    assert asyncio.run(run()) == [[_message(1)]]
