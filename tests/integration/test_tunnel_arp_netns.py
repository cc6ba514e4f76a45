"""The next-hop ARP exchange (policy_agent/ovs/tunnel_neighbours.py `_ask`) on a veth pair between two
namespaces of the test's own: the peer's kernel answers, a second target nobody holds does not."""

from __future__ import annotations

import secrets
import subprocess
import time
from functools import partial
from typing import Iterator

import pytest

from meters.netns import call_in_netns
from policy_agent.ovs.tunnel_neighbours import _ask

SILENT_WAIT = 3.0


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def pair() -> Iterator[tuple[str, str, str]]:
    """(our namespace, our interface, the peer's MAC): 192.0.2.1/24 here, 192.0.2.2/24 across the pair."""
    tag = secrets.token_hex(3)
    here, there = f"npta-{tag}", f"nptb-{tag}"
    _ip("netns", "add", here)
    try:
        _ip("netns", "add", there)
        try:
            _ip("-n", here, "link", "add", "ua", "type", "veth", "peer", "name", "ub", "netns", there)
            _ip("-n", here, "addr", "add", "192.0.2.1/24", "dev", "ua")
            _ip("-n", there, "addr", "add", "192.0.2.2/24", "dev", "ub")
            _ip("-n", here, "link", "set", "ua", "up")
            _ip("-n", there, "link", "set", "ub", "up")
            mac = subprocess.run(["ip", "-n", there, "-br", "link", "show", "ub"], check=True, capture_output=True,
                                 text=True).stdout.split()[2]
            yield here, "ua", mac
        finally:
            subprocess.run(["ip", "netns", "delete", there], capture_output=True)
    finally:
        subprocess.run(["ip", "netns", "delete", here], capture_output=True)


def test_an_answer_is_handed_on_as_it_comes_while_a_silent_target_is_still_waited_for(
        pair: tuple[str, str, str]) -> None:
    netns, interface, mac = pair
    heard: list[tuple[str, str, float]] = []
    start = time.monotonic()
    got = call_in_netns(netns, partial(_ask, interface, "192.0.2.1", ["192.0.2.2", "192.0.2.9"], SILENT_WAIT,
                                       lambda ip, m: heard.append((ip, m, time.monotonic()))))
    ended = time.monotonic()
    assert got == {"192.0.2.2": mac}
    assert [(ip, m) for ip, m, _ in heard] == [("192.0.2.2", mac)]  # once, though the kernel may answer twice
    # Handed on before the silent target's wait ran out, not with the return after it.
    assert ended - start >= SILENT_WAIT and heard[0][2] < start + SILENT_WAIT - 0.5
