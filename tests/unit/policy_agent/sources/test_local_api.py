"""The local API answers every request with a frame, and what `npaudit apply` prints is one line per error."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import struct
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from policy_agent import rpc
from policy_agent.errors import printable
from policy_agent.sources.local_api import LocalApi
from tests.support.fake_local_agent import apply, fake_agent


class _Engine:
    """Just what LocalApi.handle reads before it hands a set to the engine."""

    def __init__(self, tiers: Any = None, fail: BaseException | None = None) -> None:
        self._tiers, self._fail = tiers or {}, fail

    @property
    def tiers(self) -> Any:
        if self._fail is not None:
            raise self._fail
        return self._tiers


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="npa-api-", dir="/tmp"))  # AF_UNIX paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _ask(path: Path, engine: _Engine, request: dict[str, Any]) -> dict[str, Any]:
    """Send `request` as ASCII JSON (so lone surrogates travel as \\ud800 escapes), return the reply."""
    body = json.dumps(request).encode("ascii")

    def client() -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(path))
            sock.sendall(struct.pack(">I", len(body)) + body)
            return rpc.recv_message(sock)

    async def main() -> dict[str, Any]:
        api = LocalApi(path, engine)  # type: ignore[arg-type]
        await api.start()
        try:
            return await asyncio.to_thread(client)
        finally:
            await api.close()
    return asyncio.run(main())


def test_an_agent_side_exception_reaches_the_client_as_one_line(sock_dir: Path) -> None:
    engine = _Engine(fail=RuntimeError("tier table gone\nsecond line"))
    reply = _ask(sock_dir / "api.sock", engine, {"op": "apply", "manifests": "", "source": "t"})
    assert reply == {"ok": False, "errors": ["internal error: RuntimeError: tier table gone\\nsecond line"]}


def test_an_error_naming_a_lone_surrogate_is_answered_escaped(sock_dir: Path) -> None:
    # A file name that is not UTF-8 reaches Python with surrogate escapes; here it names a YAML error.
    request = {"op": "apply", "manifests": "a: [", "source": "caf\udce9.yaml"}
    reply = _ask(sock_dir / "api.sock", _Engine(), request)
    assert reply["ok"] is False and len(reply["errors"]) == 1, reply
    assert reply["errors"][0].startswith("caf\\udce9.yaml: invalid YAML at line 2"), reply


def test_apply_prints_control_characters_from_names_escaped(sock_dir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    agent = fake_agent(sock_dir / "api.sock", {"ok": False, "errors": [
        "Namespace/a\x1b[31mred (m.yaml#1): metadata.name: must be a DNS-1123 label",
        "Pod/x/p\nerror: forged second error"]})
    rc, err = apply(sock_dir, capsys)
    agent.close()
    assert rc == 1
    assert err.splitlines() == [
        "error: Namespace/a\\x1b[31mred (m.yaml#1): metadata.name: must be a DNS-1123 label",
        "error: Pod/x/p\\nerror: forged second error"], err


@pytest.mark.parametrize("raw, shown", [
    ("plain", "plain"), ("tab\there", "tab\\there"), ("bell\x07", "bell\\x07"), ("del\x7f", "del\\x7f"),
    ("c1\x9b", "c1\\x9b"), ("ls\u2028", "ls\\u2028"), ("bidi\u202e", "bidi\\u202e"),
    ("sur\udc80", "sur\\udc80"), ("café ✓", "café ✓"),
])
def test_printable_escapes_what_a_terminal_or_utf8_cannot_take(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_a_client_that_hangs_up_is_one_log_line_without_a_traceback(sock_dir: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Clients that close mid-frame or right after their request: each costs the log at most one line."""
    path = sock_dir / "api.sock"
    body = json.dumps({"op": "status"}).encode("ascii")
    sends = [struct.pack(">I", 100) + b"x" * 10, struct.pack(">I", len(body)) + body, b"\x00\x00"] * 5

    def clients() -> None:
        for data in sends:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(path))
                sock.sendall(data)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset

    async def main() -> None:
        api = LocalApi(path, _Engine())  # type: ignore[arg-type]
        await api.start()
        try:
            await asyncio.to_thread(clients)
            await asyncio.sleep(0.5)  # the server's side of the last connections
        finally:
            await api.close()

    caplog.set_level("DEBUG", logger="policy_agent.sources.local_api")
    asyncio.run(main())
    records = [r for r in caplog.records if r.name == "policy_agent.sources.local_api" and r.levelname != "DEBUG"]
    assert 10 <= len(records) <= len(sends), [r.getMessage() for r in records]
    assert all(r.exc_info is None and "\n" not in r.getMessage() for r in records), [r.getMessage() for r in records]
