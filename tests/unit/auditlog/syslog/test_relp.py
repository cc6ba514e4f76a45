"""RELP: frames, the sender's acknowledgement from the receiver's answers, and the forwarder's checkpoint over it."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Iterator

import pytest

from auditlog.syslog.checkpoint import load_checkpoint
from auditlog.syslog.errors import SyslogConfigError, SyslogTransportError
from auditlog.syslog.destination import make_destination
from auditlog.syslog.forwarder import Forwarder
from auditlog.syslog.relp import TXNR_MAX, Frame, RelpSender, encode_frame, next_txnr, parse_frames
from auditlog.syslog.rfc5424 import Framing
from auditlog.syslog.transport import TlsOptions, open_sender, parse_endpoint
from policy_agent.config.syslog import SyslogDestinationConfig, syslog_destination
from tests.support.certs import make_pki
from tests.support.relp_receiver import RelpReceiver
from tests.support.syslog_receiver import TcpReceiver, write_records
from tests.support.waiting import wait_for

FRAMES = [(1, b"open", b"relp_version=0\ncommands=syslog"), (2, b"syslog", b"12 <13>1 - x y"),
          (3, b"rsp", b"200 OK"), (0, b"serverclose", b""), (999999999, b"close", b"")]


def test_frames_parse_back_whatever_the_read_boundaries() -> None:
    wire = b"".join(encode_frame(*f) for f in FRAMES)
    assert encode_frame(4, b"close") == b"4 close 0\n"
    for cut in range(len(wire) + 1):
        first, rest = parse_frames(wire[:cut])
        second, left = parse_frames(rest + wire[cut:])
        assert left == b""
        assert first + second == [Frame(*f) for f in FRAMES]


@pytest.mark.parametrize("wire", [b"x rsp 6 200 OK\n", b"1 rsp 6 200 OKX", b"1 rsp 3\n", b"1 r$p 0\n",
                                  b"1" * 80, b"1 rsp 99999999 "])
def test_bytes_that_are_no_relp_frame_are_an_error(wire: bytes) -> None:
    with pytest.raises(SyslogTransportError, match="relp"):
        parse_frames(wire)


def test_a_response_code_is_read_from_its_status_line() -> None:
    assert Frame(1, b"rsp", b"200 OK\nrelp_version=0").code == 200
    assert Frame(1, b"rsp", b"500 no").code == 500
    assert Frame(1, b"rsp", b"").code is None


def test_transaction_numbers_wrap_to_one_after_nine_digits() -> None:
    assert next_txnr(1) == 2 and next_txnr(TXNR_MAX) == 1


def test_relp_urls_default_to_port_2514_and_octet_counted_frames() -> None:
    assert parse_endpoint("relp://siem.example").port == 2514
    dest = make_destination("relp://siem.example:20514", node_name="n")
    assert dest.framing is Framing.OCTET_COUNTING and dest.endpoint.port == 20514
    with pytest.raises(SyslogConfigError, match="does not apply to relp"):
        make_destination("relp://siem.example", node_name="n", framing="lf")


def test_relp_over_tls_takes_the_tls_settings_and_opens_a_relp_session_inside_tls(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, "relp")
    assert parse_endpoint("relp+tls://siem.example").port == 2514
    options = TlsOptions(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, server_name="localhost")
    dest = make_destination("relp+tls://127.0.0.1:20514", node_name="n", tls=options)
    assert dest.framing is Framing.OCTET_COUNTING and dest.tls == options
    sender = open_sender(dest.endpoint, dest.tls)
    assert isinstance(sender, RelpSender) and sender._tls is not None and sender._server_name == "localhost"
    assert isinstance(open_sender(parse_endpoint("relp://127.0.0.1"), None), RelpSender)
    with pytest.raises(SyslogConfigError, match="need a tls:// or relp\\+tls:// URL"):
        make_destination("relp://siem.example", node_name="n", tls=options)
    with pytest.raises(SyslogConfigError, match="does not apply to relp"):
        make_destination("relp+tls://siem.example", node_name="n", framing="lf")
    configured = syslog_destination(SyslogDestinationConfig(url="relp+tls://siem.example", ca=str(pki.ca)), "n")
    assert configured.tls is not None and configured.tls.ca == pki.ca


def octet_counted(seq: int) -> bytes:
    message = b'<134>1 - n npaudit - ALLOW [npaudit@32473 seq="%d" chain="a"] {}' % seq
    return b"%d %b" % (len(message), message)


@pytest.fixture
def relp() -> Iterator[RelpReceiver]:
    rx = RelpReceiver()
    yield rx
    rx.close()


def test_a_message_counts_delivered_only_once_the_receiver_answered_it(relp: RelpReceiver) -> None:
    sender = RelpSender(parse_endpoint(relp.url), timeout=5)
    sender.connect()
    relp.hold.set()  # the receiver has the bytes, not yet the messages
    frames = [octet_counted(i) for i in (1, 2)]
    sender.send(frames)
    wait_for(lambda: len(relp.seqs) == 2)
    time.sleep(0.1)
    assert sender.unacked() == sum(map(len, frames))  # TCP would have acknowledged them by now
    relp.hold.clear()
    wait_for(lambda: sender.unacked() == 0)
    assert sender.finish(2) and relp.closes == 1


def test_a_refused_message_is_an_error_never_delivered() -> None:
    rx = RelpReceiver(refuse=True)
    try:
        sender = RelpSender(parse_endpoint(rx.url), timeout=5)
        sender.connect()
        sender.send([octet_counted(1)])

        def refused() -> bool:
            try:
                return sender.unacked() == 0
            except SyslogTransportError as exc:
                assert "refused" in str(exc)
                return True
        wait_for(refused)
        assert not sender.connected
    finally:
        rx.close()


def test_a_receiver_that_is_no_relp_peer_fails_the_connect() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # the kernel accepts; nobody ever answers `open`
    try:
        sender = RelpSender(parse_endpoint(f"relp://127.0.0.1:{listener.getsockname()[1]}"), timeout=0.3)
        with pytest.raises(SyslogTransportError, match="no relp answer"):
            sender.connect()
        assert not sender.connected
    finally:
        listener.close()


def crash_resend(fwd: Forwarder, checkpoint: Path, written: int) -> int:
    """The records a crash now would send again: everything after the saved checkpoint."""
    saved = load_checkpoint(checkpoint)
    return written - (saved.seq if saved else 0)


def test_relp_checkpoints_what_the_receiver_answered_where_tcp_cannot_tell(tmp_path: Path,
                                                                          relp: RelpReceiver) -> None:
    """Both receivers got every record; a forwarder crash now re-sends everything over TCP (its checkpoint waits
    for a receive buffer's worth of acknowledged bytes after a batch), nothing over RELP."""
    live = tmp_path / "log" / "audit.jsonl"
    write_records(live, 1, 500)
    tcp_rx = TcpReceiver()
    resend = {}
    try:
        for name, url in (("tcp", tcp_rx.url), ("relp", relp.url)):
            ck = tmp_path / f"{name}.json"
            fwd = Forwarder(make_destination(url, node_name="n", batch_records=50), live=live, checkpoint=ck,
                            poll_interval=0.02)
            fwd.start()
            try:
                seqs = tcp_rx.seqs if name == "tcp" else relp.seqs
                wait_for(lambda: len(set(seqs)) == 500 and fwd.stats().last_seq_sent == 500)
                if name == "relp":
                    wait_for(lambda: crash_resend(fwd, ck, 500) == 0)
                else:
                    time.sleep(0.5)  # idle: a forwarder saves whenever it is caught up, if it may
                resend[name] = crash_resend(fwd, ck, 500)
            finally:
                fwd.stop()
    finally:
        tcp_rx.close()
    assert resend["relp"] == 0 and resend["tcp"] == 500, resend
