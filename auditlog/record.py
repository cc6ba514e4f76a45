"""The ECS-aligned audit record (config/audit-record.schema.json): packet-in straight to the chain's JCS text."""

from __future__ import annotations

import enum
import math
import time
import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from auditlog.chain import DATASET, ECS_VERSION, FORMAT_MEMBER, OBSERVER, SEQ_KEY, TIMESTAMP_KEY, RecordText
from auditlog.community_id import PORTED_PROTOCOLS, flow_community_id, ported_community_id
from auditlog.jcs import SAFE_INTEGER, canonical, number
from auditlog.packet import PacketSummary, transport_name
from auditlog.record_views import PodDirectory, PodTable, RuleLookup, RuleView
from packetin.model import PacketIn
from packetin.registers import DISPOSITION_BITS

__all__ = ["PodDirectory", "PodTable", "RecordContext", "RecordEncoder", "RuleLookup", "RuleView", "clean_text",
           "ACTIONS", "DISPOSITIONS", "OBSERVER"]

# reg7[0..3] -> (npaudit.disposition, event.action, the verdict word of event.type).
# Pass hands the packet to the next policy layer: it is neither allowed nor denied
# yet, so it gets no verdict in event.type (ECS: leave what does not fit empty).
_BY_DISPOSITION: dict[int, tuple[str, str, str | None]] = {
    0: ("Allow", "allowed", "allowed"),
    1: ("Drop", "dropped", "denied"),
    2: ("Reject", "rejected", "denied"),
    3: ("Pass", "passed", None),
}
_BY_ACTION_NAME = {v[0]: k for k, v in _BY_DISPOSITION.items()}
DISPOSITIONS = tuple(v[0] for v in _BY_DISPOSITION.values())
ACTIONS = tuple(v[1] for v in _BY_DISPOSITION.values())

_ECS = f',"ecs":{{"version":"{ECS_VERSION}"}}'


class EventIds:
    """Unique event ids, cheaply: 64 random bits drawn once per process, then a counter.

    32 hex digits like a uuid4, but one os.urandom per process instead of one per
    record (a system call that costs more than building the whole record).
    """

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16]
        self._next = itertools.count().__next__

    def __call__(self) -> str:
        return f"{self._prefix}{self._next():016x}"


@dataclass(frozen=True, kw_only=True)
class RecordContext:
    """What every record of this node shares; `cluster` "" means no cluster name is set.

    `new_event_id` makes event.id: 32 hex digits, random per process plus a counter
    (EventIds), because nothing known when a record is built is unique (seq is
    assigned later, when the writer seals the chain; two one-packet records of a
    key can share a millisecond).
    Tests inject a deterministic one. A re-sent line keeps its id, so SIEMs can still
    deduplicate at-least-once deliveries.
    """

    node: str
    rules: RuleLookup
    pods: PodDirectory
    cluster: str = ""
    new_event_id: Callable[[], str] = field(default_factory=EventIds)


def _enum_value(value: object) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _text(value: object) -> str:
    """A user-controlled string as valid Unicode (names and labels are data, never trusted)."""
    return clean_text(value if isinstance(value, str) else str(value))


def _pod_fields(found: tuple[str, str] | None) -> dict[str, str] | None:
    if not found:
        return None
    namespace, name = found
    pod = {k: _text(v) for k, v in (("name", name), ("namespace", namespace)) if v}
    return pod or None


_Pair = tuple[str, str] | None  # what PodDirectory.by_ip gives
# RecordEncoder._pair_texts: the texts of a record that only its addresses, its rule and the Pods decide.
_PairTexts = tuple[str, str, str, str, str, str, str, str, str, str, str, str, str]

_FRAGMENT, _TRUNCATED = '"fragment":true,', ',"truncated":true'


class _RuleParts:
    """The text of everything a record takes from its rule and disposition, made once per rule."""

    __slots__ = ("rule", "event_head", "event_tail", "labels", "direction", "network_direction",
                 "disposition", "priority", "tier", "rule_text", "namespace", "verdict", "said", "after_dst",
                 "after_start")

    def __init__(self, rule: RuleView | None, pin: PacketIn) -> None:
        self.rule = rule
        rule_id, disposition = pin.rule_id, pin.disposition
        if disposition not in _BY_DISPOSITION and rule is not None:
            # reg7 is the datapath's verdict and wins; the rule's action is only a fallback.
            disposition = _BY_ACTION_NAME.get(_enum_value(rule.action), disposition)
        verdict = _BY_DISPOSITION.get(disposition)
        if verdict is None:
            raise ValueError(f"packet-in of rule id {rule_id} (table {pin.table_id}) has reg7={pin.reg7:#x}, "
                             "which is no disposition, and the rule is unknown")
        name, action, verdict_type = verdict
        types = ["connection", verdict_type] if verdict_type else ["connection"]
        # event.end, event.id and event.start are written per record between these.
        self.event_head = f'"event":{{"action":"{action}","category":["network"],"dataset":"{DATASET}","end":"'
        self.event_tail = f'","type":{canonical(types)}}}'
        self.disposition = f'"disposition":"{name}",'
        self.direction = _enum_value(rule.direction).lower() if rule is not None else ""
        self.network_direction = (f'"direction":"{self.direction}",'
                                  if self.direction in ("ingress", "egress") else "")
        self.labels = (f',"labels":{canonical({"log_label": _text(rule.log_label)})}'
                       if rule is not None and rule.log_label else "")
        self.namespace = rule.namespace if rule is not None else ""
        fields: dict[str, str] = {}
        self.priority = self.tier = ""
        if rule is not None:
            if rule.rule_name:
                fields["name"] = _text(rule.rule_name)
            if rule.ruleset:
                fields["ruleset"] = _text(rule.ruleset)
            if rule.tier:
                fields["category"] = _text(rule.tier)
                # Only tiered (Antrea) rules have a priority; a K8s NetworkPolicy has none
                # (the registry fills 0.0 there), and a non-finite number is not JSON.
                # JCS writes 10.0 as 10, as any JavaScript-like re-encoder would: the
                # schema tells a SIEM to map npaudit.priority as a float.
                if isinstance(rule.priority, (int, float)) and math.isfinite(rule.priority):
                    self.priority = f'"priority":{number(float(rule.priority))},'
                self.tier = f',"tier":{canonical(_text(rule.tier))}'
        else:
            # The same slot as priority (which only a known rule has): "rule_unknown" sorts
            # after "priority" and before "seq", so canonical order holds either way.
            self.priority = '"rule_unknown":true,'
        if rule_id:  # reg6 is known from the packet even when the registry has no such rule
            fields["id"] = str(rule_id)
        self.rule_text = f',"rule":{canonical(fields)}' if fields else ""
        # The message's verdict and rule, JSON-escaped: '"message":"' + verdict + the flow + rule + '"'.
        by = (f", by {_text(rule.ruleset) or 'a policy'} rule {_text(rule.rule_name) or '#' + str(rule_id)}"
              if rule is not None else f", by unknown rule #{rule_id}" if rule_id else "")
        self.said = (canonical(f"{name} {self.direction} " if self.direction else f"{name} ")[1:-1],
                     canonical(by)[1:-1])
        # The labels of npaudit_policy_verdicts_total: the record's disposition, direction and tier.
        self.verdict = (name, self.direction, _text(rule.tier) if rule is not None and rule.tier else "")
        # A record's text between its destination and event.end, and between event.start and the message.
        self.after_dst = f"{_ECS},{self.event_head}"
        self.after_start = f'{self.event_tail}{self.labels},"message":"'


class RecordEncoder:
    """Builds audit records straight into JCS text (chain.RecordText); bench/auditlog_throughput.py times it.

    The record is the one config/audit-record.schema.json describes; fields that
    are not known are absent, never null. Everything taken from the rule, the Pods
    and the node is put in canonical form once and kept (a rule is re-read when the
    registry hands out a different object for its id; a Pod's text is keyed by its
    (namespace, name)); per packet only numbers, addresses and times are written.
    """

    MAX_CACHED = 4096  # texts per cache; a full cache starts over

    def __init__(self, ctx: RecordContext) -> None:
        self._ctx = ctx
        self._rules_get = ctx.rules.get
        self._by_ip = ctx.pods.by_ip
        self._new_event_id = ctx.new_event_id
        # EventIds' prefix and counter, so that a record's id costs no call of its own (and its ids are hex
        # digits: nothing to escape)
        ids = ctx.new_event_id
        self._id_parts = (ids._prefix, ids._next) if type(ids) is EventIds else None
        self._rules: dict[tuple[int, int], _RuleParts] = {}
        self._pods: dict[tuple[str, str], tuple[str, str]] = {}
        self._orchestrators: dict[str, str] = {}
        self._networks: dict[tuple[str, int | None, int | None, int | None], tuple[str, str]] = {}
        self._community: dict[tuple[str | None, str | None, int | None, int | None, int | None, int | None,
                                    int | None], str] = {}
        self._ovs_texts: dict[tuple[int, int, int | None], str] = {}
        # With a PodTable: per (source, destination, rule parts), the texts the Pods at both ends give
        # (npaudit's destination and source, orchestrator, related), kept while the table is the same object.
        self._ip_table: Callable[[], Mapping[str, tuple[str, str]]] | None = getattr(ctx.pods, "ip_table", None)
        self._pairs_of: Mapping[str, tuple[str, str]] | None = None
        self._pairs: dict[tuple[str | None, str | None, _RuleParts], _PairTexts] = {}
        observer: dict[str, Any] = {"hostname": _text(ctx.node)} if ctx.node else {}
        self._observer = f',"observer":{canonical({**observer, **OBSERVER})}'
        self._cluster = {"name": _text(ctx.cluster)} if ctx.cluster else None
        self._second = self._ms = -1
        self._second_text = self._ms_text = ""

    def c_parts(self) -> dict[str, Any] | None:
        """FastEncoder's view of this encoder's state (record_fast.py); None for ids or Pods not of the usual kind."""
        if (ids := self._id_parts) is None or self._ip_table is None:
            return None
        return {"fallback": self.encode_positional, "rules": self._rules, "pairs": self._pairs,
                "networks": self._networks, "community": self._community, "ovs_texts": self._ovs_texts,
                "rules_get": self._rules_get, "ip_table": self._ip_table, "id_prefix": ids[0], "id_next": ids[1],
                "fragment": _FRAGMENT, "truncated": _TRUNCATED, "max_cached": self.MAX_CACHED}

    def _rule_parts(self, pin: PacketIn) -> _RuleParts:
        rule_id = pin.rule_id
        rule = self._rules_get(rule_id) if rule_id else None
        key = (rule_id, pin.reg7 & DISPOSITION_BITS)
        parts = self._rules.get(key)
        if parts is None or parts.rule is not rule:
            parts = _cache(self._rules, key, _RuleParts(rule, pin))
        return parts

    def _pod_texts(self, found: tuple[str, str]) -> tuple[str, str]:
        """(as npaudit.destination + ",", as "," + npaudit.source) of a Pod by_ip found."""
        pod = _pod_fields(found)
        text = canonical({"pod": pod}) if pod else ""
        return _cache(self._pods, found, (f'"destination":{text},', f',"source":{text}') if text else ("", ""))

    def _orchestrator(self, namespace: str) -> str:
        fields: dict[str, Any] = {"type": "kubernetes"}
        if self._cluster:
            fields["cluster"] = self._cluster
        if namespace:
            fields["namespace"] = _text(namespace)
        return _cache(self._orchestrators, namespace, f',"orchestrator":{canonical(fields)}')

    def _network(self, key: tuple[str, int | None, int | None, int | None]) -> tuple[str, str]:
        """The network members that sort between "bytes" and "packets", and those after "packets"."""
        direction, protocol, version, vlan = key
        before, after = direction, ""
        if protocol is not None:
            before += f'"iana_number":"{protocol}",'  # ECS keyword
            transport = transport_name(protocol)
            if transport is not None:
                after += f',"transport":"{transport}"'
        if version is not None:
            after += f',"type":"ipv{version}"'
        if vlan is not None:
            after += f',"vlan":{{"id":"{vlan}"}}'  # ECS keyword
        return _cache(self._networks, key, (before, after))

    def _community_text(self, flow: tuple[str | None, str | None, int | None, int | None, int | None,
                                          int | None, int | None]) -> str:
        """network.community_id's member (with its comma), "" when the packet lacks what the hash needs."""
        cid = flow_community_id(*flow)
        return _cache(self._community, flow, f'"community_id":"{cid}",' if cid else "")

    def _ovs(self, key: tuple[int, int, int | None]) -> str:
        cookie, table, in_port = key
        port = "" if in_port is None else f'"in_port":{in_port},'
        return _cache(self._ovs_texts, key,
                      f'"ovs":{{"cookie":"0x{cookie & 0xFFFF_FFFF_FFFF_FFFF:016x}",{port}"table":{table}}},')

    def _pair_texts(self, rp: _RuleParts, src_ip: str | None, dst_ip: str | None,
                    by_ip: Callable[[str], _Pair]) -> _PairTexts:
        """(npaudit.destination's text, npaudit.source's, orchestrator's, related's, destination's up to its
        port, source's, and for the message each end without its port and before it) of a record of `rp`
        between these addresses, with `by_ip` naming their Pods."""
        src_found = by_ip(src_ip) if src_ip is not None else None
        dst_found = by_ip(dst_ip) if dst_ip is not None else None
        # The applied-to Pod is the one the rule protects: the destination of ingress
        # traffic, the source of egress traffic.
        direction = rp.direction
        applied = dst_found if direction == "ingress" else src_found if direction == "egress" else None
        applied_ns = (applied[0] if applied and applied[0] else "") or rp.namespace
        if dst_ip is not None:
            related = (f',"related":{{"ip":["{src_ip}","{dst_ip}"]}}' if src_ip is not None and src_ip != dst_ip
                       else f',"related":{{"ip":["{dst_ip}"]}}')
        else:
            related = "" if src_ip is None else f',"related":{{"ip":["{src_ip}"]}}'
        pods = self._pods
        dst_pod = (pods.get(dst_found) or self._pod_texts(dst_found))[0] if dst_found else ""
        src_pod = (pods.get(src_found) or self._pod_texts(src_found))[1] if src_found else ""
        orchestrator = self._orchestrators.get(applied_ns) or self._orchestrator(applied_ns)
        # Addresses come from decode_frame (inet_ntop / ipaddress): digits, dots,
        # colons and hex, nothing JSON would escape.
        dst_head = "" if dst_ip is None else f',"destination":{{"ip":"{dst_ip}"'
        src_head = "}" if src_ip is None else f',"source":{{"ip":"{src_ip}"'
        # And the runs of `mid` and `tail` (see encode_positional) that only these and the rule decide.
        return (dst_pod, src_pod, orchestrator, related, dst_head, src_head,
                _endpoint(src_ip, None), _port_prefix(src_ip), _endpoint(dst_ip, None), _port_prefix(dst_ip),
                f"{FORMAT_MEMBER}{dst_pod}{rp.disposition}", f"{src_pod}{rp.tier}",
                f"}}{self._observer}{orchestrator}{related}{rp.rule_text}")

    def _pair(self, rp: _RuleParts, src_ip: str | None, dst_ip: str | None,
              by_ip: Callable[[str], _Pair]) -> _PairTexts:
        """_pair_texts, kept for the table `by_ip` reads (see encode_positional)."""
        return _cache(self._pairs, (src_ip, dst_ip, rp), self._pair_texts(rp, src_ip, dst_ip, by_ip))

    def _timestamp(self, t: float) -> str:
        # UTC, nearest millisecond: epoch floats carry binary noise (….512 may be
        # ….51199999), which truncation would turn into the previous millisecond.
        ms = round(t * 1000)
        if ms == self._ms:  # under load, dozens of records share a millisecond
            return self._ms_text
        seconds, millis = divmod(ms, 1000)
        if seconds != self._second:
            self._second, self._second_text = seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        self._ms, self._ms_text = ms, "%s.%03dZ" % (self._second_text, millis)
        return self._ms_text

    def encode(self, pin: PacketIn, summary: PacketSummary, *, packets: int, bytes_: int, first: float,
               last: float, offloaded_packets: int = 0) -> RecordText:
        """The record for `packets` packets of one key, sampled by `pin` / `summary`.

        Raises ValueError only when neither reg7 nor the rule registry gives a
        disposition (no flow of ours does that).
        """
        return self.encode_positional(pin, summary, packets, bytes_, first, last, offloaded_packets)

    def encode_positional(self, pin: PacketIn, summary: PacketSummary, packets: int, bytes_: int, first: float,
                          last: float, offloaded_packets: int, coarsened: str = "", keys: int = 0) -> RecordText:
        """encode, without keyword arguments (cheaper per call: the pipeline's per-record path).

        `coarsened` ("ports" or "peers") marks a record of the overload mode, which stands for
        `keys` distinct full-detail keys (`summary` then has no ports, maybe no peer address).
        """
        rule_id = pin.rule_id
        rp = self._rules.get((rule_id, pin.reg7 & DISPOSITION_BITS))
        if rp is None or rp.rule is not (self._rules_get(rule_id) if rule_id else None):
            rp = self._rule_parts(pin)
        # _timestamp's own shortcut, without the call: records of one millisecond share the text
        first_s = self._ms_text if round(first * 1000) == self._ms else self._timestamp(first)
        last_s = first_s if last == first else self._timestamp(last)
        s = summary
        src_ip, dst_ip = s.src_ip, s.dst_ip
        ip_table = self._ip_table
        if ip_table is not None:
            table = ip_table()
            if table is not self._pairs_of:  # the Pods changed: nothing worked out from the old table holds
                self._pairs.clear()
                self._pairs_of = table
            pair = self._pairs.get((src_ip, dst_ip, rp)) or self._pair(rp, src_ip, dst_ip, table.get)
        else:
            pair = self._pair_texts(rp, src_ip, dst_ip, self._by_ip)
        (dst_pod, src_pod, orchestrator, related, dst_head, src_head, src_ep, src_pre, dst_ep, dst_pre,
         mid_head, tail_head, tail_rest) = pair
        src_port, dst_port = s.src_port, s.dst_port
        if dst_ip is not None:
            destination = f'{dst_head}}}' if dst_port is None else f'{dst_head},"port":{dst_port}}}'
            if dst_port is not None:
                dst_ep = f"{dst_pre}{dst_port}"
        else:
            destination = ""
        if src_ip is not None:
            source = f'{src_head}}}}}' if src_port is None else f'{src_head},"port":{src_port}}}}}'
            if src_port is not None:
                src_ep = f"{src_pre}{src_port}"
        else:
            source = "}"
        id_parts = self._id_parts
        if id_parts is not None:  # EventIds.__call__, inline
            event_id = f"{id_parts[0]}{id_parts[1]():016x}"
        else:
            event_id = self._new_event_id()
            if not (event_id.isascii() and event_id.isalnum()):
                event_id = canonical(_text(event_id))[1:-1]
        icmp_type, icmp_code, protocol = s.icmp_type, s.icmp_code, s.protocol
        icmp = icmp_said = ""
        if icmp_type is not None:  # ECS has no icmp field set: a vendor field
            code = "" if icmp_code is None else f'"code":{icmp_code},'
            icmp = f'"icmp":{{{code}"type":{icmp_type}}},'
            icmp_said = f" type {icmp_type}" if icmp_code is None else f" type {icmp_type} code {icmp_code}"
        counts: tuple[int | str, int | str, int | str]
        if (packets | bytes_ | offloaded_packets) > SAFE_INTEGER:  # never in practice; JCS rounds these
            counts = number(packets), number(bytes_), number(offloaded_packets)
        else:
            counts = packets, bytes_, offloaded_packets
        n_packets, n_bytes, n_offloaded = counts
        # JCS order inside aggregate: bytes, coarsened, first, keys, last, offloaded_packets, packets.
        coarse_head, coarse_keys = (f'"coarsened":"{coarsened}",', f'"keys":{keys},') if coarsened else ("", "")
        net_key = (rp.network_direction, protocol, s.ip_version, s.vlan)
        net_before, net_after = self._networks.get(net_key) or self._network(net_key)
        flow = (src_ip, dst_ip, protocol, src_port, dst_port, icmp_type, icmp_code)
        community = self._community.get(flow)
        if community is None:
            if (protocol in PORTED_PROTOCOLS and src_port is not None and dst_port is not None
                    and src_ip is not None and dst_ip is not None):
                # flow_community_id's common case, without its checks: a key's records share it
                try:
                    cid = ported_community_id(src_ip, dst_ip, protocol, src_port, dst_port)
                    community = _cache(self._community, flow, f'"community_id":"{cid}",')
                except ValueError:
                    community = self._community_text(flow)
            else:
                community = self._community_text(flow)
        # message: one short line, JSON-escaped; e.g. `Drop ingress udp 10.0.0.1:1000 -> 10.0.0.2:53, 50 packets,
        # by sec rule drop-udp`. Addresses, numbers and protocol names need no escaping; the ends come from the
        # pair's texts.
        said, by = rp.said
        proto = s.transport or (f"ip proto {protocol}" if protocol is not None else "non-IP")
        message = (f"{said}{proto} {src_ep} -> {dst_ep}{icmp_said}, "
                   f"{'1 packet' if packets == 1 else f'{packets} packets'}{by}")
        # Two f-strings of under 30 parts each: CPython builds a longer one through a list and a join.
        head = (f'{TIMESTAMP_KEY}{first_s}"{destination}{rp.after_dst}{last_s}","id":"{event_id}",'
                f'"kind":"event","outcome":"success","start":"{first_s}{rp.after_start}{message}"')
        head = (f'{head},"network":{{"bytes":{n_bytes},{community}{net_before}"packets":{n_packets}{net_after}}}'
                f',"npaudit":{{"aggregate":{{"bytes":{n_bytes},{coarse_head}"first":"{first_s}",'
                f'{coarse_keys}"last":"{last_s}","offloaded_packets":{n_offloaded},"packets":{n_packets}}},')

        ovs_key = (pin.cookie, pin.table_id, pin.in_port)
        ovs = self._ovs_texts.get(ovs_key) or self._ovs(ovs_key)
        # mid: FORMAT_MEMBER, the destination Pod, disposition, fragment, icmp, ovs, priority, SEQ_KEY;
        # tail: the source Pod, tier, truncated, "}", observer, orchestrator, related, rule, source.
        mid = f'{mid_head}{_FRAGMENT if s.fragment else ""}{icmp}{ovs}{rp.priority}{SEQ_KEY}'
        tail = f'{tail_head}{_TRUNCATED if s.truncated else ""}{tail_rest}{source}'
        text = RecordText(head, mid, tail)
        text.verdict = rp.verdict
        return text


def _port_prefix(ip: str | None) -> str:
    """An endpoint's text before its port: "10.0.0.1:" or "[fd00::1]:" ("" without an address)."""
    if ip is None:
        return ""
    return f"[{ip}]:" if ":" in ip else f"{ip}:"


def _endpoint(ip: str | None, port: int | None) -> str:
    if ip is None:
        return "?"
    if port is None:
        return ip
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _cache(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Put `value` in `cache` (emptied when it holds RecordEncoder.MAX_CACHED) and return it."""
    if len(cache) >= RecordEncoder.MAX_CACHED:
        cache.clear()
    cache[key] = value
    return value


def clean_text(value: str) -> str:
    """`value` as valid Unicode: each lone surrogate becomes U+FFFD, and two surrogate
    code points that form a pair become the character they encode."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
