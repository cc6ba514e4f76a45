#!/usr/bin/env python3
"""The real agent's CPU per packet-in on the full-detail packet-in -> record path, at paced distinct-key
rates, against the same run's floor (a bare OpenFlow reader that only counts packet-ins). Prints JSON.

The agent: the e2e cluster (tests/support/cluster.py: the agent process, its embedded OVS, Pods
through CNI) with the overload scenario's logged Drop on UDP 1024-65535 from x/a to y/a
(tests/support/overload_scenario.py). For the run the policy_deny meter is raised (--meter-rate),
the policy category's token bucket is opened wide (admission is policy, not capacity), the debug tap
is off; fair shares (on: the flood is one key, which borrows the opened category's rate, so each packet-in
pays for its key and admission as in a default agent; --no-fair-share turns them off, as this bench ran
before 2026-12-04 08:20 UTC), queues and overload marks are the agent's defaults (overload on). All said
in the JSON.

The sender: a small C program (compiled with gcc at run time into a temp dir) in x/a's network
namespace sends UDP paced at each rate (clock_nanosleep to the next 1 ms batch), datagram n from
source socket n % keys to destination port 1024 + n % 64512: every datagram a new audit key for
64512 datagrams in a row (longer than an aggregation window at every rate up to 60k/s). The audit
key of an ingress record leaves the client's source port out (measured: with the port changed only
every `keys` datagrams, one record pair per `keys` packet-ins), so only the destination port makes
a key new; the source sockets only spread the flows.

The machine's own price of waking (machine_wake_penalty): a fixed unit of Python work costs several
times more right after a sleep than back to back on this shared VM, more the longer the sleep. At low
rates it, not the agent's code, sets most of the µs per packet-in (the floor pays it too); read the
low-rate figures beside it.

Per rate, over the send plus a tail (--tail, the aggregation window closing and its records being
written): the agent's CPU per thread (user and sys from /proc/<pid>/task/*/stat, run time from
schedstat), voluntary and involuntary context switches; packet-ins OVS emitted (controller flows'
n_packets minus meter band drops), records written, coarsened records, packet-ins in records and
their fraction of the emitted, the fraction of them at full detail (not in coarsened records);
µs of agent CPU per emitted packet-in (and with the idle agent's CPU over the same time taken off).
Where the agent enters overload (coarsened records: ports dropped from the key) the µs figure is
no longer the full-detail path's: read it with full_detail_fraction beside it.

--syslog tcp: the agent forwards every record as its default forwarder does (a child process, TCP) to a
receiver on loopback that only reads (a process of the bench's own, as a SIEM off the node costs this node
nothing); each phase then also reports the forwarder process's CPU, counted until it has delivered the
phase's last record, per emitted packet-in and added to the agent's: what a node that ships to a SIEM pays.

The floor: the agent is stopped (SIGTERM; fail_mode=secure keeps the flows, the embedded OVS keeps
running) and bench/_of_floor.py reads at the same rates over the agent's own transport (over TCP, the
agent's controller target, which OVS keeps listening on, from OVS's namespace: bench/_floor_target.py;
--floor-transport mgmt: the bridge's .mgmt socket, as this bench read before 2026-12-05 05:15 UTC; the JSON
names both transports). If no packet-in reaches it with the agent gone, the agent is started again and the
floor reader runs beside it, the two then both controllers of the bridge
(both reported, nothing subtracted). The machine is 2 cores shared with other work: the
figures are comparable within one run only.

--ovn: last, once the agent's cluster is gone, the competitor at the same rates: OVN 23.03's ovn-controller
(Debian's packages unpacked beside the tree by tests/support/ovn.py, never installed) on a private OVS of its
own with a logged Drop ACL on the same UDP ports into Pod b, the same C sender in Pod a; per rate its CPU per
thread, the packet-ins OVS emitted for the ACL's log (its log flows' n_packets), the ACL lines it wrote to its
log file, OVS's rconn_overflow (packet-ins OVS dropped for a full controller queue), µs per line and per
emitted packet-in. OVN logs every packet-in a line of its own (no aggregation, no meter unless asked for).

--py-spy PATH (py-spy from PyPI) samples the agent at --profile-rate (from outside, not pausing it; the
thread holding the GIL only) and adds the share of samples per function, self and inclusive, to that
rate's phase. Run as root.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _floor_target import agent_transport, floor_reader  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from policy_agent.config.loader import AuditConfig, PacketInConfig  # noqa: E402
from policy_agent.ovs.pids import read_pid  # noqa: E402
from tests.support.cluster import Cluster  # noqa: E402
from tests.support.ovn import AclLines, OvnStack, fetch as fetch_ovn, version as ovn_version  # noqa: E402
from tests.support.overload_scenario import (FIRST_PORT, PORTS, agent_counts, flood_records,  # noqa: E402
                                             new_key_flood_cluster, settled, start_flood_pods)

HZ = os.sysconf("SC_CLK_TCK")

SENDER_C = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* sender IP FIRST_PORT PORTS KEYS RATE SECONDS: datagram n from socket n % KEYS to port
   FIRST_PORT + n % PORTS, RATE per second in 1 ms batches; prints JSON counts. */
int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: sender ip first ports keys rate seconds\n"); return 2; }
    long first = atol(argv[2]), ports = atol(argv[3]), keys = atol(argv[4]);
    double rate = atof(argv[5]), seconds = atof(argv[6]);
    if (keys < 1 || keys > 64 || ports < 1 || rate <= 0) return 2;
    int socks[64];
    for (long k = 0; k < keys; k++) socks[k] = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in dst;
    memset(&dst, 0, sizeof dst);
    dst.sin_family = AF_INET;
    if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1) return 2;
    char payload[32];
    memset(payload, 'p', sizeof payload);
    long batch = (long)(rate / 1000.0);
    if (batch < 1) batch = 1;
    long step = (long)(1e9 * batch / rate), total = (long)(rate * seconds), n = 0, sent = 0, failed = 0;
    struct timespec next, t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    next = t0;
    while (n < total) {
        for (long b = 0; b < batch && n < total; b++, n++) {
            dst.sin_port = htons((unsigned short)(first + n % ports));
            if (sendto(socks[n % keys], payload, sizeof payload, 0, (struct sockaddr *)&dst, sizeof dst) >= 0) sent++;
            else failed++;
        }
        next.tv_nsec += step;
        while (next.tv_nsec >= 1000000000L) { next.tv_nsec -= 1000000000L; next.tv_sec++; }
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("{\"attempted\": %ld, \"sent\": %ld, \"failed\": %ld, \"seconds\": %.6f}\n", n, sent, failed,
           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
"""


# --- CPU accounting from /proc (pure parts tested in tests/unit/bench/test_agent_cpu.py) ---------------


@dataclass(frozen=True)
class ThreadSample:
    name: str
    user_ticks: int
    sys_ticks: int
    run_ns: int  # schedstat's time on CPU (user + sys, ns): finer than the ticks
    voluntary: int
    involuntary: int


def parse_stat(line: str) -> tuple[str, int, int]:
    """(comm, utime, stime) in clock ticks from a /proc/<pid>[/task/<tid>]/stat line; comm may hold
    spaces and parentheses, so the fields are counted from the last ')'."""
    name = line[line.index("(") + 1:line.rindex(")")]
    fields = line[line.rindex(")") + 2:].split()  # fields[0] is field 3 (state)
    return name, int(fields[11]), int(fields[12])


def parse_switches(status: str) -> tuple[int, int]:
    """(voluntary, involuntary) context switches from a /proc/.../status text."""
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return int(values["voluntary_ctxt_switches"]), int(values["nonvoluntary_ctxt_switches"])


Sample = tuple[dict[int, ThreadSample], int]  # every live thread, and the whole process's CPU time in ns

_LIBC = ctypes.CDLL(None, use_errno=True)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def process_cpu_ns(pid: int) -> int:
    """The CPU time of every thread of `pid`, ended ones too, in ns: the process's CPU clock
    (clock_getcpuclockid), on the same count as the threads' schedstat. Not /proc/PID/stat's ticks: those and the
    threads' own ticks are rounded apart, and their difference showed 10-20 ms of CPU from threads that never
    were in 3 windows of 8 (at 1k packet-ins/s, 2-4 µs per packet-in added to a 5 s phase)."""
    clock, ts = ctypes.c_int(), _Timespec()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        raise OSError(ctypes.get_errno(), f"clock_getcpuclockid({pid})")
    if _LIBC.clock_gettime(clock, ctypes.byref(ts)) != 0:
        raise OSError(ctypes.get_errno(), f"clock_gettime(the CPU clock of {pid})")
    return ts.tv_sec * 1_000_000_000 + ts.tv_nsec


def sample_threads(pid: int) -> Sample:
    """Every thread of `pid` now (threads that end while being read are skipped), then the process's CPU
    time (process_cpu_ns: every thread's, those that have ended too)."""
    threads = _threads(pid)
    return threads, process_cpu_ns(pid)


def _threads(pid: int) -> dict[int, ThreadSample]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            name, user, system = parse_stat(Path(f"{base}/stat").read_text())
            voluntary, involuntary = parse_switches(Path(f"{base}/status").read_text())
            run_ns = int(Path(f"{base}/schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[int(tid)] = ThreadSample(name, user, system, run_ns, voluntary, involuntary)
    return out


def machine_ticks() -> tuple[int, int]:
    """(busy, all) ticks of every CPU since boot (/proc/stat): busy is all but idle and iowait."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)


def process_ticks(pid: int) -> int:
    """The user + sys ticks of every thread of `pid`, ended ones too."""
    _, user, system = parse_stat(Path(f"/proc/{pid}/stat").read_text())
    return user + system


def usage(before_sample: Sample, after_sample: Sample, hz: int = HZ) -> dict:
    """CPU and context switches between two samples: per thread (busiest first; a thread born in
    between counts from zero) and in total. A thread that ended in between (gone by `after`, or
    born and gone between the samples) has no sample of its own: its CPU is the process's CPU time
    beyond the live threads' (ended_threads_s), added to the total's user and run time."""
    (before, proc_before), (after, proc_after) = before_sample, after_sample
    zero = ThreadSample("", 0, 0, 0, 0, 0)
    threads = []
    for tid, a in after.items():
        b = before.get(tid, zero)
        threads.append({"tid": tid, "name": a.name, "user_s": (a.user_ticks - b.user_ticks) / hz,
                        "sys_s": (a.sys_ticks - b.sys_ticks) / hz, "run_s": (a.run_ns - b.run_ns) / 1e9,
                        "voluntary_switches": a.voluntary - b.voluntary,
                        "involuntary_switches": a.involuntary - b.involuntary})
    threads.sort(key=lambda t: -t["run_s"])
    total = {key: sum(t[key] for t in threads) for key in ("user_s", "sys_s", "run_s", "voluntary_switches",
                                                           "involuntary_switches")}
    ended = max(0.0, (proc_after - proc_before) / 1e9 - total["run_s"])  # both counted in ns: no rounding between
    total["ended_threads_s"] = ended
    total["user_s"] += ended  # which of user or sys it was is not known: counted once, as user
    total["run_s"] += ended
    return {"total": {k: round(v, 6) if isinstance(v, float) else v for k, v in total.items()},
            "threads": [{k: round(v, 6) if isinstance(v, float) else v for k, v in t.items()} for t in threads
                        if t["run_s"] or t["voluntary_switches"] or t["involuntary_switches"]],
            "threads_gone": len(set(before) - set(after))}


def profile_summary(collapsed: str, top: int = 25) -> dict:
    """py-spy's raw output (one "frame;frame;...;leaf count" line per stack, root first) as the share of
    samples per function: self (the leaf) and inclusive (anywhere in the stack, once per stack), top first.
    A frame is "function (file:line)"; the line is dropped so a function's lines add up."""
    self_: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        self_[frames[-1]] = self_.get(frames[-1], 0) + n
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n

    def ranked(counts: dict[str, int]) -> list[list]:
        return [[f, round(n / total, 4)] for f, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]

    return {"samples": total, "self": ranked(self_) if total else [], "inclusive": ranked(inclusive) if total else []}


# --- the run ---------------------------------------------------------------------------------------------


def compile_sender(work: Path) -> Path:
    src, exe = work / "sender.c", work / "sender"
    src.write_text(SENDER_C)
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), str(src)], check=True, capture_output=True)
    return exe


def send(exe: Path, netns: str, ip: str, rate: int, seconds: float, keys: int) -> dict:
    out = subprocess.run(["ip", "netns", "exec", netns, str(exe), ip, str(FIRST_PORT), str(PORTS), str(keys),
                          str(rate), str(seconds)], capture_output=True, text=True, check=True,
                         timeout=seconds * 3 + 60).stdout
    return json.loads(out)


def emitted_now(cluster: Cluster) -> tuple[int, int, int]:
    """(controller flows' n_packets, meter band drops, OVS's rconn_overflow: packet-ins lost in its queues)."""
    return cluster.controller_flow_packets(), cluster.meter_band_drops(), cluster.rconn_overflow()


def per_packet_in_us(seconds: float, packet_ins: int) -> float | None:
    return round(seconds / packet_ins * 1e6, 2) if packet_ins > 0 else None


def agent_rate(cluster: Cluster, exe: Path, netns: str, ip: str, rate: int, args: argparse.Namespace,
               idle_cpu_per_s: float) -> dict:
    pid = cluster.agent.pid  # type: ignore[union-attr]
    _, records0 = settled(cluster)
    reads0 = agent_counts(cluster.metrics_port)  # type: ignore[attr-defined]
    flows0, meter0, overflow0 = emitted_now(cluster)
    profiler = None
    if args.py_spy and rate == args.profile_rate:  # sampled from outside, not pausing the agent; the thread holding
        # the GIL only (--gil): a thread waiting in a syscall or for a lock is not sampled
        raw = Path(tempfile.mkdtemp(prefix="npab-agentcpu-prof-", dir="/tmp")) / "stacks.txt"
        profiler = subprocess.Popen([args.py_spy, "record", "--nonblocking", "--gil", "--threads", "--format", "raw",
                                     "--rate", "500", "--duration", str(int(args.seconds + args.tail)),
                                     "--output", str(raw), "--pid", str(pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
    vswitchd = read_pid(cluster.dir / "ovs" / "ovs-vswitchd.pid")
    forwarders = forwarder_pids(pid) if args.syslog else []
    if args.syslog and not forwarders:
        raise RuntimeError(f"no syslog forwarder process under the agent:\n{cluster.log()[-3000:]}")
    forwarders0 = sum(process_ticks(p) for p in forwarders)
    machine0, switch0 = machine_ticks(), process_ticks(vswitchd)
    before, t0 = sample_threads(pid), time.monotonic()
    sent = send(exe, netns, ip, rate, args.seconds, args.keys)
    time.sleep(args.tail)
    after, elapsed = sample_threads(pid), time.monotonic() - t0
    machine1, switch1 = machine_ticks(), process_ticks(vswitchd)
    profile = None
    if profiler is not None:
        _, err = profiler.communicate(timeout=120)
        profile = profile_summary(raw.read_text()) if raw.exists() else {"error": err[-2000:]}
        subprocess.run(["rm", "-rf", str(raw.parent)])
    _, records1 = settled(cluster, timeout=120)
    forwarder = None
    if args.syslog:  # its CPU until it has delivered the phase's last record (it reads the files behind the writer)
        after_phase = syslog_caught_up(cluster.metrics_port)  # type: ignore[attr-defined]
        if forwarder_pids(pid) != forwarders:
            raise RuntimeError("a syslog forwarder process was restarted during the phase")
        forwarder = {"cpu_s": round((sum(process_ticks(p) for p in forwarders) - forwarders0) / HZ, 3),
                     "caught_up_s_after_the_phase_settled": round(after_phase, 3)}
    reads1 = agent_counts(cluster.metrics_port)  # type: ignore[attr-defined]
    reads, paced, pressed, entered, entered_pressed, rotated, compressed = (
        reads1.get(k, 0.0) - reads0.get(k, 0.0)
        for k in ("npaudit_openflow_reads_total", "npaudit_openflow_reads_paced_total",
                  "npaudit_openflow_reads_pressed_total", "npaudit_audit_overload_entered_total",
                  "npaudit_audit_overload_entered_pressed_total", "audit_files_rotations", "audit_files_compressed"))
    flows, meter, overflow = emitted_now(cluster)
    if cluster.agent.poll() is not None:  # type: ignore[union-attr]
        raise RuntimeError(f"the agent exited during the run:\n{cluster.log()[-3000:]}")
    emitted = (flows - flows0) - (meter - meter0)
    records = {k: records1[k] - records0[k] for k in records1}
    cpu = usage(before, after)
    run_s = cpu["total"]["run_s"]
    return {"rate": rate, "sender": sent, "sent_per_s": round(sent["sent"] / sent["seconds"]),
            "measured_s": round(elapsed, 3), "packet_ins_ovs_emitted": emitted, "meter_band_dropped": meter - meter0,
            "lost_in_ovs_rconn_overflow": overflow - overflow0,
            "records": records["records"], "coarsened_records": records["coarsened_records"],
            "packet_ins_in_records": records["packets"],
            "packet_ins_in_coarsened_records": records["coarsened_packets"],
            "in_records_vs_emitted": round(records["packets"] / emitted, 4) if emitted else None,
            "full_detail_fraction": round(1 - records["coarsened_packets"] / records["packets"], 4)
            if records["packets"] else None, "cpu": cpu, "cpu_percent_of_a_core": round(100 * run_s / elapsed, 1),
            "us_per_packet_in": per_packet_in_us(run_s, emitted),
            "us_per_packet_in_idle_taken_off": per_packet_in_us(run_s - idle_cpu_per_s * elapsed, emitted),
            "us_per_record": per_packet_in_us(run_s, records["records"]),
            "openflow_reads": int(reads), "openflow_reads_paced": int(paced), "openflow_reads_pressed": int(pressed),
            # Coarse spells begun, and of those the ones input pressure began with both queues below high_mark.
            "overload_entered": int(entered), "overload_entered_by_input_pressure": int(entered_pressed),
            "packet_ins_per_read": round(emitted / reads, 1) if reads else None,
            # Audit files rotated and gzipped from the phase's start until it settled (the gzip CPU is in the
            # phase's figures as far as it ran within the measured time).
            "audit_files_rotated": int(rotated), "audit_files_compressed": int(compressed),
            # Who else used the machine meanwhile (the sender, OVS, anything): busy share of all its CPUs, and
            # ovs-vswitchd's own share of a core. Near 100 % busy, the machine, not the agent, is the limit.
            "machine_busy_percent": round(100 * (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1]), 1),
            "ovs_vswitchd_cpu_percent_of_a_core": round(100 * (switch1 - switch0) / HZ / elapsed, 1),
            **({"syslog_forwarder": {**forwarder, "us_per_packet_in": per_packet_in_us(forwarder["cpu_s"], emitted),
                                     "agent_and_forwarder_us_per_packet_in":
                                         per_packet_in_us(run_s + forwarder["cpu_s"], emitted)}}
               if forwarder is not None else {}),
            **({"profile_py_spy": profile} if profile is not None else {})}


class FloorReader:
    """bench/_of_floor.py run by `cmd` (bench/_floor_target.py floor_reader), started and stopped by pid (an
    `ip netns exec` in front execs it: the pid is the reader's). Its counts are read from the file it keeps
    them in (--counts), never asked for by signal: a signal landing just before the reader's blocking recv(2)
    waits there for more bytes, and with none coming the bench waited for ever."""

    def __init__(self, cmd: list[str]) -> None:
        fd, name = tempfile.mkstemp(prefix="npab-floor-counts-")
        os.close(fd)
        self.counts_path = Path(name)
        self.proc = subprocess.Popen([*cmd, "--counts", name], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the floor reader did not start")

    def counts(self) -> tuple[int, int]:
        """(packet-ins, other messages) read so far; two equal reads in a row, so never a torn pair."""
        last = None
        while True:
            data = self.counts_path.read_bytes()
            got: tuple[int, int] = struct.unpack("<QQ", data) if len(data) == 16 else (0, 0)
            if got == last:
                return got
            last = got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.counts_path.unlink(missing_ok=True)


def floor_rate(cluster: Cluster, reader: FloorReader, exe: Path, netns: str, ip: str, rate: int,
               args: argparse.Namespace) -> dict:
    time.sleep(1.0)  # anything of the phase before read
    flows0, meter0, overflow0 = emitted_now(cluster)
    counted0 = reader.counts()[0]
    before, t0 = sample_threads(reader.proc.pid), time.monotonic()
    sent = send(exe, netns, ip, rate, args.seconds, args.keys)
    time.sleep(args.tail)
    after, elapsed = sample_threads(reader.proc.pid), time.monotonic() - t0
    counted = reader.counts()[0] - counted0
    flows, meter, overflow = emitted_now(cluster)
    emitted = (flows - flows0) - (meter - meter0)
    cpu = usage(before, after)
    run_s = cpu["total"]["run_s"]
    return {"rate": rate, "sender": sent, "sent_per_s": round(sent["sent"] / sent["seconds"]),
            "measured_s": round(elapsed, 3), "packet_ins_ovs_emitted": emitted, "packet_ins_counted": counted,
            "lost_in_ovs_rconn_overflow": overflow - overflow0,
            "counted_vs_emitted": round(counted / emitted, 4) if emitted else None, "cpu": cpu,
            "cpu_percent_of_a_core": round(100 * run_s / elapsed, 1),
            "us_per_packet_in": per_packet_in_us(run_s, counted)}


def ovn_rates(root: Path, work: Path, exe: Path, rates: list[int], args: argparse.Namespace) -> dict:
    """OVN's ovn-controller at each rate (tests/support/ovn.py), all its threads; everything stopped again."""
    stack = OvnStack(root, work / "ovn", f"npab-ovnc{os.getpid()}")
    phases = []
    try:
        stack.up()
        netns, ip = stack.sender()
        pid = stack.pid("ovn-controller")
        assert pid is not None
        time.sleep(1.0)
        idle0 = sample_threads(pid)
        time.sleep(3.0)
        idle = usage(idle0, sample_threads(pid))["total"]["run_s"] / 3.0
        lines = AclLines(stack.log)
        for rate in rates:
            time.sleep(1.0)
            lines.new()
            flows0, overflow0 = stack.acl_log_flow_packets(), stack.rconn_overflow()
            before, t0 = sample_threads(pid), time.monotonic()
            sent = send(exe, netns, ip, rate, args.seconds, args.keys)
            time.sleep(args.tail)
            after, elapsed = sample_threads(pid), time.monotonic() - t0
            emitted = stack.acl_log_flow_packets() - flows0
            written = lines.new()
            cpu = usage(before, after)
            run_s = cpu["total"]["run_s"]
            phases.append({"rate": rate, "sender": sent, "sent_per_s": round(sent["sent"] / sent["seconds"]),
                           "measured_s": round(elapsed, 3), "packet_ins_ovs_emitted": emitted,
                           "acl_lines_written": written,
                           "lost_in_ovs_rconn_overflow": stack.rconn_overflow() - overflow0,
                           "lines_vs_emitted": round(written / emitted, 4) if emitted else None,
                           "cpu": cpu, "cpu_percent_of_a_core": round(100 * run_s / elapsed, 1),
                           "us_per_line": per_packet_in_us(run_s, written),
                           "us_per_packet_in": per_packet_in_us(run_s, emitted)})
    finally:
        stack.down()
    return {"version": ovn_version(root), "openflow_transport": "unix (the bridge's .mgmt, as OVN reads)",
            "acl": "to-lport drop, --log --severity=info, no meter, on UDP 1024-65535 into Pod b",
            "written": "an acl_log line per packet-in in ovn-controller's log file (OVN's ACL logging as shipped)",
            "idle_cpu_percent": round(100 * idle, 2), "phases": phases}


def idle_cpu(pid: int, seconds: float) -> float:
    """The agent's CPU seconds per second with no traffic (nothing scraping it)."""
    before, t0 = sample_threads(pid), time.monotonic()
    time.sleep(seconds)
    return usage(before, sample_threads(pid))["total"]["run_s"] / (time.monotonic() - t0)


_DISCARD = """
import socket, sys
listener = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(1 << 20)
while True:
    conn, _ = listener.accept()
    try:
        while conn.recv_into(buf):
            pass
    except OSError:
        pass
    conn.close()
"""


class DiscardReceiver:
    """A syslog receiver on loopback that only reads what it is sent (a SIEM off the node, as far as this node's
    CPU goes), in a process of its own, stopped through its Popen."""

    def __init__(self) -> None:
        import socket
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self._proc = subprocess.Popen([sys.executable, "-c", _DISCARD, str(self._listener.fileno())],
                                      pass_fds=(self._listener.fileno(),))

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait(10)
        self._listener.close()


def forwarder_pids(agent_pid: int) -> list[int]:
    """The agent's syslog forwarder child processes (auditlog/syslog/process.py), found through /proc."""
    out = []
    for tid in os.listdir(f"/proc/{agent_pid}/task"):
        for child in Path(f"/proc/{agent_pid}/task/{tid}/children").read_text().split():
            try:
                if b"auditlog.syslog.process" in Path(f"/proc/{child}/cmdline").read_bytes():
                    out.append(int(child))
            except OSError:
                continue
    return sorted(out)


def syslog_caught_up(port: int, timeout: float = 120.0) -> float:
    """Seconds until the forwarder has delivered the newest sealed record (npaudit_syslog_last_seq_sent
    reaching npaudit_audit_chain_seq)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                  if s.name in ("npaudit_syslog_last_seq_sent", "npaudit_audit_chain_seq")}
        if values.get("npaudit_syslog_last_seq_sent", -1) >= values.get("npaudit_audit_chain_seq", 0):
            return time.monotonic() - t0
        time.sleep(0.05)
    raise RuntimeError(f"the syslog forwarder did not catch up within {timeout:.0f} s")


def summary(agent: list[dict], floor: list[dict], floor_mode: str, ovn: dict | None = None) -> dict:
    by_rate = {}
    for a in agent:
        f = next((f for f in floor if f["rate"] == a["rate"]), None)
        o = next((o for o in ovn["phases"] if o["rate"] == a["rate"]), None) if ovn is not None else None
        agent_us, floor_us = a["us_per_packet_in"], f["us_per_packet_in"] if f else None
        by_rate[str(a["rate"])] = {
            "agent_us_per_packet_in": agent_us, "agent_us_per_packet_in_idle_taken_off":
                a["us_per_packet_in_idle_taken_off"],
            "floor_us_per_packet_in": floor_us,
            "agent_vs_floor": round(agent_us / floor_us, 1) if agent_us and floor_us else None,
            "agent_cpu_percent": a["cpu_percent_of_a_core"], "floor_cpu_percent": f["cpu_percent_of_a_core"] if f
            else None, "emitted_per_s": round(a["packet_ins_ovs_emitted"] / a["sender"]["seconds"]),
            "in_records_vs_emitted": a["in_records_vs_emitted"], "coarsened_records": a["coarsened_records"],
            "full_detail_fraction": a["full_detail_fraction"],
            "floor_counted_vs_emitted": f["counted_vs_emitted"] if f else None,
            "agent_switches_per_packet_in": round((a["cpu"]["total"]["voluntary_switches"]
                                                   + a["cpu"]["total"]["involuntary_switches"])
                                                  / a["packet_ins_ovs_emitted"], 2)
            if a["packet_ins_ovs_emitted"] else None,
            "packet_ins_per_read": a["packet_ins_per_read"],
            "machine_busy_percent": a["machine_busy_percent"],
            "ovs_vswitchd_cpu_percent_of_a_core": a["ovs_vswitchd_cpu_percent_of_a_core"],
            **({"ovn_controller_us_per_packet_in": o["us_per_packet_in"], "ovn_controller_us_per_line": o["us_per_line"],
                "ovn_lines_vs_emitted": o["lines_vs_emitted"], "ovn_cpu_percent": o["cpu_percent_of_a_core"]}
               if o is not None else {}),
            **({"syslog_forwarder_us_per_packet_in": a["syslog_forwarder"]["us_per_packet_in"],
                "agent_and_forwarder_us_per_packet_in": a["syslog_forwarder"]["agent_and_forwarder_us_per_packet_in"]}
               if "syslog_forwarder" in a else {})}
    return {"floor_mode": floor_mode, "by_rate": by_rate,
            "target_issue_22": "<= 15 us of agent CPU per packet-in at every rate 1k-40k; no coarsening"}


def wake_penalty(gaps_ms: tuple[float, ...] = (0, 1, 5, 20, 100), seconds: float = 1.0) -> dict:
    """This machine's price of sleeping: one fixed unit of Python work (JSON and SHA-256 of a small record,
    20 times), its CPU (this thread's) run back to back and after each of several sleeps. On the shared VM
    the same work costs several times more after a sleep, the longer the sleep the more: what any
    process that waits between packet-ins pays per wake-up, the agent and the floor alike."""
    import hashlib

    record = {"a": list(range(50)), "b": "x" * 200, "c": {"d": 1.5, "e": [1, 2, 3]}}

    def unit() -> None:
        for _ in range(20):
            hashlib.sha256(json.dumps(record).encode()).hexdigest()

    out = {}
    for gap in gaps_ms:
        n = max(10, int(seconds / (gap / 1000 + 0.0002)))
        c0 = time.thread_time()
        for _ in range(n):
            unit()
            if gap:
                time.sleep(gap / 1000)
        out[f"{gap:g}"] = round((time.thread_time() - c0) / n * 1e6, 1)
    return {"us_per_unit_after_a_sleep_of_ms": out,
            "after_20_ms_vs_back_to_back": round(out["20"] / out["0"], 1) if "20" in out and "0" in out else None}


def build_info(port: int) -> dict[str, str]:
    """npaudit_build_info's labels: record_encoder "c", or "python" (not built, or NPAUDIT_PURE_PYTHON set);
    audit_gzip "isal" or "zlib" (an agent older than the label gzips with zlib)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "npaudit_build_info":
                return {"record_encoder": str(sample.labels["record_encoder"]),
                        "audit_gzip": str(sample.labels.get("audit_gzip", "zlib"))}
    raise RuntimeError("the agent's metrics have no npaudit_build_info")


def main() -> int:
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,5000,10000,20000,40000", help="distinct packets/s, comma separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="send time per rate")
    ap.add_argument("--tail", type=float, default=1.5, help="seconds measured after the send (window close, write)")
    ap.add_argument("--keys", type=int, default=4, help="source ports (sockets) of the sender")
    ap.add_argument("--meter-rate", type=int, default=1_000_000, help="policy_deny meter rate and burst, pps")
    ap.add_argument("--no-fair-share", action="store_true",
                    help="fair shares off (default: on, the agent's default)")
    ap.add_argument("--rotate-mb", type=int, default=16,
                    help="audit file size that rotates it (MiB): the agent gzips each rotated file, and smaller files "
                         "than the default 100 spread that cost over the phases (from 5k/s) as a long run spreads it "
                         "over its records; much smaller ones pay per-file work (renames, listings) a default agent "
                         "does not (measured: at 4 MiB, 15 rotations/s at 40k, ~3 µs a packet-in more than at 16)")
    ap.add_argument("--syslog", choices=["tcp"], default=None,
                    help="forward every record over TCP (the agent's default: a forwarder child process) to a "
                         "receiver on loopback that only reads; the forwarder's CPU per packet-in is reported beside "
                         "the agent's, counted until it has delivered each phase's last record")
    ap.add_argument("--floor-transport", choices=("agent", "mgmt"), default="agent",
                    help="the floor reads over the agent's transport (default) or the bridge's .mgmt unix socket")
    ap.add_argument("--ovn", action="store_true",
                    help="last, OVN 23.03's ovn-controller logging the same Drop at the same rates on a private OVS "
                         "(tests/support/ovn.py; its packages are downloaded and unpacked beside the tree once)")
    ap.add_argument("--py-spy", default="", help="py-spy executable: profile the agent at --profile-rate")
    ap.add_argument("--profile-rate", type=int, default=5000, help="the rate profiled when --py-spy is given")
    args = ap.parse_args()
    rates = [int(r) for r in args.rates.split(",") if r]
    ovn_root = fetch_ovn() if args.ovn else None  # before anything starts: a download that fails stops nothing
    ovn: dict | None = None

    work = Path(tempfile.mkdtemp(prefix="npab-agentcpu-", dir="/tmp"))
    marks = AuditConfig().overload
    receiver = DiscardReceiver() if args.syslog else None
    cluster = new_key_flood_cluster(meter_rate=args.meter_rate, overload=marks.enabled,
                                    queue_size=PacketInConfig().policy.queue_size,
                                    marks=(marks.high_mark, marks.peers_mark, marks.low_mark), rotate_mb=args.rotate_mb,
                                    fair_share=not args.no_fair_share, syslog_url=receiver.url if receiver else "")
    reader: FloorReader | None = None
    load0 = os.getloadavg()
    penalty = wake_penalty()
    measured = False
    try:
        exe = compile_sender(work)
        cluster.start(timeout=120)
        netns, ip = start_flood_pods(cluster)
        settled(cluster)
        idle = idle_cpu(cluster.agent.pid, 3.0)  # type: ignore[union-attr]
        built = build_info(cluster.metrics_port)  # type: ignore[attr-defined]
        agent = [agent_rate(cluster, exe, netns, ip, rate, args, idle) for rate in rates]
        audit_path = cluster.dir / "audit" / "audit.jsonl"
        records_at_stop = flood_records(audit_path)["records"]
        cluster.stop_agent()
        vswitchd = read_pid(cluster.dir / "ovs" / "ovs-vswitchd.pid")
        transport = agent_transport(cluster.dir / "agent.log")
        floor_cmd, floor_transport = floor_reader(cluster.config, args.floor_transport)
        reader = FloorReader(floor_cmd)
        floor = [floor_rate(cluster, reader, exe, netns, ip, rate, args) for rate in rates]
        floor_mode = "agent stopped (SIGTERM), OVS running with its flows"
        reached = any(f["packet_ins_counted"] for f in floor)
        if not reached:
            cluster.start(timeout=120)
            floor_mode = ("beside the running agent: with the agent stopped no packet-in reached the floor reader "
                          f"({floor_transport}); nothing subtracted")
            floor = [floor_rate(cluster, reader, exe, netns, ip, rate, args) for rate in rates]
        flows_kept = len(cluster.flows())
        measured = True
    finally:
        if reader is not None:
            reader.close()
        cluster.close()
        if receiver is not None:
            receiver.close()
        if not measured:
            subprocess.run(["rm", "-rf", str(work)])
    try:  # the agent's cluster is gone: OVN's phases have the machine to itself as the others had
        if ovn_root is not None:
            ovn = ovn_rates(ovn_root, work, exe, rates, args)
    finally:
        subprocess.run(["rm", "-rf", str(work)])
    print(json.dumps({
        "benchmark": "agent_cpu",
        "settings": {"rates": rates, "seconds": args.seconds, "tail_seconds": args.tail, "keys": args.keys,
                     "sender": f"C, paced in 1 ms batches, a new destination port per datagram over {PORTS} ports "
                               f"(round robin over {args.keys} source ports): every datagram a new audit key",
                     "policy_deny_meter_pps": args.meter_rate,
                     "policy_category_rate_burst": "1e9 (admission opened wide for the run)",
                     "fair_share": not args.no_fair_share, "debug_tap": "off",
                     "queues_and_overload_marks": "agent defaults", "overload": marks.enabled,
                     "audit_rotation_mb": args.rotate_mb, "audit_gzip": built["audit_gzip"],
                     "syslog": f"{args.syslog}, a forwarder child process, to a receiver on loopback that only reads"
                               if args.syslog else "off",
                     "record_encoder": built["record_encoder"],
                     "agent_openflow_transport": transport, "floor_openflow_transport": floor_transport,
                     "machine": "2 cores shared with other engineers' work: noisy, compare within this run only",
                     "load_average_start": [round(x, 2) for x in load0],
                     "load_average_end": [round(x, 2) for x in os.getloadavg()]},
        "idle_agent_cpu_percent": round(100 * idle, 2),
        "machine_wake_penalty": penalty,
        "floor": {"mode": floor_mode, "openflow_transport": floor_transport,
                  "packet_ins_reached_floor_with_agent_stopped": reached,
                  "ovs_vswitchd_pid_after_agent_stop": vswitchd, "flows_after_floor": flows_kept,
                  "agent_records_at_stop": records_at_stop},
        "agent": agent, "floor_phases": floor, "summary": summary(agent, floor, floor_mode, ovn),
        **({"ovn_controller": ovn} if ovn is not None else {})}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
