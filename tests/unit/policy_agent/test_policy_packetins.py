"""The agent's answers to rejected packets: valid TCP RSTs and ICMP unreachables, nothing for what must not be answered."""

from __future__ import annotations

from scapy.all import ICMP, IP, TCP, UDP, Ether, raw

from packetin.model import Disposition, Flags, PacketIn, Userdata
from policy_agent.policy.reject import ICMP_ADMIN_PROHIBITED, ICMP_UNREACHABLE, build_reject
from policy_agent.policy_packetins import PolicyPacketIns

A = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def parsed(frame: bytes) -> Ether:
    return Ether(frame)


def checksums_valid(pkt: Ether) -> bool:
    """Let scapy recompute every checksum of the packet and compare with ours."""
    fresh = Ether(raw(pkt))
    layers = [layer for layer in (IP, TCP, ICMP) if layer in fresh]
    for layer in layers:
        del fresh[layer].chksum
    recomputed = Ether(raw(fresh))
    return all(recomputed[layer].chksum == pkt[layer].chksum for layer in layers)


def test_syn_gets_rst_ack_to_the_sender() -> None:
    syn = raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=40000, dport=80, flags="S", seq=1000))
    answer = parsed(build_reject(syn))
    assert (answer.src, answer.dst) == (A["dst"], A["src"])
    assert (answer[IP].src, answer[IP].dst) == ("10.0.0.2", "10.0.0.1")
    assert (answer[TCP].sport, answer[TCP].dport) == (80, 40000)
    assert answer[TCP].flags == "RA" and answer[TCP].ack == 1001 and answer[TCP].seq == 0
    assert checksums_valid(answer)


def test_ack_segment_gets_rst_with_its_ack_as_seq() -> None:
    seg = raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="A", seq=5, ack=777) / b"data")
    answer = parsed(build_reject(seg))
    assert answer[TCP].flags == "R" and answer[TCP].seq == 777
    assert checksums_valid(answer)


def test_udp_gets_icmp_admin_prohibited_quoting_the_datagram() -> None:
    dgram = raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=5353, dport=53) / b"query")
    answer = parsed(build_reject(dgram))
    assert answer[IP].proto == 1 and answer[IP].dst == "10.0.0.1"
    assert (answer[ICMP].type, answer[ICMP].code) == (ICMP_UNREACHABLE, ICMP_ADMIN_PROHIBITED)
    quoted = bytes(answer[ICMP].payload)
    assert quoted[:20] == raw(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=5353, dport=53) / b"query")[:20]
    assert checksums_valid(answer)


def test_never_answer_a_reset_an_icmp_error_a_later_fragment_or_non_ip() -> None:
    ip = IP(src="10.0.0.1", dst="10.0.0.2")
    assert build_reject(raw(Ether(**A) / ip / TCP(flags="R"))) is None
    assert build_reject(raw(Ether(**A) / ip / ICMP(type=3, code=1))) is None
    assert build_reject(raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2", frag=10) / (b"x" * 20))) is None
    assert build_reject(b"\x00" * 60) is None
    assert build_reject(b"") is None
    echo = parsed(build_reject(raw(Ether(**A) / ip / ICMP(type=8))))
    assert echo[ICMP].type == ICMP_UNREACHABLE


def _pin(flags: int, frame: bytes) -> PacketIn:
    return PacketIn(reason=0, table_id=40, cookie=0, in_port=7, rule_id=9, reg7=int(Disposition.REJECT),
                    userdata=Userdata(category=0, flags=flags, rule_id=9).encode(), packet=frame,
                    total_len=len(frame), received_at=0.0)


def test_responder_answers_out_of_the_in_port_and_forwards_only_logged_ones() -> None:
    sent, seen = [], []
    responder = PolicyPacketIns(lambda msg: sent.append(msg) or 1, audit=seen.append)
    syn = raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="S"))
    responder(_pin(int(Flags.REJECT), syn))
    responder(_pin(int(Flags.REJECT | Flags.LOG), syn))
    responder(_pin(int(Flags.LOG), syn))  # a logged Drop: no answer
    assert len(sent) == 2 and responder.answered == 2
    assert all(msg.actions[0].port == 7 for msg in sent)
    assert len(seen) == 2  # the two logged ones


def test_packet_ins_without_our_userdata_are_passed_on_never_answered() -> None:
    sent, seen = [], []
    responder = PolicyPacketIns(lambda msg: sent.append(msg) or 1, audit=seen.append)
    syn = raw(Ether(**A) / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=2, flags="S"))
    foreign = _pin(int(Flags.REJECT), syn)._replace(userdata=b"\x09\x00\x02\x00\x00\x00\x09")
    bare = _pin(int(Flags.REJECT), syn)._replace(userdata=b"")
    assert foreign.flags is None and bare.flags is None
    responder(foreign)
    responder(bare)
    assert sent == [] and seen == [foreign, bare]
