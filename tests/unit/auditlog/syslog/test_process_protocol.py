"""The forwarder child's pipes carry JSON, never pickle: the destination goes over whole, and a reply that is no
stats (or a pickle) is ignored, not turned into objects."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from auditlog.syslog.destination import Destination, make_destination
from auditlog.syslog.forwarder import ForwarderStats
from auditlog.syslog.process import ProcessForwarder, destination_from_json, destination_to_json
from auditlog.syslog.transport import TlsOptions


def over_the_pipe(dest: Destination) -> Destination:
    return destination_from_json(json.loads(json.dumps(destination_to_json(dest))))


@pytest.mark.parametrize("dest", [
    make_destination("udp://[fd00::1]:514", node_name="node a", facility="local3", udp_max_bytes=1400),
    make_destination("tcp://siem.example:6000", node_name="n", framing="lf", batch_records=7, batch_bytes=9000,
                     checkpoint_interval=0.5, checkpoint_records=70, window_batches=2, window_bytes=65536,
                     receive_buffer_bytes=0),
    make_destination("tls://10.0.0.1:6514", node_name="n", tls=TlsOptions(ca=Path("/etc/ca.pem"),
                     cert=Path("/etc/c.pem"), key=Path("/etc/k.pem"), server_name="siem.example")),
    make_destination("tls://10.0.0.1:6514", node_name="n", tls=TlsOptions()),
], ids=["udp", "tcp-lf", "tls-client-cert", "tls-system-store"])
def test_a_destination_goes_over_the_pipe_whole(dest: Destination) -> None:
    assert over_the_pipe(dest) == dest


class _Canary:
    """Unpickling this writes a file: proof that a pickle was turned into objects."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.path,))


def test_a_reply_that_is_a_pickle_or_not_stats_is_ignored_and_a_good_one_taken(tmp_path: Path) -> None:
    dest = make_destination("tcp://127.0.0.1:9", node_name="n")
    fwd = ProcessForwarder(dest, live=tmp_path / "audit.jsonl", checkpoint=tmp_path / "ck.json")
    r, w = os.pipe()
    replies, child = Connection(r, writable=False), Connection(w, readable=False)
    fwd._replies, fwd._numbered = replies, 3
    try:
        canary = tmp_path / "unpickled"
        child.send_bytes(pickle.dumps((3, _Canary(canary))))
        assert fwd._reply(0.2) is None and not canary.exists()
        stats = ForwarderStats("tcp://127.0.0.1:9", True, 5, 0, None, 5, 0, 0, 0, 0, receiver_wait_s=0.5)
        wrong = {**dataclasses.asdict(stats), "sent": "5"}
        child.send_bytes(json.dumps({"n": 3, "stats": wrong}).encode())
        assert fwd._reply(0.2) is None
        child.send_bytes(json.dumps({"n": 2, "stats": dataclasses.asdict(stats)}).encode())  # an answer that came too late
        child.send_bytes(json.dumps({"n": 3, "stats": dataclasses.asdict(stats)}).encode())
        assert fwd._reply(0.2) == stats
    finally:
        replies.close()
        child.close()

