"""Keyed, consistent pseudonyms for the names and addresses a support bundle carries (`npaudit bundle --redact`).

What is replaced, in every byte of text handed to `Redactor.text`:
- every IPv4 and IPv6 address (a CIDR keeps its prefix length), except unspecified, loopback
  and netmask addresses (0.0.0.0, 127.0.0.0/8, ::, ::1, 255.255.255.0 ...): an IPv4 address
  becomes one in 240.0.0.0/4 (reserved, never a real Pod's), an IPv6 address one in
  2001:db8::/32 (documentation). The family is kept, the subnet structure is not: two
  addresses of one /24 get unrelated pseudonyms. An IPv4 address seen once in dotted form is
  also replaced where it stands as a hex number (`0xaf40002`, `0x0af40002`: OpenFlow loads).
- every MAC address but broadcast, multicast and all-zero: one that embeds an IPv4 address
  (`02:00:` + its 4 bytes, our Pods' MACs) becomes `02:00:` + the bytes of that address's
  pseudonym; any other one a keyed locally administered MAC.
- every name learned beforehand (`learn`, `learn_record`): Pod names, namespaces, node and
  cluster names, label values, policy and rule names. A name is replaced where it stands as a
  whole token (not inside a longer name), as `<kind>-<8 hex>`, and so are its JSON-escaped
  and Prometheus-escaped spellings. Label keys and tier names are kept: they name a schema,
  not a workload.
`file` redacts a JSON, JSON-lines or YAML file by its parsed values (so escaped, quoted or
folded spellings are all found, syntax such as JSON `true` is never a token, and the result
still parses), anything else as text.
A pseudonym is HMAC-SHA256(key, kind + value): the same input gives the same pseudonym within
one Redactor (one bundle); the key is random per bundle and never leaves the process, so
pseudonyms cannot be reversed or matched across bundles.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
from typing import Any, Mapping

NAME_KINDS = ("pod", "namespace", "node", "cluster", "label", "policy", "rule")
_V4_NET = ipaddress.ip_network("240.0.0.0/4")
_V6_NET = ipaddress.ip_network("2001:db8::/32")

# A name is a whole token: not glued to letters, digits, '_' or '-' on either side, nor to
# a '.' that continues the token (so `web` is found in "pod web." but not in "web.svc").
_BEFORE = r"(?<![\w-])(?<!\w\.)"
_AFTER = r"(?![\w-])(?!\.\w)"
_IPV6 = r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])"
_IPV4 = r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w]|\.\d)"
# Not inside a longer colon-separated hex run, but after `set_field:` or `dl_src=` (OpenFlow's text).
_MAC = r"(?<![\w.])(?<![0-9A-Fa-f]{2}:)(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![\w.])(?!:[0-9A-Fa-f])"
_FIND_IPV4 = re.compile(_IPV4)


def _spellings(value: str) -> set[str]:
    """`value` as the bundle's text files may hold it: raw, JSON-escaped (ASCII or not), and
    escaped as a Prometheus label value."""
    prometheus = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], prometheus}


def _is_kept(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Addresses that identify nothing: unspecified, loopback, and netmasks."""
    if addr.is_unspecified or addr.is_loopback:
        return True
    bits = int(addr)
    width = addr.max_prefixlen
    inverted = ~bits & ((1 << width) - 1)
    return bits >> (width - 1) == 1 and inverted & (inverted + 1) == 0  # 1...10...0


class Redactor:
    """One bundle's pseudonyms: learn the names, then scrub text; never reveals its key."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("redaction key: at least 16 bytes")
        self._key = key
        self._names: dict[str, str] = {}  # value -> pseudonym (the first kind learned wins)
        self._spelled: dict[str, str] = {}  # every spelling of a learned value -> its pseudonym
        self._addresses: dict[str, str] = {}
        self._hex: dict[str, str] = {}  # "0x..." of an IPv4 address seen -> its pseudonym
        self._taken: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self.counts: dict[str, int] = {}

    def _digest(self, text: str) -> bytes:
        return hmac.new(self._key, text.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def learn(self, kind: str, value: Any) -> None:
        """Remember `value` (a str) as a `kind` name to replace; empty and non-str values are ignored."""
        if kind not in NAME_KINDS:
            raise ValueError(f"redaction kind {kind!r}: must be one of {', '.join(NAME_KINDS)}")
        if not isinstance(value, str) or not value or value in self._names:
            return
        pseudonym = self._unique(f"{kind}-" + self._digest(f"{kind}\0{value}").hex()[:8])
        self._names[value] = pseudonym
        for spelling in _spellings(value):
            self._spelled.setdefault(spelling, pseudonym)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._pattern = None

    def learn_addresses(self, text: str) -> None:
        """Every dotted IPv4 address in `text`, so that its hex spelling is replaced anywhere too."""
        for match in _FIND_IPV4.finditer(text):
            try:
                addr = ipaddress.IPv4Address(match.group(0))
            except ValueError:
                continue
            if _is_kept(addr) or f"0x{int(addr):x}" in self._hex:
                continue
            pseudonym = ipaddress.IPv4Address(self.address(str(addr)))
            for form in (f"0x{int(addr):x}", f"0x{int(addr):08x}"):
                self._hex[form] = f"0x{int(pseudonym):x}" if len(form) < 10 else f"0x{int(pseudonym):08x}"
            self._pattern = None

    def learn_record(self, record: Mapping[str, Any]) -> None:
        """The names an audit record carries (its addresses need no learning: all are replaced)."""
        npaudit = _dict(record.get("npaudit"))
        for side in ("source", "destination"):
            pod = _dict(_dict(npaudit.get(side)).get("pod"))
            self.learn("pod", pod.get("name"))
            self.learn("namespace", pod.get("namespace"))
        self.learn("node", _dict(record.get("observer")).get("hostname"))
        orchestrator = _dict(record.get("orchestrator"))
        self.learn("cluster", _dict(orchestrator.get("cluster")).get("name"))
        self.learn("namespace", orchestrator.get("namespace"))
        self.learn("label", _dict(record.get("labels")).get("log_label"))
        rule = _dict(record.get("rule"))
        self.learn("rule", rule.get("name"))
        ruleset = rule.get("ruleset")
        if isinstance(ruleset, str):  # Kind:namespace/name or Kind:name
            scope, _, name = ruleset.partition(":")[2].rpartition("/")
            self.learn("namespace", scope)
            self.learn("policy", name)

    def _unique(self, candidate: str) -> str:
        """Two inputs never share a pseudonym (a truncated hash can collide): the later one moves on."""
        n = 0
        pseudonym = candidate
        while pseudonym in self._taken:
            n += 1
            pseudonym = f"{candidate}-{n}"
        self._taken.add(pseudonym)
        return pseudonym

    def address(self, text: str) -> str:
        """The pseudonym of one address (text that is not an address, or is kept, comes back as is)."""
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            return text
        if _is_kept(addr):
            return text
        canonical = str(addr)
        known = self._addresses.get(canonical)
        if known is not None:
            return known
        net = _V4_NET if addr.version == 4 else _V6_NET
        host_bits = net.max_prefixlen - net.prefixlen
        value = int.from_bytes(self._digest(f"ip\0{canonical}"), "big")
        for _ in range(1 << 16):  # a collision moves to the next address of the range
            pseudonym = str(net.network_address + value % (1 << host_bits))
            if pseudonym not in self._taken:
                break
            value += 1
        self._taken.add(pseudonym)
        self._addresses[canonical] = pseudonym
        self.counts["ip"] = self.counts.get("ip", 0) + 1
        return pseudonym

    def _compiled(self) -> re.Pattern[str]:
        if self._pattern is None:
            names = sorted(self._spelled, key=len, reverse=True)  # the longest name wins
            alternatives = "|".join(map(re.escape, names)) or "(?!)"  # (?!) never matches
            hexes = "|".join(map(re.escape, sorted(self._hex, key=len, reverse=True))) or "(?!)"
            self._pattern = re.compile(
                f"(?P<mac>{_MAC})|(?P<v6>{_IPV6})|(?P<v4>{_IPV4})|(?<![\\w])(?P<hex>{hexes})(?![\\w])"
                f"|{_BEFORE}(?P<name>{alternatives}){_AFTER}")
        return self._pattern

    def _replace(self, match: re.Match[str]) -> str:
        name = match.group("name")
        if name is not None:
            return self._spelled[name]
        if match.group("mac") is not None:
            return self.mac(match.group(0))
        if match.group("hex") is not None:
            return self._hex[match.group(0)]
        return self.address(match.group(0))

    def mac(self, text: str) -> str:
        """The pseudonym of one MAC address (broadcast, multicast and all-zero come back as they are)."""
        octets = bytes(int(part, 16) for part in text.split(":"))
        if octets[0] & 1 or not any(octets):
            return text
        if octets[:2] == b"\x02\x00":  # a Pod's MAC: 02:00 + its IPv4 address
            mapped = ipaddress.IPv4Address(self.address(str(ipaddress.IPv4Address(octets[2:])))).packed
            return ":".join(f"{b:02x}" for b in b"\x02\x00" + mapped)
        known = self._addresses.get(text.lower())
        if known is not None:
            return known
        value = int.from_bytes(self._digest(f"mac\0{text.lower()}")[:5], "big")
        while True:  # a collision moves on
            pseudonym = ":".join(f"{b:02x}" for b in b"\x02" + value.to_bytes(5, "big"))
            if pseudonym not in self._taken:
                break
            value = (value + 1) % (1 << 40)
        self._taken.add(pseudonym)
        self._addresses[text.lower()] = pseudonym
        self.counts["mac"] = self.counts.get("mac", 0) + 1
        return pseudonym

    def text(self, text: str) -> str:
        """`text` with every address and learned name replaced, in one pass (a pseudonym is never
        replaced again)."""
        return self._compiled().sub(self._replace, text)

    def data(self, data: bytes) -> bytes:
        """`text` over bytes: UTF-8, with bytes that are not kept as they were."""
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")

    def value(self, value: Any) -> Any:
        """A parsed JSON/YAML value with every string in it (keys too) redacted; other scalars kept."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(item) for item in value]
        if isinstance(value, dict):
            return {self.value(k): self.value(v) for k, v in value.items()}
        return value

    def file(self, name: str, data: bytes) -> bytes:
        """A bundle file redacted by its parsed values where it is JSON, JSON lines or YAML (it then
        still parses), as text otherwise or when it does not parse."""
        import yaml

        try:
            if name.endswith(".json"):
                parsed = json.loads(data)
                indent = 2 if b"\n" in data.strip() else None
                return json.dumps(self.value(parsed), indent=indent, ensure_ascii=False).encode() + b"\n"
            if name.endswith(".jsonl"):
                return b"".join(json.dumps(self.value(json.loads(line)), ensure_ascii=False,
                                           separators=(",", ":")).encode() + b"\n"
                                for line in data.splitlines() if line.strip())
            if name.endswith((".yaml", ".yml")):
                docs = [self.value(doc) for doc in yaml.safe_load_all(data)]
                return yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True).encode()
        except (ValueError, yaml.YAMLError, RecursionError):
            pass  # not what its name says: every byte as text
        return self.data(data)

    def summary(self) -> dict[str, Any]:
        """What was replaced, as counts per kind (never the values or the key)."""
        return {"replaced": dict(sorted(self.counts.items())),
                "kinds": ["ip", "mac", *NAME_KINDS],
                "kept": "unspecified, loopback and netmask addresses; label keys; tier names",
                "ipv4_range": str(_V4_NET), "ipv6_range": str(_V6_NET)}


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}
