"""A hand-written fake OpenFlow 1.5 switch on a unix socket, with a faucet-style fake flow table
and OVS-like bundles (atomic commit; discarded on error or when the connection closes)."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any

from os_ken.ofproto import ofproto_v1_5 as ofp
from os_ken.ofproto import ofproto_v1_5_parser as parser

from packetin import bundles, messages
from tests.support.waiting import eventually

HEADER = struct.Struct("!BBHI")  # version, type, length, xid
VERSION = 6
NX_VENDOR = 0x2320
NXT_SET_PACKET_IN_FORMAT = 16
NXT_PACKET_IN2 = 30
OFPMBT_DROP_BIT = 1 << ofp.OFPMBT_DROP

FlowKey = tuple[int, int, tuple[tuple[str, Any], ...]]


@dataclass
class Flow:
    table: int
    priority: int
    match: dict[str, Any]
    actions: list[Any]  # os-ken action objects of the apply-actions instruction
    goto: int | None
    cookie: int


@dataclass
class Meter:
    meter_id: int
    flags: int
    bands: list[tuple[int, int]]  # (rate, burst_size) of each drop band


@dataclass
class Group:
    group_id: int
    group_type: int
    buckets: list[list[Any]]  # os-ken actions of each bucket


@dataclass(frozen=True)
class Mod:
    """One FLOW_MOD / METER_MOD / GROUP_MOD in arrival order."""

    kind: str  # "flow", "meter" or "group"
    command: int
    xid: int
    ident: Any  # flow key, meter id or group id


def message(msg_type: int, xid: int, body: bytes = b"", version: int = VERSION) -> bytes:
    return HEADER.pack(version, msg_type, 8 + len(body), xid) + body


def error(xid: int, err_type: int, code: int, offending: bytes) -> bytes:
    """OFPT_ERROR carrying the first 64 bytes of the offending message, as OVS does."""
    return message(ofp.OFPT_ERROR, xid, struct.pack("!HH", err_type, code) + offending[:64])


def prop(ptype: int, payload: bytes) -> bytes:
    """A property: type, length without padding, payload, zero padding to 8 bytes."""
    length = 4 + len(payload)
    return struct.pack("!HH", ptype, length) + payload + b"\0" * ((-length) % 8)


def packet_in2(*, xid: int = 0, packet: bytes = b"\0" * 14, table_id: int = 0, cookie: int = 0,
               reason: int = 0, in_port: int = 1, rule_id: int = 0, reg7: int = 0,
               userdata: bytes = b"", tail: bytes = b"") -> bytes:
    """NXT_PACKET_IN2 laid out as OVS 3.1 sends it; `tail` is appended raw (for malformed ones)."""
    metadata = (struct.pack("!II", (0x8000 << 16) | (0 << 9) | 4, in_port)
                + struct.pack("!IQ", (0x8001 << 16) | (3 << 9) | 8, (rule_id << 32) | reg7))
    props = (prop(0, packet) + prop(3, bytes([table_id])) + prop(4, b"\0" * 4 + struct.pack("!Q", cookie))
             + prop(5, bytes([reason])) + prop(6, metadata))
    if userdata:
        props += prop(7, userdata)
    return message(ofp.OFPT_EXPERIMENTER, xid, struct.pack("!II", NX_VENDOR, NXT_PACKET_IN2) + props + tail)


@dataclass
class Bundle:
    flags: int
    msgs: list[bytes]  # the bundled flow_mods, in order


class _Conn(asyncio.Protocol):
    def __init__(self, switch: "FakeSwitch") -> None:
        self.switch = switch
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.dropped = False
        self.bundles: dict[int, Bundle] = {}  # open bundles die with the connection, as in OVS

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.switch._conns.append(self)
        self.switch.accepted += 1
        v = self.switch.hello_version
        self.send(message(ofp.OFPT_HELLO, 1, struct.pack("!HHI", 1, 8, 1 << v), version=v))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 8 and not self.dropped:
            length = struct.unpack_from("!H", self.buf, 2)[0]
            if length < 8:
                return self.drop()
            if len(self.buf) < length:
                return
            raw = bytes(self.buf[:length])
            del self.buf[:length]
            self.switch._handle(self, raw)

    def connection_lost(self, exc: Exception | None) -> None:
        self.switch._conns.remove(self)
        if not self.dropped:
            self.switch.peer_closed += 1

    def send(self, raw: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(raw)

    def drop(self) -> None:
        self.dropped = True
        if self.transport is not None:
            self.transport.abort()


class FakeSwitch:
    """Serves one bridge's OpenFlow socket; its table lives only as long as the instance."""

    def __init__(self, path: str, *, datapath_id: int = 0xFEEDC0FFEE, max_meter: int = 1024,
                 band_types: int = OFPMBT_DROP_BIT, max_bands: int = 1, hello_version: int = VERSION,
                 refuse_out_port: int | None = 77, refuse_meter_features: bool = False,
                 record_tables: bool = False) -> None:
        self.path = path
        self.datapath_id = datapath_id
        self.max_meter = max_meter
        self.band_types = band_types
        self.max_bands = max_bands
        self.hello_version = hello_version
        self.refuse_out_port = refuse_out_port
        self.refuse_meter_features = refuse_meter_features
        self.answer_echo = True
        self.hold_barriers = False  # queue barrier replies until release_barriers()
        self.drop_on: int | None = None  # drop the connection on the next message of this type
        # Drop the connection at the next bundle commit, "before" or "after" carrying it out.
        self.drop_on_commit: str | None = None
        self.refuse_table: int | None = None  # refuse every flow ADD into this table
        self.refuse_on_add = False  # refusals at OFPT_BUNDLE_ADD_MESSAGE time (else at the commit)
        self.commits = 0  # bundles committed
        self.flows: dict[FlowKey, Flow] = {}
        self.meters: dict[int, Meter] = {}
        self.groups: dict[int, Group] = {}
        self.mods: list[Mod] = []
        self.received: list[tuple[int, int]] = []  # (type, xid) of every message
        self.received_raw: list[bytes] = []
        # With record_tables: the flow table (key, actions) as it stood after each message handled.
        self.tables: list[frozenset[tuple[FlowKey, tuple[str, ...]]]] | None = [] if record_tables else None
        self.echo_requests = 0
        self.packet_in_format: int | None = None
        self.miss_send_len: int | None = None
        self.accepted = self.peer_closed = 0  # connections accepted / closed by the client
        self._held: list[tuple[_Conn, int]] = []
        self._conns: list[_Conn] = []
        self._server: asyncio.AbstractServer | None = None

    # --- control from tests ----------------------------------------------------------

    async def start(self) -> None:
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _Conn(self), self.path)

    async def stop(self) -> None:
        """Stop listening and drop every connection (ovs-vswitchd died)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.drop()
        await eventually(lambda: not self._conns, 1.0, "fake switch connections to close")

    def drop(self) -> None:
        for conn in list(self._conns):
            conn.drop()

    def send(self, raw: bytes) -> None:
        for conn in self._conns:
            conn.send(raw)

    def release_barriers(self) -> None:
        held, self._held = self._held, []
        for conn, xid in held:
            conn.send(message(ofp.OFPT_BARRIER_REPLY, xid))

    def types(self) -> list[int]:
        return [t for t, _ in self.received]

    # --- protocol ------------------------------------------------------------------------

    def _handle(self, conn: _Conn, raw: bytes) -> None:
        _, msg_type, _, xid = HEADER.unpack_from(raw)
        self.received.append((msg_type, xid))
        self.received_raw.append(raw)
        if self.drop_on == msg_type:
            self.drop_on = None
            conn.drop()
            return
        reply: bytes | None = None
        err: tuple[int, int] | None = None
        if msg_type == ofp.OFPT_ECHO_REQUEST:
            self.echo_requests += 1
            if self.answer_echo:
                reply = message(ofp.OFPT_ECHO_REPLY, xid, raw[8:])
        elif msg_type == ofp.OFPT_FEATURES_REQUEST:
            reply = message(ofp.OFPT_FEATURES_REPLY, xid,
                            struct.pack("!QIBB2xII", self.datapath_id, 0, 254, 0, 0x4F, 0))
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            if self.hold_barriers:
                self._held.append((conn, xid))
            else:
                reply = message(ofp.OFPT_BARRIER_REPLY, xid)
        elif msg_type == ofp.OFPT_SET_CONFIG:
            self.miss_send_len = struct.unpack_from("!H", raw, 10)[0]
        elif msg_type == ofp.OFPT_EXPERIMENTER:
            if struct.unpack_from("!II", raw, 8) == (NX_VENDOR, NXT_SET_PACKET_IN_FORMAT):
                self.packet_in_format = struct.unpack_from("!I", raw, 16)[0]
            else:
                err = (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_EXPERIMENTER)
        elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
            mp_type = struct.unpack_from("!H", raw, 8)[0]
            if mp_type == ofp.OFPMP_METER_FEATURES and not self.refuse_meter_features:
                # OVS 3.1 answers in the 16-byte OpenFlow 1.3 layout even on 1.5.
                body = struct.pack("!HH4x", mp_type, 0) + struct.pack(
                    "!IIIBB2x", self.max_meter, self.band_types, 0xF, self.max_bands, 0)
                reply = message(ofp.OFPT_MULTIPART_REPLY, xid, body)
            else:
                err = (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_MULTIPART)
        elif msg_type == ofp.OFPT_FLOW_MOD:
            err = self._flow_mod(raw, xid, self.flows, self.mods)
        elif msg_type == ofp.OFPT_BUNDLE_CONTROL:
            reply, err = self._bundle_control(conn, raw, xid)
        elif msg_type == ofp.OFPT_BUNDLE_ADD_MESSAGE:
            err = self._bundle_add(conn, raw, xid)
        elif msg_type == ofp.OFPT_METER_MOD:
            err = self._meter_mod(raw, xid)
        elif msg_type == ofp.OFPT_GROUP_MOD:
            err = self._group_mod(raw, xid)
        elif msg_type not in (ofp.OFPT_HELLO, ofp.OFPT_ECHO_REPLY):
            err = (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_TYPE)
        if err is not None:
            reply = error(xid, err[0], err[1], raw)
        if reply is not None:
            conn.send(reply)
        if self.tables is not None:
            self.tables.append(frozenset((k, tuple(map(str, f.actions))) for k, f in self.flows.items()))

    def _bundle_control(self, conn: _Conn, raw: bytes, xid: int) -> tuple[bytes | None, tuple[int, int] | None]:
        bundle_id, ctrl_type, flags = bundles.parse_control(raw)
        failed = ofp.OFPET_BUNDLE_FAILED
        bundle = conn.bundles.get(bundle_id)
        if ctrl_type == ofp.OFPBCT_OPEN_REQUEST:
            if bundle is not None:
                return None, (failed, ofp.OFPBFC_BAD_ID)
            conn.bundles[bundle_id] = Bundle(flags, [])
        elif bundle is None:
            return None, (failed, ofp.OFPBFC_BAD_ID)
        elif ctrl_type == ofp.OFPBCT_DISCARD_REQUEST:
            del conn.bundles[bundle_id]
        elif ctrl_type == ofp.OFPBCT_COMMIT_REQUEST:
            del conn.bundles[bundle_id]
            if bundle.flags != flags:
                return None, (failed, ofp.OFPBFC_BAD_FLAGS)
            if self.drop_on_commit == "before":
                self.drop_on_commit = None
                conn.drop()
                return None, None
            if not self._commit(conn, bundle):
                return None, (failed, ofp.OFPBFC_MSG_FAILED)
            if self.drop_on_commit == "after":
                self.drop_on_commit = None
                conn.drop()
                return None, None
        else:
            return None, (failed, ofp.OFPBFC_BAD_TYPE)
        return message(ofp.OFPT_BUNDLE_CONTROL, xid, struct.pack("!IHH", bundle_id, ctrl_type + 1, flags)), None

    def _bundle_add(self, conn: _Conn, raw: bytes, xid: int) -> tuple[int, int] | None:
        bundle_id, flags, inner = bundles.parse_add(raw)
        bundle = conn.bundles.get(bundle_id)
        if bundle is None:
            return (ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_BAD_ID)
        if HEADER.unpack_from(inner)[3] != xid:
            return (ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_MSG_BAD_XID)
        if flags != bundle.flags:
            return (ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_BAD_FLAGS)
        if inner[1] != ofp.OFPT_FLOW_MOD:
            return (ofp.OFPET_BUNDLE_FAILED, ofp.OFPBFC_MSG_UNSUP)
        if self.refuse_on_add:
            err = self._flow_mod(inner, xid, dict(self.flows), [])  # checked, not applied
            if err is not None:
                return err
        bundle.msgs.append(inner)
        return None

    def _commit(self, conn: _Conn, bundle: Bundle) -> bool:
        """Apply every message to a copy of the table; keep it only if all succeeded (atomic)."""
        staged, mods = dict(self.flows), []
        for inner in bundle.msgs:
            inner_xid = HEADER.unpack_from(inner)[3]
            err = self._flow_mod(inner, inner_xid, staged, mods)
            if err is not None:
                conn.send(error(inner_xid, err[0], err[1], inner))  # OVS names the failing message too
                return False
        self.flows.clear()
        self.flows.update(staged)
        self.mods.extend(mods)
        self.commits += 1
        return True

    def _flow_mod(self, raw: bytes, xid: int, flows: dict[FlowKey, Flow], mods: list[Mod]) -> tuple[int, int] | None:
        msg = messages.parse(raw)
        if msg is None:  # os-ken cannot read it (e.g. controller2 with meter_id)
            return (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_LEN)
        match = dict(msg.match.items())
        key: FlowKey = (msg.table_id, msg.priority, tuple(sorted(match.items())))
        mods.append(Mod("flow", msg.command, xid, key))
        actions: list[Any] = []
        goto = None
        for inst in msg.instructions:
            if isinstance(inst, parser.OFPInstructionActions):
                actions.extend(inst.actions)
            elif isinstance(inst, parser.OFPInstructionGotoTable):
                goto = inst.table_id
        if msg.command == ofp.OFPFC_ADD:
            if any(isinstance(a, parser.OFPActionOutput) and a.port == self.refuse_out_port
                   for a in actions):
                return (ofp.OFPET_BAD_ACTION, ofp.OFPBAC_BAD_OUT_PORT)
            if msg.table_id == self.refuse_table:
                return (ofp.OFPET_FLOW_MOD_FAILED, ofp.OFPFMFC_TABLE_FULL)
            flows[key] = Flow(msg.table_id, msg.priority, match, actions, goto, msg.cookie)
        elif msg.command == ofp.OFPFC_DELETE_STRICT:
            flows.pop(key, None)
        elif msg.command == ofp.OFPFC_DELETE:  # by cookie, in every table (a previous agent round)
            for k in [k for k, f in flows.items() if f.cookie & msg.cookie_mask == msg.cookie & msg.cookie_mask]:
                del flows[k]
        return None

    def _meter_mod(self, raw: bytes, xid: int) -> tuple[int, int] | None:
        msg = messages.parse(raw)
        if msg is None:
            return (ofp.OFPET_BAD_REQUEST, ofp.OFPBRC_BAD_LEN)
        self.mods.append(Mod("meter", msg.command, xid, msg.meter_id))
        meter = Meter(msg.meter_id, msg.flags, [(b.rate, b.burst_size) for b in msg.bands])
        if msg.command == ofp.OFPMC_ADD and msg.meter_id in self.meters:
            return (ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_METER_EXISTS)
        if msg.command == ofp.OFPMC_MODIFY and msg.meter_id not in self.meters:
            return (ofp.OFPET_METER_MOD_FAILED, ofp.OFPMMFC_UNKNOWN_METER)
        if msg.command in (ofp.OFPMC_ADD, ofp.OFPMC_MODIFY):
            self.meters[msg.meter_id] = meter
        elif msg.command == ofp.OFPMC_DELETE:
            if msg.meter_id == ofp.OFPM_ALL:
                self.meters.clear()
            self.meters.pop(msg.meter_id, None)
        return None

    def _group_mod(self, raw: bytes, xid: int) -> tuple[int, int] | None:
        # Parsed by struct: os-ken 2.x's OFPBucket.parser slices bucket properties as
        # buf[offset:offset + len] and raises on every group mod with two or more buckets.
        command, group_type, group_id, array_len, _ = struct.unpack_from(ofp.OFP_GROUP_MOD_PACK_STR, raw, 8)
        self.mods.append(Mod("group", command, xid, group_id))
        buckets: list[list[Any]] = []
        off, end = ofp.OFP_GROUP_MOD_SIZE, ofp.OFP_GROUP_MOD_SIZE + array_len
        while off < end:
            blen, alen, _bucket_id = struct.unpack_from(ofp.OFP_BUCKET_PACK_STR, raw, off)
            if blen < ofp.OFP_BUCKET_SIZE + alen or off + blen > end:
                return (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_BAD_BUCKET)
            acts: list[Any] = []
            a = off + ofp.OFP_BUCKET_SIZE
            while a < off + ofp.OFP_BUCKET_SIZE + alen:
                acts.append(parser.OFPAction.parser(raw, a))
                a += acts[-1].len
            buckets.append(acts)
            off += blen
        if command == ofp.OFPGC_ADD and group_id in self.groups:
            return (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_GROUP_EXISTS)
        if command == ofp.OFPGC_MODIFY and group_id not in self.groups:
            return (ofp.OFPET_GROUP_MOD_FAILED, ofp.OFPGMFC_UNKNOWN_GROUP)
        if command in (ofp.OFPGC_ADD, ofp.OFPGC_MODIFY):
            self.groups[group_id] = Group(group_id, group_type, buckets)
        elif command == ofp.OFPGC_DELETE:
            if group_id == ofp.OFPG_ALL:
                self.groups.clear()
            self.groups.pop(group_id, None)
        return None
