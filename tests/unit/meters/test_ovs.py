"""meters.ovs: which OVS meters the bridge should carry for the configured limits."""

from __future__ import annotations

from os_ken.ofproto import ofproto_v1_5 as ofp

from meters.ovs import (METER_POLICY_ALLOW, METER_POLICY_DENY, METER_TRACEFLOW, MeterLimits, MeterSpec,
                        MeterSupport, desired_meters)
from packetin import messages

LIMITS = MeterLimits(policy_allow=(1000, 200), policy_deny=(500, 100), traceflow=(100, 50))


def test_each_category_gets_its_own_meter_with_its_configured_rate_and_burst() -> None:
    assert desired_meters(LIMITS, supported=True) == [
        MeterSpec(METER_POLICY_ALLOW, rate_pps=1000, burst=200),
        MeterSpec(METER_POLICY_DENY, rate_pps=500, burst=100),
        MeterSpec(METER_TRACEFLOW, rate_pps=100, burst=50),
    ]


def test_a_datapath_without_meters_gets_none() -> None:
    assert desired_meters(LIMITS, supported=False) == []


def test_meter_ids_are_distinct_so_a_drop_flood_cannot_starve_allow_or_traceflow() -> None:
    ids = [spec.meter_id for spec in desired_meters(LIMITS, supported=True)]
    assert len(set(ids)) == 3 and all(i > 0 for i in ids)


def test_zero_burst_meter_is_encoded_without_the_burst_flag() -> None:
    spec, = desired_meters(MeterLimits((10, 0), (10, 0), (10, 0)), supported=True)[:1]
    mod = messages.meter_mod(spec, ofp.OFPMC_ADD)
    assert mod.flags & ofp.OFPMF_PKTPS and not mod.flags & ofp.OFPMF_BURST
    assert (mod.meter_id, mod.bands[0].rate, mod.bands[0].burst_size) == (METER_POLICY_ALLOW, 10, 0)


def test_meter_support_needs_meters_and_a_drop_band() -> None:
    drop = 1 << ofp.OFPMBT_DROP
    assert MeterSupport(max_meter=64, band_types=drop, max_bands=1).supported
    assert not MeterSupport(max_meter=0, band_types=drop, max_bands=1).supported
    assert not MeterSupport(max_meter=64, band_types=1 << ofp.OFPMBT_DSCP_REMARK, max_bands=1).supported


def test_old_import_paths_still_name_the_same_classes() -> None:
    import packetin
    from packetin.channel import MeterSupport as ChannelMeterSupport

    assert messages.MeterSpec is MeterSpec and packetin.MeterSpec is MeterSpec
    assert ChannelMeterSupport is MeterSupport and packetin.MeterSupport is MeterSupport
