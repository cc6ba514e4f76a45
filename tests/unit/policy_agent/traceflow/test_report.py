"""A destination node's report on the wire, and the re-tagging of a received trace packet: what one node
writes the other reads, what fits one tunnel packet, and anything else read as nothing (never an error)."""

from __future__ import annotations

import hashlib
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.all import IP, TCP, UDP, Ether

from policy_agent.traceflow.report import (
    MAGIC, MAX_BODY, REPORT_PORT, REPORT_VNI, VERSION, decode_report, encode_report, report_out, retag)
from policy_agent.traceflow.tags import identity

FRAME = bytes(Ether() / IP(src="10.248.1.2", dst="10.248.2.2", tos=(9 << 2) | 1) / TCP(sport=45000, dport=80,
                                                                                           flags="S"))
KEY = identity(FRAME) or b""
OBS = [{"table": 0, "name": "classifier", "action": "accept", "detail": "from the tunnel: node n1 (198.51.100.11)"},
       {"table": 70, "name": "forward", "action": "output", "detail": "to Pod y/b on port 100"}]
OUTCOME = {"result": "delivered", "pod": "y/b", "port": 100, "detail": "delivered to Pod y/b on port 100"}


def report_frame(**over: object) -> bytes:
    args: dict[str, object] = dict(tag=9, identity=KEY, node="n2", observations=OBS, outcome=OUTCOME,
                                   src="198.51.100.12", dst="198.51.100.11")
    args.update(over)
    return encode_report(**args)  # type: ignore[arg-type]


def test_a_report_reads_back_as_written_and_is_a_well_formed_udp_frame() -> None:
    frame = report_frame()
    report = decode_report(frame)
    assert report is not None
    assert (report.tag, report.identity, report.node) == (9, KEY, "n2")
    assert (report.observations, report.outcome) == (OBS, OUTCOME)
    pkt = Ether(frame)
    assert (pkt[IP].src, pkt[IP].dst, pkt[UDP].dport) == ("198.51.100.12", "198.51.100.11", REPORT_PORT)
    rebuilt = IP(bytes(pkt[IP]))
    del rebuilt.chksum
    assert IP(bytes(rebuilt)).chksum == pkt[IP].chksum  # scapy computes the same checksum


def test_a_report_too_large_for_one_tunnel_packet_is_cut_down_and_keeps_its_outcome() -> None:
    # Hashes: what compression cannot shrink, like many distinct rule names.
    many = [{**OBS[1], "detail": hashlib.sha256(b"d%d" % i).hexdigest(),
             "rule": {"policy": hashlib.sha256(b"p%d" % i).hexdigest()}} for i in range(200)]
    frame = report_frame(observations=many)
    assert len(frame) <= 14 + 20 + 8 + 7 + len(KEY) + MAX_BODY
    report = decode_report(frame)
    assert report is not None and report.outcome == OUTCOME
    assert len(report.observations) < len(many) and "too large" in json.dumps(report.observations)


def test_the_report_packet_out_goes_into_the_tunnel_to_the_trace_s_node_marked_as_a_report() -> None:
    msg = report_out(report_frame(), "198.51.100.11", 1)
    fields = [(a.key, a.value) for a in msg.actions[:2]]
    assert fields == [("tun_ipv4_dst", "198.51.100.11"), ("tunnel_id", REPORT_VNI)]
    assert msg.actions[2].port == 1 and msg.match["in_port"] == 0xFFFFFFFD  # OFPP_CONTROLLER


def _payload(body: bytes, magic: bytes = MAGIC, version: int = VERSION) -> bytes:
    import struct
    head = struct.pack("!4sBBB", magic, version, 9, len(KEY)) + KEY
    return bytes(Ether() / IP(src="198.51.100.12", dst="198.51.100.11") / UDP(sport=REPORT_PORT, dport=REPORT_PORT)
                 / (head + body))


@pytest.mark.parametrize("frame", [
    FRAME,  # a TCP frame
    bytes(Ether() / IP() / UDP() / b"NPTR"),  # too short
    _payload(zlib.compress(json.dumps({"node": "n2", "observations": [], "outcome": OUTCOME}).encode()), magic=b"XXXX"),
    _payload(zlib.compress(json.dumps({"node": "n2", "observations": [], "outcome": OUTCOME}).encode()), version=9),
    _payload(b"not zlib at all"),
    _payload(zlib.compress(b"[1, 2]")),
    _payload(zlib.compress(json.dumps({"node": 3, "observations": [], "outcome": OUTCOME}).encode())),
    _payload(zlib.compress(json.dumps({"node": "n2", "observations": [1], "outcome": OUTCOME}).encode())),
    _payload(zlib.compress(json.dumps({"node": "n2", "observations": [], "outcome": {"result": 1}}).encode())),
    _payload(zlib.compress(b" " * (1 << 20))),  # expands past what a report may be
])
def test_anything_but_a_report_reads_as_none(frame: bytes) -> None:
    assert decode_report(frame) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=200))
def test_decoding_any_bytes_never_raises(head: bytes, tail: bytes) -> None:
    decode_report(head + tail)
    decode_report(_payload(head) + tail)


def test_retag_sets_the_dscp_keeps_the_ecn_bits_and_the_rest_and_redoes_the_checksum() -> None:
    out = retag(FRAME, 33)
    ip = Ether(out)[IP]
    assert ip.tos == (33 << 2) | 1
    check = IP(bytes(ip))
    del check.chksum
    assert IP(bytes(check)).chksum == ip.chksum
    assert out[:15] == FRAME[:15] and out[16:24] == FRAME[16:24] and out[26:] == FRAME[26:]
    with pytest.raises(ValueError):
        retag(b"\x00" * 40, 33)
