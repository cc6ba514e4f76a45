"""The trace service against a scripted switch: flows in and out, the packet-out, copies to an answer,
timeouts, usage errors, and the category-0 dispatcher staying silent about trace packets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from scapy.all import IP, TCP, Ether

from packetin.model import Disposition, Flags, PacketIn, Userdata
from policy_agent.policy.model import Action, Direction, Pod
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy.selection import Endpoint
from policy_agent.policy_packetins import PolicyPacketIns
from policy_agent.traceflow.flows import Phase, TraceMark
from policy_agent.traceflow.service import TraceService
from tests.support.clock import ManualClock, ManualSleep

SRC = Endpoint(Pod("x", "a"), "10.0.0.2", "02:00:00:00:00:02", 3)
DST = Endpoint(Pod("y", "b"), "10.0.0.3", "02:00:00:00:00:03", 4)
RULE = RuleInfo(rule_id=11, policy_kind="AntreaClusterNetworkPolicy", namespace="", policy_name="reject-81",
                rule_name="refuse-81", tier="securityops", priority=5, action=Action.REJECT,
                direction=Direction.INGRESS, log_label="", logged=True)


class Pods:
    endpoints = {SRC.pod.key: SRC, DST.pod.key: DST}
    pods: dict[tuple[str, str], Pod] = {}

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return next((k for k, e in self.endpoints.items() if e.ip == ip), None)


def copy_pin(tag: int, table: int, phase: Phase, rule: int = 0, disposition: int = 0, frame: bytes = b""
             ) -> PacketIn:
    return PacketIn(reason=1, table_id=table, cookie=0, in_port=3, rule_id=rule, reg7=disposition,
                    userdata=TraceMark(tag, phase).userdata(), packet=frame, total_len=len(frame), received_at=0.0)


class Switch:
    """Records flow changes and packet-outs; answers a packet-out with `script(tag, frame)` copies."""

    def __init__(self, service_ref: list[TraceService], script: Any) -> None:
        self.installed: list[Any] = []
        self.deleted: list[Any] = []
        self.sent: list[Any] = []
        self._service = service_ref
        self._script = script

    async def install_flows(self, flows: Any) -> None:
        self.installed += flows

    async def delete_flows(self, flows: Any) -> None:
        self.deleted += flows

    def send_nowait(self, msg: Any) -> int:
        self.sent.append(msg)
        frame = bytes(msg.data)
        tag = frame[15] >> 2
        loop = asyncio.get_running_loop()
        for pin in self._script(tag, frame):
            loop.call_soon(self._service[0], pin)
        return 1


def make(script: Any, budget: tuple[float, float] = (500.0, 200.0), **timeline: Any) -> tuple[TraceService, Switch]:
    ref: list[TraceService] = []
    switch = Switch(ref, script)
    ref.append(TraceService(switch, Pods, {11: RULE}.get, round_=lambda: 2, meters=lambda: True, linger=0.05,
                            budget=budget, **timeline))
    return ref[0], switch


def rejected(tag: int, frame: bytes) -> list[PacketIn]:
    return [copy_pin(tag, t, Phase.ARRIVAL, frame=frame) for t in (20, 30, 31, 32, 40)] + \
        [copy_pin(tag, 20, Phase.AFTER, 11, Disposition.REJECT, frame=frame)]


def test_a_trace_installs_its_flows_injects_at_the_source_port_and_removes_them() -> None:
    async def main() -> dict[str, Any]:
        service, switch = make(rejected)
        reply = await service.trace({"from": "x/a", "to": "y/b", "port": 81, "source_port": 45000})
        assert service.tags.running == 1  # until its flows are gone, behind the answer
        await service.close()
        assert switch.installed and switch.deleted == switch.installed and service.tags.running == 0
        (out,) = switch.sent
        assert out.match["in_port"] == 3 and out.actions[0].port == 0xFFFFFFF9  # OFPP_TABLE
        pkt = Ether(bytes(out.data))
        assert (pkt[IP].src, pkt[IP].dst, pkt[TCP].sport, pkt[TCP].dport, pkt[TCP].flags) == (
            "10.0.0.2", "10.0.0.3", 45000, 81, "S")
        assert pkt[IP].tos >> 2 == reply["trace"]["tag"]
        assert service.stats.outcomes["rejected"] == 1
        return reply

    reply = asyncio.run(main())
    assert reply["ok"]
    outcome = reply["trace"]["outcome"]
    assert outcome["result"] == "rejected" and outcome["reply"] == "a TCP RST"
    assert outcome["rule"]["policy"] == "reject-81"
    assert reply["trace"]["from"] == {"pod": "x/a", "ip": "10.0.0.2", "port": 3}


def test_no_copies_is_a_timeout_and_the_flows_still_go() -> None:
    async def main() -> None:
        service, switch = make(lambda tag, frame: [])
        reply = await service.trace({"from": "x/a", "to": "10.0.0.99", "timeout": 0.05})
        assert reply["ok"] and reply["trace"]["outcome"]["result"] == "timeout"
        assert reply["trace"]["to"] == {"pod": None, "ip": "10.0.0.99"}
        await service.close()
        assert switch.deleted == switch.installed
        assert service.stats.outcomes["timeout"] == 1
    asyncio.run(main())


@pytest.mark.parametrize("request_, error", [
    ({"from": "x/zz", "to": "y/b"}, "from: no running Pod x/zz on this node"),
    ({"from": "x/a", "to": "y/zz"}, "to: no Pod y/zz runs on this node or has an address known to it"),
    ({"from": "xa", "to": "y/b"}, "from: must be NAMESPACE/POD, got 'xa'"),
    ({"from": "x/a", "to": "300.1.1.1"}, "to: must be NAMESPACE/POD or an IPv4 address, got '300.1.1.1'"),
    ({"from": "x/a", "to": "y/b", "protocol": "gre"}, "protocol: must be one of tcp, udp, sctp, icmp, got 'gre'"),
    ({"from": "x/a", "to": "y/b", "port": 0}, "port: must be an integer in 1..65535, got 0"),
    ({"from": "x/a", "to": "y/b", "protocol": "icmp", "port": 80}, "port: ICMP has no ports"),
    ({"from": "x/a", "to": "y/b", "timeout": 0}, "timeout: must be seconds in (0, 60], got 0"),
])
def test_usage_errors_are_one_line_naming_the_field(request_: dict[str, Any], error: str) -> None:
    async def main() -> dict[str, Any]:
        service, switch = make(rejected)
        reply = await service.trace(request_)
        assert switch.installed == [] and switch.sent == []
        return reply
    assert asyncio.run(main()) == {"ok": False, "errors": [error], "usage": True}


def test_policy_packet_ins_of_a_trace_are_neither_answered_nor_audited_until_the_tag_is_forgotten() -> None:
    sent: list[Any] = []
    audited: list[PacketIn] = []
    seen: list[PacketIn] = []
    dispatcher: list[PolicyPacketIns] = []

    def script(tag: int, frame: bytes) -> list[PacketIn]:
        # The logged Reject rule's category-0 copy of the same packet, through the real dispatcher.
        policy_copy = PacketIn(reason=0, table_id=40, cookie=0, in_port=3, rule_id=11, reg7=2,
                               userdata=Userdata(category=0, flags=int(Flags.REJECT | Flags.LOG), rule_id=11).encode(),
                               packet=frame, total_len=len(frame), received_at=0.0)
        seen.append(policy_copy)
        dispatcher[0](policy_copy)
        return rejected(tag, frame)

    async def main() -> None:
        service, _ = make(script)
        dispatcher.append(PolicyPacketIns(lambda msg: sent.append(msg) or 1, audit=audited.append,
                                          suppress=service.suppress))
        await service.trace({"from": "x/a", "to": "y/b", "port": 81})
        dispatcher[0](seen[0])  # trailing behind a flood, before the linger ends: still silent
        assert sent == [] and audited == [] and service.stats.suppressed == 2
        await asyncio.sleep(0.1)  # the linger is over: the same packet is an ordinary one again
        dispatcher[0](seen[0])
        assert len(sent) == 1 and audited == [seen[0]]
    asyncio.run(main())


def test_copies_of_no_running_trace_are_counted_as_stray() -> None:
    service, _ = make(rejected)
    service(copy_pin(7, 20, Phase.ARRIVAL))
    service(copy_pin(7, 20, Phase.ARRIVAL)._replace(userdata=b"\x01\x01"))
    assert service.stats.stray == 2


def test_traces_beyond_the_copy_budget_wait_their_turn_instead_of_losing_copies() -> None:
    # The service's clock moves only by the waits it makes for copy budget.
    clock = ManualClock(1000.0)
    sleep = ManualSleep(instant=float("inf"), clock=clock)

    async def main() -> list[str]:
        # 90 copies/s with room for one trace (9 copies): the 2nd and 3rd wait 0.1 s each.
        service, switch = make(rejected, budget=(90.0, 9.0), clock=clock, sleep=sleep)
        replies = await asyncio.gather(*(service.trace({"from": "x/a", "to": "y/b", "port": 81, "timeout": 2})
                                         for _ in range(3)))
        return [r["trace"]["outcome"]["result"] for r in replies]

    assert asyncio.run(main()) == ["rejected"] * 3
    assert clock.now - 1000.0 == pytest.approx(0.2)  # two traces' worth of copies waited for, no more
    assert all(d == pytest.approx(0.1) for d in sleep.delays)


def test_a_late_copy_of_an_earlier_trace_with_the_same_tag_is_not_taken_for_the_running_one() -> None:
    def late_then_real(tag: int, frame: bytes) -> list[PacketIn]:
        earlier = frame[:34] + bytes([0x9C, 0x41]) + frame[36:]  # another source port, same tag
        return [copy_pin(tag, 20, Phase.AFTER, 11, Disposition.DROP, frame=earlier)] + rejected(tag, frame)

    async def main() -> tuple[dict[str, Any], TraceService]:
        service, _ = make(late_then_real)
        return await service.trace({"from": "x/a", "to": "y/b", "port": 81}), service
    reply, service = asyncio.run(main())
    assert reply["trace"]["outcome"]["result"] == "rejected" and service.stats.stray == 1


def test_a_live_trace_injects_nothing_purges_the_datapath_cache_and_follows_the_first_real_packet() -> None:
    purged: list[bool] = []

    async def main() -> dict[str, Any]:
        service, switch = make(rejected)
        service._purge = lambda: purged.append(True)
        task = asyncio.ensure_future(service.trace({"from": "x/a", "to": "y/b", "port": 81, "live": True}))
        while not switch.installed:
            await asyncio.sleep(0.01)
        tag = dict(switch.installed[0].match)
        assert "ip_dscp" not in tag and "tcp_src" not in tag
        again = await service.trace({"from": "x/a", "to": "y/b", "port": 80, "live": True})
        assert again["usage"] and "running already" in again["errors"][0]
        real = bytes(Ether() / IP(src="10.0.0.2", dst="10.0.0.3") / TCP(sport=50123, dport=81, flags="S"))
        other = bytes(Ether() / IP(src="10.0.0.2", dst="10.0.0.3") / TCP(sport=50124, dport=81, flags="S"))
        (dscp,) = service._running
        service(copy_pin(dscp, 20, Phase.ARRIVAL, frame=real))
        service(copy_pin(dscp, 20, Phase.ARRIVAL, frame=other))  # a second real packet: not this trace's
        for pin in rejected(dscp, real)[1:]:
            service(pin)
        reply = await task
        assert switch.sent == [] and purged == [True] and service.stats.stray == 1
        return reply

    reply = asyncio.run(main())
    trace = reply["trace"]
    assert trace["live"] and trace["source_port"] == 50123
    assert trace["outcome"]["result"] == "rejected" and trace["outcome"]["detail"].endswith(
        "the source Pod received a TCP RST")
