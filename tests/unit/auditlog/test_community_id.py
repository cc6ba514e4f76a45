"""auditlog.community_id against the Community ID spec's published baseline (corelight/community-id-spec,
baseline/baseline_deflt.json and baseline_seed1.json): every vector, both seeds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog.community_id import community_id, flow_community_id

# (proto, saddr, daddr, sport, dport, seed 0, seed 1). For ICMP/ICMPv6 sport is the type and dport the
# counterpart type (request/reply pairs) or the code (one-way messages), as the baseline lists them.
BASELINE = [
    (58, "fe80::200:86ff:fe05:80da", "fe80::260:97ff:fe07:69ea", 135, 136,
     "1:dGHyGvjMfljg6Bppwm3bg0LO8TY=", "1:kHa1FhMYIT6Ym2Vm2AOtoOARDzY="),
    (58, "fe80::260:97ff:fe07:69ea", "fe80::200:86ff:fe05:80da", 136, 135,
     "1:dGHyGvjMfljg6Bppwm3bg0LO8TY=", "1:kHa1FhMYIT6Ym2Vm2AOtoOARDzY="),
    (58, "fe80::260:97ff:fe07:69ea", "fe80::200:86ff:fe05:80da", 135, 136,
     "1:zavyT/cezQr1fmImYCwYnMXbgck=", "1:2hSqmsDZ2kdcY9kbiUzOEBic0iM="),
    (58, "fe80::200:86ff:fe05:80da", "fe80::260:97ff:fe07:69ea", 136, 135,
     "1:zavyT/cezQr1fmImYCwYnMXbgck=", "1:2hSqmsDZ2kdcY9kbiUzOEBic0iM="),
    (58, "3ffe:501:1800:2345::2", "3ffe:507:0:1:200:86ff:fe05:80da", 3, 0,
     "1:2ObVBgIn28oZvibYZhZMBgh7WdQ=", "1:lVEtCZpYu84Xqaa++3lXFyuu2n4="),
    (58, "3ffe:501:410:0:2c0:dfff:fe47:33e", "3ffe:507:0:1:200:86ff:fe05:80da", 1, 4,
     "1:hLZd0XGWojozrvxqE0dWB1iM6R0=", "1:W8MHwXpWzpoSTD+cGcaJr4u0ys8="),
    (58, "3ffe:507:0:1:200:86ff:fe05:80da", "3ffe:501:0:1001::2", 128, 129,
     "1:+TW+HtLHvV1xnGhV1lv7XoJrqQg=", "1:GfZxjAkDk2MkegpBYHV6tadtFXQ="),
    (58, "3ffe:501:0:1001::2", "3ffe:507:0:1:200:86ff:fe05:80da", 129, 128,
     "1:+TW+HtLHvV1xnGhV1lv7XoJrqQg=", "1:GfZxjAkDk2MkegpBYHV6tadtFXQ="),
    (58, "fe80::200:86ff:fe05:80da", "ff02::2", 133, 134,
     "1:hO+sN4H+MG5MY/8hIrXPqc4ZQz0=", "1:L7Ka0ZMYu+J3bL4ulW2PrqyXNo8="),
    (58, "fe80::260:97ff:fe07:69ea", "ff02::1", 134, 133,
     "1:pkvHqCL88/tg1k4cPigmZXUtL00=", "1:K/ee5UCqAMAQXDorP5nSa2CGLjc="),
    (1, "192.168.0.89", "192.168.0.1", 8, 0, "1:X0snYXpgwiv9TZtqg64sgzUn6Dk=", "1:03g6IloqVBdcZlPyX8r0hgoE7kA="),
    (1, "192.168.0.1", "192.168.0.89", 0, 8, "1:X0snYXpgwiv9TZtqg64sgzUn6Dk=", "1:03g6IloqVBdcZlPyX8r0hgoE7kA="),
    (1, "10.0.0.1", "10.0.0.2", 11, 0, "1:YHxtAirCG//0OzkcVAukqKQN9xM=", "1:XjUibYHaafLQ3pxQeiMI8g25q20="),
    (6, "2001:470:e5bf:dead:4957:2174:e82c:4887", "2607:f8b0:400c:c03::1a", 63943, 25,
     "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4=", "1:eJYTW6AOzFLlSUoESovMjnu7rMw="),
    (6, "2607:f8b0:400c:c03::1a", "2001:470:e5bf:dead:4957:2174:e82c:4887", 25, 63943,
     "1:/qFaeAR+gFe1KYjMzVDsMv+wgU4=", "1:eJYTW6AOzFLlSUoESovMjnu7rMw="),
    (132, "192.168.170.8", "192.168.170.56", 7, 7, "1:MP2EtRCAUIZvTw6MxJHLV7N7JDs=", "1:5w3ZRjeKBzqT3zsaEECDGjUbYeg="),
    (132, "192.168.170.56", "192.168.170.8", 7, 7, "1:MP2EtRCAUIZvTw6MxJHLV7N7JDs=", "1:5w3ZRjeKBzqT3zsaEECDGjUbYeg="),
    (6, "128.232.110.120", "66.35.250.204", 34855, 80,
     "1:LQU9qZlK+B5F3KDmev6m5PMibrg=", "1:3V71V58M3Ksw/yuFALMcW0LAHvc="),
    (6, "66.35.250.204", "128.232.110.120", 80, 34855,
     "1:LQU9qZlK+B5F3KDmev6m5PMibrg=", "1:3V71V58M3Ksw/yuFALMcW0LAHvc="),
    (17, "192.168.1.52", "8.8.8.8", 54585, 53, "1:d/FP5EW3wiY1vCndhwleRRKHowQ=", "1:Q9We8WO3piVF8yEQBNJF4uiSVrI="),
    (17, "8.8.8.8", "192.168.1.52", 53, 54585, "1:d/FP5EW3wiY1vCndhwleRRKHowQ=", "1:Q9We8WO3piVF8yEQBNJF4uiSVrI="),
    (46, "10.1.12.1", "10.1.12.2", None, None, "1:KHlLkgoJW7ifUTyTSgyVfkFHzKw=", "1:rYir8gphR31noO9iDRQmF/BteEI="),
    (46, "10.1.12.2", "10.1.12.1", None, None, "1:KHlLkgoJW7ifUTyTSgyVfkFHzKw=", "1:rYir8gphR31noO9iDRQmF/BteEI="),
]
# ICMP types with a counterpart (the rest are one-way: ordering does not apply).
PAIRED = {1: {0, 8, 9, 10, 13, 14, 15, 16, 17, 18}, 58: {128, 129, 130, 131, 133, 134, 135, 136, 139, 140, 144, 145}}


@pytest.mark.parametrize("proto,saddr,daddr,sport,dport,seed0,seed1", BASELINE)
def test_every_baseline_vector_with_seed_0_and_seed_1(proto: int, saddr: str, daddr: str, sport: int | None,
                                                      dport: int | None, seed0: str, seed1: str) -> None:
    one_way = proto in PAIRED and sport not in PAIRED[proto]
    assert community_id(saddr, daddr, proto, sport, dport, one_way=one_way) == seed0
    assert community_id(saddr, daddr, proto, sport, dport, one_way=one_way, seed=1) == seed1


@pytest.mark.parametrize("proto,saddr,daddr,sport,dport,seed0,seed1", BASELINE)
def test_a_decoded_packet_gets_the_baseline_id_from_its_icmp_type_and_code(
        proto: int, saddr: str, daddr: str, sport: int | None, dport: int | None, seed0: str, seed1: str) -> None:
    if proto in PAIRED:  # the packet has a type and a code (0 for the paired ones here); the mapping is ours
        code = 0 if sport in PAIRED[proto] else dport
        assert flow_community_id(saddr, daddr, proto, None, None, sport, code) == seed0
    else:
        assert flow_community_id(saddr, daddr, proto, sport, dport, None, None) == seed0


def test_what_a_packet_does_not_carry_gives_no_id() -> None:
    assert flow_community_id("10.0.0.1", "10.0.0.2", 6, None, None, None, None) is None    # non-first fragment
    assert flow_community_id("10.0.0.1", None, 17, 1, 2, None, None) is None               # coarsened: no peer
    assert flow_community_id("10.0.0.1", "10.0.0.2", 1, None, None, None, None) is None    # ICMP cut short
    assert flow_community_id("10.0.0.1", "10.0.0.2", 1, None, None, 3, None) is None       # one-way, no code
    assert flow_community_id("10.0.0.1", "fe80::1", 6, 1, 2, None, None) is None           # mixed versions


ADDRESSES = st.sampled_from(["10.0.0.1", "10.0.0.2", "192.168.1.52", "8.8.8.8", "fe80::1", "2001:db8::2", "::1"])


@settings(max_examples=500, deadline=None)
@given(ADDRESSES, ADDRESSES, st.sampled_from([6, 17, 132]), st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_a_ported_flow_hashes_as_the_spec_function_in_either_direction(saddr: str, daddr: str, proto: int,
                                                                       sport: int, dport: int) -> None:
    # The per-record path keeps each address pair's packed form; the ordering must stay the spec's,
    # also for a pair met the other way round first and for a flow between one address's own ports.
    expected = None if (":" in saddr) != (":" in daddr) else community_id(saddr, daddr, proto, sport, dport)
    assert flow_community_id(daddr, saddr, proto, dport, sport, None, None) == expected
    assert flow_community_id(saddr, daddr, proto, sport, dport, None, None) == expected
