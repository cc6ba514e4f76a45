"""NXT_PACKET_IN2 messages and frames built field by field, for decoder and grouping tests."""

from __future__ import annotations

import functools
import struct

from scapy.layers.inet import ICMP, IP, TCP, UDP  # noqa: E402
from scapy.layers.l2 import Dot1Q, Ether  # noqa: E402

from packetin.model import Flags, Userdata  # noqa: E402


def prop(ptype: int, body: bytes) -> bytes:
    """One property: `!HH` type, length (header + body), body, zero padding to 8."""
    length = 4 + len(body)
    return struct.pack("!HH", ptype, length) + body + b"\0" * (-length % 8)


def oxm(oxm_class: int, field_: int, value: bytes, mask: bytes = b"") -> bytes:
    header = (oxm_class << 16) | (field_ << 9) | (bool(mask) << 8) | (len(value) + len(mask))
    return struct.pack("!I", header) + value + mask


def packet_in2(props: list[bytes], xid: int = 0) -> bytes:
    body = b"".join(props)
    return struct.pack("!BBHIII", 6, 4, 16 + len(body), xid, 0x2320, 30) + body


def in_port_oxm(port: int) -> bytes:
    return oxm(0x8000, 0, struct.pack("!I", port))


def xreg3_oxm(reg6: int, reg7: int) -> bytes:
    # OF1.5 packet register xreg3 = (reg6 << 32) | reg7.
    return oxm(0x8001, 3, struct.pack("!Q", (reg6 << 32) | reg7))


def nxm_reg_oxm(n: int, value: int) -> bytes:
    return oxm(0x0001, n, struct.pack("!I", value))


MAC = {"src": "02:00:00:00:00:01", "dst": "02:00:00:00:00:02"}
AT = 1_700_000_000.0


@functools.lru_cache(maxsize=None)
def frame(src: str, dst: str, l4: str, dport: int, ident: int = 0, payload: int = 8, frag: int = 0,
          vlan: bool = False) -> bytes:
    """An Ethernet frame; `l4` is udp, tcp, tcpopt (TCP with options), tcpcut (TCP whose options
    are cut off), icmp or gre (a protocol the decoder does not look into)."""
    ip = IP(src=src, dst=dst, id=ident, flags=frag >> 13, frag=frag & 0x1FFF)
    layer = {"udp": lambda: UDP(sport=40000, dport=dport), "tcp": lambda: TCP(sport=40000, dport=dport),
             "tcpopt": lambda: TCP(sport=40000, dport=dport, options=[("MSS", 1460), ("NOP", None), ("NOP", None)]),
             "tcpcut": lambda: TCP(sport=40000, dport=dport, dataofs=15),
             "icmp": lambda: ICMP(type=dport % 256, code=0), "gre": lambda: IP(proto=47)}[l4]()
    eth = Ether(**MAC) / Dot1Q(vlan=5) if vlan else Ether(**MAC)
    return bytes(eth / ip / layer / (b"x" * payload))


def message(packet: bytes, *, in_port: int = 1, reg6: int = 7, reg7: int = 1, flags: int = int(Flags.LOG),
            ct_tp_dst: int = 0, cookie: int = 3, nxm_regs: bool = False, full_len: int | None = None,
            xid: int = 0) -> bytes:
    """An NXT_PACKET_IN2 in the order OVS 3.1 sends it."""
    regs = nxm_reg_oxm(6, reg6) + nxm_reg_oxm(7, reg7) if nxm_regs else xreg3_oxm(reg6, reg7)
    metadata = (in_port_oxm(in_port) + oxm(0x8000, 5, b"\x08\x00") + oxm(0x8001, 2, struct.pack("!Q", 0x60a2))
                + regs + oxm(0x0001, 105, struct.pack("!I", 0x21)) + oxm(0x0001, 106, b"\x00\x0f")
                + oxm(0x0001, 120, bytes([10, 246, 0, 2])) + oxm(0x0001, 124, struct.pack("!H", 40000))
                + oxm(0x0001, 125, struct.pack("!H", ct_tp_dst)))
    props = [prop(0, packet)]
    if full_len is not None:
        props.append(prop(1, struct.pack("!I", full_len)))
    props += [prop(3, b"\x28"), prop(4, b"\0" * 4 + struct.pack("!Q", cookie)), prop(5, b"\0"),
              prop(6, metadata), prop(7, Userdata(category=0, flags=flags, rule_id=reg6).encode())]
    return packet_in2(props, xid)


def lone_message(kind: str, port: int) -> bytes:
    """One NXT_PACKET_IN2 from 10.0.0.1 to 10.0.0.2 (UDP to `port`) of a kind the lone path's tests send: drop (a
    plain logged Drop), cut (its TCP frame truncated), allow, reject, unlogged, malformed (a property cut short)."""
    packet = frame("10.0.0.1", "10.0.0.2", "tcpcut" if kind == "cut" else "udp", port)  # cut: a truncated frame
    if kind == "allow":
        return message(packet, reg7=0, ct_tp_dst=port)
    if kind == "reject":
        return message(packet, flags=int(Flags.REJECT | Flags.LOG), ct_tp_dst=port)
    if kind == "unlogged":
        return message(packet, flags=0, ct_tp_dst=port)
    if kind == "malformed":
        whole = message(packet, ct_tp_dst=port)
        return whole[:2] + len(whole[:40]).to_bytes(2, "big") + whole[4:40]  # a property cut short
    return message(packet, ct_tp_dst=port)
