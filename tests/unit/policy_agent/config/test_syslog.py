"""The agent's syslog section (validated at load, naming the field) and the npaudit_syslog_* metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from auditlog.syslog.forwarder import ForwarderStats
from auditlog.syslog.rfc5424 import Framing
from policy_agent.config.loader import ConfigError, load, loads, syslog_destination
from policy_agent.metrics import SyslogCollector

ROOT = Path(__file__).resolve().parents[4]


def test_the_shipped_config_forwards_nowhere_and_keeps_checkpoints_under_state_dir() -> None:
    config = load(ROOT / "config" / "npaudit.yaml")
    assert config.syslog.destinations == ()
    assert config.syslog_checkpoint_dir == Path(config.state_dir) / "syslog"


def test_destinations_load_into_forwarder_destinations() -> None:
    config = loads("node_name: node-a\nsyslog:\n  checkpoint_dir: /var/lib/npaudit/syslog\n  destinations:\n"
                   "    - {url: 'tls://siem:6514', ca: /etc/ca.pem, framing: lf, facility: local4}\n"
                   "    - {url: 'udp://10.0.0.1', udp_max_bytes: 1400}\n")
    tls, udp = (syslog_destination(d, config.node) for d in config.syslog.destinations)
    assert (tls.name, tls.framing, tls.header.facility, tls.header.hostname) == ("tls://siem:6514", Framing.LF,
                                                                                  20, "node-a")
    assert tls.tls is not None and tls.tls.ca == Path("/etc/ca.pem")
    assert (udp.name, udp.framing, udp.max_bytes, udp.tls) == ("udp://10.0.0.1:514", Framing.DATAGRAM, 1400, None)
    assert config.syslog_checkpoint_dir == Path("/var/lib/npaudit/syslog")


@pytest.mark.parametrize("section,message", [
    ("destinations: [{url: 'http://h'}]", "syslog.destinations[0]: syslog destination 'http://h': scheme"),
    ("destinations: [{}]", "syslog.destinations[0]"),
    ("destinations: 3", "syslog.destinations: must be a list"),
    ("destinations: [{url: 'tcp://h', framing: newline}]", "syslog.destinations[0].framing: must be one of"),
    ("destinations: [{url: 'udp://h', udp_max_bytes: 100}]", "udp_max_bytes"),
    ("destinations: [{url: 'tcp://h', ca: /ca.pem}]", "need a tls:// or relp+tls:// URL"),
    ("destinations: [{url: 'tcp://h', facility: local9}]", "facility"),
    ("destinations: [{url: 'tcp://h:514'}, {url: 'tcp://h'}]", "destinations[1]: tcp://h:514 is already"),
    ("destinations: [{url: 'tcp://h', colour: red}]", "syslog.destinations[0].colour: unknown field"),
])
def test_a_bad_destination_stops_loading_with_the_field_named(section: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        loads(f"syslog:\n  {section}\n")
    assert any(message in e for e in info.value.errors), info.value.errors


def test_forwarding_needs_the_audit_log() -> None:
    with pytest.raises(ConfigError, match="audit.enabled"):
        loads("audit: {enabled: false}\nsyslog: {destinations: [{url: 'tcp://h'}]}\n")


class Fixed:
    def __init__(self, stats: ForwarderStats) -> None:
        self._stats = stats

    def stats(self) -> ForwarderStats:
        return self._stats


def test_metrics_export_each_destination_outcomes_losses_and_position() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SyslogCollector([
        Fixed(ForwarderStats("tcp://a:514", True, 42, 0, None, sent=42, lost=3, truncated=0, skipped=1, errors=2,
                             receiver_wait_s=1.5)),
        Fixed(ForwarderStats("udp://b:514", False, None, None, "x", sent=5, lost=0, truncated=4, skipped=0,
                             errors=0)),
    ]))
    get = registry.get_sample_value
    assert get("npaudit_syslog_records_total", {"destination": "tcp://a:514", "outcome": "sent"}) == 42
    assert get("npaudit_syslog_records_total", {"destination": "udp://b:514", "outcome": "truncated"}) == 4
    assert get("npaudit_syslog_records_lost_total", {"destination": "tcp://a:514"}) == 3
    assert get("npaudit_syslog_errors_total", {"destination": "tcp://a:514"}) == 2
    assert get("npaudit_syslog_connected", {"destination": "udp://b:514"}) == 0
    assert get("npaudit_syslog_last_seq_sent", {"destination": "tcp://a:514"}) == 42
    assert get("npaudit_syslog_last_seq_sent", {"destination": "udp://b:514"}) is None
    assert get("npaudit_syslog_receiver_wait_seconds_total", {"destination": "tcp://a:514"}) == 1.5
    assert get("npaudit_syslog_receiver_wait_seconds_total", {"destination": "udp://b:514"}) == 0


def test_batch_window_and_checkpoint_settings_reach_the_destination_and_default_to_the_forwarders() -> None:
    from auditlog.syslog import destination, window

    config = loads("syslog:\n  destinations:\n    - {url: 'tcp://h:514'}\n"
                   "    - {url: 'tcp://h:515', batch_records: 10, batch_bytes: 4096, checkpoint_interval: 0.5,"
                   " checkpoint_records: 100, window_batches: 2, window_bytes: 65536}\n")
    default, tuned = (syslog_destination(d, "n") for d in config.syslog.destinations)
    assert (default.batch_records, default.batch_bytes, default.checkpoint_interval, default.checkpoint_records,
            default.window_batches, default.window_bytes) == (
        destination.BATCH_RECORDS, destination.BATCH_BYTES, destination.CHECKPOINT_INTERVAL,
        destination.CHECKPOINT_RECORDS,
        window.WINDOW_BATCHES, window.WINDOW_BYTES)
    assert (tuned.batch_records, tuned.batch_bytes, tuned.checkpoint_interval, tuned.checkpoint_records,
            tuned.window_batches, tuned.window_bytes) == (10, 4096, 0.5, 100, 2, 65536)


@pytest.mark.parametrize("field,value", [("batch_records", 0), ("batch_bytes", -1), ("checkpoint_interval", -1),
                                         ("checkpoint_records", 0), ("window_batches", 0), ("window_bytes", 0)])
def test_a_bad_batch_or_checkpoint_setting_names_its_field(field: str, value: int) -> None:
    with pytest.raises(ConfigError) as info:
        loads(f"syslog:\n  destinations: [{{url: 'tcp://h', {field}: {value}}}]\n")
    assert any(f"syslog.destinations[0].{field}" in e for e in info.value.errors), info.value.errors
