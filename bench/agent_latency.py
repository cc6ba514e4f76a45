#!/usr/bin/env python3
"""Issue 22's latency through the real agent: a packet leaves a Pod, its record is readable in the file. JSON.

bench/auditlog_throughput.py --latency-only times the agent's path in a consumer process; this times the
agent itself, as a user sees it. The cluster is bench/agent_cpu.py's (tests/support/overload_scenario.py:
the agent process, its embedded OVS, x/a and y/a through CNI, a logged Drop on UDP 1024-65535 from x/a to
y/a), with the agent's default fair shares on (--no-fair-share: off). A sender in x/a sends one datagram
every 1/--rate s, each to a new destination port (each a new audit key, so each record is a "first",
written at once), and prints when it sent each. A watcher in this process
(inotify on the file, IN_MODIFY: no polling that would take CPU from the agent) reads each appended line
and notes when the line of each port became readable. Latency = readable - sent, wall clock on one machine.

The floor, in the same run, once the agent is stopped (OVS keeps its flows, fail_mode=secure): a bare
OpenFlow reader on the bridge's .mgmt socket (bench/_of_floor.py --append) that, per packet-in, finds the
UDP destination port in the frame and appends it as a line to a file, watched the same way. That is what
the sender, the kernel, OVS and any reader that writes a line cost before the agent's own work. The agent
reads over its default transport for an OVS in a namespace of its own, TCP (--transport unix: a unix socket,
punix:<rundir>/br-int.npaudit); the floor over the same transport by default (over TCP: the agent's own
controller target, which OVS keeps listening on once the agent is stopped, from the namespace OVS runs in), or
over the bridge's .mgmt unix socket (--floor-transport mgmt, what this bench did before 2026-12-05).

The agent's phase also says how many reads of the OpenFlow socket it took and how many of them its lone path took
(a read of one plain logged packet-in, its record written before the read's bookkeeping: packetin/reader.py).

The sender sends --packets per phase; the agent phase comes first (the floor needs the agent stopped), so
this is one round of each: compare them within one run only. The machine's own latency drifts by a tenth of a
millisecond from one minute to the next, as much as the agent's own part: with --rounds N the agent is started
again after each floor phase and the two alternate N times. The agent's and the floor's figures are then pooled
over the rounds, each round's are in `rounds`, and agent minus floor is the median of the rounds' own differences
(each a pair measured a minute apart).

With --c-floor, a third phase after the floor's: the same reader in C (bench/_of_floor.c, compiled with gcc at run
time), over the same transport, watched the same way: what reading and appending cost with no Python, whose
interpreter a reader pays for again after every quiet spell.

With --ovn, a last phase once the agent's cluster is gone: OVN's ovn-controller (Debian 12's OVN 23.03, unpacked
beside the tree by tests/support/ovn.py, never installed) on a private OVS of its own, with a logged Drop ACL on
UDP 1024-65535 into Pod b, the same sender in Pod a, and its ACL log lines watched the same way in ovn-controller's
log file: the competitor's latency on the same machine in the same run. It reads over the bridge's .mgmt unix
socket, as OVN does.

With --trace, each phase also says where its reader's time went, from the kernel's side (bench/_wake_trace.py: bcc
on the scheduler and syscall tracepoints of the agent's main thread, then of the floor reader): woken until
running, the event loop's own turn before it reads, the message's handling until the write, the write itself
(OVN's phase: its ovn_pinctrl thread, which reads the packet-ins and writes the ACL log lines).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _floor_target import agent_transport, floor_reader  # noqa: E402
from _latency_probe import LOW_RATE_SENDER, quantiles_ms  # noqa: E402
from _wake_trace import WakeTrace, episodes, timeline  # noqa: E402
from agent_cpu import build_info  # noqa: E402

from policy_agent.config.loader import AuditConfig, PacketInConfig  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.overload_scenario import agent_counts, new_key_flood_cluster, settled, start_flood_pods  # noqa: E402
from tests.support.ovn import OvnStack, acl_drop_port, fetch as fetch_ovn, version as ovn_version  # noqa: E402

HERE = Path(__file__).resolve().parent
IN_MODIFY = 0x2
# sent_to_readable_steady leaves out each phase's first WARM packets: there the agent's encoders learn the texts of
# a new rule, Pod pair and OVS place (the first record is the Python encoder's, the second makes the C encoder's
# template; only from the third is a lone record made from the message's bytes). A running agent pays that once per
# rule and Pod pair; this bench pays it every round, the agent started anew: 2 packets of 200, at the p99.
WARM = 3
PRIVATE = ("_ms", "_steady_ms")  # each phase's samples, for pooling: not printed


class Appends:
    """Notes when each key's line became readable in `path` (a file only ever appended to), via inotify."""

    def __init__(self, path: Path, key_of: Callable[[bytes], int | None]) -> None:
        self.seen: dict[int, float] = {}
        self._key_of = key_of
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        path.touch(exist_ok=True)
        if self._libc.inotify_add_watch(self._fd, str(path).encode(), IN_MODIFY) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self._file = open(path, "rb")
        self._file.seek(0, os.SEEK_END)
        self._pending = b""
        self._wake_r, self._wake_w = os.pipe()  # close() ends the wait through it
        self._thread = threading.Thread(target=self._run, name="appends", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._fd, self._wake_r], [], [])  # until the file is written to
            if self._wake_r in ready:
                return
            now = time.time()
            os.read(self._fd, 4096)
            self._pending += self._file.read()
            *lines, self._pending = self._pending.split(b"\n")
            for line in lines:
                key = self._key_of(line)
                if key is not None and key not in self.seen:
                    self.seen[key] = now

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self._fd, self._wake_r, self._wake_w):
            os.close(fd)
        self._file.close()


def record_port(line: bytes) -> int | None:
    """The destination port of a flood record's line (the scenario's logged Drop), else None."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if record.get("labels", {}).get("log_label") != "flood":
        return None
    port = record.get("destination", {}).get("port")
    return port if isinstance(port, int) else None


def build_c_floor(work: Path) -> Path:
    """bench/_of_floor.c compiled with gcc into `work`: the floor reader without Python (--c-floor)."""
    exe = work / "of_floor"
    done = subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(exe), str(HERE / "_of_floor.c")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"gcc could not build bench/_of_floor.c:\n{done.stderr}")
    return exe


def c_floor_command(python_floor: list[str], exe: Path) -> list[str]:
    """The Python floor's command line (floor_reader's) with the C reader in place of the Python one: the same
    namespace, the same target."""
    at = python_floor.index(sys.executable)
    return [*python_floor[:at], str(exe), *python_floor[at + 2:]]


def start_floor(cmd: list[str], lines: Path) -> subprocess.Popen[str]:
    """A floor reader appending to `lines`, once it says it is ready."""
    lines.touch()
    proc = subprocess.Popen([*cmd, str(lines)], stdout=subprocess.PIPE, text=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "ready":
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"the floor reader {cmd} did not start")
    return proc


def stop_floor(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def floor_port(line: bytes) -> int | None:
    return int(line) if line.strip().isdigit() else None


def percentiles(ms: list[float]) -> dict:
    return {"n": len(ms), **quantiles_ms(ms)} if ms else {"n": 0}


def phase(netns: str, ip: str, n: int, rate: float, watched: Path,
          key_of: Callable[[bytes], int | None], trace_tid: int | None = None) -> dict:
    """The sender's `n` datagrams and when each one's line became readable in `watched`; with `trace_tid`, that
    reader thread's wake-ups over the phase too (bench/_wake_trace.py)."""
    appends = Appends(watched, key_of)
    tracer: WakeTrace | None = None
    traced: list = []
    try:
        tracer = WakeTrace(trace_tid) if trace_tid is not None else None
        out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", LOW_RATE_SENDER, ip, str(n),
                              str(rate)], capture_output=True, text=True, check=True, timeout=n / rate * 3 + 60).stdout
        time.sleep(1.0)  # the last packet's way through
    finally:
        appends.close()
        if tracer is not None:
            traced = tracer.stop()
    sent = {int(port): float(t) for port, t in (line.split() for line in out.splitlines())}
    lat = [(appends.seen[p] - t) * 1000 for p, t in sent.items() if p in appends.seen]
    steady = [(appends.seen[p] - t) * 1000 for i, (p, t) in enumerate(sent.items()) if i >= WARM and p in appends.seen]
    return {"sent": len(sent), "readable": len(lat), "sent_to_readable": percentiles(lat),
            "sent_to_readable_steady": percentiles(steady), "_ms": lat, "_steady_ms": steady,
            **({"wake_timeline": {**timeline(episodes(traced)), "traced_thread": trace_tid,
                                  "mounted_tracefs": tracer.mounted_tracefs, "lost_events": tracer.lost}}
               if tracer is not None else {})}


def ovn_phase(root: Path, work: Path, args: argparse.Namespace) -> dict:
    """OVN's ovn-controller on the same sender and the same kind of Drop (tests/support/ovn.py), its ACL log lines
    watched in its log file; everything it started stopped again."""
    stack = OvnStack(root, work / "ovn", f"npab-ovn{os.getpid()}")
    try:
        stack.up()
        netns, ip = stack.sender()
        tid = stack.pinctrl_tid() if args.trace else None
        if args.trace and tid is None:
            raise RuntimeError("ovn-controller has no ovn_pinctrl thread to trace")
        got = phase(netns, ip, args.packets, args.rate, stack.log, acl_drop_port, trace_tid=tid)
    finally:
        stack.down()
    return {"version": ovn_version(root), "openflow_transport": "unix (the bridge's .mgmt, as OVN reads)",
            "readable": "an acl_log line in ovn-controller's log file (OVN's ACL logging as shipped, no meter)",
            "acl": "to-lport drop, --log --severity=info, on UDP 1024-65535 into Pod b", **got}


def one_round(cluster: Cluster, netns: str, ip: str, args: argparse.Namespace, work: Path, floor_cmd: list[str],
              c_exe: Path | None) -> dict:
    """The agent's phase (the agent running), then the agent stopped and the floor's phase (and the C floor's)."""
    work.mkdir(parents=True)
    before = agent_counts(cluster.metrics_port)  # type: ignore[attr-defined]
    agent = phase(netns, ip, args.packets, args.rate, cluster.dir / "audit" / "audit.jsonl", record_port,
                  trace_tid=cluster.agent.pid if args.trace and cluster.agent is not None else None)
    after = agent_counts(cluster.metrics_port)  # type: ignore[attr-defined]
    # reads of the phase, those the lone path took (record first), and of those the quiet wait's (packetin/quiet.py)
    agent["reads"], agent["lone_reads"], agent["quiet_reads"] = (
        round(after.get(k, 0.0) - before.get(k, 0.0)) for k in ("npaudit_openflow_reads_total",
                                                                 "npaudit_openflow_reads_lone_total",
                                                                 "npaudit_openflow_reads_quiet_total"))
    cluster.stop_agent()
    floor_proc: subprocess.Popen[str] | None = None
    c_floor: dict | None = None
    try:
        floor_proc = start_floor([*floor_cmd, "--append"], work / "floor.lines")
        floor = phase(netns, ip, args.packets, args.rate, work / "floor.lines", floor_port,
                      trace_tid=floor_proc.pid if args.trace else None)
        stop_floor(floor_proc)
        if c_exe is not None:
            floor_proc = start_floor(c_floor_command(floor_cmd, c_exe), work / "c_floor.lines")
            c_floor = phase(netns, ip, args.packets, args.rate, work / "c_floor.lines", floor_port,
                            trace_tid=floor_proc.pid if args.trace else None)
    finally:
        stop_floor(floor_proc)
    a50, f50 = agent["sent_to_readable"].get("p50_ms"), floor["sent_to_readable"].get("p50_ms")
    return {"agent": agent, "floor": floor, "c_floor": c_floor,
            "agent_minus_floor_p50_ms": round(a50 - f50, 3) if a50 is not None and f50 is not None else None}


def pooled(phases: list[dict]) -> dict:
    """One phase's figures over rounds: counts summed, latencies pooled (each round's own wake trace stays in it)."""
    if len(phases) == 1:
        return {k: v for k, v in phases[0].items() if k not in PRIVATE}
    lat = [ms for p in phases for ms in p["_ms"]]
    out = {"sent": sum(p["sent"] for p in phases), "readable": sum(p["readable"] for p in phases),
           "sent_to_readable": percentiles(lat)}
    if all("_steady_ms" in p for p in phases):
        out["sent_to_readable_steady"] = percentiles([ms for p in phases for ms in p["_steady_ms"]])
    for k in ("reads", "lone_reads", "quiet_reads"):
        if k in phases[0]:
            out[k] = sum(p[k] for p in phases)
    return out


def answering(metrics_port: int, timeout: float = 60.0) -> None:
    """Until a restarted agent answers on its metrics port."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            agent_counts(metrics_port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packets", type=int, default=600, help="per phase")
    ap.add_argument("--rate", type=float, default=17.0, help="packets/s (issue 22: 17)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the agent's phase and the floor's, alternated, the agent started again for each "
                         "(agent minus floor: the median of the rounds' own)")
    ap.add_argument("--no-fair-share", action="store_true",
                    help="fair shares off (default: on, the agent's default)")
    ap.add_argument("--transport", choices=("auto", "tcp", "unix"), default="auto",
                    help="the agent's openflow.transport (auto, its default here: tcp)")
    ap.add_argument("--floor-transport", choices=("agent", "mgmt"), default="agent",
                    help="the floor reads over the agent's transport (default) or the bridge's .mgmt unix socket")
    ap.add_argument("--c-floor", action="store_true",
                    help="a third phase: the same floor reader in C (bench/_of_floor.c, built with gcc): what reading "
                         "and appending cost without Python")
    ap.add_argument("--trace", action="store_true",
                    help="trace the agent's main thread and the floor reader in their phases (bcc, tracefs): where "
                         "each packet-in's time goes, from wake-up to the line written (bench/_wake_trace.py)")
    ap.add_argument("--ovn", action="store_true",
                    help="a last phase: OVN 23.03's ovn-controller logging the same Drop on a private OVS "
                         "(tests/support/ovn.py; its packages are downloaded and unpacked beside the tree once)")
    args = ap.parse_args()
    ovn_root = fetch_ovn() if args.ovn else None  # before anything starts: a download that fails stops nothing
    work = Path(tempfile.mkdtemp(prefix="npab-agentlat-", dir="/tmp"))
    marks = AuditConfig().overload
    cluster = new_key_flood_cluster(meter_rate=1000, overload=marks.enabled,
                                    queue_size=PacketInConfig().policy.queue_size,
                                    marks=(marks.high_mark, marks.peers_mark, marks.low_mark),
                                    fair_share=not args.no_fair_share)
    if args.transport != "auto":
        cluster.config.write_text(cluster.config.read_text() + f"openflow:\n  transport: {args.transport}\n")
    load0 = os.getloadavg()
    rounds: list[dict] = []
    measured = False
    try:
        cluster.start(timeout=120)
        netns, ip = start_flood_pods(cluster)
        settled(cluster)
        encoder = build_info(cluster.metrics_port)["record_encoder"]  # type: ignore[attr-defined]
        transport = agent_transport(cluster.dir / "agent.log")
        floor_cmd, floor_transport = floor_reader(cluster.config, args.floor_transport)
        c_exe = build_c_floor(work) if args.c_floor else None
        for r in range(args.rounds):
            if r:  # the agent again, as it was: its OVS kept running, its Pods and policy in its state
                cluster.start(timeout=120)
                answering(cluster.metrics_port)  # type: ignore[attr-defined]
                settled(cluster)
            rounds.append(one_round(cluster, netns, ip, args, work / f"r{r}", floor_cmd, c_exe))
        measured = True
    finally:
        cluster.close()
        if not measured:
            subprocess.run(["rm", "-rf", str(work)])
    try:  # the agent's cluster is gone: OVN's phase has the machine to itself as the others had
        ovn = ovn_phase(ovn_root, work, args) if ovn_root is not None else None
    finally:
        subprocess.run(["rm", "-rf", str(work)])
    agent, floor = pooled([rd["agent"] for rd in rounds]), pooled([rd["floor"] for rd in rounds])
    c_floor = pooled([rd["c_floor"] for rd in rounds]) if rounds[0]["c_floor"] is not None else None
    diffs = [d for rd in rounds if (d := rd["agent_minus_floor_p50_ms"]) is not None]
    for rd in rounds:
        for k in ("agent", "floor", "c_floor"):
            if rd.get(k) is not None:
                for private in PRIVATE:
                    rd[k].pop(private, None)
    a50, f50 = agent["sent_to_readable"].get("p50_ms"), floor["sent_to_readable"].get("p50_ms")
    if ovn is not None:
        for private in PRIVATE:
            ovn.pop(private, None)
    print(json.dumps({
        "benchmark": "agent_latency",
        "settings": {"packets_per_phase": args.packets, "rate_per_s": args.rate,
                     "sender": "Python in x/a, one UDP datagram per 1/rate s, each to a new port (a new audit key)",
                     "readable": "inotify IN_MODIFY on the file, the line read and parsed, stamped on wake-up",
                     "record_encoder": encoder,
                     "fair_share": not args.no_fair_share,
                     "agent_openflow_transport": transport,
                     "floor_openflow_transport": floor_transport,
                     "load_average_start": [round(x, 2) for x in load0],
                     "load_average_end": [round(x, 2) for x in os.getloadavg()]},
        "agent": agent,
        "floor_bare_reader_appending": floor,
        "agent_minus_floor_p50_ms": round(statistics.median(diffs), 3) if diffs else None,
        **({"rounds": rounds, "agent_minus_floor_p50_ms_rounds": diffs,
            "agent_minus_floor_p50_ms_pooled": round(a50 - f50, 3) if a50 is not None and f50 is not None else None}
           if len(rounds) > 1 else {}),
        **({"floor_c_reader_appending": c_floor,
            "agent_minus_c_floor_p50_ms": round(a50 - c50, 3) if a50 is not None and
            (c50 := c_floor["sent_to_readable"].get("p50_ms")) is not None else None} if c_floor is not None else {}),
        **({"ovn_controller": ovn,
            "agent_minus_ovn_p50_ms": round(a50 - o50, 3) if a50 is not None and
            (o50 := ovn["sent_to_readable"].get("p50_ms")) is not None else None} if ovn is not None else {}),
        "target": {"p50_ms": 0.6, "p99_ms": 1.0},
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

