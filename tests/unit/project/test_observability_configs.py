"""config/prometheus alerts and config/grafana dashboard: they parse and name only what the agent exports.

promtool is not installed here, so the rule file is checked structurally only (groups, rules,
for, labels, annotations) and its PromQL by the small scanner below: metric names, label
names, label values of `=` and `=~` matchers, grouping labels, rate() over counters only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from auditlog.writer import LOSS_KEYS
from tests.support.scrape import scrape  # noqa: F401 (fixture: the agent's registry, scraped)

CONFIG = Path(__file__).resolve().parents[3] / "config"
ALERTS = CONFIG / "prometheus" / "npaudit-alerts.yaml"
DASHBOARD = CONFIG / "grafana" / "npaudit-dashboard.json"
# Labels Prometheus adds from the scrape target, on every series.
TARGET_LABELS = frozenset({"instance", "job"})
SEVERITIES = frozenset({"critical", "warning", "info"})
# Series name -> label name -> values seen in the scrape.
Series = dict[str, dict[str, set[str]]]

_IDENT = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan"})


@pytest.fixture
def series(scrape) -> Series:  # noqa: F811 (the imported fixture)
    """Every exported series with its labels and values (the registry the agent builds)."""
    samples = [s for _, _, family_samples in scrape.values() for s in family_samples]
    index: Series = {}
    for name, labels in samples:
        values = index.setdefault(name, {})
        for key, value in labels.items():
            values.setdefault(key, set()).add(value)
    return index


def _labels_of(names: list[str], series: Series) -> set[str]:
    return TARGET_LABELS.union(*(series.get(name, {}) for name in names))


def expr_problems(expr: str, series: Series, result_labels: set[str] = frozenset()) -> list[str]:
    """What in one PromQL expression names a series, label or value the agent does not export.

    result_labels: labels a legend or annotation reads from the result ({{x}}, $labels.x).
    """
    problems: list[str] = []
    text = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    grouping = re.findall(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    selectors = re.findall(rf"({_IDENT})?\s*\{{([^}}]*)\}}", text)
    text = re.sub(rf"({_IDENT})?\s*\{{[^}}]*\}}", lambda m: f" {m.group(1) or ''} ", text)
    bare = [name for name in re.findall(rf"(?<![\w.$]){_IDENT}(?![\w:])(?!\s*\()", text) if name not in _KEYWORDS]
    names = [name for name, _ in selectors if name] + bare
    if not names:
        problems.append(f"{expr!r}: names no metric")
    for name in names:
        if name not in series:
            problems.append(f"{name}: not exported")
    for name, matchers in selectors:
        known = _labels_of([name], series)
        for label, op, value in re.findall(r"(\w+)\s*(=~|!~|!=|=)\s*\"([^\"]*)\"", matchers):
            if label not in known:
                problems.append(f"{name}{{{label}}}: no such label")
            elif label not in TARGET_LABELS and "$" not in value and op in ("=", "=~"):
                exported = series[name][label]
                problems += [f"{name}{{{label}={wanted!r}}}: no such value"
                             for wanted in value.split("|") if wanted not in exported]
    available = _labels_of(names, series)
    for _, labels in grouping:
        problems += [f"{expr!r}: groups by {label!r}, on none of its metrics"
                     for label in re.findall(r"\w+", labels) if label not in available]
    outer = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", expr)
    if outer:
        available = set(re.findall(r"\w+", outer.group(1)))
    problems += [f"{expr!r}: reads label {label!r}, which its result does not carry"
                 for label in result_labels if label not in available]
    for name in re.findall(rf"\b(?:rate|irate|increase)\(\s*({_IDENT})", expr):
        if not name.endswith("_total"):
            problems.append(f"{name}: rate/increase over a gauge")
    return problems


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def _panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def test_the_checker_rejects_a_metric_label_or_value_the_agent_does_not_export(series) -> None:
    assert expr_problems("increase(npaudit_audit_writer_total{event=\"lost_write_error\"}[5m]) > 0", series) == []
    assert expr_problems("rate(npaudit_audit_recrods_total[5m]) > 0", series) == [
        "npaudit_audit_recrods_total: not exported"]
    assert expr_problems("npaudit_syslog_connected{dest=\"a\"} == 0", series) == [
        "npaudit_syslog_connected{dest}: no such label"]
    assert expr_problems("npaudit_packetin_total{outcome=~\"dropped_rate_limit|dropped_full\"}", series) == [
        "npaudit_packetin_total{outcome='dropped_full'}: no such value"]
    assert expr_problems("sum by (daemon) (npaudit_syslog_backlog_bytes)", series)
    assert expr_problems("sum by (destination) (npaudit_syslog_backlog_bytes)", series, {"instance"})
    assert expr_problems("rate(npaudit_audit_writer_queue_depth[5m])", series) == [
        "npaudit_audit_writer_queue_depth: rate/increase over a gauge"]
    assert expr_problems("vector(1)", series) == ["'vector(1)': names no metric"]


def test_every_alert_names_only_exported_metrics_labels_and_values(series) -> None:
    for rule in _rules():
        used = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        assert expr_problems(rule["expr"], series, used) == [], rule["alert"]


def test_every_alert_has_a_unique_name_a_for_a_severity_and_a_summary_and_description() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    assert set(document) == {"groups"}
    assert len({group["name"] for group in document["groups"]}) == len(document["groups"])
    names = [rule["alert"] for rule in _rules()]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"Npaudit[A-Za-z]+", n) for n in names), names
    for rule in _rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip(), rule["alert"]


def test_the_records_lost_alert_counts_exactly_the_writers_loss_events() -> None:
    (rule,) = [r for r in _rules() if r["alert"] == "NpauditAuditRecordsLost"]
    (events,) = re.findall(r"event=~\"([^\"]*)\"", rule["expr"])
    assert set(events.split("|")) == set(LOSS_KEYS)


def test_the_alerts_cover_every_loss_and_outage_an_operator_must_hear_about() -> None:
    exprs = " ".join(rule["expr"] for rule in _rules())
    for needed in ("npaudit_audit_writer_total", "npaudit_audit_writer_queue_depth", "dropped_rate_limit",
                   "dropped_queue_full", "npaudit_ovs_packetin_lost_total", "npaudit_openflow_connected",
                   "npaudit_syslog_connected", "npaudit_syslog_backlog_bytes", "npaudit_syslog_records_lost_total",
                   "npaudit_ovs_restarts_capped", "npaudit_ovs_restarts_total", "npaudit_datapath_meters_supported",
                   "npaudit_meter_dropped_packets_total", "npaudit_audit_overload_level",
                   "npaudit_packetin_fair_share_keys_evicted_total", "npaudit_ebpf_offload_events_total",
                   "npaudit_traceflow_total"):
        assert needed in exprs, needed


def test_every_dashboard_target_and_variable_names_only_exported_metrics_and_labels(series) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
            assert expr_problems(target["expr"], series, used) == [], (panel["title"], target["refId"])
    for variable in dashboard["templating"]["list"]:
        metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"]["query"]).groups()
        assert metric in series and label in _labels_of([metric], series), variable["name"]


def test_the_dashboard_is_importable_with_a_prometheus_datasource_input() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 39 and dashboard["uid"] and dashboard["title"]
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    ids = [panel["id"] for panel in _panels()]
    assert len(ids) == len(set(ids))
    for panel in _panels():
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for part in (panel, *panel["targets"]):
            assert part["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_the_dashboard_shows_records_packet_ins_losses_queues_syslog_ovs_offload_overload_and_traces() -> None:
    exprs = " ".join(target["expr"] for panel in _panels() for target in panel["targets"])
    for needed in ("npaudit_audit_records_total", "npaudit_packetin_total", "npaudit_ovs_packetin_lost_total",
                   "npaudit_audit_writer_queue_depth", "npaudit_audit_chain_seq", "npaudit_syslog_last_seq_sent",
                   "npaudit_syslog_backlog_bytes", "npaudit_syslog_records_lost_total", "npaudit_ovs_up",
                   "npaudit_ovs_restarts_total", "npaudit_meter_dropped_packets_total",
                   "npaudit_audit_writer_queue_capacity", "npaudit_ebpf_offload_active",
                   "npaudit_ebpf_offloaded_packets_total", "npaudit_audit_overload_level",
                   "npaudit_audit_records_coarsened_total", "npaudit_packetin_fair_share_keys",
                   "npaudit_packetin_fair_share_borrowed_total", "npaudit_traceflow_total",
                   "npaudit_traceflow_suppressed_total"):
        assert needed in exprs, needed
