"""The agent's local API on a unix socket (mode 0600): `npaudit apply|delete -f` in standalone mode,
`npaudit syslog status`, `npaudit status|stats`, `npaudit trace`, `npaudit get`.

Framed by policy_agent.rpc (4-byte length + JSON), like the CNI socket. A request is one
transaction: the set is validated as a whole (against the Tiers the agent already has), the
engine compiles it, its intent is written, the switch takes it atomically, the applied store
records it (sources/apply_intent.py), and only then is the reply sent. Any failure rejects
the whole set with one line per problem and leaves the agent, OVS and the store as they were.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Protocol, Sized

from auditlog.syslog.status import SyslogStatus

from policy_agent.errors import AgentError, PolicyRejected, one_line, printable
from policy_agent.sources.applied_store import AppliedStore
from policy_agent.sources.apply_intent import StoreIntent
from policy_agent.sources.inventory import InventoryEngine, answer
# The client side (op names, call, OutcomeUnknown) lives in rpc.py; imported from here too.
from policy_agent.rpc import (GET_OP, STATUS_OP, SYSLOG_STATUS_OP, TRACE_OP, ConnectionClosed, FrameError,
                              read_message, write_message)
from policy_agent.rpc import OutcomeUnknown as OutcomeUnknown, call as call  # noqa: F401  (re-exported)
from policy_agent.policy.manifests import ManifestError, ObjectSet, load_text
from policy_agent.policy.model import Namespace, Pod, Policy, Tier

log = logging.getLogger(__name__)


def counts(objs: ObjectSet) -> dict[str, int]:
    return {"namespaces": len(objs.namespaces), "pods": len(objs.pods), "tiers": len(objs.tiers),
            "policies": len(objs.policies)}




class ApiEngine(Protocol):
    """What the local API needs of the policy engine (policy_agent/engine.py): its tiers and rules, and
    changes kept through a persist hook."""

    @property
    def registry(self) -> Sized: ...

    @property
    def tiers(self) -> dict[str, Tier]: ...

    async def apply(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                    tiers: Iterable[Tier] = (), policies: Iterable[Policy] = (), *,
                    persist: StoreIntent | None = None) -> None: ...

    async def delete(self, namespaces: Iterable[Namespace] = (), pods: Iterable[Pod] = (),
                     tiers: Iterable[Tier] = (), policies: Iterable[Policy] = (), *,
                     persist: StoreIntent | None = None) -> None: ...


class LocalApi:
    def __init__(self, socket_path: Path, engine: ApiEngine, store: AppliedStore | None = None,
                 syslog_status: Callable[[], SyslogStatus] | None = None,
                 status: Callable[[], Awaitable[dict[str, Any]]] | None = None,
                 trace: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.socket_path = socket_path
        self._engine = engine
        self._store = store
        self._syslog_status = syslog_status
        self._status = status
        self._trace = trace
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        old = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        finally:
            os.umask(old)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await read_message(reader)
                response = await self.handle(request)
            except ConnectionClosed as exc:  # a client that went away: nobody to answer
                log.info("local API client hung up before its request was whole: %s", one_line(exc))
                return
            except FrameError as exc:
                response = {"ok": False, "errors": [str(exc)]}
            except Exception as exc:  # the client gets one line, never a connection closed on it
                log.error("local API request failed: %s", one_line(exc))
                log.debug("local API request failed", exc_info=True)
                response = {"ok": False, "errors": [f"internal error: {one_line(exc)}"]}
            if not response.get("ok"):  # names from the request can hold lone surrogates or control characters
                response["errors"] = [printable(str(line)) for line in response.get("errors", [])]
            await write_message(writer, response)
        except ConnectionError as exc:  # hung up before the reply: one line, no traceback (a client can do it at will)
            log.info("local API client hung up before its reply: %s", one_line(exc))
        except Exception as exc:  # one bad client must not take the API down
            log.warning("local API request failed: %s", one_line(exc))
            log.debug("local API request failed", exc_info=True)
        finally:
            writer.close()

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == SYSLOG_STATUS_OP:  # off the loop: forwarders in child processes answer over a pipe
            return await asyncio.to_thread(self.syslog_status)
        if op == STATUS_OP:
            return await self.status()
        if op == GET_OP:  # what is in force (npaudit get): read on the loop, between changes
            if not isinstance(self._engine, InventoryEngine):
                return {"ok": False, "errors": ["this agent lists nothing"]}
            return answer(self._engine, request)
        if op == TRACE_OP:  # one packet through the pipeline (policy_agent/traceflow)
            if self._trace is None:
                return {"ok": False, "errors": ["this agent runs no traces"]}
            return await self._trace(request)
        if op not in ("apply", "delete"):
            return {"ok": False, "errors": [f"op: must be apply, delete, {STATUS_OP}, {SYSLOG_STATUS_OP}, "
                                            f"{GET_OP} or {TRACE_OP}, got {op!r}"]}
        text = request.get("manifests")
        if not isinstance(text, str):
            return {"ok": False, "errors": ["manifests: must be a string"]}
        try:
            objs = load_text(text, str(request.get("source") or "<request>"), known_tiers=self._engine.tiers)
        except ManifestError as exc:
            return {"ok": False, "errors": exc.errors}
        change = self._engine.apply if op == "apply" else self._engine.delete
        try:
            await change(objs.namespaces, objs.pods, objs.tiers, objs.policies,
                         persist=None if self._store is None else self._intent(op, text))
        except PolicyRejected as exc:
            return {"ok": False, "errors": exc.errors}
        except AgentError as exc:
            log.error("%s from %s failed, nothing applied: %s", op, request.get("source"), exc)
            return {"ok": False, "errors": [str(exc)]}
        log.info("%s from %s: %s", op, request.get("source"), counts(objs))
        return {"ok": True, op: counts(objs), "rules": len(self._engine.registry)}

    def syslog_status(self) -> dict[str, Any]:
        """Read-only: each syslog forwarder's snapshot and the writer's newest seq (no destinations: an empty list)."""
        status = self._syslog_status() if self._syslog_status is not None else SyslogStatus(None)
        return {"ok": True, "syslog": status.to_json()}

    async def status(self) -> dict[str, Any]:
        """Read-only: the agent's status snapshot (policy_agent/status.py says what is in it)."""
        if self._status is None:
            return {"ok": False, "errors": ["this agent serves no status"]}
        return {"ok": True, "status": await self._status()}

    def _intent(self, op: str, text: str) -> StoreIntent:
        """The engine's persist hook: the change's intent, then the applied store, around the commit."""
        store = self._store
        if store is None:
            raise AgentError("the local API keeps changes only with an applied store")
        return StoreIntent(store, op, text, lambda: self._engine.tiers)
