"""Runs traces on the agent: tag, flows in, packet out, copies collected, flows out, tag released.

The category-1 (traceflow) subscriber and the local API's "trace" op meet here. Copies of a
running trace arrive through the traceflow channel, with its own meter and token bucket, so a
flood of policy packet-ins delays no trace. The category-0 dispatcher asks `suppress` for each
policy packet-in: a trace packet that meets a logged or Reject rule is neither audited nor
answered, only counted.

Between nodes (Geneve, `cross`): a trace to a Pod of another node leaves table 70 into the tunnel,
marked (report.py); that node's agent gets it from its table 0 (`_received`), traces it through its
own pipeline under a tag of its own, and sends its observations back through the tunnel; the
source waits for them within the trace's timeout and answers with both parts (crossnode.merge).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Protocol, Sequence

from meters.token_bucket import TokenBucket
from packetin import messages
from packetin.errors import PacketInError
from packetin.model import PacketIn
from packetin.protocol_numbers import IPPROTO_TCP
from policy_agent.cluster.nodes import PeerNode
from policy_agent.errors import AgentError
from policy_agent.policy.reject import answer_protocol, build_reject
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy.selection import Endpoint
from policy_agent.traceflow.crossnode import CrossNode, merge
from policy_agent.traceflow.flows import MAX_COPIES, Phase, TraceMark, trace_flows
from policy_agent.traceflow.packet import build_packet
from policy_agent.traceflow.report import Report, decode_report, encode_report, report_out, retag
from policy_agent.traceflow.request import PodDirectory, TraceRequest, TraceUsageError, parse
from policy_agent.traceflow.result import NO_REPORT, OUTCOMES, Copy, Destination, complete, decode
from policy_agent.traceflow.tags import TagRegistry, TagsExhausted, TraceTag, identity, packet_ports
from packetin.tasks import within

if TYPE_CHECKING:
    from policy_agent.ovs.gateway import GatewayPlan

log = logging.getLogger(__name__)

# Seconds a trace packet is still recognised after its trace (its policy packet-ins may trail behind a flood).
LINGER = 5.0
# Copies per second and burst the traceflow meter and channel admit unless configured otherwise.
DEFAULT_BUDGET = (500.0, 200.0)
ERROR = "error"  # a trace that could not run (outcome label of npaudit_traceflow_total)
# Seconds this node gives another node's trace packet to pass its pipeline (copies come within milliseconds).
RECEIVED_TIMEOUT = 2.0


class Switch(Protocol):
    """What a trace needs of the OpenFlow channel."""

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    def send_nowait(self, msg: Any) -> int: ...


@dataclass
class _Running:
    tag: TraceTag
    identity: bytes | None  # live: that of the first real packet copied
    live: bool = False
    frame: bytes = b""  # the traced packet (live: the first copy's)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    copies: list[Copy] = field(default_factory=list)
    peer: PeerNode | None = None  # the node the packet went to through the tunnel, whose report is awaited
    report: Report | None = None
    reported: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class TraceStats:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*OUTCOMES, ERROR), 0))
    suppressed: int = 0  # category-0 packet-ins of trace packets: not audited, not answered
    stray: int = 0  # traceflow copies of no running trace (late, or not ours), reports of none
    received: int = 0  # other nodes' trace packets traced here (their destination), each reported back
    reports: int = 0  # reports of other nodes taken into this node's traces

    def to_json(self) -> dict[str, Any]:
        """For `npaudit status`: traces by outcome since the agent started, suppressed and stray packet-ins,
        other nodes' traces run here and their reports taken."""
        return {"outcomes": dict(self.outcomes), "suppressed": self.suppressed, "stray": self.stray,
                "received": self.received, "reports": self.reports}


def reject_reply(frame: bytes) -> str | None:
    """What the source Pod would receive if a Reject rule stopped `frame` (the agent's own answer)."""
    answer = build_reject(frame)
    if answer is None:
        return None
    if answer_protocol(answer) == IPPROTO_TCP:
        return "a TCP RST"
    return "an ICMP destination unreachable (administratively prohibited)"


def destination(ip: str, dst: Endpoint | None, gateway: GatewayPlan | None) -> Destination:
    """What table 70 does with a packet to `ip`: the Pod `dst`, the node gateway, or nothing."""
    if dst is not None:
        return Destination(ip, f"{dst.pod.namespace}/{dst.pod.name}", dst.ofport)
    if gateway is not None and gateway.routes_to(ip):
        return Destination(ip, None, gateway.ofport, gateway.describe())
    return Destination(ip)


class TraceService:
    """`trace` (the local API op) and `__call__` (the traceflow subscriber)."""

    def __init__(self, switch: Switch, pods: Callable[[], PodDirectory | None],
                 rules: Callable[[int], RuleInfo | None], *, round_: Callable[[], int], meters: Callable[[], bool],
                 budget: tuple[float, float] = DEFAULT_BUDGET, purge: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, linger: float = LINGER,
                 gateway: GatewayPlan | None = None, cross: CrossNode | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._switch = switch
        self._cross = cross  # traces between nodes (None: one node)
        self._gateway = gateway  # where Pods' packets to no Pod go (None: nowhere)
        self._purge = purge  # the datapath's megaflows, so live traffic meets a live trace's flows at once
        self._pods = pods
        self._rules = rules
        self._round = round_
        self._meters = meters
        self._clock = clock
        self._sleep = sleep  # the wait for copy budget, on the same timeline as `clock`
        self._linger = linger
        self.tags = TagRegistry()
        self._running: dict[int, _Running] = {}
        self._cleanups: set[asyncio.Task[None]] = set()
        self.stats = TraceStats()
        # Traces start no faster than the traceflow meter and channel admit their copies: a burst of
        # traces waits its turn rather than losing copies to the meter and timing out.
        rate, burst = budget
        self._budget = TokenBucket(rate, max(burst, MAX_COPIES), clock())

    def set_gateway(self, gateway: GatewayPlan) -> None:
        """The node gateway came up after start (its Pod subnet from the Node object)."""
        self._gateway = gateway

    def waiting(self) -> bool:
        """Whether a trace (this node's, or another node's packet traced here) waits for its copies: the
        OpenFlow channel then reads every packet-in as it comes, a flood's among them (packetin/read_pacing.py)."""
        return bool(self._running)

    async def warm_up(self) -> None:
        """Import scapy off the loop once, so the first trace does not pay for it."""
        await asyncio.to_thread(build_packet, TraceTag(0, "0.0.0.0", "0.0.0.0", 6, 1, 1), "02:00:00:00:00:01", None)

    # --- the subscribers ------------------------------------------------------------------

    def __call__(self, pin: PacketIn) -> None:
        mark = TraceMark.decode(pin.userdata)
        if mark is not None and mark.phase == Phase.FROM_TUNNEL:
            self._received(pin.packet)
            return
        if mark is not None and mark.phase == Phase.REPORT:
            self._report(pin.packet)
            return
        running = self._running.get(mark.tag) if mark is not None else None
        if running is not None and running.identity is None and identity(pin.packet) is not None:
            running.identity, running.frame = identity(pin.packet), pin.packet  # live: the first packet is the one
        if mark is None or running is None or identity(pin.packet) != running.identity:
            self.stats.stray += 1  # late copies of an earlier trace with this tag, or of a later live packet
            return
        running.copies.append(Copy(pin.table_id, mark.phase, pin.rule_id, pin.disposition))
        if complete(running.copies):
            running.done.set()

    # --- between nodes -------------------------------------------------------------------

    def _report(self, frame: bytes) -> None:
        """Another node's report: taken into the running trace it names, from the node it went to."""
        report = decode_report(frame)
        running = self._running.get(report.tag) if report is not None else None
        if report is None or running is None or running.peer is None or running.report is not None \
                or report.identity != running.identity or report.node != running.peer.name:
            self.stats.stray += 1
            return
        self.stats.reports += 1
        running.report = report
        running.reported.set()

    def _received(self, frame: bytes) -> None:
        """Another node's trace packet, out of the tunnel: traced here (in a task), reported back."""
        cross, key = self._cross, identity(frame)
        peer = cross.peer_for(str(ipaddress.IPv4Address(key[2:6]))) if cross is not None and key else None
        try:
            retag(frame, 0)  # a whole IPv4 header, or nothing to trace
        except ValueError:
            peer = None
        if cross is None or key is None or peer is None:
            self.stats.stray += 1  # no node to report to (its source is no routed peer's Pod), or no packet
            return
        task = asyncio.get_running_loop().create_task(self._trace_received(frame, key, peer, cross))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _trace_received(self, frame: bytes, key: bytes, peer: PeerNode, cross: CrossNode) -> None:
        self.stats.received += 1
        origin = f"node {peer.name} ({peer.address})"
        pods = self._pods()
        if pods is None:
            return self._send_report(key, peer, cross, [], {"result": NO_REPORT, "detail": "its agent has not started "
                                                                  "its policy engine yet"})
        if not self._budget.take(self._clock(), MAX_COPIES):
            return self._send_report(key, peer, cross, [], {"result": NO_REPORT, "detail": "too many traces at once "
                                                                  "(traceflow budget spent); try again"})
        try:
            local = self.tags.allocate()
        except TagsExhausted as exc:
            return self._send_report(key, peer, cross, [], {"result": NO_REPORT, "detail": str(exc)})
        flows: list[messages.FlowSpec] = []
        mine = retag(frame, local)
        hold = self.tags.hold(mine)
        try:
            src, dst = str(ipaddress.IPv4Address(key[2:6])), str(ipaddress.IPv4Address(key[6:10]))
            sport, dport = packet_ports(mine)
            tag = TraceTag(local, src, dst, key[1], sport, dport)
            flows = trace_flows(self._round(), tag, meters=self._meters())
            at = pods.by_ip(dst)
            dest = destination(dst, pods.endpoints.get(at) if at is not None else None, self._gateway)
            running = self._running[local] = _Running(tag, identity(mine), frame=mine)
            try:
                await self._switch.install_flows(flows)
                self._switch.send_nowait(messages.packet_out_to_pipeline(mine, cross.tunnel_ofport))
                try:
                    await within(running.done.wait(), RECEIVED_TIMEOUT)
                    timed_out = False
                except asyncio.TimeoutError:
                    timed_out = True
            finally:
                del self._running[local]
            result = decode(running.copies, rules=self._rules, destination=dest, reject_reply=reject_reply(mine),
                            timed_out=timed_out, arrived_from=origin)
            log.info("trace from %s %s -> %s: %s here", origin, src, dst, result.result)
            self._send_report(key, peer, cross, result.observations, result.outcome)
        except (PacketInError, asyncio.TimeoutError) as exc:
            self._send_report(key, peer, cross, [], {"result": NO_REPORT,
                                                     "detail": f"its switch did not take the trace: {exc}"})
        finally:
            asyncio.get_running_loop().call_later(self._linger, self.tags.forget, hold)
            self._finish(local, flows)

    def _send_report(self, key: bytes, peer: PeerNode, cross: CrossNode, observations: list[dict[str, Any]],
                     outcome: dict[str, Any]) -> None:
        frame = encode_report(key[0] >> 2, key, cross.node, observations, outcome, cross.address, peer.address)
        try:
            self._switch.send_nowait(report_out(frame, peer.address, cross.tunnel_ofport))
        except PacketInError as exc:
            log.warning("trace report to node %s not sent: %s", peer.name, exc)

    def may_suppress(self) -> bool:
        """False when `suppress` is False for every packet-in (no trace packet lately)."""
        return self.tags.any_known()

    def suppress(self, pin: PacketIn) -> bool:
        """True for a category-0 packet-in of a trace packet: the dispatcher neither audits nor answers it."""
        if self.tags.match(pin.packet) is None:
            return False
        self.stats.suppressed += 1
        return True

    # --- a trace -----------------------------------------------------------------------

    async def trace(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The local API's answer: {"ok": true, "trace": {...}} or {"ok": false, "errors": [...], "usage": bool}."""
        pods = self._pods()
        if pods is None:
            return {"ok": False, "errors": ["the agent has not started its policy engine yet"], "usage": False}
        started = self._clock()
        try:
            req = parse(request, pods)
            self._one_live_per_pair(req)
            await self._pace()
            tag = TraceTag(self.tags.allocate(), req.source.ip, req.dst_ip, req.proto, req.source_port, req.port)
        except TraceUsageError as exc:
            return {"ok": False, "errors": [str(exc)], "usage": True}
        except TagsExhausted as exc:
            self.stats.outcomes[ERROR] += 1
            return {"ok": False, "errors": [str(exc)], "usage": False}
        key: bytes | None = None
        flows: list[messages.FlowSpec] = []
        try:
            dst = req.destination
            frame = b""
            if not req.live:
                frame = build_packet(tag, req.source.mac, dst.mac if dst is not None else None)
                key = self.tags.hold(frame)
            dest, peer = self._destination(req)
            tunnel = (dest.ofport or 0, peer.address) if peer is not None and not req.live else None
            flows = trace_flows(self._round(), tag, meters=self._meters(), live=req.live, tunnel=tunnel)
            return {"ok": True, "trace": await self._run(req, tag, frame, key, flows, started, dest,
                                                         peer if tunnel is not None else None)}
        except (PacketInError, asyncio.TimeoutError) as exc:
            self.stats.outcomes[ERROR] += 1
            return {"ok": False, "errors": [f"the switch did not take the trace: {exc or type(exc).__name__}"],
                    "usage": False}
        finally:
            if key is not None:
                asyncio.get_running_loop().call_later(self._linger, self.tags.forget, key)
            self._finish(tag.dscp, flows)

    def _one_live_per_pair(self, req: TraceRequest) -> None:
        """Two live traces whose filters overlap would share their packets' copies: refused."""
        if req.live and any(r.live and (r.tag.src, r.tag.dst, r.tag.proto) == (req.source.ip, req.dst_ip, req.proto)
                            for r in self._running.values()):
            raise TraceUsageError(f"live: a live trace {req.source.ip} -> {req.dst_ip} ({req.protocol}) is running "
                                  "already; wait for it to end")

    def _finish(self, dscp: int, flows: list[messages.FlowSpec]) -> None:
        """Remove the trace's flows, then free its tag: behind the answer, which needs neither."""
        async def cleanup() -> None:
            try:
                if flows:
                    await self._remove(flows)
            finally:
                self.tags.release(dscp)
        task = asyncio.get_running_loop().create_task(cleanup())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def close(self) -> None:
        """Wait for the flows of finished traces to be removed (the agent calls this before the channel goes)."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def _remove(self, flows: list[messages.FlowSpec]) -> None:
        """Also after a refused install: a refused batch may have left some of its flows in."""
        try:
            await self._switch.delete_flows(flows)
        except (PacketInError, asyncio.TimeoutError) as exc:
            # They match only this trace's exact packet; the next agent round deletes them.
            log.warning("trace flows of tag %d not removed: %s", flows and dict(flows[0].match).get("ip_dscp"), exc)

    async def _purge_datapath(self) -> None:
        """A megaflow cached before the live trace's flows would carry its packets past them."""
        if self._purge is None:
            return
        try:
            await asyncio.to_thread(self._purge)
        except AgentError as exc:
            log.warning("live trace: %s; packets may pass untraced until OVS revalidates its datapath flows", exc)

    async def _pace(self) -> None:
        while not self._budget.take(self._clock(), MAX_COPIES):
            missing = MAX_COPIES - self._budget.tokens(self._clock())
            await self._sleep(max(missing, 0.5) / self._budget.rate)

    def _destination(self, req: TraceRequest) -> tuple[Destination, PeerNode | None]:
        """Where table 70 sends the trace's packet, and the node whose report to await (Geneve)."""
        cross = self._cross
        peer = cross.peer_for(req.dst_ip) if cross is not None and req.destination is None else None
        if peer is None:
            return destination(req.dst_ip, req.destination, self._gateway), None
        remote = req.remote
        pod = f"{remote.namespace}/{remote.name}" if remote is not None else None
        if cross is not None and cross.geneve:
            return Destination(req.dst_ip, pod, cross.tunnel_ofport, tunnel=(peer.name, peer.address)), peer
        dest = destination(req.dst_ip, None, self._gateway)
        note = f"{dest.gateway}; routed mode: node {peer.name} ({peer.address}) is not traced (Geneve only)"
        return Destination(dest.ip, None, dest.ofport, note if dest.gateway else None), None

    async def _run(self, req: TraceRequest, tag: TraceTag, frame: bytes, key: bytes | None,
                   flows: list[messages.FlowSpec], started: float, dest: Destination,
                   peer: PeerNode | None) -> dict[str, Any]:
        running = self._running[tag.dscp] = _Running(tag, key, req.live, frame, peer=peer)
        try:
            await self._switch.install_flows(flows)
            installed = self._clock()
            if req.live:
                await self._purge_datapath()
            else:
                self._switch.send_nowait(messages.packet_out_to_pipeline(frame, req.source.ofport))
            try:
                await within(running.done.wait(), max(req.timeout - (installed - started), 0.001))
                timed_out = False
            except asyncio.TimeoutError:
                timed_out = True
            result = decode(running.copies, rules=self._rules, destination=dest,
                            reject_reply=reject_reply(running.frame), source_port=req.source.ofport,
                            timed_out=timed_out, live=req.live)
            tunneled = peer is not None and bool(result.observations) and result.observations[-1]["action"] == "tunnel"
            if tunneled and running.report is None:
                try:
                    await within(running.reported.wait(), max(req.timeout - (self._clock() - started), 0))
                except asyncio.TimeoutError:
                    pass
        finally:
            del self._running[tag.dscp]
        if tunneled and peer is not None and self._cross is not None:
            result.observations, result.outcome = merge(self._cross.node, result.observations, peer, running.report,
                                                        self._clock() - started)
        self.stats.outcomes[result.result if result.result in self.stats.outcomes else ERROR] += 1
        elapsed = (self._clock() - started) * 1000
        log.info("trace %s -> %s %s/%s: %s in %.1f ms (flows in after %.1f ms)", req.describe()["from"]["pod"],
                 req.dst_ip, req.protocol, req.port, result.result, elapsed, (installed - started) * 1000)
        described = req.describe()
        if req.live and running.frame:
            described["source_port"] = packet_ports(running.frame)[0]  # the real packet's
        return {**described, "tag": tag.dscp, "observations": result.observations,
                "outcome": result.outcome, "elapsed_ms": round(elapsed, 3)}
