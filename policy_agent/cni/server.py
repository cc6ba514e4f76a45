"""The agent's CNI server: a unix socket that turns plugin requests into CniHandler calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from policy_agent.cni.wire import (
    ERR_INTERNAL, ERR_UNKNOWN_CONTAINER, CniError, CniRequest, error_response, ok_response, read_request,
    write_response,
)
from policy_agent.errors import AgentError
from packetin.tasks import within

log = logging.getLogger(__name__)


class CniServerError(AgentError):
    """The CNI socket cannot be served (path taken, another agent listening, bad directory)."""


class CniHandler(Protocol):
    """What the server calls; each method raises CniError(code, msg, details) on failure."""

    async def add(self, req: CniRequest) -> dict[str, Any]: ...

    async def delete(self, req: CniRequest) -> None: ...

    async def check(self, req: CniRequest) -> None: ...


class CniServer:
    """Serves one request per connection on `socket_path` (mode 0600, parent directory 0750)."""

    def __init__(self, socket_path: Path, handler: CniHandler, *, max_concurrent: int = 32,
                 read_timeout: float = 10.0) -> None:
        self.socket_path = Path(socket_path)
        self._handler = handler
        # Requests beyond this wait for a slot instead of piling work onto OVSDB and netlink.
        self._slots = asyncio.Semaphore(max_concurrent)
        self._read_timeout = read_timeout
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # (command, outcome) -> count, outcome "ok" or the CNI error code.
        self.requests: Counter[tuple[str, str]] = Counter()

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start(self) -> None:
        sock = await asyncio.to_thread(self._bind)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        log.info("CNI server listening on %s", self.socket_path)

    def _bind(self) -> socket.socket:
        path = self.socket_path
        parent = path.parent
        if not parent.exists():
            parent.mkdir(parents=True, mode=0o750)
            os.chmod(parent, 0o750)  # mkdir's mode is filtered by the umask
        elif parent.stat().st_mode & 0o002 and not parent.stat().st_mode & stat.S_ISVTX:
            raise CniServerError(f"{parent} is world-writable: anyone could replace the CNI socket")
        self._clear_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            # Restrict before listen(): until then connect() is refused, so no
            # client ever reaches the socket with umask-derived permissions. This
            # avoids changing the process-wide umask under other threads.
            os.chmod(path, 0o600)
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise CniServerError(f"cannot serve CNI on {path}: {exc}") from exc
        self._inode = path.stat().st_ino
        return sock

    @staticmethod
    def _clear_stale(path: Path) -> None:
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise CniServerError(f"{path} exists and is not a socket; not removing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)  # left behind by an agent that died
            return
        finally:
            probe.close()
        raise CniServerError(f"another process is serving {path}")

    async def close(self, grace: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace` seconds, cancel the rest."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        # Remove the socket only if it is still ours (a new agent may have replaced it).
        with contextlib.suppress(OSError):
            if self._inode is not None and self.socket_path.stat().st_ino == self._inode:
                self.socket_path.unlink()
        self._inode = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            response = await self._respond(reader)
            with contextlib.suppress(ConnectionError, OSError):
                await write_response(writer, response)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _respond(self, reader: asyncio.StreamReader) -> dict[str, Any]:
        command, started = "?", time.monotonic()
        req: CniRequest | None = None
        try:
            req = await within(read_request(reader), self._read_timeout)
            command = req.command
            async with self._slots:
                result = await self._dispatch(req)
        except CniError as err:
            self.requests[(command, str(err.code))] += 1
            if err.code == ERR_UNKNOWN_CONTAINER:  # routine: runtimes repeat DEL
                log.info("CNI %s %s: %s", command, _who(req), err)
            else:
                log.warning("CNI %s %s failed (code %d): %s", command, _who(req), err.code, err)
            return error_response(err)
        except (asyncio.TimeoutError, ConnectionError, OSError) as exc:
            self.requests[(command, "io")] += 1
            log.warning("CNI request dropped: %s", exc or type(exc).__name__)
            return error_response(CniError(ERR_INTERNAL, "request not received", type(exc).__name__))
        except Exception as exc:  # a handler bug must not take the server down
            self.requests[(command, str(ERR_INTERNAL))] += 1
            log.exception("CNI %s %s: unexpected error", command, _who(req))
            return error_response(CniError(ERR_INTERNAL, f"npaudit agent failed {command}",
                                           f"{type(exc).__name__}: {exc}"))
        self.requests[(command, "ok")] += 1
        log.info("CNI %s %s ok in %.0f ms", command, _who(req), (time.monotonic() - started) * 1000)
        return ok_response(result)

    async def _dispatch(self, req: CniRequest) -> dict[str, Any] | None:
        if req.command == "ADD":
            return await self._handler.add(req)
        if req.command == "DEL":
            await self._handler.delete(req)
        else:
            await self._handler.check(req)
        return None


def _who(req: CniRequest | None) -> str:
    return f"container={req.container_id} pod={req.pod}" if req is not None else "(unparsed request)"
