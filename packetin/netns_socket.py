"""Open a socket inside another network namespace (e.g. to reach 127.0.0.1 of the OVS namespace)."""

from __future__ import annotations

import socket

from meters.netns import call_in_netns


def socket_in_netns(netns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that lives in network namespace `netns` (a name under /run/netns) for life;
    the caller's own namespace never changes."""
    return call_in_netns(netns, lambda: socket.socket(family, kind))
