"""bench/agent_latency.py's parts: the floor reader's UDP port out of an NXT_PACKET_IN2 as OVS 3.1 sends it,
the watcher that stamps each appended line (real inotify on a temp file), and the percentiles."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
