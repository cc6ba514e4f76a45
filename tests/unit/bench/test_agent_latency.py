"""bench/agent_latency.py's parts: the floor reader's UDP port out of an NXT_PACKET_IN2 as OVS 3.1 sends it,
the watcher that stamps each appended line (real inotify on a temp file), and the percentiles."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.packet_ins import frame, message
from tests.support.bench_modules import load_bench

bench = load_bench("agent_latency")
floor = load_bench("_of_floor")


def test_the_floor_finds_each_packet_ins_udp_port_and_skips_what_is_not_udp() -> None:
    assert floor.udp_dst_port(message(frame("10.0.0.1", "10.0.0.2", "udp", 40123))) == 40123
    assert floor.udp_dst_port(message(frame("10.0.0.1", "10.0.0.2", "tcp", 443))) is None
    assert floor.udp_dst_port(message(frame("10.0.0.1", "10.0.0.2", "icmp", 0))) is None
    got: list[bytes] = []
    stream = b"".join(message(frame("10.0.0.1", "10.0.0.2", "udp", p)) for p in (2000, 2001))
    assert floor.scan(stream, got.append)[0] == 2 and [floor.udp_dst_port(m) for m in got] == [2000, 2001]


def test_the_watcher_stamps_each_key_once_when_its_line_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"labels":{"log_label":"flood"},"destination":{"port":1}}\n')  # before: not counted
    appends = bench.Appends(path, bench.record_port)
    try:
        with open(path, "a") as f:
            before = time.time()
            f.write(json.dumps({"labels": {"log_label": "flood"}, "destination": {"port": 5}}) + "\n")
            f.flush()
            f.write('{"labels":{"log_label":"other"},"destination":{"port":6}}\n{"labels":{"log_label":"flo')
            f.flush()
            deadline = time.monotonic() + 5
            while 5 not in appends.seen and time.monotonic() < deadline:
                time.sleep(0.01)
            f.write('od"},"destination":{"port":7}}\n')
            f.flush()
            while 7 not in appends.seen and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        appends.close()
    assert set(appends.seen) == {5, 7} and appends.seen[5] >= before and appends.seen[7] >= appends.seen[5]


def test_percentiles() -> None:
    assert bench.percentiles([]) == {"n": 0}
    got = bench.percentiles([float(x) for x in range(1, 101)])
    assert got["n"] == 100 and got["p50_ms"] == 50.5 and got["max_ms"] == 100.0 and 99 <= got["p99_ms"] <= 100


def _config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\novs:\n  run_dir: {tmp_path / 'ovs'}\n  netns: npe-abc\n"
                    f"audit:\n  path: {tmp_path / 'audit.jsonl'}\n" + extra)
    return path


def test_the_floor_reads_over_the_agents_transport_unless_told_mgmt(tmp_path: Path) -> None:
    """The floor's command line: over TCP (the agent's default with OVS in a namespace of its own) from that
    namespace to the agent's target; over unix to the agent's socket; with mgmt, the bridge's .mgmt socket."""
    tcp = _config(tmp_path)
    cmd, said = bench.floor_reader(tcp, "agent")
    assert cmd[:4] == ["ip", "netns", "exec", "npe-abc"] and cmd[-1] == "tcp:127.0.0.1:6653" and said.startswith("tcp")
    cmd, said = bench.floor_reader(_config(tmp_path, "openflow:\n  transport: unix\n"), "agent")
    assert cmd[-1] == str(tmp_path / "ovs" / "br-int.npaudit") and "netns" not in cmd and said.startswith("unix")
    cmd, said = bench.floor_reader(tcp, "mgmt")
    assert cmd[-1] == str(tmp_path / "ovs" / "br-int.mgmt") and "netns" not in cmd and ".mgmt" in said


def test_the_agents_transport_is_read_from_its_log(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("x\nOpenFlow connected to tcp:127.0.0.1:6653 (dpid 0000000000000001, connect #1, meters yes)\n")
    assert bench.agent_transport(log) == "tcp"
    log.write_text(log.read_text() + f"OpenFlow connected to {tmp_path}/ovs/br-int.npaudit (dpid 1, connect #2)\n")
    assert bench.agent_transport(log) == "unix"  # the last connection
    log.write_text("nothing yet\n")
    with pytest.raises(RuntimeError):  # a log without a connection must not pass for one
        bench.agent_transport(log)


def test_the_floor_connects_over_tcp_and_unix(tmp_path: Path) -> None:
    import socket

    for family, address, target in ((socket.AF_INET, ("127.0.0.1", 0), None),
                                    (socket.AF_UNIX, str(tmp_path / "s.sock"), str(tmp_path / "s.sock"))):
        with socket.socket(family, socket.SOCK_STREAM) as server:
            server.bind(address)
            server.listen(1)
            if family == socket.AF_INET:
                target = f"tcp:127.0.0.1:{server.getsockname()[1]}"
            with floor.connect(target) as sock:
                peer, _ = server.accept()
                with peer:
                    sock.sendall(b"hello")
                    assert peer.recv(5) == b"hello"
                if family == socket.AF_INET:
                    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_the_c_floor_reader_shakes_hands_answers_echoes_and_appends_each_udp_port(tmp_path: Path) -> None:
    """bench/_of_floor.c, built as --c-floor builds it, against a switch played over a unix socket: the Python
    floor's handshake, an echo request answered, each NXT_PACKET_IN2's UDP port a line (others skipped), messages
    split across reads and packed in one."""
    import socket

    exe = bench.build_c_floor(tmp_path)
    path, lines = str(tmp_path / "switch.sock"), tmp_path / "floor.lines"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    proc = bench.start_floor([str(exe), path], lines)  # connected (the listen backlog takes it) and ready
    conn, _ = server.accept()
    try:
        hello = b""
        while len(hello) < len(floor.handshake()):
            hello += conn.recv(1024)
        assert hello == floor.handshake()
        conn.sendall(bytes([6, 2, 0, 12, 0, 0, 0, 9]) + b"ping")  # OFPT_ECHO_REQUEST, xid 9
        assert conn.recv(1024) == bytes([6, 3, 0, 12, 0, 0, 0, 9]) + b"ping"
        first = message(frame("10.0.0.1", "10.0.0.2", "udp", 40123))
        stream = (first + message(frame("10.0.0.1", "10.0.0.2", "tcp", 443))
                  + message(frame("10.0.0.1", "10.0.0.2", "udp", 2000)) + message(frame("10.0.0.1", "10.0.0.2", "udp", 7)))
        conn.sendall(stream[:21])  # a message cut across reads
        time.sleep(0.05)
        conn.sendall(stream[21:])
        deadline = time.monotonic() + 5
        while lines.read_text().count("\n") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert lines.read_text() == "40123\n2000\n7\n"
    finally:
        conn.close()
        server.close()
        proc.wait(10)  # the stream's end ends it
    assert proc.returncode == 0


def test_the_c_floor_takes_the_python_floors_place_in_its_command_line(tmp_path: Path) -> None:
    import sys

    cmd, _ = bench.floor_reader(_config(tmp_path), "agent")
    assert bench.c_floor_command(cmd, tmp_path / "of_floor") == ["ip", "netns", "exec", "npe-abc",
                                                                  str(tmp_path / "of_floor"), "tcp:127.0.0.1:6653"]
    cmd, _ = bench.floor_reader(_config(tmp_path), "mgmt")
    assert sys.executable not in bench.c_floor_command(cmd, tmp_path / "x")
    assert bench.c_floor_command(cmd, tmp_path / "x") == [str(tmp_path / "x"), str(tmp_path / "ovs" / "br-int.mgmt")]


def _phase(ms: list[float], reads: int | None = None) -> dict:
    got = {"sent": len(ms) + 1, "readable": len(ms), "sent_to_readable": bench.percentiles(ms), "_ms": list(ms),
           "wake_timeline": {"episodes": len(ms)}}
    return got if reads is None else {**got, "reads": reads, "lone_reads": reads - 1}


def test_rounds_pool_their_latencies_and_sum_their_counts() -> None:
    """--rounds: the agent's (and the floor's) phases of every round as one phase: the samples pooled, the counts
    summed; a round's own wake trace stays in the round. One round is that round's phase as it was."""
    one = _phase([1.0, 2.0, 3.0], reads=4)
    got = bench.pooled([one])
    assert got == {k: v for k, v in one.items() if k != "_ms"} and "_ms" in one
    got = bench.pooled([_phase([1.0, 2.0, 3.0], reads=4), _phase([10.0, 20.0], reads=3)])
    assert got["sent"] == 7 and got["readable"] == 5 and got["reads"] == 7 and got["lone_reads"] == 5
    assert got["sent_to_readable"] == bench.percentiles([1.0, 2.0, 3.0, 10.0, 20.0])
    assert "wake_timeline" not in got and "_ms" not in got
    assert "reads" not in bench.pooled([_phase([1.0]), _phase([2.0])])
    steady = [{**_phase([9.0, 1.0]), "_steady_ms": [1.0]}, {**_phase([8.0, 3.0]), "_steady_ms": [3.0]}]
    got = bench.pooled(steady)  # each phase's first packets (the encoders learning) left out of the steady figure
    assert got["sent_to_readable_steady"] == bench.percentiles([1.0, 3.0]) and "_steady_ms" not in got
    assert "_steady_ms" not in bench.pooled(steady[:1])
