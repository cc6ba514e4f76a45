"""The trace service between nodes, against scripted switches: the source sends the packet into the tunnel
and waits for the destination's report within its timeout; the destination traces a marked packet from the
tunnel under a tag of its own and reports back; reports of no running trace are not taken."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any, Callable

from scapy.all import IP, TCP, Ether

from packetin import messages
from packetin.model import PacketIn
from policy_agent.cluster.nodes import PeerNode
from policy_agent.ovs.gateway import GatewayPlan
from policy_agent.policy.model import Pod
from policy_agent.policy.selection import Endpoint
from policy_agent.traceflow.crossnode import CrossNode
from policy_agent.traceflow.flows import Phase, TraceMark
from policy_agent.traceflow.report import REPORT_VNI, TRACE_VNI, decode_report, encode_report
from policy_agent.traceflow.service import TraceService
from policy_agent.traceflow.tags import identity

SRC = Endpoint(Pod("x", "a"), "10.248.1.2", "02:00:00:00:00:02", 100)
LOCAL_DST = Endpoint(Pod("y", "b"), "10.248.2.2", "02:00:00:00:00:03", 101)
REMOTE = Pod("y", "b", ips=("10.248.2.2",), node="n2")
N1 = PeerNode("n1", "10.248.1.0/24", "198.51.100.11")
N2 = PeerNode("n2", "10.248.2.0/24", "198.51.100.12")
TUNNEL = 1


class SourcePods:
    """Node n1: x/a runs here; y/b is known by its object (it runs on n2)."""

    endpoints = {SRC.pod.key: SRC}
    pods = {REMOTE.key: REMOTE}

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return REMOTE.key if ip == REMOTE.ips[0] else SRC.pod.key if ip == SRC.ip else None


class DestinationPods:
    """Node n2: y/b runs here."""

    endpoints = {LOCAL_DST.pod.key: LOCAL_DST}
    pods: dict[tuple[str, str], Pod] = {}

    def by_ip(self, ip: str) -> tuple[str, str] | None:
        return LOCAL_DST.pod.key if ip == LOCAL_DST.ip else None


def peers(*nodes: PeerNode) -> Callable[[str], PeerNode | None]:
    return lambda ip: next((p for p in nodes if ipaddress.IPv4Address(ip) in ipaddress.IPv4Network(p.pod_cidr)), None)


def pin(phase: Phase, frame: bytes, table: int = 0, tag: int = 0, rule: int = 0, disposition: int = 0) -> PacketIn:
    return PacketIn(reason=1, table_id=table, cookie=0, in_port=TUNNEL, rule_id=rule, reg7=disposition,
                    userdata=TraceMark(tag, phase).userdata(), packet=frame, total_len=len(frame), received_at=0.0)


class Switch:
    """Records flows and packet-outs; a packet-out into the pipeline is answered with `script(tag, frame)`."""

    def __init__(self, service: list[TraceService], script: Callable[[int, bytes], list[PacketIn]]) -> None:
        self.installed: list[messages.FlowSpec] = []
        self.deleted: list[messages.FlowSpec] = []
        self.sent: list[Any] = []
        self._service, self._script = service, script

    async def install_flows(self, flows: Any) -> None:
        self.installed += flows

    async def delete_flows(self, flows: Any) -> None:
        self.deleted += flows

    def send_nowait(self, msg: Any) -> int:
        self.sent.append(msg)
        frame = bytes(msg.data)
        if msg.match["in_port"] != 0xFFFFFFFD:  # into the pipeline (a report goes out from the controller)
            loop = asyncio.get_running_loop()
            for p in self._script(frame[15] >> 2, frame):
                loop.call_soon(self._service[0], p)
        return 1


def make(pods: Any, cross: CrossNode, script: Callable[[int, bytes], list[PacketIn]]
         ) -> tuple[TraceService, Switch]:
    ref: list[TraceService] = []
    switch = Switch(ref, script)
    ref.append(TraceService(switch, lambda: pods, {}.get, round_=lambda: 2, meters=lambda: True, linger=0.05,
                            cross=cross))
    return ref[0], switch


def through_the_tunnel(tag: int, frame: bytes) -> list[PacketIn]:
    """n1's copies of a packet that egress lets go: every point, table 70 last, then the AFTER copy."""
    return [pin(Phase.ARRIVAL, frame, t, tag) for t in (20, 30, 31, 32, 40, 41, 42, 70)] + \
        [pin(Phase.AFTER, frame, 20, tag)]


SOURCE = CrossNode("n1", "198.51.100.11", TUNNEL, True, peers(N2))
DESTINATION = CrossNode("n2", "198.51.100.12", TUNNEL, True, peers(N1))


def test_a_trace_to_another_node_s_pod_crosses_the_tunnel_and_takes_that_node_s_report() -> None:
    def script(tag: int, frame: bytes) -> list[PacketIn]:
        report = encode_report(tag, identity(frame) or b"", "n2",
                               [{"table": 0, "name": "classifier", "action": "accept", "detail": "from the tunnel"}],
                               {"result": "delivered", "pod": "y/b", "detail": "delivered to Pod y/b on port 101"},
                               "198.51.100.12", "198.51.100.11")
        forged = encode_report(tag, identity(frame) or b"", "n3", [], {"result": "dropped"}, "1.1.1.1", "2.2.2.2")
        return through_the_tunnel(tag, frame) + [pin(Phase.REPORT, forged), pin(Phase.REPORT, report)]

    async def main() -> dict[str, Any]:
        service, switch = make(SourcePods(), SOURCE, script)
        reply = await service.trace({"from": "x/a", "to": "y/b", "port": 80, "timeout": 2})
        await service.close()
        hop = next(f for f in switch.installed if f.table == 70)
        assert [a for a in hop.actions if not isinstance(a, messages.Controller)] == [
            messages.SetField("tun_ipv4_dst", "198.51.100.12"), messages.SetField("tunnel_id", TRACE_VNI),
            messages.Output(TUNNEL)]
        assert service.stats.reports == 1 and service.stats.stray == 1  # n3's report is not n2's
        assert service.stats.outcomes["delivered"] == 1
        return reply["trace"]

    trace = asyncio.run(main())
    assert trace["to"] == {"pod": "y/b", "ip": "10.248.2.2", "node": "n2"}
    hop = next(o for o in trace["observations"] if o["table"] == 70)
    assert hop["node"] == "n1" and hop["tunnel"] == {"node": "n2", "address": "198.51.100.12"}
    assert hop["detail"] == "into the Geneve tunnel (port 1) to Pod y/b on node n2 (198.51.100.12)"
    ingress = [o["detail"] for o in trace["observations"] if o["node"] == "n1" and o["table"] in (40, 41, 42)]
    assert ingress == ["no rule: the destination's ingress is judged on its node, n2"] * 3
    assert trace["observations"][-1] == {"table": 0, "name": "classifier", "action": "accept",
                                         "detail": "from the tunnel", "node": "n2"}
    assert trace["outcome"]["result"] == "delivered" and trace["outcome"]["node"] == "n2"


def test_a_destination_that_never_reports_is_named_when_the_trace_s_timeout_ends() -> None:
    async def main() -> tuple[dict[str, Any], float]:
        service, _ = make(SourcePods(), SOURCE, through_the_tunnel)
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await service.trace({"from": "x/a", "to": "y/b", "port": 80, "timeout": 0.3})
        await service.close()
        assert service.stats.outcomes["no-report"] == 1
        return reply["trace"], loop.time() - started

    trace, took = asyncio.run(main())
    assert trace["outcome"]["result"] == "no-report" and trace["outcome"]["node"] == "n2"
    assert 0.25 <= took < 1.0


def test_egress_dropped_on_the_source_node_waits_for_no_report() -> None:
    def dropped(tag: int, frame: bytes) -> list[PacketIn]:
        return [pin(Phase.ARRIVAL, frame, t, tag) for t in (20, 30)] + [pin(Phase.AFTER, frame, 20, tag, 0, 1)]

    async def main() -> dict[str, Any]:
        service, _ = make(SourcePods(), SOURCE, dropped)
        reply = await service.trace({"from": "x/a", "to": "y/b", "port": 80, "timeout": 5})
        await service.close()
        return reply["trace"]

    trace = asyncio.run(main())
    assert trace["outcome"]["result"] == "dropped" and "node" not in trace["outcome"]
    assert all("node" not in o for o in trace["observations"])


def test_routed_mode_says_the_other_node_is_not_traced() -> None:
    routed = CrossNode("n1", "198.51.100.11", TUNNEL, False, peers(N2))

    def script(tag: int, frame: bytes) -> list[PacketIn]:
        return through_the_tunnel(tag, frame)

    async def main() -> tuple[dict[str, Any], list[messages.FlowSpec]]:
        service, switch = make(SourcePods(), routed, script)
        service.set_gateway(GatewayPlan("npaudit-gw0", 2, "10.248.1.1", "10.248.1.0/24", "02:00:00:00:00:09"))
        reply = await service.trace({"from": "x/a", "to": "y/b", "port": 80, "timeout": 1})
        await service.close()
        return reply["trace"], switch.installed

    trace, flows = asyncio.run(main())
    assert not any(isinstance(a, messages.Output) for f in flows for a in f.actions)  # the trace stops at 70
    assert trace["outcome"]["result"] == "forwarded" and trace["outcome"]["detail"] == (
        "forwarded to the node gateway npaudit-gw0 (10.248.1.1, port 2); routed mode: node n2 (198.51.100.12) "
        "is not traced (Geneve only)")


def test_the_destination_traces_a_marked_packet_under_its_own_tag_and_reports_back() -> None:
    arrived = bytes(Ether(dst="02:00:00:00:00:01") / IP(src="10.248.1.2", dst="10.248.2.2", tos=9 << 2)
                    / TCP(sport=45000, dport=80, flags="S"))

    def delivered(tag: int, frame: bytes) -> list[PacketIn]:
        return [pin(Phase.ARRIVAL, frame, t, tag) for t in (20, 30, 31, 32, 40, 41, 42, 70)] + \
            [pin(Phase.AFTER, frame, 20, tag)]

    async def main() -> tuple[TraceService, Switch]:
        service, switch = make(DestinationPods(), DESTINATION, delivered)
        service(pin(Phase.FROM_TUNNEL, arrived))
        while len(switch.sent) < 2:
            await asyncio.sleep(0.01)
        await service.close()
        return service, switch

    service, switch = asyncio.run(main())
    injected, report_msg = switch.sent
    assert injected.match["in_port"] == TUNNEL  # as if from the tunnel, into the pipeline
    local_tag = bytes(injected.data)[15] >> 2
    assert local_tag != 9 and Ether(bytes(injected.data))[TCP].sport == 45000
    assert {dict(f.match)["ip_dscp"] for f in switch.installed} == {local_tag}
    assert switch.deleted == switch.installed and service.tags.running == 0
    assert [(a.key, a.value) for a in report_msg.actions[:2]] == [("tun_ipv4_dst", "198.51.100.11"),
                                                                   ("tunnel_id", REPORT_VNI)]
    report = decode_report(bytes(report_msg.data))
    assert report is not None and (report.tag, report.identity, report.node) == (9, identity(arrived), "n2")
    assert report.observations[0]["detail"] == "from the tunnel: node n1 (198.51.100.11)"
    assert report.observations[3]["detail"].startswith("no rule: a packet from the tunnel had its egress judged")
    assert report.outcome["result"] == "delivered" and report.outcome["pod"] == "y/b"
    assert service.stats.received == 1


def test_a_marked_packet_from_no_known_node_s_pod_is_counted_and_not_traced() -> None:
    stranger = bytes(Ether() / IP(src="10.9.9.9", dst="10.248.2.2", tos=9 << 2) / TCP(sport=1, dport=80))

    async def main() -> tuple[TraceService, Switch]:
        service, switch = make(DestinationPods(), DESTINATION, delivered_nothing)
        service(pin(Phase.FROM_TUNNEL, stranger))
        service(pin(Phase.REPORT, stranger))  # no report at all
        # From n1's Pod, but its IPv4 header announces 24 bytes and the frame ends after 22 of them.
        cut = stranger[:14] + b"\x46" + stranger[15:26] + bytes([10, 248, 1, 2]) + stranger[30:36]
        service(pin(Phase.FROM_TUNNEL, cut))
        await asyncio.sleep(0.05)
        return service, switch

    def delivered_nothing(tag: int, frame: bytes) -> list[PacketIn]:
        return []

    service, switch = asyncio.run(main())
    assert switch.sent == [] and switch.installed == [] and service.stats.stray == 3 and service.stats.received == 0
