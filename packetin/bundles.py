"""OpenFlow 1.5 bundles (OFPT_BUNDLE_CONTROL, OFPT_BUNDLE_ADD_MESSAGE) as pure functions: no I/O.

A bundle makes a batch of flow changes atomic on the switch: messages added to
an open bundle change nothing until the commit, the commit applies all of them
or none, and a bundle still open when the connection closes is discarded. OVS
(3.1) has no limit on the messages in one bundle besides memory; it discards a
bundle that receives nothing for `other_config:bundle-idle-timeout` (10 s by
default), which our sender never approaches: it adds, confirms and commits back to back.
"""

from __future__ import annotations

import struct
from typing import Any, Iterable, Sequence

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin.errors import DecodeError
from packetin import messages
from packetin.messages import CODEC

# Atomic: all or nothing. Ordered: in the order added (new flows before stale ones go).
FLAGS = ofp.OFPBF_ATOMIC | ofp.OFPBF_ORDERED
_HEADER = struct.Struct("!BBHI")  # version, type, length, xid
_ADD = struct.Struct("!BBHII2xH")  # header, bundle_id, pad, flags; the inner message follows
_CTRL_BODY = struct.Struct("!IHH")  # bundle_id, type, flags (after the header)


def control(bundle_id: int, ctrl_type: int, flags: int = FLAGS) -> Any:
    """An OFPT_BUNDLE_CONTROL request (open, commit, discard) for the channel's request()."""
    return parser.OFPBundleCtrlMsg(CODEC, bundle_id, ctrl_type, flags, [])


def add_message(bundle_id: int, inner: bytes, xid: int, flags: int = FLAGS) -> bytes:
    """OFPT_BUNDLE_ADD_MESSAGE wrapping a serialised message. OpenFlow (and OVS, which
    refuses otherwise) wants the inner xid equal to the outer one: it is rewritten here."""
    body = inner[:4] + xid.to_bytes(4, "big") + inner[8:]
    return _ADD.pack(ofp.OFP_VERSION, ofp.OFPT_BUNDLE_ADD_MESSAGE, _ADD.size + len(body), xid,
                     bundle_id, flags) + body


def add_messages(bundle_id: int, inner: Iterable[bytes], xids: Iterable[int], flags: int = FLAGS) -> bytes:
    """Several add_message()s concatenated: one write on the wire."""
    return b"".join(add_message(bundle_id, msg, xid, flags) for msg, xid in zip(inner, xids, strict=True))


def parse_control(raw: bytes) -> tuple[int, int, int]:
    """(bundle_id, type, flags) of an OFPT_BUNDLE_CONTROL message."""
    if len(raw) < _HEADER.size + _CTRL_BODY.size or raw[1] != ofp.OFPT_BUNDLE_CONTROL:
        raise DecodeError(f"not an OFPT_BUNDLE_CONTROL message ({len(raw)} bytes)")
    bundle_id, ctrl_type, flags = _CTRL_BODY.unpack_from(raw, _HEADER.size)
    return bundle_id, ctrl_type, flags


def parse_add(raw: bytes) -> tuple[int, int, bytes]:
    """(bundle_id, flags, inner message) of an OFPT_BUNDLE_ADD_MESSAGE."""
    if len(raw) < _ADD.size + _HEADER.size or raw[1] != ofp.OFPT_BUNDLE_ADD_MESSAGE:
        raise DecodeError(f"not an OFPT_BUNDLE_ADD_MESSAGE ({len(raw)} bytes)")
    _, _, length, _, bundle_id, flags = _ADD.unpack_from(raw)
    inner = raw[_ADD.size:length]
    if _HEADER.unpack_from(inner)[2] != len(inner):
        raise DecodeError(f"bundled message length {_HEADER.unpack_from(inner)[2]} != {len(inner)} bytes held")
    return bundle_id, flags, inner


def encode_flows(bundle_id: int, install: Sequence[messages.FlowSpec], delete: Sequence[messages.FlowSpec],
                 xids: Sequence[int], flags: int = FLAGS) -> bytes:
    """The add messages of a flow bundle, in order: new flows first, then the deletes.
    Pure and thread-safe: the channel runs it off the event loop for big bundles."""
    inner = [messages.serialize(messages.flow_add(f), 0) for f in install]
    inner += [messages.serialize(messages.flow_delete_strict(f), 0) for f in delete]
    return add_messages(bundle_id, inner, xids, flags)
