"""A fake agent on the CNI socket and a runner of the `npaudit cni` plugin, for the plugin's tests."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Coroutine, Iterator

import pytest
from hypothesis import strategies as st

from policy_agent import rpc
from policy_agent.cni import wire
from policy_agent.cni.plugin import run
from policy_agent.cni.server import CniServer
from policy_agent.cni.wire import CniError, CniRequest

RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
          "ips": [{"address": "10.245.0.2/24", "gateway": "10.245.0.1", "interface": 0}],
          "routes": [], "dns": {}}


class FakeHandler:
    """Records requests; answers from `known`, or raises what a test put in `fail`."""

    def __init__(self) -> None:
        self.requests: list[CniRequest] = []
        self.known: set[str] = {"c1"}
        self.fail: BaseException | None = None

    async def _common(self, req: CniRequest) -> None:
        self.requests.append(req)
        if self.fail is not None:
            raise self.fail
        if req.container_id not in self.known:
            raise CniError(wire.ERR_UNKNOWN_CONTAINER, f"container {req.container_id} unknown")

    async def add(self, req: CniRequest) -> dict[str, Any]:
        await self._common(req)
        return {**RESULT, "cniVersion": req.cni_version}

    async def delete(self, req: CniRequest) -> None:
        await self._common(req)

    async def check(self, req: CniRequest) -> None:
        await self._common(req)


class LoopThread:
    """An event loop in a thread, so the blocking plugin can talk to an asyncio server."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 5.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


class Agent:
    def __init__(self, path: Path, handler: FakeHandler, server: CniServer, lt: LoopThread) -> None:
        self.path, self.handler, self.server, self.lt = path, handler, server, lt


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="cnit", dir="/tmp"))  # AF_UNIX paths are limited to 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def agent(tmp: Path) -> Iterator[Agent]:
    lt = LoopThread()
    handler = FakeHandler()
    path = tmp / "run" / "cni.sock"
    server = CniServer(path, handler, read_timeout=2.0)
    lt.run(server.start())
    try:
        yield Agent(path, handler, server, lt)
    finally:
        lt.run(server.close(grace=1.0))
        lt.stop()


def netconf(sock: Path | str, **extra: Any) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit", "agentSocket": str(sock),
            "ipam": {"type": "host-local"}, **extra}


def env(command: str = "ADD", **extra: str) -> dict[str, str]:
    base = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/pod1",
            "CNI_IFNAME": "eth0", "CNI_PATH": "/opt/cni/bin",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"}
    base.update(extra)
    return {k: v for k, v in base.items() if v != "<unset>"}


def invoke(environ: dict[str, str], conf: Any) -> tuple[int, str]:
    out = io.StringIO()
    stdin = conf if isinstance(conf, bytes) else json.dumps(conf).encode()
    return run(environ, stdin, out), out.getvalue()


def _exchange(path: Path, data: bytes) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(data)
        return rpc.recv_message(s)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
