"""OVS meter band statistics: the OFPMP_METER codec (recorded OVS 3.1 bytes) and totals that survive resets."""

from __future__ import annotations

import struct

import pytest
from os_ken.ofproto import ofproto_v1_5 as ofp

from meters.ovs import METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW
from meters.stats import Dropped, MeterReading, MeterTotals, meter_name
from packetin import messages
from packetin.errors import DecodeError

# ovs-vswitchd 3.1 (netdev) answering OFPMP_METER for meter 7 (rate 50 pps, burst 10) after 500
# UDP packets: 473 dropped by the band (24510 bytes), 1.411 s after the meter was added.
OVS31_METER_STATS = bytes.fromhex(
    "0613004800b67a6f00090000000000000000000700380000000000000000000000000000000001f4"
    "000000000000652200000001187f5cc000000000000001d90000000000005fbe")


def test_the_request_asks_every_meter_in_openflow_15() -> None:
    raw = messages.serialize(messages.meter_stats_request(), 42)
    version, msg_type, _, xid, mp_type, _, meter_id = (raw[0], raw[1], raw[2:4], int.from_bytes(raw[4:8], "big"),
                                                       int.from_bytes(raw[8:10], "big"), raw[10:16],
                                                       int.from_bytes(raw[16:20], "big"))
    assert (version, msg_type, xid, mp_type, meter_id) == (
        ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REQUEST, 42, ofp.OFPMP_METER_STATS, ofp.OFPM_ALL)


def test_a_recorded_ovs_reply_gives_the_band_drops_and_the_meters_age() -> None:
    (reading,) = messages.parse_meter_stats([OVS31_METER_STATS])
    assert (reading.meter_id, reading.dropped_packets, reading.dropped_bytes) == (7, 473, 24510)
    assert reading.age == pytest.approx(1.411)


def _reply(*meters: tuple[int, list[tuple[int, int]], float]) -> bytes:
    """An OFPMP_METER reply in the OpenFlow 1.5 layout (os-ken serialises only requests)."""
    body = b""
    for meter_id, bands, age in meters:
        band_bytes = b"".join(struct.pack("!QQ", p, b) for p, b in bands)
        body += struct.pack("!IH6xIQQII", meter_id, 40 + len(band_bytes), 0, 0, 0, int(age),
                            round(age % 1 * 1e9)) + band_bytes
    return struct.pack("!BBHIHH4x", ofp.OFP_VERSION, ofp.OFPT_MULTIPART_REPLY, 16 + len(body), 1,
                       ofp.OFPMP_METER_STATS, 0) + body


def test_every_meter_of_every_part_is_read_and_bands_are_summed() -> None:
    parts = [_reply((1, [(5, 500)], 2.0), (2, [(7, 700), (3, 300)], 2.5)), _reply((3, [], 0.25))]
    assert messages.parse_meter_stats(parts) == [MeterReading(1, 5, 500, 2.0), MeterReading(2, 10, 1000, 2.5),
                                                 MeterReading(3, 0, 0, 0.25)]


def test_a_cut_or_inconsistent_reply_is_a_decode_error_not_a_crash() -> None:
    cut = OVS31_METER_STATS[:50]
    for raw in (cut, cut[:2] + (50).to_bytes(2, "big") + cut[4:]):  # cut; and cut inside a meter
        with pytest.raises(DecodeError):
            messages.parse_meter_stats([raw])


def test_meters_get_the_names_the_metric_labels_use() -> None:
    assert [meter_name(i) for i in (METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW, 99)] == [
        "policy_allow", "policy_deny", "traceflow", "99"]


def test_a_meter_made_after_the_agent_started_counts_from_zero() -> None:
    totals = MeterTotals(started=100.0)
    totals.update([MeterReading(2, 40, 4000, age=3.0)], now=105.0)  # created at 102
    totals.update([MeterReading(2, 45, 4500, age=8.0)], now=110.0)
    assert totals.totals() == {2: Dropped(45, 4500)}


def test_a_meter_older_than_the_agent_is_the_baseline() -> None:
    totals = MeterTotals(started=100.0)
    totals.update([MeterReading(2, 1000, 9000, age=500.0)], now=101.0)
    assert totals.totals() == {2: Dropped(0, 0)}
    totals.update([MeterReading(2, 1010, 9100, age=505.0)], now=106.0)
    assert totals.totals() == {2: Dropped(10, 100)}


def test_an_ovs_restart_never_makes_the_totals_go_backwards() -> None:
    totals = MeterTotals(started=0.0)
    totals.update([MeterReading(2, 300, 3000, age=10.0)], now=10.0)
    # vswitchd restarted: the agent's replay made the meter again, which counts from zero.
    totals.update([MeterReading(2, 20, 200, age=1.0)], now=15.0)
    assert totals.totals() == {2: Dropped(320, 3200)} and totals.resets == 1


def test_a_meter_made_again_whose_count_already_passed_the_old_one_is_still_a_reset() -> None:
    totals = MeterTotals(started=0.0)
    totals.update([MeterReading(2, 30, 300, age=10.0)], now=10.0)
    totals.update([MeterReading(2, 50, 500, age=2.0)], now=15.0)  # younger than the last reading
    assert totals.totals() == {2: Dropped(80, 800)} and totals.resets == 1


def test_steady_readings_are_not_resets_despite_clock_jitter() -> None:
    totals = MeterTotals(started=-10.0)
    for k in range(1, 6):
        totals.update([MeterReading(1, 10 * k, 100 * k, age=5.0 * k + 0.2 * (k % 2))], now=5.0 * k)
    assert totals.totals() == {1: Dropped(50, 500)} and totals.resets == 0
