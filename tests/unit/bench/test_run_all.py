"""bench/run_all.py: every public bench found and run, its JSON taken, figures and failures on the page.

The benches here are small scripts written by the test into a directory of their
own (the real ones need root, OVS and minutes); run_all runs them as processes.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load_run_all():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_run_all", ROOT / "bench" / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_all = _load_run_all()


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    d = tmp_path / "bench"
    d.mkdir()
    # Progress on stdout before an indented JSON document, as several benches print.
    (d / "pod_throughput.py").write_text(
        "import json\nprint('warming up')\nprint(json.dumps({'benchmark': 'pod_throughput', "
        "'logging_on_vs_off_ratio': 0.97, 'mbit_per_s_median': {'off': 250.0, 'on': 242.5}, "
        "'phases': [{'ratio': 9}], 'target_met': True}, indent=2))\n")
    # A bench run_all has no headline list for (another helper's, say): its comparison keys are found.
    (d / "other_helpers.py").write_text(
        "import json\nprint(json.dumps({'summary': {'admitted_vs_configured_ratio': 1.02, 'rate': 1000}}))\n")
    (d / "broken.py").write_text("import sys\nprint('partial')\nsys.stderr.write('boom: no OVS here\\n')\n"
                                 "sys.exit(3)\n")
    (d / "_helper.py").write_text("raise SystemExit('a private module is never run')\n")
    (d / "notes.txt").write_text("not a bench\n")
    return d


def test_discovers_public_benches_only(bench_dir: Path) -> None:
    (bench_dir / "run_all.py").write_text("raise SystemExit('not itself')\n")
    assert [p.name for p in run_all.benches(bench_dir)] == ["broken.py", "other_helpers.py", "pod_throughput.py"]


def test_results_page_has_facts_figures_json_and_failures(bench_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    code = run_all.main(["--bench-dir", str(bench_dir), "--out", str(out), "--note", "Shared machine."])
    assert code == 1  # one bench failed
    page = out.read_text()
    assert "Shared machine." in page
    for fact in ("cpu model", "cores", "kernel", "ovs", "load average at start", "load average at end"):
        assert f"| {fact} |" in page, fact
    assert "| pod_throughput | TCP between Pods: logging on vs off | 0.97 |" in page
    assert "| pod_throughput | TCP between Pods Mbit/s (on) | 242.5 |" in page
    assert "| other_helpers | summary.admitted_vs_configured_ratio | 1.02 |" in page
    assert "| broken | **failed** (exit 3) | see below |" in page
    assert "boom: no OVS here" in page
    assert "a private module is never run" not in page
    # Each result verbatim (as JSON) in its own section.
    section = page.split("## pod_throughput", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(section)["logging_on_vs_off_ratio"] == 0.97


def test_only_and_unknown_names(bench_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "RESULTS.md"
    assert run_all.main(["--bench-dir", str(bench_dir), "--out", str(out), "--only", "pod_throughput"]) == 0
    assert "## broken" not in out.read_text() and "## pod_throughput" in out.read_text()
    assert run_all.main(["--bench-dir", str(bench_dir), "--out", str(out), "--only", "nope"]) == 2
    assert "no such bench: nope" in capsys.readouterr().err


def test_last_json_takes_the_document_at_the_end() -> None:
    assert run_all.last_json('progress {not json}\n{"a": 1}\n{\n  "b": [1, 2]\n}\n') == {"b": [1, 2]}
    with pytest.raises(ValueError):
        run_all.last_json("no json here\n")


# The shape of each bench's JSON (keys as the bench prints them, values made up): every named figure is found.
SHAPES = {
    "meter_accuracy": {"ratio_by_rate": {"10": 1.0, "1000": 0.99}, "within_2_percent": {"10": True, "1000": True},
                       "rates": [{"ratio": 1.0}]},
    "flood": {"vswitchd_cpu_ratio_off_over_on": 3.4,
              "runs": {"offload_off": {"quiet_ping": {"p99_ratio": 1.5}, "accounting": {"unaccounted": 0}},
                       "offload_on": {"quiet_ping": {"p99_ratio": 1.1}, "accounting": {"unaccounted": 2}}}},
    "audit_overload": {"phases": [], "summary": {
        "ovs_busy_node": {"accounted_vs_emitted_worst": {"off": 0.7, "on": 0.995},
                          "lost_at_agent_worst": {"off": 9, "on": 0}},
        "synthetic_lost_in_agent_queue": {"off": 9, "on": 0},
        "full_detail_records_per_s_in_process_best": {"without_overload": 9000, "with_overload_check": 8900}}},
    "auditlog_throughput": {"phases": [], "summary": {
        "distinct_flows": {"records_per_s": 50000}, "distinct_flows_one_per_frame": {"records_per_s": 24000},
        "aggregated_flood": {"accounted_vs_ceiling": 0.97},
        "capacity_writer_ab": {"inline_vs_thread_only_records_per_s_best": 1.01,
                               "inline_vs_thread_only_cpu_seconds_best": 0.99},
        "latency": {"floor_bare_reader": {"sent_to_read": {"p50_ms": 0.3, "p99_ms": 0.9}}, "target_met": True,
                    "thread_only": {"end_to_end": {"p50_ms": 0.9, "p99_ms": 2.2}},
                    "inline": {"end_to_end": {"p50_ms": 0.7, "p99_ms": 1.5},
                               "agent_read_to_written": {"p99_ms": 0.6}}}}},
    "traceflow_latency": {"targets": {"no_flood": {"client_p99_ms": 12.0, "met": True},
                                      "flood": {"client_p99_ms": 40.0, "met": True}},
                          "cross_node": {"client_p99_vs_same_node": 1.4}},
    "megaflow_purge": {"baseline_unixctl_version_ms": {"p50": 0.2, "max": 0.4, "n": 25},
                       "purge": {"0": {"purge_ms": {"p50": 0.3}}, "5000": {"purge_ms": {"p50": 4.1}}}},
    "agent_cpu": {"agent": [], "floor_phases": [], "summary": {"floor_mode": "agent stopped", "by_rate": {
        "5000": {"agent_us_per_packet_in": 68.0, "floor_us_per_packet_in": 20.0, "agent_vs_floor": 3.4,
                 "in_records_vs_emitted": 1.0, "full_detail_fraction": 1.0}}}},
    "soak_flood": {"rss_mb": {"max": 120.5, "samples": 60}, "targets_met": True,
                   "accounting": {"agent": {"difference": 0}, "ovs_vs_agent": {"difference": 0}}},
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_named_figure_of_todays_benches_is_found_in_their_json(name: str) -> None:
    found = run_all.headlines(name, SHAPES[name])
    labels = [label for label, _ in found]
    for label, pattern in run_all.HEADLINES[name]:
        assert any(fnmatch.fnmatchcase(got, re.sub(r"\{\d\}", "*", label)) for got in labels), pattern
    assert "{" not in " ".join(labels)


def test_the_named_figures_are_labelled_by_their_key() -> None:
    found = dict(run_all.headlines("flood", SHAPES["flood"]))
    assert found["flood: frames unaccounted (offload_on)"] == 2
    assert found["flood: vswitchd CPU offload off / on"] == 3.4
    assert dict(run_all.headlines("megaflow_purge", SHAPES["megaflow_purge"]))[
        "megaflow purge p50 ms, 5000 megaflows"] == 4.1
