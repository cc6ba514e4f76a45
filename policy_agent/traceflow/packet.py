"""The trace packet, built with scapy: the source Pod's MAC and IP, DSCP = the trace's tag, checksums computed."""

from __future__ import annotations

from packetin.protocol_numbers import IPPROTO_ICMP, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP
from policy_agent.traceflow.tags import TraceTag

# Any unicast MAC will do when the destination is no Pod: table 70 rewrites eth_dst for Pods.
UNKNOWN_DST_MAC = "02:00:00:00:00:01"
PROTOCOLS = {"tcp": IPPROTO_TCP, "udp": IPPROTO_UDP, "sctp": IPPROTO_SCTP, "icmp": IPPROTO_ICMP}


def build_packet(tag: TraceTag, src_mac: str, dst_mac: str | None) -> bytes:
    """Ethernet/IPv4 frame of the trace: TCP SYN, UDP or SCTP INIT to the ports of `tag`, or ICMP echo."""
    from scapy.layers.inet import ICMP, IP, TCP, UDP
    from scapy.layers.l2 import Ether
    from scapy.layers.sctp import SCTP, SCTPChunkInit

    ip = Ether(src=src_mac, dst=dst_mac or UNKNOWN_DST_MAC) / IP(src=tag.src, dst=tag.dst, tos=tag.dscp << 2, ttl=64)
    if tag.proto == IPPROTO_TCP:
        pkt = ip / TCP(sport=tag.sport, dport=tag.dport, flags="S", seq=0x7F000000 | tag.dscp)
    elif tag.proto == IPPROTO_UDP:
        pkt = ip / UDP(sport=tag.sport, dport=tag.dport) / b"npaudit traceflow"
    elif tag.proto == IPPROTO_SCTP:
        pkt = ip / SCTP(sport=tag.sport, dport=tag.dport) / SCTPChunkInit(init_tag=0x7F000000 | tag.dscp)
    else:
        pkt = ip / ICMP(type=8, id=tag.sport or 0, seq=tag.dscp) / b"npaudit traceflow"
    return bytes(pkt)
