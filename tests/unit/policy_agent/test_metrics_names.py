"""The agent's Prometheus exposition as a scraper sees it: names, types, labels, units, and the README's list."""

from __future__ import annotations

import re
from pathlib import Path


from tests.support.scrape import scrape  # noqa: F401 (fixtures)

README = Path(__file__).resolve().parents[3] / "README.md"


def test_build_info_is_one_gauge_with_the_versions_that_matter(scrape) -> None:
    kind, labels, samples = scrape["npaudit_build_info"]
    assert kind == "gauge" and labels == {"version", "python", "os_ken", "ovs", "record_encoder", "audit_gzip",
                                          "quiet_wait"}
    ((name, values),) = samples
    assert name == "npaudit_build_info" and all(values.values())
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", values["python"])
    assert values["record_encoder"] == "c"  # make setup builds auditlog/_record_fast.c
    assert values["quiet_wait"] == "c"  # and packetin/_quiet_fast.c
    assert values["audit_gzip"] == "isal"  # make setup installs the isal wheel


def test_process_metrics_are_on_the_agents_registry(scrape) -> None:
    assert scrape["process_cpu_seconds"][0] == "counter"
    assert scrape["process_resident_memory_bytes"][0] == "gauge"
    assert "process_open_fds" in scrape


def test_written_bytes_are_a_counter_of_their_own_not_an_event(scrape) -> None:
    kind, labels, samples = scrape["npaudit_audit_writer_bytes"]
    assert kind == "counter" and labels == set()
    assert [name for name, _ in samples] == ["npaudit_audit_writer_bytes_total"]
    events = {values["event"] for _, values in scrape["npaudit_audit_writer"][2]}
    assert "bytes" not in events and {"written", "rotations", "chain_restarts"} <= events


def test_every_counter_ends_in_total_and_no_gauge_does(scrape) -> None:
    for family, (kind, _, samples) in scrape.items():
        names = {name for name, _ in samples}
        assert names, family  # every family shows a sample here, so the suffixes below are checked
        if kind == "counter":
            assert names == {family + "_total"}, family
        else:
            assert not any(name.endswith("_total") for name in names), family


def test_units_are_base_units_spelled_as_suffixes(scrape) -> None:
    # Prometheus conventions: seconds and bytes, as the last word (before _total).
    for family in scrape:
        assert not re.search(r"_(ms|milliseconds|kb|mb|kilobytes|megabytes|minutes|hours)(_|$)", family), family
        if "bytes" in family:
            assert family.endswith("_bytes"), family


def _readme_metric_names() -> set[str]:
    text = README.read_text()
    section = text.split("\n### Metrics\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(npaudit_[a-z0-9_]+)", section))


def test_the_readme_lists_exactly_the_metrics_the_agent_exports(scrape) -> None:
    exported = {family + "_total" if kind == "counter" else family
                for family, (kind, _, _) in scrape.items() if family.startswith("npaudit_")}
    assert _readme_metric_names() == exported
