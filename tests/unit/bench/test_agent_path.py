"""bench/agent_path.py --stages: the probes meet a lone packet-in's path where the bench says, in order, and the
path's C calls alone still make the record."""

from __future__ import annotations

from pathlib import Path

from tests.support.bench_modules import load_bench

bench = load_bench("agent_path")
ROOT = Path(__file__).resolve().parents[3]


def test_the_stages_of_a_lone_packet_in_come_in_the_paths_order_and_every_record_is_written() -> None:
    got = bench.measure(ROOT, 12, 1, idle=0.001, stages=True)
    assert got["records"] == 12
    stages = list(got["stages_us"])
    # The lone path: the record made from the message's bytes and written before the decode (Demux.early, once the
    # first reads left the C encoder its texts), then Demux.lone and the read's batch (its bookkeeping) after it
    order = ["write_inline>", "seal_and_write>", "os_write>", "<os_write", "<seal_and_write", "<write_inline", "lone>",
             "begin_batch>", "<begin_batch", "end_batch>", "release>", "<release", "<end_batch", "<lone", "read_end"]
    assert stages == order, stages  # each probe fired on every read, in this order
    times = [got["stages_us"][s] for s in order]
    assert times == sorted(times) and times[0] > 0
    calls = got["c_calls_us"]
    steps = ["decode", "add_run", "encode_run", "seal_run", "write", "all"]
    assert sorted(calls) == sorted(steps + [f"one_call_{s}" for s in steps])  # Python-sequenced, and from one C call
    for prefix in ("", "one_call_"):
        assert calls[prefix + "all"] >= max(calls[prefix + s] for s in steps[:-1]) > 0
