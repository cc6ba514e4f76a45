"""The hand-offs of one packet-in on its way to the audit file, stamped in the bench only.

The latency consumer runs the agent's path (channel -> demux -> AuditPipeline with the
agent's overload mode -> AuditWriter thread -> file) and stamps each packet-in (wall
clock, time.time(), so that the sender's and the file reader's stamps compare):

  read     the channel decoded it off the socket (PacketIn.received_at)
  handler  the demux consumer handed it to the pipeline
  submit   the pipeline gave its record to the writer (decode, aggregate, encode done)
  take     the writer thread took the record off its queue (written inline by `submit`,
           the record is taken at once: this hand-off is then ~0)
  emit     its sealed line went to the file handler (lock, rotation check, write(2))
  written  the write of the batch holding it returned (readable in the file from then)

End to end is sender -> `written`: the writer's own stamp when the write(2) returned, so
no reader's wake-up is in it (and no polling reader takes CPU from the sender, OVS and
the agent during a round: the file is read once the round is over, to check that each
stamped record is really there). The floor is a bare reader in the same run (`consume_floor`: a blocking
socket, a hand-made handshake, a stamp at each recv), i.e. what the sender, the kernel
and OVS cost before any agent code.

Stamps are keyed by UDP destination port (the latency sender gives every packet its own
port). `breakdown` turns them, with the sender's and the file reader's times, into
per-hand-off p50/p99 in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

from _bridge import consumer_path, until_sigterm

from packetin import messages as m, wire

from auditlog.record_fast import aggregator  # the agent's: in C where built
from auditlog.chain import RecordText
from auditlog.overload import Overload
from auditlog.pipeline import AuditPipeline
from auditlog.record import RecordContext
from auditlog.writer import AuditWriter
from packetin.model import Category, PacketIn
from policy_agent.config.overload import OverloadConfig

# One UDP datagram every 1/rate s from a Pod, datagram i to port 20000 + i (each a new audit key); prints
# "<port> <time.time() when sent>" per datagram. Args: destination address, count, rate.
LOW_RATE_SENDER = r"""
import socket, sys, time
dst, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(n):
    port = 20000 + i
    t = time.time()
    s.sendto(b"lat", (dst, port))
    print(port, t, flush=True)
    time.sleep(1.0 / rate)
"""
MARKS = OverloadConfig()  # the agent's default overload marks

# (name, from stamp, to stamp): the hand-offs, in path order.
HANDOFFS = (("socket_read", "sent", "read"),          # sender -> kernel -> OVS upcall -> agent read
            ("demux_queue", "read", "handler"),       # dispatch, channel, consumer task wake-up
            ("aggregation", "handler", "submit"),     # decode, aggregate, encode
            ("writer_thread", "submit", "take"),      # writer thread wake-up
            ("seal", "take", "emit"),                 # hash chain
            ("write", "emit", "written"))             # the file handler: lock, rotation check, write(2)


class StampingWriter(AuditWriter):
    """An AuditWriter that stamps when a record is submitted, taken and written."""

    def __init__(self, *args: Any, stamps: dict[int, dict[str, float]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stamps = stamps
        self.current: int | None = None  # the port of the packet-in the pipeline is handling
        self._ports: dict[int, int] = {}  # id(record) -> port, until taken
        self._taken: list[int] = []

    def submit(self, record: RecordText) -> bool:
        port = self.current
        if port is not None and "submit" not in self.stamps[port]:
            self.stamps[port]["submit"] = time.time()
            self._ports[id(record)] = port
        return super().submit(record)

    def _take(self) -> tuple[list[RecordText], list[Any]]:
        records, done = super()._take()
        now = time.time()
        taken = self._taken = []
        for record in records:
            port = self._ports.pop(id(record), None)
            if port is not None:
                self.stamps[port]["take"] = now
                taken.append(port)
        return records, done

    def _emit(self, text: str) -> None:
        now = time.time()
        for port in self._taken:
            self.stamps[port].setdefault("emit", now)
        super()._emit(text)

    def _emit_records(self, records: list[RecordText]) -> None:
        if self._ports:  # written inline by submit: never on the queue, taken now
            now = time.time()
            for record in records:
                port = self._ports.pop(id(record), None)
                if port is not None:
                    self.stamps[port].update(take=now, inline=1)
                    self._taken.append(port)
        super()._emit_records(records)
        now = time.time()
        for port in self._taken:
            self.stamps[port]["written"] = now
        self._taken = []


def udp_dst_port(frame: bytes) -> int | None:
    """The UDP destination port of an untagged IPv4 frame without options (the bench's)."""
    if len(frame) >= 38 and frame[12:14] == b"\x08\x00" and frame[23] == 17 and frame[14] == 0x45:
        return int.from_bytes(frame[36:38], "big")
    return None


def consume_floor(target: str, netns: str, append_path: str = "") -> None:
    """The floor: a bare OpenFlow reader (no agent code) stamping each packet-in as recv returns;
    with `append_path`, the file-append floor too: one short line per packet-in appended with one
    write(2) (what a logger that neither aggregates nor chains does), stamped "written" when it
    returned. Prints {"stamps": {port: {"read": time[, "written": time]}}} at SIGTERM."""
    from packetin.netns_socket import socket_in_netns

    host, _, port_text = target[4:].rpartition(":")
    s = socket_in_netns(netns)
    s.connect((host, int(port_text)))
    for msg in (m.hello(), m.set_config(), m.set_packet_in_format_nxt2()):
        s.sendall(m.serialize(msg, 1))
    stamps: dict[int, dict[str, float]] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    s.settimeout(0.2)
    framer = wire.Framer()
    fd = os.open(append_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640) if append_path else -1
    cpu = time.process_time()
    print("ready", flush=True)
    while not stop:
        try:
            data = s.recv(1 << 16)
        except TimeoutError:
            continue
        now = time.time()
        if not data:
            break
        for msg in framer.feed(data):
            if msg[1] == 2:  # echo request: answer, or OVS drops us
                s.sendall(bytes([msg[0], 3]) + msg[2:])
            elif wire.is_packet_in2(msg):
                port = udp_dst_port(wire.decode_packet_in2(msg, now).packet)
                if port is not None:
                    stamps[port] = {"read": now}
                    if fd >= 0:
                        os.write(fd, b'{"destination":{"port":%d},"read":%.6f}\n' % (port, now))
                        stamps[port]["written"] = time.time()
    if fd >= 0:
        os.close(fd)
    print(json.dumps({"stamps": stamps, "cpu_s": time.process_time() - cpu}), flush=True)


def consume_latency(target: str, netns: str, audit_path: str, context: RecordContext, inline: bool = True) -> None:
    """The agent's audit path with stamps; prints {"stamps": {port: {stage: time}}, ...} at SIGTERM.
    `inline`: the writer's default (lone records written by submit); False: always its thread."""
    stamps: dict[int, dict[str, float]] = {}

    async def main() -> None:
        gap = {} if inline else {"inline_gap": None}
        writer = StampingWriter(Path(audit_path), backup_count=50, stamps=stamps, **gap)
        writer.start()
        demux_fill: list[Any] = []
        overload = Overload(lambda: max(demux_fill[0].queue_fill(Category.POLICY) if demux_fill else 0.0,
                                        writer.queue_fill()),
                            high_mark=MARKS.high_mark, peers_mark=MARKS.peers_mark, low_mark=MARKS.low_mark)
        pipeline = AuditPipeline(context, writer, aggregator(window=1.0), overload=overload)

        def handler(pin: PacketIn) -> None:
            port = udp_dst_port(pin.packet)
            if port is not None:
                stamps[port] = {"read": pin.received_at, "handler": time.time()}
            writer.current = port
            try:
                pipeline(pin)
            finally:
                writer.current = None

        # The agent's policy channel size (packetin.policy.queue_size default).
        async with consumer_path(target, netns, handler, queue_size=65536) as (channel, demux):
            demux_fill.append(demux)
            pipeline.start()
            cpu = time.process_time()
            stats = await until_sigterm(demux)
            cpu = time.process_time() - cpu
        await asyncio.to_thread(writer.flush_wait, 30)
        await pipeline.close()
        await asyncio.to_thread(writer.close)
        print(json.dumps({"delivered": stats["delivered"], "decoded": channel.packet_ins,
                          "stamps": stamps, "cpu_s": cpu}), flush=True)

    asyncio.run(main())


def quantiles_ms(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (milliseconds, at least one), rounded to µs."""
    values = sorted(values)
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) >= 2 else [values[0]] * 99
    return {"p50_ms": round(q[49], 3), "p99_ms": round(q[98], 3), "max_ms": round(values[-1], 3)}


# sent, ports in the file, stamps, the consumer's CPU seconds from "ready" to SIGTERM
Round = tuple[dict[int, float], set[int], dict[str, dict[str, float]], float]


def cpu_us_per_packet(rounds: list[Round]) -> float:
    return round(sum(r[3] for r in rounds) * 1e6 / max(1, sum(len(r[0]) for r in rounds)), 1)


def floor(rounds: list[Round]) -> dict:
    """The bare reader's sender -> read and, where it appended lines, sender -> line written (the
    file-append floor), over every round."""
    lat = [(s["read"] - t) * 1000 for sent, _, stamps, _ in rounds for port, t in sent.items()
           if (s := stamps.get(str(port))) is not None]
    written = [(s["written"] - t) * 1000 for sent, in_file, stamps, _ in rounds for port, t in sent.items()
               if (s := stamps.get(str(port))) is not None and "written" in s and port in in_file]
    sent = sum(len(r[0]) for r in rounds)
    return {"packets": sent, "read": len(lat), "cpu_us_per_packet": cpu_us_per_packet(rounds),
            **({"sent_to_read": quantiles_ms(lat)} if lat else {}),
            **({"sent_to_written_file_append": quantiles_ms(written)} if written else {})}


def breakdown(rounds: list[Round]) -> dict:
    """Over the packets of every round that have every stamp and a record in the file: end to end
    (sender -> written), the agent's part (read -> written) and each hand-off, p50/p99/max in ms."""
    rows = []
    for sent, in_file, stamps, _ in rounds:
        for port, t in sent.items():
            s = stamps.get(str(port))
            if s is None or port not in in_file:
                continue
            row = {**s, "sent": t}
            if all(k in row for _, a, b in HANDOFFS for k in (a, b)):
                rows.append(row)
    out: dict[str, Any] = {"packets": sum(len(r[0]) for r in rounds), "complete_packets": len(rows),
                           "cpu_us_per_packet": cpu_us_per_packet(rounds)}
    if not rows:
        return out
    out["written_inline"] = sum(1 for r in rows if r.get("inline"))
    out["end_to_end"] = quantiles_ms([(r["written"] - r["sent"]) * 1000 for r in rows])
    out["agent_read_to_written"] = quantiles_ms([(r["written"] - r["read"]) * 1000 for r in rows])
    out["handoffs"] = {name: quantiles_ms([(r[b] - r[a]) * 1000 for r in rows]) for name, a, b in HANDOFFS}
    return out
