"""OpenFlowChannel's atomic flow changes: one OpenFlow bundle, sent and committed in two round trips.

The switch answers the messages of one connection in order, so requests can be
pipelined: open + every add + a barrier go out in one write (the barrier's reply
follows the open's and every add's error), then commit + a barrier. The adds are
confirmed before the commit because OVS refuses a flow_mod it cannot decode at
ADD_MESSAGE time and would then commit the bundle without it (not atomic).
A mixin of OpenFlowChannel (packetin/channel.py): it uses that connection's state.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Sequence

from os_ken.ofproto import ofproto_v1_5 as ofp

from packetin import bundles, messages
from packetin.desired_state import DesiredState
from packetin.errors import ChannelClosed, OpenFlowError
from packetin.refusals import raise_first, refusal
from packetin.tasks import within

# Bundles of at most this many flows are encoded on the event loop (a few µs each with the
# struct encoder, bench/flow_encoder.py: less than a thread hop); bigger ones in a thread.
LOOP_ENCODE_FLOWS = 64


class BundleExchange:
    """commit_flows and the bundle exchange behind it (the channel's replay uses `_bundle` too)."""

    settings: Any
    _desired: DesiredState
    _errors: dict[int, Any]
    _pending: dict[int, asyncio.Future[Any]]
    _bundle_id: int
    _bundle_lock: asyncio.Lock
    _proto: Any

    def _next_xid(self) -> int:
        raise NotImplementedError

    def _send_raw(self, data: bytes) -> None:
        raise NotImplementedError

    async def request(self, msg: Any) -> Any:
        raise NotImplementedError

    async def commit_flows(self, install: Sequence[messages.FlowSpec], delete: Sequence[messages.FlowSpec]) -> None:
        """Install and delete flows as one atomic, ordered bundle: the switch applies all of it or
        none. Returns once the commit and a barrier are confirmed. A refusal (OpenFlowError naming
        the flow) leaves the switch and the desired state as they were; so does a connection lost
        before the commit. Lost after it (ChannelClosed), the outcome is unknown until the
        reconnect, whose replay brings the switch back to the desired state, which stays the old one.
        """
        if not install and not delete:
            return
        async with self._bundle_lock:
            raise_first(await self._bundle(install, delete))
        self._desired.flows.update((f.key, f) for f in install)
        for f in delete:
            self._desired.flows.pop(f.key, None)

    async def _bundle(self, install: Sequence[messages.FlowSpec],
                      delete: Sequence[messages.FlowSpec]) -> dict[int, OpenFlowError]:
        """Send one bundle and commit it (call holding _bundle_lock). Returns {} once the commit
        is confirmed, else the switch's refusals by index (install first): nothing changed then."""
        specs = [*install, *delete]
        self._bundle_id = self._bundle_id % 0xFFFFFFFF + 1
        bundle_id, xids = self._bundle_id, [self._next_xid() for _ in specs]
        if len(specs) > LOOP_ENCODE_FLOWS:
            # Encoding thousands of flow_mods takes a while: off the loop, which keeps answering echo.
            wire_bytes = await asyncio.to_thread(bundles.encode_flows, bundle_id, install, delete, xids)
        else:
            wire_bytes = bundles.encode_flows(bundle_id, install, delete, xids)
        what = [f.describe() for f in install] + ["delete " + f.describe() for f in delete]
        self._errors.update(dict.fromkeys(xids))
        try:
            # Raises if the open is refused; a refused add means no commit at all.
            await self._pipelined([bundles.control(bundle_id, ofp.OFPBCT_OPEN_REQUEST)], wire_bytes)
            refused = self._refusals(xids, what)
            if refused:
                with contextlib.suppress(OpenFlowError, ChannelClosed, asyncio.TimeoutError):
                    await self.request(bundles.control(bundle_id, ofp.OFPBCT_DISCARD_REQUEST))
                return refused
            return await self._commit(bundle_id, specs, xids, what)
        finally:
            for xid in xids:
                self._errors.pop(xid, None)

    async def _commit(self, bundle_id: int, specs: list[messages.FlowSpec], xids: list[int],
                      what: list[str]) -> dict[int, OpenFlowError]:
        try:
            await self._pipelined([bundles.control(bundle_id, ofp.OFPBCT_COMMIT_REQUEST)])
        except OpenFlowError:
            # The switch names the failing message with an error of its own, sent before the commit's.
            refused = self._refusals(xids, what)
            if refused:
                return refused
            raise
        except (ChannelClosed, asyncio.TimeoutError) as exc:
            self._desired.in_doubt.update((f.key, f) for f in specs)
            if self._proto is not None and self._proto.transport is not None:
                self._proto.transport.abort()  # a silent switch: reconnect, and the replay settles it
            raise ChannelClosed(f"no answer from {self.settings.target} to the commit of bundle {bundle_id} "
                                f"({len(specs)} flows): outcome unknown until the reconnect") from exc
        return {}

    async def _pipelined(self, requests: list[Any], raw: bytes = b"") -> list[Any]:
        """Send `requests`, then `raw` (messages answered only by errors), then a barrier, in one
        write; return the requests' replies once all are in: one round trip. A refused request
        raises its OpenFlowError (the first one's, in order)."""
        xids = [self._next_xid() for _ in range(len(requests) + 1)]
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in xids]
        self._pending.update(zip(xids, futs))
        try:
            self._send_raw(b"".join(messages.serialize(msg, xid) for msg, xid in zip(requests, xids)) + raw +
                           messages.serialize(messages.barrier(), xids[-1]))
            return [await within(fut, self.settings.request_timeout) for fut in futs][:-1]
        finally:
            for xid, fut in zip(xids, futs):
                self._pending.pop(xid, None)
                if fut.done() and not fut.cancelled():
                    fut.exception()  # read: one failing after an earlier one did is no "never retrieved"

    def _refusals(self, xids: list[int], what: list[str]) -> dict[int, OpenFlowError]:
        return {i: refusal(err, None, what[i], xid) for i, xid in enumerate(xids)
                if (err := self._errors.get(xid)) is not None}
