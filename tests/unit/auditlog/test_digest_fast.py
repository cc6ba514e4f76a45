"""auditlog/_digest_fast.c: the record path's SHA-1, SHA-256 and texts in the module's own code give what hashlib,
time.strftime and socket.inet_pton give. Both digests take the CPU's SHA extensions where /proc/cpuinfo lists them;
where it does not, SHA-256 is OpenSSL's and SHA-1 plain C. Every implementation this machine has is checked here,
the one without the extensions on every machine."""

from __future__ import annotations

import hashlib
import ipaddress
import platform
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from auditlog import record_fast

if not record_fast.built():  # `make setup` builds it; a test run without it is no test of it
    pytest.fail("auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev, libssl-dev)")

from auditlog import _record_fast as fast  # noqa: E402

LAST = 253402300799  # 9999-12-31T23:59:59, the last second a record's timestamp carries


def cpu_has_sha_ni() -> bool:
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    return "sha_ni" in flags and "ssse3" in flags and "sse4_1" in flags


def impls() -> list[str]:
    return ["auto", "openssl"] + (["sha-ni"] if fast.digest_impl() == "sha-ni" else [])


def test_the_seal_takes_the_cpus_sha_extensions_exactly_where_it_has_them() -> None:
    x86 = platform.machine() in ("x86_64", "i686", "i386")
    assert fast.digest_impl() == ("sha-ni" if x86 and cpu_has_sha_ni() else "openssl")
    if fast.digest_impl() == "openssl":  # a CPU without them: asking for them is refused, not faked
        with pytest.raises(ValueError):
            fast.sha256(b"x", "sha-ni")
        with pytest.raises(ValueError):
            fast.sha1_of(b"x", "sha-ni")


@pytest.mark.parametrize("impl", impls())
def test_sha256_at_every_length_around_the_block_and_padding_edges(impl: str) -> None:
    for n in [*range(0, 300), 447, 448, 511, 512, 1000, 4095, 4096, 65537]:
        data = bytes((i * 131 + n) & 0xFF for i in range(n))
        assert fast.sha256(data, impl) == hashlib.sha256(data).digest(), n


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_sha256_is_sha256(data: bytes) -> None:
    for impl in impls():
        assert fast.sha256(data, impl) == hashlib.sha256(data).digest()


def sha1_impls() -> list[str]:
    return ["c"] + (["sha-ni"] if fast.digest_impl() == "sha-ni" else [])


@pytest.mark.parametrize("impl", sha1_impls())
def test_sha1_at_every_length_around_the_block_and_padding_edges(impl: str) -> None:
    for n in [*range(0, 200), 1000, 4096]:
        data = bytes((i * 7 + n) & 0xFF for i in range(n))
        assert fast.sha1_of(data, impl) == hashlib.sha1(data).digest(), n
        assert fast.sha1(data) == hashlib.sha1(data).digest(), n


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1000))
def test_sha1_is_sha1(data: bytes) -> None:
    for impl in sha1_impls():
        assert fast.sha1_of(data, impl) == hashlib.sha1(data).digest()


def test_an_unknown_implementation_is_refused() -> None:
    with pytest.raises(ValueError):
        fast.sha256(b"x", "md5")
    with pytest.raises(ValueError):
        fast.sha1_of(b"x", "openssl")


@pytest.mark.parametrize("seconds", [0, 59, 86399, 86400, 951782400, 951868800, 4107542400, 4107456000, 68169600,
                                     1764900000, 2**31 - 1, 2**31, 253402214400, LAST])
def test_the_second_text_at_the_calendars_edges(seconds: int) -> None:
    # 2000-02-29 and 2000-03-01 (a leap century), 2100-02-28 and 2100-03-01 (not one), 1972-02-29, 2038's rollover
    assert fast.utc_second(seconds) == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


@settings(max_examples=2000, deadline=None)
@given(st.integers(0, LAST))
def test_the_second_text_is_strftimes(seconds: int) -> None:
    assert fast.utc_second(seconds) == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def test_the_second_text_refuses_what_no_record_carries() -> None:
    for bad in (-1, LAST + 1):
        with pytest.raises(ValueError):
            fast.utc_second(bad)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 9, 10, 99, 100, 2**53, 2**63 - 1, 2**64 - 1])))
def test_the_decimal_is_strs(n: int) -> None:
    assert fast.decimal(n) == str(n)


def pton(text: str) -> bytes | None:
    try:
        return socket.inet_pton(socket.AF_INET, text)
    except OSError:
        return None


@pytest.mark.parametrize("text", ["0.0.0.0", "255.255.255.255", "10.10.1.5", "1.2.3.4", "256.1.1.1", "01.2.3.4",
                                  "1.2.3", "1.2.3.4.", ".1.2.3", "1..2.3", "1.2.3.04", "1.2.3.4 ", "", "1234.1.1.1",
                                  "1.2.3.255", "1.2.3.256", "00.0.0.0", "a.b.c.d", "::1"])
def test_the_dotted_quad_is_read_as_inet_pton_reads_it(text: str) -> None:
    mine = fast.ipv4(text)
    assert mine is None or mine == pton(text)  # None: inet_pton decides (the encoder asks it then)
    if pton(text) is not None and str(ipaddress.IPv4Address(text)) == text:
        assert mine == pton(text)  # the canonical text, every Pod address, is read here


@settings(max_examples=1000, deadline=None)
@given(st.text(alphabet="0123456789.", max_size=17))
def test_any_text_is_read_as_inet_pton_reads_it_or_left_to_it(text: str) -> None:
    mine = fast.ipv4(text)
    assert mine is None or mine == pton(text)
    if pton(text) is not None and str(ipaddress.IPv4Address(text)) == text:
        assert mine == pton(text)
