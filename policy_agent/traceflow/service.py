"""Runs traces on the agent: tag, flows in, packet out, copies collected, flows out, tag released.

The category-1 (traceflow) subscriber and the local API's "trace" op meet here. Copies of a
running trace arrive through the traceflow channel, with its own meter and token bucket, so a
flood of policy packet-ins delays no trace. The category-0 dispatcher asks `suppress` for each
policy packet-in: a trace packet that meets a logged or Reject rule is neither audited nor
answered, only counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from packetin import messages
from packetin.errors import PacketInError
from packetin.model import PacketIn
from policy_agent.policy.rules import RuleInfo
from policy_agent.policy_packetins import build_reject
from policy_agent.traceflow.flows import Phase, TraceMark, trace_flows
from policy_agent.traceflow.packet import build_packet
from policy_agent.traceflow.request import PodDirectory, TraceRequest, TraceUsageError, parse
from policy_agent.traceflow.result import OUTCOMES, Copy, Destination, complete, decode
from policy_agent.traceflow.tags import TagRegistry, TagsExhausted, TraceTag

log = logging.getLogger(__name__)

# Seconds a released tag still marks its trace's packet-ins (they may trail in the policy channel).
LINGER = 5.0
ERROR = "error"  # a trace that could not run (outcome label of npaudit_traceflow_total)


class Switch(Protocol):
    """What a trace needs of the OpenFlow channel."""

    async def install_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    async def delete_flows(self, flows: Sequence[messages.FlowSpec]) -> None: ...

    def send_nowait(self, msg: Any) -> int: ...


@dataclass
class _Running:
    tag: TraceTag
    done: asyncio.Event = field(default_factory=asyncio.Event)
    copies: list[Copy] = field(default_factory=list)


@dataclass
class TraceStats:
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys((*OUTCOMES, ERROR), 0))
    suppressed: int = 0  # category-0 packet-ins of trace packets: not audited, not answered
    stray: int = 0  # traceflow copies of no running trace (late, or not ours)


def reject_reply(frame: bytes) -> str | None:
    """What the source Pod would receive if a Reject rule stopped `frame` (the agent's own answer)."""
    answer = build_reject(frame)
    if answer is None:
        return None
    return "a TCP RST" if answer[23] == 6 else "an ICMP destination unreachable (administratively prohibited)"


class TraceService:
    """`trace` (the local API op) and `__call__` (the traceflow subscriber)."""

    def __init__(self, switch: Switch, pods: Callable[[], PodDirectory | None],
                 rules: Callable[[int], RuleInfo | None], *, round_: Callable[[], int], meters: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic, linger: float = LINGER) -> None:
        self._switch = switch
        self._pods = pods
        self._rules = rules
        self._round = round_
        self._meters = meters
        self._clock = clock
        self._linger = linger
        self.tags = TagRegistry()
        self._running: dict[int, _Running] = {}
        self.stats = TraceStats()

    async def warm_up(self) -> None:
        """Import scapy off the loop once, so the first trace does not pay for it."""
        await asyncio.to_thread(build_packet, TraceTag(0, "0.0.0.0", "0.0.0.0", 6, 1, 1), "02:00:00:00:00:01", None)

    # --- the subscribers ------------------------------------------------------------------

    def __call__(self, pin: PacketIn) -> None:
        mark = TraceMark.decode(pin.userdata)
        running = self._running.get(mark.tag) if mark is not None else None
        if mark is None or running is None:
            self.stats.stray += 1
            return
        running.copies.append(Copy(pin.table_id, mark.phase, pin.rule_id, pin.disposition))
        if complete(running.copies):
            running.done.set()

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
        try:
            req = parse(request, pods)
            tag = self.tags.allocate(req.source.ip, req.dst_ip, req.proto, req.source_port, req.port)
        except TraceUsageError as exc:
            return {"ok": False, "errors": [str(exc)], "usage": True}
        except TagsExhausted as exc:
            self.stats.outcomes[ERROR] += 1
            return {"ok": False, "errors": [str(exc)], "usage": False}
        try:
            return {"ok": True, "trace": await self._run(req, tag)}
        except (PacketInError, asyncio.TimeoutError) as exc:
            self.stats.outcomes[ERROR] += 1
            return {"ok": False, "errors": [f"the switch did not take the trace: {exc or type(exc).__name__}"],
                    "usage": False}
        finally:
            asyncio.get_running_loop().call_later(self._linger, self.tags.forget, tag)

    async def _run(self, req: TraceRequest, tag: TraceTag) -> dict[str, Any]:
        started = self._clock()
        dst = req.destination
        frame = build_packet(tag, req.source.mac, dst.mac if dst is not None else None)
        flows = trace_flows(self._round(), tag, meters=self._meters())
        running = self._running[tag.dscp] = _Running(tag)
        try:
            await self._switch.install_flows(flows)
            try:
                self._switch.send_nowait(messages.packet_out_to_pipeline(frame, req.source.ofport))
                left = req.timeout - (self._clock() - started)
                try:
                    await asyncio.wait_for(running.done.wait(), max(left, 0.001))
                    timed_out = False
                except asyncio.TimeoutError:
                    timed_out = True
            finally:
                await self._switch.delete_flows(flows)
        finally:
            del self._running[tag.dscp]
        result = decode(running.copies, rules=self._rules,
                        destination=Destination(req.dst_ip, None if dst is None else
                                                f"{dst.pod.namespace}/{dst.pod.name}",
                                                None if dst is None else dst.ofport),
                        reject_reply=reject_reply(frame), source_port=req.source.ofport, timed_out=timed_out)
        self.stats.outcomes[result.result] += 1
        elapsed = (self._clock() - started) * 1000
        log.info("trace %s -> %s %s/%s: %s in %.1f ms", req.describe()["from"]["pod"], req.dst_ip, req.protocol,
                 req.port, result.result, elapsed)
        return {**req.describe(), "tag": tag.dscp, "observations": result.observations,
                "outcome": result.outcome, "elapsed_ms": round(elapsed, 3)}
