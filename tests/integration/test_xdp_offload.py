"""The XDP drop offload on a real Pod veth: judged floods stop before OVS, counted exactly; misses, expiry and detach pass."""

from __future__ import annotations

import ctypes
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meters.ebpf import maps
from meters.ebpf.loader import XdpOffload, probe
from meters.ebpf.maps import OffloadKey, OffloadRule, icmp_port, rule_until
from meters.errors import OffloadUnavailable
from tests.support.podnet import PodNet, set_neighbor

from tests.integration.conftest import OvsEnv, PodFactory

PORT, OTHER_PORT = 5353, 5354
RULE_ID = 0xC0FFEE01
SECOND = 1_000_000_000


@pytest.fixture(scope="module")
def offload() -> Iterator[XdpOffload]:
    # One compile for the module (clang takes seconds); each test empties the maps.
    prog = XdpOffload.compile(max_entries=1024)
    yield prog
    prog.close()


@pytest.fixture
def xdp(offload: XdpOffload) -> Iterator[XdpOffload]:
    offload.flush()
    yield offload
    for netns, ifname in offload.attached:
        offload.detach(ifname, netns)
    offload.flush()


def two_pods(make_pod: PodFactory) -> tuple[PodNet, PodNet]:
    a, b = make_pod("a", 1), make_pod("b", 2)
    set_neighbor(a, b)
    set_neighbor(b, a)
    return a, b


def ofctl(env: OvsEnv, *args: str) -> str:
    return subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", *args], capture_output=True, text=True,
                          check=True).stdout


def drop_flows(env: OvsEnv, *ports: int) -> None:
    """One counting drop flow per UDP destination port (and one for ICMP): what OVS saw."""
    for port in ports:
        ofctl(env, "add-flow", env.mgmt, f"priority=200,udp,tp_dst={port},actions=drop")
    ofctl(env, "add-flow", env.mgmt, "priority=200,icmp,actions=drop")


def ovs_packets(env: OvsEnv, match: str) -> int:
    """n_packets of the flows `match` selects, once the revalidators have pushed the
    datapath's counts to them (they lag by up to a second otherwise)."""
    for _ in range(2):  # a round that began before the last packet may have missed it
        subprocess.run(["ovs-appctl", "-t", str(env.run_dir / "ovs-vswitchd.ctl"), "revalidator/wait"],
                       capture_output=True, text=True, check=True, timeout=10)
    out = ofctl(env, "dump-flows", env.mgmt, match)
    return sum(int(n) for n in re.findall(r"n_packets=(\d+)", out))


def send_udp(src: PodNet, dst: PodNet, port: int, count: int) -> float:
    """`count` datagrams from `src`, paced in bursts of 64 so that the veth's 256-slot
    receive ring never overflows before XDP sees them; the seconds it took."""
    code = (f"import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"start = time.monotonic()\n"
            f"for i in range({count}):\n"
            f"    s.sendto(b'npaudit', ('{dst.ip}', {port}))\n"
            f"    if i % 64 == 63: time.sleep(0.0005)\n"
            f"print(time.monotonic() - start)")
    res = subprocess.run(["ip", "netns", "exec", src.netns, sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=60, check=True)
    return float(res.stdout)


def tx_dropped(pod: PodNet) -> int:
    """Frames the Pod's eth0 could not hand to its peer (they never reached XDP)."""
    out = subprocess.run(["ip", "-n", pod.netns, "-s", "-j", "link", "show", "eth0"],
                         capture_output=True, text=True, check=True).stdout
    return int(re.search(r'"tx":\{[^}]*"dropped":(\d+)', out).group(1))  # type: ignore[union-attr]


def udp_key(ifindex: int, a: PodNet, b: PodNet, port: int) -> OffloadKey:
    return OffloadKey.make(ifindex, a.ip, b.ip, maps.IPPROTO_UDP, port)


# --- the map layout against the C program ------------------------------------


def test_codec_sizes_and_offsets_match_the_structs_bcc_built_from_the_program(offload: XdpOffload) -> None:
    rules, state = offload._bpf["offload_rules"], offload._bpf["offload_state"]
    assert (ctypes.sizeof(rules.Key), ctypes.sizeof(rules.Leaf), ctypes.sizeof(state.Leaf)) == (
        maps.KEY_SIZE, maps.RULE_SIZE, maps.STATE_SIZE)
    offsets = {name: getattr(rules.Key, name).offset for name, _ in rules.Key._fields_}
    assert offsets == {"ifindex": 0, "family": 4, "proto": 5, "port": 6, "src": 8, "dst": 24}
    offsets = {name: getattr(rules.Leaf, name).offset for name, _ in rules.Leaf._fields_}
    assert offsets == {"expires_ns": 0, "rule_id": 8, "rate_pps": 12, "burst": 16, "reserved": 20}
    offsets = {name: getattr(state.Leaf, name).offset for name, _ in state.Leaf._fields_}
    assert offsets == {"tokens": 0, "last_ns": 8, "dropped_packets": 16, "dropped_bytes": 24,
                       "passed_packets": 32, "passed_bytes": 40}


addresses = st.one_of(st.tuples(st.ip_addresses(v=4), st.ip_addresses(v=4)),
                      st.tuples(st.ip_addresses(v=6), st.ip_addresses(v=6)))


@settings(max_examples=200, deadline=None)
@given(ifindex=st.integers(1, 2**32 - 1), pair=addresses, proto=st.sampled_from(sorted(maps.PORT_PROTOCOLS)),
       port=st.integers(0, 0xFFFF), rule_id=st.integers(0, 2**32 - 1), rate=st.integers(0, maps.MAX_RATE_PPS),
       burst=st.integers(0, maps.MAX_BURST), expires=st.integers(0, 2**64 - 1))
def test_encoded_entries_read_back_field_by_field_through_bcc_types(
        offload: XdpOffload, ifindex: int, pair: tuple, proto: int, port: int, rule_id: int, rate: int,
        burst: int, expires: int) -> None:
    rules = offload._bpf["offload_rules"]
    key = OffloadKey(ifindex, pair[0], pair[1], proto, port)
    ck = rules.Key.from_buffer_copy(maps.encode_key(key))
    assert (ck.ifindex, ck.family, ck.proto) == (ifindex, pair[0].version, proto)
    assert bytes(ck.port) == port.to_bytes(2, "big")
    assert bytes(ck.src)[:len(pair[0].packed)] == pair[0].packed
    assert bytes(ck.dst)[:len(pair[1].packed)] == pair[1].packed
    assert maps.decode_key(bytes(ck)) == key
    cr = rules.Leaf.from_buffer_copy(maps.encode_rule(OffloadRule(rule_id, rate, burst, expires)))
    assert (cr.rule_id, cr.rate_pps, cr.burst, cr.expires_ns, cr.reserved) == (rule_id, rate, burst, expires, 0)


# --- behaviour on a real veth ----------------------------------------------------


def test_a_cached_flood_is_dropped_before_ovs_with_exact_counts_and_samples_pass(
        ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    drop_flows(ovs_env, PORT, OTHER_PORT)
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    rate, burst, sent = 20, 5, 3000
    key = udp_key(ifindex, a, b, PORT)
    xdp.put(key, rule_until(RULE_ID, rate, burst, time.monotonic_ns(), 30 * SECOND))
    lost0 = tx_dropped(a)

    elapsed = send_udp(a, b, PORT, sent)
    send_udp(a, b, OTHER_PORT, 40)
    time.sleep(0.3)

    reached = sent - (tx_dropped(a) - lost0)
    counts = xdp.counters()[key]
    assert counts.dropped_packets + counts.passed_packets == reached  # every packet seen, counted once
    assert reached >= sent * 0.99
    assert counts.passed_packets <= burst + rate * elapsed + 1  # the bucket's allowance
    assert counts.passed_packets >= burst
    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == counts.passed_packets  # OVS saw only the samples
    frame = 14 + 20 + 8 + len(b"npaudit")
    assert (counts.dropped_bytes, counts.passed_bytes) == (frame * counts.dropped_packets, frame * counts.passed_packets)
    # A flow without an entry is untouched: all of it reaches OVS, nothing is counted for it.
    assert ovs_packets(ovs_env, f"udp,tp_dst={OTHER_PORT}") == 40
    assert list(xdp.counters()) == [key]
    final = xdp.delete(key)
    assert final == counts and xdp.counters() == {} and xdp.rules() == {}


def test_icmp_is_keyed_by_type_and_code(ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    drop_flows(ovs_env)
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    echo = OffloadKey.make(ifindex, a.ip, b.ip, maps.IPPROTO_ICMP, icmp_port(8, 0))
    xdp.put(echo, rule_until(RULE_ID, 0, 0, time.monotonic_ns(), 30 * SECOND))  # no samples: drop all

    subprocess.run(["ip", "netns", "exec", a.netns, "ping", "-c", "5", "-i", "0.05", "-W", "0.2", b.ip],
                   capture_output=True, timeout=20)

    assert xdp.counters()[echo].dropped_packets == 5
    assert ovs_packets(ovs_env, "icmp") == 0


def test_an_ipv6_udp_flood_is_keyed_and_dropped_like_ipv4(
        ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    for pod, peer, addr, peer_addr in ((a, b, "fd00::a", "fd00::b"), (b, a, "fd00::b", "fd00::a")):
        subprocess.run(["ip", "-n", pod.netns, "addr", "add", f"{addr}/64", "dev", "eth0", "nodad"], check=True)
        subprocess.run(["ip", "-n", pod.netns, "neigh", "replace", peer_addr, "lladdr", peer.mac, "dev", "eth0"],
                       check=True)
    ofctl(ovs_env, "add-flow", ovs_env.mgmt, f"priority=200,udp6,tp_dst={PORT},actions=drop")
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    key = OffloadKey.make(ifindex, "fd00::a", "fd00::b", maps.IPPROTO_UDP, PORT)
    xdp.put(key, rule_until(RULE_ID, 0, 0, time.monotonic_ns(), 30 * SECOND))
    code = ("import socket\ns = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
            f"for i in range(25): s.sendto(b'npaudit', ('fd00::b', {PORT}))")
    subprocess.run(["ip", "netns", "exec", a.netns, sys.executable, "-c", code], check=True, timeout=30)

    assert xdp.counters()[key] == maps.OffloadCounts(25, 25 * (14 + 40 + 8 + 7), 0, 0)
    assert ovs_packets(ovs_env, f"udp6,tp_dst={PORT}") == 0


def test_after_expiry_packets_reach_ovs_again_and_sweep_returns_the_final_counts(
        ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    drop_flows(ovs_env, PORT)
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    key = udp_key(ifindex, a, b, PORT)
    ttl = SECOND // 2
    xdp.put(key, rule_until(RULE_ID, 0, 0, time.monotonic_ns(), ttl))
    send_udp(a, b, PORT, 200)
    time.sleep(ttl / SECOND + 0.2)
    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == 0

    send_udp(a, b, PORT, 30)
    time.sleep(0.3)

    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == 30
    assert xdp.counters()[key].dropped_packets == 200  # expired packets are not counted as dropped
    assert xdp.stats()["expired"] >= 30
    assert xdp.sweep(time.monotonic_ns()) == {key: maps.OffloadCounts(200, 200 * 49, 0, 0)}
    assert xdp.rules() == {} and xdp.counters() == {}


def test_after_detach_every_packet_reaches_ovs(ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    drop_flows(ovs_env, PORT)
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    key = udp_key(ifindex, a, b, PORT)
    xdp.put(key, rule_until(RULE_ID, 0, 0, time.monotonic_ns(), 30 * SECOND))
    send_udp(a, b, PORT, 50)
    time.sleep(0.2)
    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == 0

    assert xdp.detach(a.host_if, ovs_env.netns) is True
    send_udp(a, b, PORT, 40)
    time.sleep(0.3)

    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == 40
    assert xdp.counters()[key].dropped_packets == 50
    assert xdp.attached == {}


def test_flush_by_rule_removes_only_that_rules_entries(ovs_env: OvsEnv, make_pod: PodFactory, xdp: XdpOffload) -> None:
    a, b = two_pods(make_pod)
    drop_flows(ovs_env, PORT, OTHER_PORT)
    ifindex = xdp.attach(a.host_if, ovs_env.netns)
    now = time.monotonic_ns()
    first, second = udp_key(ifindex, a, b, PORT), udp_key(ifindex, a, b, OTHER_PORT)
    xdp.put(first, rule_until(RULE_ID, 0, 0, now, 30 * SECOND))
    xdp.put(second, rule_until(RULE_ID + 1, 0, 0, now, 30 * SECOND))
    send_udp(a, b, PORT, 20)
    time.sleep(0.2)

    removed = xdp.flush(lambda _key, rule: rule is not None and rule.rule_id == RULE_ID)
    send_udp(a, b, PORT, 10)
    send_udp(a, b, OTHER_PORT, 10)
    time.sleep(0.3)

    assert removed == {first: maps.OffloadCounts(20, 20 * 49, 0, 0)}
    assert list(xdp.rules()) == [second]
    assert ovs_packets(ovs_env, f"udp,tp_dst={PORT}") == 10  # the flushed flow decides in OVS again
    assert ovs_packets(ovs_env, f"udp,tp_dst={OTHER_PORT}") == 0


# --- the degraded path ------------------------------------------------------------


def test_a_program_that_does_not_compile_raises_one_line_naming_the_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("#include <uapi/linux/bpf.h>\nint xdp_offload(struct xdp_md *ctx) { return undefined_thing; }\n")
    with pytest.raises(OffloadUnavailable) as err:
        XdpOffload.compile(source=broken)
    message = str(err.value)
    assert "\n" not in message
    assert "broken.c" in message and "undefined_thing" in message and "error:" in message
    result = probe(source=broken)
    assert not result.ok and "undefined_thing" in result.reason


def test_missing_kernel_headers_raise_one_line_saying_so(tmp_path: Path) -> None:
    with pytest.raises(OffloadUnavailable) as err:
        XdpOffload.compile(kernel_source=tmp_path / "no-headers")
    assert "\n" not in str(err.value)
    assert "Unable to find kernel headers" in str(err.value)
    result = probe(kernel_source=tmp_path / "no-headers")
    assert not result.ok and "kernel headers" in result.reason


def test_probe_says_the_tier_runs_here_with_the_real_program() -> None:
    assert probe().ok, probe().reason


def test_a_missing_source_file_raises_the_typed_error(tmp_path: Path) -> None:
    with pytest.raises(OffloadUnavailable, match="does not exist"):
        XdpOffload.compile(source=tmp_path / "gone.c")
