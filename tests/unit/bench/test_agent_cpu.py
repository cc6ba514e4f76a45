"""bench/agent_cpu.py's pure parts: CPU and context switches from /proc stat and status texts, and the floor
reader's (bench/_of_floor.py) message counting on OpenFlow bytes as OVS 3.1 sends them, cut anywhere."""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

import pytest

from tests.support.bench_modules import load_bench
from tests.support.packet_ins import frame, message

ROOT = Path(__file__).resolve().parents[3]


bench = load_bench("agent_cpu")
floor = load_bench("_of_floor")

# A task's stat line whose comm holds a space and a ')': utime 250, stime 40 (fields 14 and 15).
STAT = ("4242 (npaudit ag) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 40 0 0 20 0 7 0 4880 3133440 382 "
        "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n")
STATUS = "Name:\tpython\nState:\tS (sleeping)\nvoluntary_ctxt_switches:\t1234\nnonvoluntary_ctxt_switches:\t56\n"


def test_stat_line_gives_name_user_and_sys_ticks_past_a_comm_with_parentheses() -> None:
    assert bench.parse_stat(STAT) == ("npaudit ag) x", 250, 40)


def test_status_gives_voluntary_and_involuntary_switches() -> None:
    assert bench.parse_switches(STATUS) == (1234, 56)


def test_usage_is_per_thread_differences_busiest_first_and_their_total() -> None:
    t = bench.ThreadSample
    before = {1: t("main", 100, 50, 1_500_000_000, 10, 2), 2: t("writer", 5, 5, 100_000_000, 3, 0),
              3: t("gone", 1, 1, 1, 1, 1)}
    after = {1: t("main", 130, 60, 1_900_000_000, 40, 7), 2: t("writer", 10, 5, 150_000_000, 53, 0),
             4: t("born", 2, 1, 30_000_000, 4, 1), 5: t("idle", 0, 0, 0, 0, 0)}
    # The process's CPU time grew by 0.55 s: the live threads' 0.48 and 0.07 of threads that ended in between.
    got = bench.usage((before, 10_000_000_000), (after, 10_550_000_000), hz=100)
    assert [(x["tid"], x["user_s"], x["sys_s"], x["run_s"], x["voluntary_switches"], x["involuntary_switches"])
            for x in got["threads"]] == [(1, 0.3, 0.1, 0.4, 30, 5), (2, 0.05, 0.0, 0.05, 50, 0),
                                         (4, 0.02, 0.01, 0.03, 4, 1)]
    assert got["total"] == {"user_s": 0.44, "sys_s": 0.11, "run_s": 0.55, "voluntary_switches": 84,
                            "involuntary_switches": 6, "ended_threads_s": 0.07}
    assert got["threads_gone"] == 1


def test_no_ended_thread_cpu_when_the_live_threads_account_for_the_process() -> None:
    t = bench.ThreadSample
    got = bench.usage(({1: t("main", 10, 10, 0, 0, 0)}, 0), ({1: t("main", 20, 12, 120_000_000, 0, 0)}, 120_000_000),
                      hz=100)
    assert got["total"]["ended_threads_s"] == 0.0 and got["total"]["run_s"] == 0.12


def test_ticks_rounded_apart_make_no_ended_thread_cpu() -> None:
    """The main thread's ticks say 0.01 s, the process's would have said 0.03: only the ns counts are compared."""
    t = bench.ThreadSample
    got = bench.usage(({1: t("main", 0, 0, 0, 0, 0)}, 5_000_000),
                      ({1: t("main", 1, 0, 24_000_000, 0, 0)}, 29_000_000), hz=100)
    assert got["total"]["ended_threads_s"] == 0.0 and got["total"]["run_s"] == 0.024


def test_a_real_thread_sample_reads_this_process() -> None:
    import os

    threads, cpu_ns = bench.sample_threads(os.getpid())
    assert os.getpid() in threads and threads[os.getpid()].run_ns > 0
    assert cpu_ns >= sum(x.run_ns for x in threads.values())  # read after the threads: theirs and more


def test_the_process_cpu_clock_counts_a_thread_that_ended() -> None:
    import os
    import threading

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    before = bench.sample_threads(os.getpid())
    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    got = bench.usage(before, bench.sample_threads(os.getpid()))
    assert got["total"]["ended_threads_s"] >= 0.04, got["total"]  # its 50 ms spin, give or take its start and end


def _stream() -> tuple[bytes, int, int, list[bytes]]:
    """Packet-ins (NXT_PACKET_IN2 as OVS 3.1 sends them, and one OFPT_PACKET_IN), a barrier reply,
    an echo request, and another experimenter message: (bytes, packet-ins, others, echo replies owed)."""
    pins = [message(frame("10.246.0.2", "10.246.0.3", "udp", 1024 + i), ct_tp_dst=1024 + i, xid=i) for i in range(5)]
    of_packet_in = struct.pack("!BBHIIHBBQ", 6, 10, 24, 9, 0xFFFFFFFF, 64, 1, 0, 7)
    barrier_reply = struct.pack("!BBHI", 6, 21, 8, 77)
    echo = struct.pack("!BBHI", 6, 2, 12, 5) + b"ping"
    other_nx = struct.pack("!BBHIII", 6, 4, 16, 8, 0x2320, 31)  # an NX message that is not a packet-in
    data = b"".join(pins[:2]) + barrier_reply + pins[2] + echo + of_packet_in + other_nx + b"".join(pins[3:])
    return data, 6, 3, [struct.pack("!BBHI", 6, 3, 12, 5) + b"ping"]


def test_floor_counts_packet_ins_and_owes_an_echo_reply() -> None:
    data, packet_ins, others, replies = _stream()
    assert floor.scan(data) == (packet_ins, others, replies, len(data))


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_floor_counts_the_same_whatever_the_reads_cut(chunk: int) -> None:
    data, packet_ins, others, _ = _stream()
    pending, counted, other = bytearray(), 0, 0
    for i in range(0, len(data), chunk):
        pending += data[i:i + chunk]
        n, o, _, used = floor.scan(pending)
        counted, other = counted + n, other + o
        del pending[:used]
    assert (counted, other, bytes(pending)) == (packet_ins, others, b"")


# Three NXT_PACKET_IN2 recorded from a real OVS 3.1 (the decoder's tests read the same file).
RECORDED = (ROOT / "tests" / "unit" / "data" / "ovs31_packet_in2_stream.bin").read_bytes()


@pytest.mark.parametrize("chunk", [1, 13, 4096])
def test_floor_counts_packet_ins_recorded_from_ovs_between_other_messages(chunk: int) -> None:
    built, packet_ins, others, _ = _stream()
    data = RECORDED + built + RECORDED
    pending, counted, other = bytearray(), 0, 0
    for i in range(0, len(data), chunk):
        pending += data[i:i + chunk]
        n, o, _, used = floor.scan(pending)
        counted, other = counted + n, other + o
        del pending[:used]
    assert (counted, other, bytes(pending)) == (3 + packet_ins + 3, others, b"")


def test_floor_leaves_a_cut_message_for_the_next_read() -> None:
    one = message(frame("10.246.0.2", "10.246.0.3", "udp", 2000))
    assert floor.scan(one + one[:20]) == (1, 0, [], len(one))
    assert floor.scan(one[:7]) == (0, 0, [], 0)


def test_floor_refuses_a_length_below_the_header() -> None:
    with pytest.raises(ValueError):
        floor.scan(struct.pack("!BBHI", 6, 10, 4, 0))


def test_floor_handshake_is_hello_set_config_and_the_packet_in2_format() -> None:
    data = floor.handshake()
    assert floor.scan(data) == (0, 3, [], len(data))
    assert data[:2] == b"\x06\x00" and data[8:10] == b"\x06\x09" and data[16:20] == b"\x00\x00\xff\xff"
    assert struct.unpack("!III", data[28:40]) == (0x2320, 16, 2)


def test_profile_summary_shares_self_and_inclusive_per_function_lines_merged() -> None:
    raw = ("thread (1): Main;run (loop.py:10);submit (writer.py:5);notify (threading.py:370) 6\n"
           "thread (1): Main;run (loop.py:10);submit (writer.py:7) 2\n"
           "thread (1): Main;run (loop.py:12);run (loop.py:10);decode (wire.py:40) 2\n"
           "not a stack line\n")
    got = bench.profile_summary(raw, top=3)
    assert got["samples"] == 10
    assert got["self"] == [["notify (threading.py)", 0.6], ["decode (wire.py)", 0.2], ["submit (writer.py)", 0.2]]
    # A function twice in one stack (recursion) counts once for that stack.
    assert got["inclusive"][:2] == [["run (loop.py)", 1.0], ["thread (1): Main", 1.0]]
    assert bench.profile_summary("") == {"samples": 0, "self": [], "inclusive": []}


def test_the_wake_penalty_gives_a_figure_per_sleep_and_the_ratio() -> None:
    got = bench.wake_penalty(gaps_ms=(0, 20), seconds=0.05)
    assert set(got["us_per_unit_after_a_sleep_of_ms"]) == {"0", "20"}
    assert all(v > 0 for v in got["us_per_unit_after_a_sleep_of_ms"].values())
    assert got["after_20_ms_vs_back_to_back"] > 0


def test_the_floor_readers_counts_are_exact_after_every_chunk_asked_at_once_and_never_wait(tmp_path: Path) -> None:
    """Counts asked right after each of many chunks (the moment the reader goes back to its blocking recv(2)).
    Asked by SIGUSR1, a signal that landed just before that recv was only handled once more bytes came, and the
    bench (and CI) waited for ever; read from the reader's counts file they are there once it has read them."""
    import random
    import socket
    import time

    path = tmp_path / "of.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    reader = bench.FloorReader([sys.executable, str(ROOT / "bench" / "_of_floor.py"), str(path)])
    conn, _ = server.accept()
    hello = floor.handshake()
    assert conn.recv(len(hello), socket.MSG_WAITALL) == hello
    rng = random.Random(7)
    packet_in = message(frame("10.0.0.1", "10.0.0.2", "udp", 1))
    echo = struct.pack("!BBHI", 6, 2, 8, 99)
    total = others = 0
    try:
        for _ in range(1000):
            n = rng.randint(1, 50)
            conn.sendall(packet_in * n + echo)
            total, others = total + n, others + 1
            if rng.random() < 0.5:
                time.sleep(rng.random() * 0.0002)
            deadline = time.monotonic() + 10
            while reader.counts() != (total, others):
                assert time.monotonic() < deadline, (reader.counts(), total, others)
                time.sleep(0.0005)
            # Its echo reply came back: the reader answers as it counts.
            assert conn.recv(8) == struct.pack("!BBHI", 6, 3, 8, 99)
    finally:
        reader.close()
        conn.close()
        server.close()
    assert not getattr(reader, "counts_path", Path("/nonexistent")).exists()


def test_the_floor_reader_runs_the_command_its_transport_gives_and_counts_over_it(tmp_path: Path) -> None:
    """The CPU floor is started from bench/_floor_target.py's command line (the agent's transport by default,
    the bridge's .mgmt socket with --floor-transport mgmt), and counts the packet-ins it reads there."""
    import socket
    import time

    targets = load_bench("_floor_target")
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\novs:\n  run_dir: {tmp_path / 'ovs'}\n"
                      f"audit:\n  path: {tmp_path / 'audit.jsonl'}\nopenflow:\n  transport: unix\n")
    (tmp_path / "ovs").mkdir()
    for transport, socket_name in (("agent", "br-int.npaudit"), ("mgmt", "br-int.mgmt")):
        cmd, _ = targets.floor_reader(config, transport)
        assert cmd[-1] == str(tmp_path / "ovs" / socket_name)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(cmd[-1])
        server.listen(1)
        reader = bench.FloorReader(cmd)
        conn, _ = server.accept()
        try:
            conn.sendall(message(frame("10.0.0.1", "10.0.0.2", "udp", 1)) * 3)
            deadline = time.monotonic() + 5
            while reader.counts()[0] < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert reader.counts() == (3, 0)
        finally:
            reader.close()
            conn.close()
            server.close()
