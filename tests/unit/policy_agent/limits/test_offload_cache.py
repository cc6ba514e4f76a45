"""policy_agent.limits.offload_cache: which packet-ins get cached, flush before a change, counts folded once, the degraded path.

The XDP program is replaced by an in-memory map with the loader's semantics
(put keeps counts, flush/sweep return final counts); the real program runs in
tests/integration/test_xdp_offload.py and tests/e2e/test_offload_e2e.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)

import pytest  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from scapy.layers.inet import ICMP, IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from auditlog.aggregate import Aggregator  # noqa: E402
from auditlog.pipeline import AuditPipeline  # noqa: E402
from meters.ebpf.maps import IPPROTO_ICMP, IPPROTO_UDP, OffloadCounts, OffloadKey, OffloadRule, icmp_port  # noqa: E402
from meters.errors import OffloadUnavailable  # noqa: E402
from packetin.model import Disposition, Flags, PacketIn, Userdata  # noqa: E402
from policy_agent.cni.state import PodInterfaceInfo  # noqa: E402
from policy_agent.limits.offload_cache import DropOffload, OffloadCollector, OffloadPodHooks  # noqa: E402
from policy_agent.config.offload import OffloadConfig  # noqa: E402
from policy_agent.policy.compiler import rule_flags  # noqa: E402
from policy_agent.policy.model import Action  # noqa: E402
from tests.support.audit_pipeline import RULE, Writer, context  # noqa: E402

SECOND = 1_000_000_000
MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
FRAME = bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1000, dport=53))
PING = bytes(Ether(**MAC) / IP(src="10.0.0.1", dst="10.0.0.2") / ICMP(type=8, code=0))
OFPORT, IFINDEX = 5, 42
KEY = OffloadKey.make(IFINDEX, "10.0.0.1", "10.0.0.2", IPPROTO_UDP, 53)
POD = PodInterfaceInfo(namespace="x", name="a", container_id="c1", netns="/run/netns/p", ifname="eth0",
                       ip="10.0.0.1", prefix_len=24, mac="02:00:00:00:00:01", gateway=None,
                       host_ifname="npa1", ofport=OFPORT)
ELIGIBLE = int(Flags.LOG | Flags.OFFLOAD_ELIGIBLE)


class FakeXdp:
    """The loader's XdpOffload contract in memory; `hit` plays the program dropping packets of a key."""

    def __init__(self) -> None:
        self.rules: dict[OffloadKey, OffloadRule] = {}
        self.state: dict[OffloadKey, OffloadCounts] = {}
        self.attached: dict[tuple[str | None, str], int] = {}
        self.closed = False

    def attach(self, ifname: str, netns: str | None = None) -> int:
        self.attached[(netns, ifname)] = IFINDEX
        return IFINDEX

    def detach(self, ifname: str, netns: str | None = None) -> bool:
        return self.attached.pop((netns, ifname), None) is not None

    def put(self, key: OffloadKey, rule: OffloadRule) -> None:
        self.rules[key] = rule

    def hit(self, key: OffloadKey, dropped: int, size: int = 100) -> None:
        assert key in self.rules
        c = self.state.get(key, OffloadCounts())
        self.state[key] = c + OffloadCounts(dropped, dropped * size, 0, 0)

    def counters(self) -> dict[OffloadKey, OffloadCounts]:
        return dict(self.state)

    def flush(self, match: Callable[[OffloadKey, OffloadRule | None], bool] | None = None
              ) -> dict[OffloadKey, OffloadCounts]:
        chosen = [k for k in set(self.rules) | set(self.state) if match is None or match(k, self.rules.get(k))]
        for k in chosen:
            self.rules.pop(k, None)
        return {k: self.state.pop(k) for k in chosen if k in self.state}

    def sweep(self, now_ns: int) -> dict[OffloadKey, OffloadCounts]:
        return self.flush(lambda _k, rule: rule is None or rule.expires_ns <= now_ns)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.ns = 1000 * SECOND
        self.wall = 1_700_000_000.0


def make(config: OffloadConfig | None = None, *, busy: Callable[[], bool] = lambda: False,
         loader: Any = None) -> tuple[DropOffload, FakeXdp, Writer, AuditPipeline, Clock]:
    xdp, writer, clock = FakeXdp(), Writer(), Clock()
    pipeline = AuditPipeline(context(), writer, Aggregator(window=1.0), wall_clock=lambda: clock.wall)
    cfg = config or OffloadConfig(enabled=True, threshold_pps=5, rate_pps=3, burst=4, ttl_s=2.0)
    offload = DropOffload(cfg, pipeline, ovs_netns="ovsns", busy=busy, loader=loader or (lambda _cfg: xdp),
                          mono_ns=lambda: clock.ns, wall=lambda: clock.wall)
    offload.load()
    return offload, xdp, writer, pipeline, clock


def pin(at: float, *, disposition: int = Disposition.DROP, flags: int = ELIGIBLE, frame: bytes = FRAME,
        in_port: int = OFPORT) -> PacketIn:
    ud = Userdata(category=0, flags=flags, rule_id=RULE.rule_id).encode()
    return PacketIn(reason=0, table_id=40, cookie=1, in_port=in_port, rule_id=RULE.rule_id, reg7=disposition,
                    userdata=ud, packet=frame, total_len=len(frame), received_at=at)


def flood(offload: DropOffload, pipeline: AuditPipeline, at: float, n: int, **kw: Any) -> None:
    """`n` packet-ins of one flow within the second starting at `at`, through the audit pipeline first."""
    for i in range(n):
        p = pin(at + i / (10 * n), **kw)
        pipeline(p)
        offload(p)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_only_a_logged_drop_is_offload_eligible_and_the_compiler_says_so_once() -> None:
    assert rule_flags(Action.DROP, True) == ELIGIBLE
    assert rule_flags(Action.DROP, False) == 0
    assert rule_flags(Action.ALLOW, True) == int(Flags.LOG)
    assert rule_flags(Action.PASS, True) == int(Flags.LOG)
    assert rule_flags(Action.REJECT, True) == int(Flags.LOG | Flags.REJECT)


def test_a_logged_drop_flood_above_the_threshold_is_cached_with_rule_bucket_and_expiry() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 4)  # below 5 per second: OVS keeps every packet
        assert xdp.rules == {}
        offload(pin(clock.wall + 0.5))
        assert xdp.rules == {KEY: OffloadRule(RULE.rule_id, 3, 4, clock.ns + 2 * SECOND)}
        assert offload.stats().entries == 1 and offload.counts["inserted"] == 1
    run(go())


def test_the_count_restarts_each_second_so_a_slow_steady_drop_is_never_cached() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        for second in range(5):
            flood(offload, pipeline, clock.wall + second, 4)
        assert xdp.rules == {}
    run(go())


@pytest.mark.parametrize("disposition", [Disposition.ALLOW, Disposition.REJECT, Disposition.PASS])
def test_allow_reject_and_pass_are_never_cached_even_if_a_flag_said_so(disposition: int) -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 50, disposition=disposition)
        assert xdp.rules == {}
    run(go())


def test_a_drop_without_the_flag_or_from_a_port_without_xdp_is_never_cached() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 50, flags=int(Flags.LOG))
        flood(offload, pipeline, clock.wall, 50, in_port=OFPORT + 1)
        assert xdp.rules == {}
    run(go())


def test_icmp_is_keyed_by_type_and_code() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 5, frame=PING)
        assert list(xdp.rules) == [OffloadKey.make(IFINDEX, "10.0.0.1", "10.0.0.2", IPPROTO_ICMP, icmp_port(8, 0))]
    run(go())


def test_samples_refresh_the_entry_whatever_their_rate_once_half_its_life_is_gone() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 5)
        first = xdp.rules[KEY].expires_ns
        clock.ns += SECOND // 2
        offload(pin(clock.wall + 1.5))  # one sample a second: far below the threshold
        assert xdp.rules[KEY].expires_ns == first and offload.counts["refreshed"] == 0
        clock.ns += SECOND
        offload(pin(clock.wall + 2.5))
        assert xdp.rules[KEY].expires_ns == clock.ns + 2 * SECOND and offload.counts["refreshed"] == 1
    run(go())


def test_dropped_counts_are_folded_into_the_flows_record_once_and_totals_are_exact() -> None:
    async def go() -> None:
        offload, xdp, writer, pipeline, clock = make()
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 5)  # 5 seen by OVS, then cached
        xdp.hit(KEY, 1000)
        await offload.read()
        await offload.read()  # nothing new: nothing folded twice
        xdp.hit(KEY, 500)
        clock.ns += 3 * SECOND  # expired: swept with its final counts
        await offload.read()
        assert xdp.rules == {} and offload.stats().entries == 0
        clock.wall += 5
        pipeline._emit(pipeline.aggregator.flush(clock.wall))
        assert writer.packets() == 5 + 1500
        offloaded = sum(r.record()["npaudit"]["aggregate"]["offloaded_packets"] for r in writer.records)
        assert offloaded == 1500
        assert (offload.counts["offloaded_packets"], offload.counts["offloaded_bytes"]) == (1500, 150_000)
    run(go())


def test_a_change_flushes_first_folding_the_counts_and_nothing_judged_before_it_ends_is_cached_again() -> None:
    async def go() -> None:
        changing = [False]
        offload, xdp, writer, pipeline, clock = make(busy=lambda: changing[0])
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 5)
        xdp.hit(KEY, 70)
        changing[0] = True  # the engine holds its lock
        await offload.invalidate()
        assert xdp.rules == {} and offload.counts["offloaded_packets"] == 70
        flood(offload, pipeline, clock.wall + 0.2, 20)  # packet-ins of the old flows, during the change
        assert xdp.rules == {}
        changing[0] = False
        late = pin(clock.wall + 0.5)  # read before the change ended, handled after it
        clock.wall += 1.0
        offload(late)
        flood(offload, pipeline, clock.wall + 0.5, 4)
        assert xdp.rules == {}  # the old packet-in did not count, and four is below the threshold
        offload(pin(clock.wall + 0.9))
        assert list(xdp.rules) == [KEY]
    run(go())


def test_detaching_a_pod_folds_and_removes_its_entries_and_close_folds_the_rest() -> None:
    async def go() -> None:
        offload, xdp, _w, pipeline, clock = make()
        hooks_called: list[str] = []

        class Engine:
            async def pod_added(self, info: PodInterfaceInfo) -> None:
                hooks_called.append("added")

            async def pod_deleted(self, info: PodInterfaceInfo) -> None:
                assert xdp.attached == {}  # detached before the Pod's flows go
                hooks_called.append("deleted")

        hooks = OffloadPodHooks(Engine(), offload)
        await hooks.pod_added(POD)
        assert xdp.attached == {("ovsns", "npa1"): IFINDEX} and offload.stats().attached == 1
        flood(offload, pipeline, clock.wall, 5)
        xdp.hit(KEY, 9)
        await hooks.pod_deleted(POD)
        assert hooks_called == ["added", "deleted"] and xdp.rules == {} and offload.counts["offloaded_packets"] == 9
        offload(pin(clock.wall + 0.9))  # the port is gone: nothing to key on
        assert xdp.rules == {}
        await offload.close()
        assert xdp.closed and not offload.active
    run(go())


def test_a_program_that_cannot_load_is_one_warning_metric_0_and_the_agent_carries_on(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(_cfg: OffloadConfig) -> Any:
        raise OffloadUnavailable("XDP offload broken.c: <stdin>:1:1: error: unknown type name 'nonsense'")

    async def go() -> None:
        with caplog.at_level(logging.WARNING, logger="policy_agent.limits.offload_cache"):
            offload, _xdp, writer, pipeline, clock = make(loader=broken)
        await offload.attach(POD)
        flood(offload, pipeline, clock.wall, 50)
        await offload.invalidate()
        await offload.read()
        await offload.close()
        assert not offload.active and offload.stats().attached == 0
        assert offload.state.startswith("unavailable: XDP offload broken.c") and "nonsense" in offload.state
        assert len(writer.records) == 1  # the flood is still logged, by OVS, as it always was
        registry = CollectorRegistry()
        registry.register(OffloadCollector(offload))
        assert "npaudit_ebpf_offload_active 0.0" in generate_latest(registry).decode()

    run(go())
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "npaudit_ebpf_offload_active=0" in warnings[0].getMessage()


def test_disabled_in_the_config_loads_nothing_and_says_so() -> None:
    called: list[OffloadConfig] = []
    offload = DropOffload(OffloadConfig(), None, ovs_netns="", loader=lambda cfg: called.append(cfg))  # type: ignore
    offload.load()
    assert called == [] and not offload.active
    assert offload.status()["state"] == "disabled in the config (offload.enabled: false)"


def test_the_engine_flushes_cached_verdicts_before_each_bundle_that_changes_flows_and_reports_its_change() -> None:
    from policy_agent.engine import PolicyEngine
    from policy_agent.policy.model import Namespace, Pod
    from policy_agent.policy.rules import RuleRegistry
    from tests.support.engine_doubles import Info, RecordingChannel, drop_web

    async def go() -> None:
        ch = RecordingChannel()
        seen_changing: list[bool] = []

        class Verdicts:
            async def invalidate(self) -> None:
                seen_changing.append(eng.changing)
                ch.calls.append(("invalidate", []))

        eng = PolicyEngine(ch, RuleRegistry(), round_=3, meters=lambda: True, verdicts=Verdicts())
        await eng.apply(namespaces=[Namespace("x")], pods=[Pod("x", "a", labels=(("app", "web"),))])
        await eng.pod_added(Info("x", "a", "10.0.0.5", "02:00:00:00:00:05", 5))  # type: ignore[arg-type]
        ch.calls.clear()
        await eng.apply(policies=[drop_web()])
        assert [c[0] for c in ch.calls] == ["invalidate", "commit"]
        ch.calls.clear()
        await eng.apply(pods=[Pod("x", "a", labels=(("app", "db"),))])  # a label change
        assert [c[0] for c in ch.calls] == ["invalidate", "commit"]
        ch.calls.clear()
        await eng.apply(namespaces=[Namespace("x")])  # nothing changes in OVS: nothing to flush
        assert [c[0] for c in ch.calls] == []  # nothing to send (the channel sends nothing for an empty bundle)
        assert seen_changing and all(seen_changing) and not eng.changing

    run(go())


def test_status_probes_here_only_when_the_agents_offload_is_not_running() -> None:
    import io

    from policy_agent.config.loader import AgentConfig
    from policy_agent.cli.status import run_status

    probes: list[int] = []

    def probe() -> tuple[bool, str]:
        probes.append(1)
        return True, ""

    for active, state in ((True, "active: XDP on 2 Pod veth(s), 1 cached Drop flow(s), threshold 100 pps"),
                          (False, "unavailable: bcc is not importable")):
        status = {"ebpf": {"active": active, "state": state}}
        out = io.StringIO()
        assert run_status(AgentConfig(), "table", api=lambda s, r, st=status: {"ok": True, "status": st},
                          probe=probe, out=out) == 0
        line = next(x for x in out.getvalue().splitlines() if x.startswith("ebpf"))
        assert state in line and (("probe here" in line) is not active)
    assert probes == [1]
