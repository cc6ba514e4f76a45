#!/usr/bin/env python3
"""The agent's packet-in -> record path in process, OVS out of the way: CPU µs per packet-in. Prints JSON.

The agent's own pieces, wired as the agent wires them: PacketInReader (learned-layout decode) ->
Demux (admission, inline hand-off) -> PolicyPacketIns (with a trace registry and an idle offload,
as a default agent has; a read's plain logged packet-ins handed on as runs, handle_run) -> AuditPipeline
(1 s windows; take_run) -> AuditWriter (inline writes, a real file),
the records enriched through the engine's address table (both ends are Pods) and a logged
securityops Drop. The messages are the agent's own UDP Drop packet-ins as OVS 3.1 sent them
(tests/unit/data/agent_udp_drop_packet_in2_stream.bin, 240 bytes), each given a new destination
port: every packet-in a new audit key and a "first" record, as in bench/agent_cpu.py's flood.
They are handed to the reader `--per-read` at a time (1: a packet-in a wake-up; 22: what a paced read
brought at 1k/s on the real path with 20 ms pauses, ~86 with 100 ms, ~150 with today's 200 ms; 256: what a paced
read aims for over TCP; 511: the most handled inline). With --idle-ms the path
sleeps after each read as the agent does between wake-ups: on this VM a path that has slept runs
slower, the more so the longer it slept (likely its caches lost while the vCPU was halted).

With --base DIR (another checkout of this tree), each round runs the same measurement in a child
process on DIR's code and then on this one, alternating the order per round; the JSON gives the
minimum per side (other work on the machine only ever makes a run slower). Nothing here times
wake-ups, syscalls of the socket or the window timer: bench/agent_cpu.py measures the real path.
With --front only the reader and the demux run (decoding, the sort by category, admission and its fair-share
keys), the policy handler taking each read's packet-ins and doing nothing with them.

--stages (one child, this checkout, a packet-in a read, --idle-ms between reads): where a lone packet-in's time
goes, in wall µs from the read's start (perf_counter_ns), median over the reads (the first 5 left out): when the
record made from the message's bytes (the early path, once the first reads left the C encoder its texts) is written
inline, sealed and written (os_write: the file write itself), begin and end; then the demux's lone (the packet-in
decoded), the pipeline's begin_batch and end_batch, the writer's release, and the read's end. Each stage
is timed by a wrapper around the agent's own method, which costs a little itself. Then `c_calls`: after the same
sleep, only the path's calls into C, one after the other on a fresh packet-in, each timed: the learned-layout
decode, the aggregator's add_run, the encoder's encode_run, the sealer's seal_run and the line's write(2). What the
lone path would still pay, cold, if nothing but those calls ran between the read and the write. Every other
packet-in takes the same calls from one C function instead (bench/_c_chain.c, built with gcc at run time:
`one_call_*`): no Python bytecode between them, what the pieces themselves cost a lone path written in C.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
C_CALLS = 300  # --stages: packet-ins through the C calls alone (every other one from one C function)


def measure(root: Path, n: int, per_read: int, compare: bool = False, idle: float = 0.0, front: bool = False,
            keep: Path | None = None, fair: bool = False, stages: bool = False) -> dict:
    """One run on the code of the checkout at `root` (first on sys.path). With `compare`: a fixed clock and
    fixed event ids, destination ports that repeat (aggregate records too), and the files' digest. With `keep`
    (a directory), the audit files written are moved there (bench/gzip_codec.py compresses them). With `fair`, the
    agent's default fair shares stay on (one key: within the opened category it always borrows)."""
    import asyncio
    import importlib
    import tempfile
    import time

    for package in ("packetin", "auditlog", "policy_agent", "meters"):  # imported from `root`, or no A/B
        where = Path(importlib.import_module(package).__file__ or "").resolve()
        if not where.is_relative_to(root.resolve()):
            raise RuntimeError(f"{package} was imported from {where}, not from the checkout measured ({root})")

    try:  # the agent's aggregator: in C where built (a base checkout may have only the Python class)
        from auditlog.record_fast import aggregator
    except ImportError:
        from auditlog.aggregate import Aggregator as aggregator  # type: ignore[assignment]
    from auditlog.packet import decode_frame
    from auditlog.pipeline import AuditPipeline
    from auditlog.record import EventIds, RecordContext
    from auditlog.writer import AuditWriter
    from packetin import wire
    from packetin.demux import INLINE_MAX, Demux
    from packetin.gctune import settle_heap
    from packetin.model import Category
    from packetin.reader import PacketInReader
    from policy_agent.audit_trail import _LateDirectory
    from policy_agent.config.loader import PacketInConfig
    from policy_agent.config.offload import OffloadConfig
    from policy_agent.limits import admission
    from policy_agent.limits.offload_cache import DropOffload
    from policy_agent.policy.model import Action, Direction
    from policy_agent.policy.rules import RuleInfo, RuleRegistry
    from policy_agent.traceflow.tags import TagRegistry

    raw = (root / "tests/unit/data/agent_udp_drop_packet_in2_stream.bin").read_bytes()
    template = wire.Framer().feed(raw)[0]
    sample = wire.decode_packet_in2(template, 0.0)
    at = bytes(template).find(sample.packet) + 36  # the UDP destination port in the message
    msg = bytearray(template)
    msgs = []
    for i in range(n + (C_CALLS if stages else 0)):  # with stages, the C calls' own: ports the path has not had
        port = 1024 + (i * 7919) % 2500 if compare else 1024 + i % 64000
        msg[at:at + 2] = port.to_bytes(2, "big")
        msgs.append(bytes(msg))
    flow = decode_frame(sample.packet)

    class Engine:  # the engine's Pod lookups: PolicyEngine.by_ip / ip_table
        table = {flow.src_ip: ("frontend", "client-5d8f7c9b4-x2k8q"), flow.dst_ip: ("backend", "postgres-0")}

        def by_ip(self, ip: str) -> tuple[str, str] | None:
            return self.table.get(ip)

        def ip_table(self) -> dict:
            return self.table

    engine = Engine()
    rules = RuleRegistry()
    rules.replace({sample.rule_id: RuleInfo(
        rule_id=sample.rule_id, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="bench",
        rule_name="drop-udp", tier="securityops", priority=1.0, action=Action.DROP, direction=Direction.INGRESS,
        log_label="bench", logged=True)})
    ids = EventIds()
    if compare:
        ids._prefix = "0" * 16  # the same ids on both sides
    clock = [1.7e9]

    def wall() -> float:  # real time, or in a comparison a clock the loop steps
        return clock[0] if compare else time.time()

    ctx = RecordContext(node="bench", cluster="bench", rules=rules, pods=_LateDirectory(lambda: engine),
                        new_event_id=ids)
    tags = TagRegistry()

    def suppress(pin: object) -> bool:  # TraceflowService.suppress
        return tags.match(pin.packet) is not None  # type: ignore[attr-defined]

    async def run() -> dict:
        from policy_agent.policy_packetins import PolicyPacketIns

        work = Path(tempfile.mkdtemp(prefix="npaudit-agent-path-"))
        writer = AuditWriter(work / "audit.jsonl", backup_count=50, clock=wall)
        writer.start()
        pipeline = AuditPipeline(ctx, writer, aggregator(window=1.0), wall_clock=wall)
        dispatcher = PolicyPacketIns(lambda m: 0, audit=pipeline, offload=DropOffload(OffloadConfig(), pipeline,
                                                                                       ovs_netns=""),
                                     suppress=suppress, may_suppress=tags.any_known)
        demux = Demux(inline_max=INLINE_MAX)
        class Taken:  # --front: the read's packet-ins are taken, nothing done with them
            def __call__(self, pin: object) -> None:
                pass

            def handle_run(self, items: list, start: int, end: int, failed: object) -> tuple[int, int]:
                return end, 0
        admission.subscribe(demux, {Category.POLICY: Taken() if front else dispatcher}, PacketInConfig(),
                            direction=lambda r: "ingress", now=time.monotonic())
        for sub in demux._subs.values():  # admission is policy, not capacity: as bench/agent_cpu.py opens it
            sub.bucket = type(sub.bucket)(1e12, 1e12, time.monotonic())
            if sub.fair is not None:
                sub.fair = type(sub.fair)(1e12, 1e12, key_rate=sub.fair.key_rate, key_burst=sub.fair.key_burst,
                                          max_keys=sub.fair.max_keys, now=time.monotonic())
            if not fair:
                sub.fair = None
        demux.start()
        marks: list[tuple[str, int]] = []
        if stages:
            _probe_stages(marks, demux, pipeline, writer)
        lone_sink = getattr(demux, "lone", None)  # a read of one packet-in, its record first (a base tree: none)
        # ... made from its bytes before the decode (a base tree: none; before the quiet wait: the demux's early alone)
        early_sink = demux if hasattr(demux, "early_arm") else getattr(demux, "early", None)
        reader = PacketInReader(demux.dispatch, lambda m: None, wall_clock=wall,
                                **({"lone_sink": lone_sink} if lone_sink is not None else {}),
                                **({"early_sink": early_sink} if early_sink is not None else {}))
        lone = getattr(reader, "lone", lambda raw: False)
        settle_heap()
        reads: list[tuple[int, int, list[tuple[str, int]]]] = []
        c0 = time.process_time()
        for i in range(0, n, per_read):
            clock[0] += 0.0002 * per_read  # a port comes back within its window
            marks.clear()
            t0 = time.perf_counter_ns()
            if per_read != 1 or not lone(msgs[i]):  # as the agent's OpenFlowStream.data_received
                reader.on_messages(msgs[i:i + per_read])
            if stages:
                reads.append((t0, time.perf_counter_ns(), list(marks)))
            if idle:
                time.sleep(idle)  # the path waits for the next read, as the agent does between wake-ups
        cpu = time.process_time() - c0
        if stages:
            calls = _c_calls(reader, pipeline, writer, msgs[n:], work, idle)
        writer.flush_wait(60)
        await demux.stop()
        await pipeline.close()
        writer.close()
        records = sum(1 for f in work.glob("audit.jsonl*")
                      for line in (gzip.open(f, "rt") if f.suffix == ".gz" else f.open()) if line.strip())
        files = sorted(work.glob("audit.jsonl*"))
        digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
        if keep is not None:
            for f in files:
                f.rename(keep / f.name)
        subprocess.run(["rm", "-rf", str(work)], check=False)
        if stages:
            return {"stages_us": _stage_medians(reads), "c_calls_us": calls, "records": records}
        if compare:
            return {"files": [f.name for f in files], "sha256": digest, "records": records,
                    "pipeline": pipeline.stats,
                    # how many writes took them depends on the writer thread's timing: not compared
                    "writer": {k: v for k, v in writer.stats.items() if k != "batches"},
                    "delivered": demux.stats()[Category.POLICY]["delivered"]}
        return {"us_per_packet_in": round(cpu / n * 1e6, 2), "packet_ins": pipeline.stats["packet_ins"],
                "records": records, "delivered": demux.stats()[Category.POLICY]["delivered"]}

    return asyncio.run(run())


def _probe_stages(marks: list[tuple[str, int]], demux: Any, pipeline: Any, writer: Any) -> None:
    """Wrap the lone path's steps (instance attributes, as the agent's objects call them) to note when each begins
    ("name>") and ends ("<name") in `marks`."""
    import time

    clock = time.perf_counter_ns
    handler = writer._handler
    for obj, name, label in ((demux, "lone", "lone"), (demux, "dispatch", "dispatch"),
                             (pipeline, "begin_batch", "begin_batch"), (pipeline, "_emit", "emit"),
                             (pipeline, "end_batch", "end_batch"), (writer, "release", "release"),
                             (writer, "_write_inline", "write_inline"), (writer, "_emit_records", "seal_and_write"),
                             (handler, "do_write", "os_write")):
        if hasattr(obj, name):  # a base tree may not have every step (the lone path)
            setattr(obj, name, _timed(getattr(obj, name), label, marks, clock))


def _timed(f: Any, label: str, marks: list[tuple[str, int]], clock: Any) -> Any:
    def timed(*args: Any) -> Any:
        marks.append((label + ">", clock()))
        try:
            return f(*args)
        finally:
            marks.append(("<" + label, clock()))
    return timed


def _stage_medians(reads: list[tuple[int, int, list[tuple[str, int]]]]) -> dict[str, float]:
    """Median µs from each read's start to each mark, in the order the marks first came; the read's end last."""
    import statistics

    at: dict[str, list[float]] = {}
    for start, end, marks in reads[5:]:
        for label, t in marks:
            at.setdefault(label, []).append((t - start) / 1000)
        at.setdefault("read_end", []).append((end - start) / 1000)
    return {label: round(statistics.median(v), 1) for label, v in at.items()}


def _c_calls(reader: Any, pipeline: Any, writer: Any, msgs: list[bytes], work: Path, idle: float) -> dict[str, float]:
    """After each sleep of `idle`, a fresh packet-in through the path's C calls only, each timed (median µs)."""
    import statistics
    import time

    from auditlog.chain import CHAIN_KEY, GENESIS
    from auditlog.pipeline import _RUN_LAYOUT

    clock = time.perf_counter_ns
    seal, decode, add_run = writer._seal_run, reader._decode, pipeline._add_run
    encode_run = getattr(pipeline.encoder, "encode_run", None)
    if seal is None or add_run is None or encode_run is None:
        return {}
    one_call = _c_chain(work).chain
    fd = os.open(work / "c_calls.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    seq, chain = 0, GENESIS
    took: dict[str, list[float]] = {}
    try:
        for i, msg in enumerate(msgs):
            time.sleep(idle)
            if i % 2:  # the same calls from one C function, nothing between them (bench/_c_chain.c)
                ns, (_, seq, chain) = one_call(decode, msg, time.time, add_run, pipeline._decode_frame, _RUN_LAYOUT,
                                               pipeline.rule_packet_ins, encode_run, seal, seq, chain, CHAIN_KEY, fd)
                if i >= 5:
                    for label, v in zip(_C_CALL_STEPS, ns):
                        took.setdefault("one_call_" + label, []).append(v / 1000)
                continue
            t0 = clock()
            pin = decode(msg, time.time())
            t1 = clock()
            out: list[Any] = []
            add_run([pin], 0, 1, pipeline._decode_frame, _RUN_LAYOUT, pipeline.rule_packet_ins, out)
            t2 = clock()
            records: list[Any] = []
            encode_run(out, 0, records)
            t3 = clock()
            lines: list[str] = []
            _, seq, chain = seal(records, 0, seq, chain, CHAIN_KEY, lines)
            t4 = clock()
            os.write(fd, (lines[0] + "\n").encode())
            t5 = clock()
            if i >= 5:
                for label, t in zip(_C_CALL_STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                    took.setdefault(label, []).append(t / 1000)
    finally:
        os.close(fd)
    return {label: round(statistics.median(v), 1) for label, v in took.items()}


_C_CALL_STEPS = ("decode", "add_run", "encode_run", "seal_run", "write", "all")


def _c_chain(work: Path) -> Any:
    """bench/_c_chain.c built with gcc into `work` (an extension of this interpreter) and imported."""
    import importlib.util
    import sysconfig

    so = work / ("_c_chain" + str(sysconfig.get_config_var("EXT_SUFFIX")))
    done = subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}",
                           "-o", str(so), str(Path(__file__).resolve().parent / "_c_chain.c")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"gcc could not build bench/_c_chain.c:\n{done.stderr}")
    spec = importlib.util.spec_from_file_location("_c_chain", so)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {so}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child(root: Path, n: int, per_read: int, compare: bool = False, idle_ms: float = 0.0, fair: bool = False,
          front: bool = False, stages: bool = False) -> dict:
    # This script, run on `root`'s code (a base checkout may not have it).
    out = subprocess.run([sys.executable, __file__, "--compare-one" if compare else "--one", str(root), str(n),
                          str(per_read), "--idle-ms", str(idle_ms), *(["--fair-share"] if fair else []),
                          *(["--front"] if front else []), *(["--stages"] if stages else [])],
                         cwd=root, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packet-ins", type=int, default=None,
                    help="packet-ins a run (default 20,000; with --stages, reads: 300, each followed by --idle-ms)")
    ap.add_argument("--per-read", default="1,5,64", help="packet-ins per read, comma separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--idle-ms", default="0", help="ms the path sleeps after each read, comma separated (with "
                    "--per-read: the agent's wake-ups at a given rate, e.g. 22 a read every 20 ms is 1k/s)")
    ap.add_argument("--base", default="", help="another checkout: interleaved A/B against its code")
    ap.add_argument("--compare", action="store_true",
                    help="with --base: the same stream (fixed clock and ids) through both; are the files identical")
    ap.add_argument("--fair-share", action="store_true",
                    help="keep the agent's default fair shares on (default: off, as bench/agent_cpu.py --no-fair-share)")
    ap.add_argument("--front", action="store_true",
                    help="the reader and the demux only (decoding, the sort by category, admission with its keys): "
                         "the policy handler takes each read's packet-ins and does nothing with them")
    ap.add_argument("--stages", action="store_true",
                    help="where a lone packet-in's time goes (a packet-in a read, --idle-ms between reads; this "
                         "checkout, one child)")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--compare-one", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.packet_ins is None:  # --stages sleeps after every read: 20,000 of them at 100 ms would take 34 minutes
        args.packet_ins = 300 if args.stages else 20000
    one = args.one or args.compare_one
    if one:
        root = Path(one[0])
        sys.path.insert(0, str(root))
        print(json.dumps(measure(root, int(one[1]), int(one[2]), compare=bool(args.compare_one),
                                 idle=float(args.idle_ms) / 1000, fair=args.fair_share, front=args.front,
                                 stages=args.stages)))
        return 0
    if args.stages:
        return stages(args.packet_ins, [float(x) for x in args.idle_ms.split(",")], args.fair_share)
    if args.compare:
        return compare(HERE, Path(args.base).resolve(), args.packet_ins, args.per_read)
    sides = {"this": HERE, **({"base": Path(args.base).resolve()} if args.base else {})}
    result: dict = {"benchmark": "agent_path", "packet_ins": args.packet_ins, "rounds": args.rounds,
                    "fair_share": args.fair_share, "front_only": args.front,
                    "load_average_start": os.getloadavg(), "by_per_read": {}}
    idles = [float(x) for x in args.idle_ms.split(",")]
    for per_read, idle_ms in [(int(x), i) for x in args.per_read.split(",") for i in idles]:
        from packetin.demux import INLINE_MAX  # only here: a child (--one) imports the code of the tree it measures

        if per_read > INLINE_MAX:  # a bigger read goes to the demux task, which runs after the timed loop
            ap.error(f"--per-read above {INLINE_MAX} would not be timed")
        runs: dict[str, list[dict]] = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                runs[side].append(child(sides[side], args.packet_ins, per_read, idle_ms=idle_ms, fair=args.fair_share,
                                        front=args.front))
        row = {side: {"us_per_packet_in_min": min(x["us_per_packet_in"] for x in got),
                      "us_per_packet_in_runs": [x["us_per_packet_in"] for x in got],
                      "records_every_run": sorted({x["records"] for x in got})} for side, got in runs.items()}
        if "base" in row:
            row["this_vs_base"] = round(row["this"]["us_per_packet_in_min"] / row["base"]["us_per_packet_in_min"], 3)
        result["by_per_read"][per_read if idles == [0.0] else f"{per_read} every {idle_ms:g} ms"] = row
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


def stages(n: int, idles_ms: list[float], fair: bool) -> int:
    """--stages: one child per idle time, on this checkout."""
    result: dict = {"benchmark": "agent_path_stages", "reads": n, "fair_share": fair,
                    "load_average_start": os.getloadavg(), "by_idle_ms": {}}
    for idle_ms in idles_ms:
        result["by_idle_ms"][f"{idle_ms:g}"] = child(HERE, n, 1, idle_ms=idle_ms, fair=fair, stages=True)
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result, indent=1))
    return 0


def compare(this: Path, base: Path, n: int, per_reads: str) -> int:
    """The same packet-in stream through `base`'s path and this one's: the files must be byte for byte the same,
    and every count. Prints JSON; exit status 1 when anything differs."""
    result: dict = {"benchmark": "agent_path_compare", "packet_ins": n, "by_per_read": {}}
    same = True
    for per_read in [int(x) for x in per_reads.split(",")]:
        got = {"this": child(this, n, per_read, True), "base": child(base, n, per_read, True)}
        identical = got["this"] == got["base"]
        same = same and identical
        result["by_per_read"][per_read] = {"identical": identical, "records": got["this"]["records"],
                                           "sha256": got["this"]["sha256"], **({} if identical else got)}
    result["identical"] = same
    print(json.dumps(result, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
