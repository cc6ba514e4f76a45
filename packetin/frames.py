"""The one walker of Ethernet frames: VLAN tags, then the IPv4 / IPv6 header and where the transport starts.

Every reader of a frame (the audit decoder, the fair-share key, the overload group key,
the Reject answer, trace tags) finds its offsets here, so they agree on what a frame is:

- Ethernet II, then any number of VLAN tags whose type is one of `VLAN_TPIDS` (802.1Q,
  802.1ad, and the pre-standard 0x9100 S-tag some switches still send); the network
  header starts after the last tag's type field (`l3_offset`).
- IPv4: the header is IHL * 4 bytes (`ipv4_header_len`, 0 when it is no IPv4 header).
- IPv6: a 40-byte header, then extension headers (`ipv6_upper_layer`) up to the
  upper-layer header, a non-first fragment (no header follows), or the frame's end.

Pure functions of (bytes, offset), no allocation on the IPv4 paths: some readers run per
packet-in. `start` / `l3` offsets let a reader walk a frame embedded in a larger message.
A frame cut short never raises: the walker says so (-1, 0, or `None`).
"""

from __future__ import annotations

from packetin.protocol_numbers import ETH_TYPE_IPV4, ETH_TYPE_IPV6

__all__ = ["VLAN_TPIDS", "MIN_ETHERTYPE", "l3_offset", "eth_type", "outer_vlan", "ipv4_header_len",
           "ipv4_fragment_offset", "ipv4_more_fragments", "ipv6_upper_layer", "destination_address",
           "IPV6_NO_NEXT_HEADER", "IPV6_FRAGMENT"]

# 802.1Q, 802.1ad (QinQ S-tag), and the pre-standard 0x9100 S-tag.
VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100))
# Values below this in the type/length field are an 802.3 length, not an ethertype.
MIN_ETHERTYPE = 0x0600

IPV6_NO_NEXT_HEADER, IPV6_FRAGMENT, _AH = 59, 44, 51
# IPv6 extension headers laid out as (next header, length in 8-octet units - 1): hop-by-hop,
# routing, destination options, and (RFC 7045) mobility, HIP, shim6.
_EXT_8OCTET = frozenset((0, 43, 60, 135, 139, 140))
_V4, _V6 = ETH_TYPE_IPV4, ETH_TYPE_IPV6


def l3_offset(frame: bytes, start: int = 0) -> int:
    """Where the network header of the Ethernet frame at `frame[start:]` starts: after the
    addresses, every VLAN tag and the type field. -1 when the frame ends before that type field."""
    off = start + 12
    n = len(frame)
    if n < off + 2:
        return -1
    tpids = VLAN_TPIDS
    while ((frame[off] << 8) | frame[off + 1]) in tpids:
        off += 4  # the tag: TPID (just read) + TCI; the next type field follows
        if n < off + 2:
            return -1
    return off + 2


def eth_type(frame: bytes, l3: int) -> int:
    """The type field before the network header at `l3` (an `l3_offset` >= 0): the ethertype, or
    an 802.3 length when below MIN_ETHERTYPE."""
    return (frame[l3 - 2] << 8) | frame[l3 - 1]


def outer_vlan(frame: bytes, l3: int, start: int = 0) -> int | None:
    """The outermost VLAN id of the frame at `start` whose network header is at `l3`; None if untagged."""
    if l3 <= start + 14:
        return None
    return ((frame[start + 14] << 8) | frame[start + 15]) & 0x0FFF


def ipv4_header_len(frame: bytes, l3: int) -> int:
    """The IPv4 header length (IHL * 4) of the header at `l3`; 0 when the frame ends before its
    fixed 20 bytes or they are no IPv4 header (version not 4, IHL below 5). Options announced
    by IHL may still be cut off: compare with len(frame)."""
    if len(frame) < l3 + 20 or l3 < 0:
        return 0
    vihl = frame[l3]
    if vihl >> 4 != 4 or vihl & 0x0F < 5:
        return 0
    return (vihl & 0x0F) * 4


def ipv4_fragment_offset(frame: bytes, l3: int) -> int:
    """The fragment offset (8-octet units) of the IPv4 header at `l3` (ipv4_header_len > 0): not 0
    for every fragment but the first, which alone carries the transport header."""
    return ((frame[l3 + 6] & 0x1F) << 8) | frame[l3 + 7]


def ipv4_more_fragments(frame: bytes, l3: int) -> bool:
    """The MF flag of the IPv4 header at `l3`: set on every fragment but the last."""
    return bool(frame[l3 + 6] & 0x20)


def ipv6_upper_layer(frame: bytes, l3: int) -> tuple[int | None, int, bool, bool]:
    """Walk the extension headers after the IPv6 header at `l3` (40 bytes present):
    (upper-layer protocol, its offset, fragment, no header there).

    The protocol is None when the frame ends inside an extension header (offset: where that
    header starts). `fragment` is True for every piece of a fragmented datagram (an atomic
    fragment, offset 0 with M clear, RFC 6946, is a whole datagram). The last item is True
    for a non-first fragment: what follows is the middle of the payload, not a header.
    """
    n = len(frame)
    nh = frame[l3 + 6]
    off = l3 + 40
    fragment = False
    # Each extension header is at least 8 bytes, so this loop ends within the frame.
    while True:
        if nh in _EXT_8OCTET or nh == _AH:
            if n < off + 2:
                return None, off, fragment, False
            size = (frame[off + 1] + 2) * 4 if nh == _AH else (frame[off + 1] + 1) * 8
            if n < off + size:
                return None, off, fragment, False
            nh = frame[off]
            off += size
        elif nh == IPV6_FRAGMENT:
            if n < off + 8:
                return None, off, fragment, False
            offset_m = (frame[off + 2] << 8) | frame[off + 3]
            nh = frame[off]
            off += 8
            fragment = fragment or offset_m >> 3 != 0 or bool(offset_m & 1)
            if offset_m >> 3:
                return nh, off, True, True
        else:
            return nh, off, fragment, False


def destination_address(frame: bytes, _tpids: frozenset[int] = VLAN_TPIDS) -> bytes:
    """The destination address bytes of an Ethernet + IPv4/IPv6 frame (4 or 16), b"" when the
    frame has no whole IPv4 header (or no 40-byte IPv6 header) after its VLAN tags.

    Per packet-in (the fair-share key): `l3_offset`'s walk written out here, without the call.
    """
    n = len(frame)
    if n < 14:
        return b""
    off = 12
    kind = (frame[12] << 8) | frame[13]
    while kind in _tpids:
        off += 4
        if n < off + 2:
            return b""
        kind = (frame[off] << 8) | frame[off + 1]
    ip = off + 2
    if kind == _V4:
        # Version 4 and IHL at least 5, the fixed header present.
        return frame[ip + 16:ip + 20] if n >= ip + 20 and 0x45 <= frame[ip] <= 0x4F else b""
    if kind == _V6:
        return frame[ip + 24:ip + 40] if n >= ip + 40 and 0x60 <= frame[ip] <= 0x6F else b""
    return b""
