"""Keyed pseudonyms for `npaudit bundle --redact`: consistent, family-preserving, whole tokens only."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policy_agent.bundle.redact import Redactor
from tests.support.audit_records import sample_record

KEY = b"k" * 32


def test_the_same_name_or_address_gets_the_same_pseudonym_everywhere_in_one_bundle() -> None:
    r = Redactor(KEY)
    r.learn("pod", "web-5c")
    first = r.text("pod web-5c at 10.244.1.3")
    second = r.text('{"name": "web-5c", "ip": "10.244.1.3"}')
    pod, ip = first.split()[1], first.split()[3]
    assert pod.startswith("pod-") and pod in second and ip in second
    assert "web-5c" not in first + second and "10.244.1.3" not in first + second


def test_another_key_gives_other_pseudonyms_so_bundles_cannot_be_matched() -> None:
    texts = []
    for key in (KEY, b"x" * 32):
        r = Redactor(key)
        r.learn("namespace", "frontend")
        texts.append(r.text("frontend 10.0.0.7"))
    assert texts[0] != texts[1]


def test_addresses_keep_their_family_and_land_in_reserved_ranges() -> None:
    r = Redactor(KEY)
    v4, v6 = r.address("10.244.0.5"), r.address("fd00::99")
    assert ipaddress.ip_address(v4) in ipaddress.ip_network("240.0.0.0/4")
    assert ipaddress.ip_address(v6) in ipaddress.ip_network("2001:db8::/32")
    assert r.address("fd00:0::99") == v6  # one address, two spellings, one pseudonym


def test_a_cidr_keeps_its_prefix_length_and_identifying_nothing_is_kept() -> None:
    r = Redactor(KEY)
    out = r.text("nw_dst=10.1.2.0/24 mask 255.255.255.0 lo 127.0.0.1 any 0.0.0.0 ::1 ::")
    assert "10.1.2.0" not in out and out.split()[0].endswith("/24")
    assert out.split()[1:] == ["mask", "255.255.255.0", "lo", "127.0.0.1", "any", "0.0.0.0", "::1", "::"]


def test_a_name_is_replaced_as_a_whole_token_not_inside_longer_words() -> None:
    r = Redactor(KEY)
    r.learn("namespace", "web")
    out = r.text("web/web-5c webhook web.svc (web) web.")
    assert out.split()[1:4] == ["webhook", "web.svc", out.split()[3]]
    assert out.startswith("namespace-") and "/web-5c" in out and "(namespace-" in out


def test_the_longest_learned_name_wins_and_pseudonyms_are_not_replaced_again() -> None:
    r = Redactor(KEY)
    r.learn("namespace", "db")
    r.learn("pod", "db-0")
    out = r.text("db db-0")
    ns, pod = out.split()
    assert ns.startswith("namespace-") and pod.startswith("pod-")


def test_mac_addresses_are_replaced_as_macs_and_times_are_not_taken_for_addresses() -> None:
    r = Redactor(KEY)
    out = r.text("dl_src=fa:16:3e:00:00:01 at 02:14:03 std::vector ff:ff:ff:ff:ff:ff 01:00:5e:00:00:fb")
    mac = out.split()[0].removeprefix("dl_src=")
    assert mac != "fa:16:3e:00:00:01" and re.fullmatch(r"02(:[0-9a-f]{2}){5}", mac)
    assert out.split()[1:] == ["at", "02:14:03", "std::vector", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:fb"]
    assert r.text("fa:16:3e:00:00:01") == mac  # consistent


def test_a_pods_mac_carries_the_pseudonym_of_the_address_it_embeds() -> None:
    r = Redactor(KEY)
    out = r.text("nw_dst=10.251.0.2 actions=set_field:02:00:0a:fb:00:02->eth_dst")
    pseudonym = ipaddress.IPv4Address(out.split()[0].removeprefix("nw_dst="))
    assert "02:00:0a:fb:00:02" not in out
    assert f"set_field:02:00:{':'.join(f'{b:02x}' for b in pseudonym.packed)}->eth_dst" in out


def test_an_address_seen_dotted_is_also_replaced_in_hex() -> None:
    r = Redactor(KEY)
    r.learn_addresses("pod at 10.244.0.2")
    out = r.text("load:0xaf40002->NXM_NX_REG3[] load:0x0af40002->NXM_NX_REG4[] cookie=0xaf40002aa")
    pseudonym = int(ipaddress.IPv4Address(r.address("10.244.0.2")))
    assert out.split()[:2] == [f"load:0x{pseudonym:x}->NXM_NX_REG3[]", f"load:0x{pseudonym:08x}->NXM_NX_REG4[]"]
    assert out.split()[2] == "cookie=0xaf40002aa"  # a longer number is not an address


def test_a_name_is_found_in_its_escaped_spellings_and_parsed_files_still_parse() -> None:
    import json

    import yaml
    r = Redactor(KEY)
    weird = ['caf\u00e9-r\u00e8gle', 'say "hi"', 'back\\slash', 'two\nlines', "true"]
    for name in weird:
        r.learn("rule", name)
    as_json = json.dumps({"rules": weird, "enabled": True}).encode()
    as_yaml = yaml.safe_dump({"rules": weird, "on": True, "long": " ".join(weird * 20)}).encode()
    metrics = "".join(f'npaudit_rule{{name="{n}"}} 1\n'.replace(n, n.replace("\\", "\\\\").replace('"', '\\"')
                                                               .replace("\n", "\\n")) for n in weird).encode()
    outputs = {"a.json": r.file("a.json", as_json), "a.yaml": r.file("a.yaml", as_yaml),
               "m.txt": r.file("m.txt", metrics), "r.jsonl": r.file("r.jsonl", as_json + b"\n" + as_json)}
    assert json.loads(outputs["a.json"])["enabled"] is True  # JSON's true is syntax, not the rule "true"
    assert yaml.safe_load(outputs["a.yaml"])["on"] is True
    assert all(json.loads(line)["enabled"] is True for line in outputs["r.jsonl"].splitlines())
    for name in weird[:-1]:
        for spelling in {name, json.dumps(name)[1:-1], json.dumps(name, ensure_ascii=False)[1:-1]}:
            for where, data in outputs.items():
                assert spelling.encode() not in data, (name, where)
    assert b'"true"' not in outputs["a.json"] and b"true" in outputs["a.json"]


def test_an_audit_record_teaches_every_name_it_carries() -> None:
    r = Redactor(KEY)
    record = sample_record(1)
    record["orchestrator"] = {"cluster": {"name": "prod-eu"}}
    r.learn_record(record)
    text = r.text(str(record))
    for original in ("client-1-7d9f", "web-5c", "backend", "frontend", "node-b", "prod-eu", "audit-a",
                     "rule-1", "allow-web", record["source"]["ip"], record["destination"]["ip"]):
        assert original not in text, original
    assert r.summary()["replaced"]["pod"] == 2


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError):
        Redactor(b"short")


def _identifies_nothing(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    bits, width = int(addr), addr.max_prefixlen
    netmask = bits >> (width - 1) == 1 and bin(bits).rstrip("0").count("0") == 1  # "0b1...1"
    return addr.is_unspecified or addr.is_loopback or netmask


@given(st.ip_addresses().filter(lambda a: "." not in str(a) or a.version == 4))  # not ::ffff:1.2.3.4
def test_every_address_that_identifies_something_is_replaced_within_its_family(
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    out = Redactor(KEY).text(f"x {addr} y").split()[1]
    if _identifies_nothing(addr):
        assert out == str(addr)
    else:
        assert out != str(addr) and ipaddress.ip_address(out).version == addr.version
