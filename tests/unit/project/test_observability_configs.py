"""config/prometheus alerts and config/grafana dashboard: they parse and name only what the agent exports.

The rule file goes through `promtool check rules` (syntax, PromQL, templates) and its alerts
about the agent itself through `promtool test rules`; on top, what promtool cannot know is
checked here: the house structure (for, severity, summary, description) and, by the small
scanner below, that every metric name, label name, label value of `=` and `=~` matchers
and grouping label is one the agent exports, and rate() is taken over counters only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from auditlog.writer import LOSS_KEYS
from tests.support.promtool import check_rules, promtool, run_rule_tests  # noqa: F401 (fixture: the binary)
from tests.support.scrape import scrape  # noqa: F401 (fixture: the agent's registry, scraped)

CONFIG = Path(__file__).resolve().parents[3] / "config"
ALERTS = CONFIG / "prometheus" / "npaudit-alerts.yaml"
DASHBOARD = CONFIG / "grafana" / "npaudit-dashboard.json"
# Labels Prometheus adds from the scrape target, on every series.
TARGET_LABELS = frozenset({"instance", "job"})
# Series Prometheus makes itself for each scrape target.
SCRAPE_SERIES = ("up",)
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
    for name in SCRAPE_SERIES:
        index.setdefault(name, {})
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
        if not name.endswith(("_total", "_bucket", "_sum", "_count")):
            problems.append(f"{name}: rate/increase over a gauge")
    return problems


# promtool test rules: the agent-down alerts over made-up `up` series (one node down; then no target at all).
AGENT_DOWN_TESTS = """
rule_files: [%(rules)s]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="npaudit", instance="10.0.0.1:9108"}'
        values: '1 1 0 0 0 0'
      - series: 'up{job="npaudit", instance="10.0.0.2:9108"}'
        values: '1 1 1 1 1 1'
    alert_rule_test:
      - eval_time: 3m
        alertname: NpauditAgentDown
        exp_alerts: []
      - eval_time: 5m
        alertname: NpauditAgentDown
        exp_alerts:
          - exp_labels: {severity: critical, job: npaudit, instance: "10.0.0.1:9108"}
            exp_annotations:
              summary: "npaudit agent on 10.0.0.1:9108 cannot be scraped"
              description: "%(down)s"
      - eval_time: 5m
        alertname: NpauditAgentsAbsent
        exp_alerts: []
  - interval: 1m
    input_series:
      - series: 'up{job="other", instance="10.0.0.9:9100"}'
        values: '1x20'
    alert_rule_test:
      - eval_time: 15m
        alertname: NpauditAgentsAbsent
        exp_alerts:
          - exp_labels: {severity: critical, job: npaudit}
            exp_annotations:
              summary: "Prometheus scrapes no npaudit agent"
              description: "%(absent)s"
  - interval: 1m
    input_series:
      - series: 'npaudit_audit_record_latency_seconds_bucket{job="npaudit", instance="n1", le="0.5"}'
        values: '0+10x30'
      - series: 'npaudit_audit_record_latency_seconds_bucket{job="npaudit", instance="n1", le="1.0"}'
        values: '0+1000x30'
      - series: 'npaudit_audit_record_latency_seconds_bucket{job="npaudit", instance="n1", le="+Inf"}'
        values: '0+1000x30'
      - series: 'npaudit_audit_record_latency_seconds_bucket{job="npaudit", instance="n2", le="0.5"}'
        values: '0+1000x30'
      - series: 'npaudit_audit_record_latency_seconds_bucket{job="npaudit", instance="n2", le="+Inf"}'
        values: '0+1000x30'
    alert_rule_test:
      - eval_time: 20m
        alertname: NpauditAuditRecordLatencyHigh
        exp_alerts:
          - exp_labels: {severity: warning, instance: n1}
            exp_annotations:
              summary: "Audit records on n1 lag their packets (p99 994.9ms)"
              description: "%(latency)s"
"""


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
                   "npaudit_traceflow_total", 'up{job="npaudit"}', 'absent(up{job="npaudit"})',
                   "npaudit_audit_record_latency_seconds_bucket"):
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
                   "npaudit_traceflow_suppressed_total", "npaudit_policy_verdicts_total",
                   "npaudit_audit_record_latency_seconds_bucket", 'up{job="npaudit"'):
        assert needed in exprs, needed


def test_promtool_accepts_the_alert_rules(promtool: Path) -> None:  # noqa: F811 (the imported fixture)
    result = check_rules(promtool, ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


def test_promtool_rejects_a_broken_rule_file(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    broken = tmp_path / "broken.yaml"
    broken.write_text(ALERTS.read_text().replace("up{job=\"npaudit\"} == 0", "up{job=\"npaudit\" == 0", 1))
    assert check_rules(promtool, broken).returncode != 0


def test_the_agent_down_and_latency_alerts_fire_for_a_failed_scrape_no_target_and_a_slow_p99(
        promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    by_name = {rule["alert"]: rule for rule in _rules()}
    tests = tmp_path / "agent-down.test.yaml"
    tests.write_text(AGENT_DOWN_TESTS % {
        "rules": json.dumps(str(ALERTS)),
        "down": by_name["NpauditAgentDown"]["annotations"]["description"],
        "absent": by_name["NpauditAgentsAbsent"]["annotations"]["description"],
        "latency": by_name["NpauditAuditRecordLatencyHigh"]["annotations"]["description"]})
    result = run_rule_tests(promtool, tests)
    assert result.returncode == 0, result.stdout + result.stderr
