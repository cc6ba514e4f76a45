"""Each logged rule's own loss, end to end, with the DEFAULT deny meter (1000 packet-ins/s, burst 200).

Two Pods flood two logged Drop rules of one policy in the same window, 2,000 packets at
2,000 pps each: the deny meter they share drops most of their packet-ins. For each rule,
the packets in its records plus the loss the trail states for that rule (npaudit.loss.by_rule)
equal, exactly, the packets its flows matched in OVS (read by ovs-ofctl), each rule with its
own figure; `npaudit stats --rule` shows the same sum. The same holds when the agent's first loss
window falls in the middle of the flood, and across a restart (whose flows OVS replaces keeping their counts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Iterator, NamedTuple

import jsonschema
import pytest

from tests.support.cluster import Cluster
from tests.support.e2e_scenarios import SCHEMA
from tests.support.rule_flows import RULES, TWO_LOGGED_DROPS, logged_rule_flow_packets

SENT, PPS = 2000, 2000


# Paced UDP sender: argv ip port count pps; prints the datagrams that left.
SENDER = r"""
import socket, sys, time
ip, port, count, pps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
t0, sent = time.perf_counter(), 0
for i in range(count):
    try:
        s.sendto(b"flood%d" % i, (ip, port)); sent += 1
    except OSError:
        pass
    ahead = t0 + (i + 1) / pps - time.perf_counter()
    if ahead > 0:
        time.sleep(ahead)
print(sent)
"""


class Variant(NamedTuple):
    per_rule: bool  # meters.per_rule: each rule's loss also says what its own meter dropped
    interval: float  # meters.stats_interval: the rules' flows (and meters) are read this often
    sent: int  # datagrams each Pod sends, at PPS


VARIANTS = {
    "class-meter": Variant(False, 0.5, SENT),
    "per-rule-meters": Variant(True, 0.5, SENT),
    # The agent's first loss window falls in the middle of the flood (2 s after it started, the
    # flood runs from about 1 s to 4 s): the rules' flows were made by this run, so all they
    # count is this run's to account, not a baseline taken mid-flood.
    "first-window-mid-flood": Variant(False, 2.0, 3 * PPS),
}


@pytest.fixture(params=list(VARIANTS))
def two_rules(request: pytest.FixtureRequest) -> Iterator[tuple[Cluster, Variant]]:
    """The default meter rates; one meter for the class, or one per rule."""
    v = VARIANTS[request.param]
    c = Cluster(extra_config=f"meters:\n  stats_interval: {v.interval}\n"
                             f"  per_rule: {{enabled: {str(v.per_rule).lower()}}}\n")
    try:
        c.start()
        yield c, v
    finally:
        c.close()


def rule_ids(records: list[dict[str, Any]]) -> dict[str, int]:
    return {r["rule"]["name"]: int(r["rule"]["id"]) for r in records
            if r["event"]["action"] != "audit-loss" and r.get("rule", {}).get("name") in RULES}


def account(records: list[dict[str, Any]], metered: dict[str, int] | None = None
            ) -> tuple[dict[str, int], dict[str, int]]:
    """({rule name: packets in its records}, {rule name: loss the trail states for it}); `metered` gets
    {rule name: the part of it the rule's own meter dropped}."""
    recorded = dict.fromkeys(RULES, 0)
    stated = dict.fromkeys(RULES, 0)
    for r in records:
        if r["event"]["action"] == "audit-loss":
            for item in r["npaudit"]["loss"].get("by_rule", ()):
                name = item["rule"].get("name")
                if name in stated:
                    stated[name] += item["count"]
                    if metered is not None and "meter" in item:
                        metered[name] = metered.get(name, 0) + item["meter"]
        elif r.get("rule", {}).get("name") in recorded:
            recorded[r["rule"]["name"]] += r["npaudit"]["aggregate"]["packets"]
    return recorded, stated


def flood_both(cluster: Cluster, target_ip: str, count: int) -> list[int]:
    senders = [subprocess.Popen(["ip", "netns", "exec", cluster.pods[src].netns, sys.executable, "-c", SENDER,
                                 target_ip, port, str(count), str(PPS)], stdout=subprocess.PIPE, text=True)
               for src, port in (("one/a", "53"), ("two/b", "54"))]
    return [int(p.communicate(timeout=120)[0]) for p in senders]


def settled(cluster: Cluster, timeout: float = 60) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(in records, stated lost, flows matched) per rule once records + stated = matched (or timed out)."""
    deadline = time.monotonic() + timeout
    while True:
        records = cluster.audit_records()
        ids = rule_ids(records)
        flows = logged_rule_flow_packets(cluster)
        recorded, stated = account(records)
        matched = {name: flows.get(rule_id, 0) for name, rule_id in ids.items()}
        if (len(ids) == 2 and all(recorded[n] + stated[n] == matched[n] for n in RULES)) \
                or time.monotonic() > deadline:
            return recorded, stated, matched
        time.sleep(0.5)


def test_each_flooded_logged_drop_rule_states_its_own_loss_exactly(two_rules: tuple[Cluster, Variant]) -> None:
    cluster, variant = two_rules
    per_rule = variant.per_rule
    cluster.apply(TWO_LOGGED_DROPS)
    cluster.add_pod("one", "a", server=False)
    cluster.add_pod("two", "b", server=False)
    target = cluster.add_pod("target", "t")
    sent = flood_both(cluster, target.ip, variant.sent)

    # The trail states a rule's loss once its flows' counts have settled (a window or two later).
    recorded, stated, matched = settled(cluster)
    ids = rule_ids(cluster.audit_records())
    print(f"sent {sent}; flows matched {matched}; in records {recorded}; stated lost {stated}")
    assert len(ids) == 2, ids
    for name in RULES:
        assert stated[name] > 0, f"the deny meter dropped packet-ins of {name}: its loss must be stated"
        assert recorded[name] + stated[name] == matched[name], (name, recorded, stated, matched)

    metered: dict[str, int] = {}
    account(cluster.audit_records(), metered)
    if per_rule:  # each rule's own meter: its part is exactly what OVS says that meter dropped
        assert sum(metered.values()) == cluster.meter_band_drops() and set(metered) == set(RULES), metered
        assert all(0 < metered[n] <= stated[n] for n in RULES), (metered, stated)
    else:
        assert metered == {}, "with one meter per class a rule's meter drops are not known apart"

    cluster.stop_agent()
    records = cluster.audit_records()
    assert account(records) == (recorded, stated), "the last window stated more than the settled figures"
    for r in records:
        if r["event"]["action"] == "audit-loss":
            jsonschema.validate(r, SCHEMA)
    for name in RULES:
        res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "stats", "-o", "json", "--rule", name,
                              "--config", str(cluster.config)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        shown = json.loads(res.stdout)["files"]["rule"]
        assert (shown["packets_in_records"], shown["stated_loss"], shown["packets_hit"]) == \
            (recorded[name], stated[name], matched[name]), shown
    verify = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "verify", str(cluster.dir / "audit")],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_after_a_restart_the_flows_the_new_run_added_again_go_on_counting_and_the_sum_stays_exact() -> None:
    """The new run ADDs the rules' flows again in its own round: OVS replaces them and keeps their counts.
    The restarted agent takes those counts as its baseline, so the trail (both runs') still adds up to
    exactly what the flows matched, and the second flood's loss is stated once, not with the first's again."""
    cluster = Cluster(extra_config="meters:\n  stats_interval: 0.5\n")
    try:
        cluster.start()
        cluster.apply(TWO_LOGGED_DROPS)
        cluster.add_pod("one", "a", server=False)
        cluster.add_pod("two", "b", server=False)
        target = cluster.add_pod("target", "t")
        assert flood_both(cluster, target.ip, SENT) == [SENT, SENT]
        recorded, stated, matched = settled(cluster)
        assert matched == dict.fromkeys(RULES, SENT), matched
        assert all(recorded[n] + stated[n] == SENT for n in RULES), (recorded, stated)

        cluster.stop_agent()
        (cluster.state / "api.sock").unlink(missing_ok=True)
        cluster.start()
        assert flood_both(cluster, target.ip, SENT) == [SENT, SENT]
        recorded2, stated2, matched2 = settled(cluster)
        print(f"first run {recorded} + {stated}; both runs {recorded2} + {stated2}; flows {matched2}")
        assert matched2 == dict.fromkeys(RULES, 2 * SENT), "OVS kept the flows' counts across the re-add"
        for name in RULES:
            assert recorded2[name] + stated2[name] == 2 * SENT, (name, recorded2, stated2)
            assert stated2[name] > stated[name], "the second flood's loss is stated too"
    finally:
        cluster.close()
