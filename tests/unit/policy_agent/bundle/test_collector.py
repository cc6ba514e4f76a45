"""`npaudit bundle`: opt-in audit records, --since, size caps, manifest hashes, and --redact over every byte."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import re
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from policy_agent.bundle.redact import Redactor
from policy_agent.config import loader as config_mod
from policy_agent.bundle.collector import (
    AUDIT_NAME, HEAD, TAIL, ApiCall, BundleOptions, BundleRefused, Collected, Command, Fetched, HttpGet,
    Inline, Item, Plan, assemble, plan,
)
from policy_agent.bundle.archive import HostCollector, collect, write_bundle
from policy_agent.cli.main import main
from tests.support.audit_records import T0, sample_record, stamp, write_set

UTC = dt.timezone.utc
NOW = dt.datetime(2024, 5, 1, 3, 0, tzinfo=UTC)
N = 120
NODE = "worker-17"

APPLIED = """\
apiVersion: v1
kind: Namespace
metadata: {name: payments, labels: {team: ledger-team}}
---
apiVersion: v1
kind: Pod
metadata: {name: ledger-7f, namespace: payments, labels: {app: ledger-app}}
status: {podIP: 10.77.3.9}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-ledger, namespace: payments}
spec:
  podSelector: {matchLabels: {app: ledger-app}}
  ingress: [{from: [{ipBlock: {cidr: 10.77.0.0/16}}]}]
"""
CNI_STATE = {"version": 1, "phase": "ready", "host_mac": "fa:16:3e:00:00:01",  # as policy_agent.cni.state writes it
             "info": {"namespace": "payments", "name": "ledger-7f", "container_id": "c0ffee", "netns": "/proc/1/ns/net",
                      "ifname": "eth0", "ip": "10.77.3.9", "prefix_len": 24, "mac": "02:00:0a:4d:03:09",
                      "gateway": "10.77.3.1", "host_ifname": "npa-c0ffee", "ofport": 7},
             "ipam_netconf": {}, "result": None}
OVS_FLOWS = (b" cookie=0x1, table=10, priority=100,ip,nw_src=10.77.3.9,nw_dst=10.96.0.10 actions=drop\n"
             b" cookie=0x1, table=10, priority=90,ipv6,ipv6_src=fd00::2 actions=resubmit(,20)\n")
STATUS = {"ok": True, "node": NODE, "pods": ["payments/ledger-7f"], "last_error": "pod frontend/web-5c at 10.96.1.11"}


class FakeCollector:
    """Canned answers for commands, the agent's API and metrics; real files for the rest."""

    def __init__(self, agent_running: bool = True) -> None:
        self.agent_running = agent_running
        self.host = HostCollector()

    def fetch(self, item: Item, limit: int) -> Fetched:
        source = item.source
        if isinstance(source, Command):
            return Fetched(((item.name, OVS_FLOWS if "dump-flows" in source.argv else b"ok\n"),))
        if isinstance(source, ApiCall):
            if not self.agent_running:
                from policy_agent.bundle.collector import Unavailable
                raise Unavailable(f"agent not running or not reachable at {source.socket}")
            return Fetched(((item.name, json.dumps(STATUS).encode()),))
        if isinstance(source, HttpGet):
            return Fetched(((item.name, b'npaudit_packetin_total{outcome="delivered"} 5\n'),))
        return self.host.fetch(item, limit)


def _config(tmp_path: Path, allow: bool) -> config_mod.AgentConfig:
    return config_mod.loads(json.dumps({
        "state_dir": str(tmp_path / "state"), "audit": {"path": str(tmp_path / "logs" / "audit.jsonl")},
        "bundle": {"allow_audit_logs": allow}, "metrics": {"listen": ""},
        "ovs": {"run_dir": str(tmp_path / "ovs")}}))


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node's files: applied store, CNI state, and N audit records over rotated (gz) files."""
    (tmp_path / "state" / "cni" / "containers").mkdir(parents=True)
    (tmp_path / "state" / "applied.yaml").write_text(APPLIED)
    (tmp_path / "state" / "cni" / "containers" / "c0ffee.json").write_text(json.dumps(CNI_STATE, indent=1))
    (tmp_path / "logs").mkdir()
    write_set(tmp_path / "logs" / "audit.jsonl", (sample_record(i) for i in range(N)), max_bytes=8_000)
    return tmp_path


def _bundle(node: Path, *, allow: bool = True, include: bool = True, redact: bool = False,
            max_bytes: int = 1 << 24, since: dt.datetime | None = None) -> Path:
    cfg = _config(node, allow)
    options = BundleOptions(now=NOW, max_bytes=max_bytes, since=since, include_audit=include, redact=redact)
    planned = plan(cfg, options, version="test", node=NODE)
    files, manifest = assemble(planned, collect(planned, FakeCollector(), max_bytes), cfg, options,
                               Redactor(os.urandom(32)) if redact else None)
    out = node / "bundle.tar.gz"
    write_bundle(out, files, manifest, now=NOW, min_free=0)
    return out


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]


def _records(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines()]


def test_manifest_lists_every_file_with_its_true_size_and_sha256_and_all_are_private(node: Path) -> None:
    path = _bundle(node)
    members = _members(path)
    manifest = json.loads(members.pop("manifest.json"))
    assert {e["name"] for e in manifest["files"]} == set(members)
    for entry in manifest["files"]:
        assert entry["size"] == len(members[entry["name"]])
        assert entry["sha256"] == hashlib.sha256(members[entry["name"]]).hexdigest()
    assert {"version.json", "config.json", "agent/status.json", "ovs/dump-flows.txt", "state/applied.yaml",
            "state/cni/c0ffee.json", AUDIT_NAME} <= set(members)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with tarfile.open(path) as tar:
        assert {m.mode for m in tar.getmembers()} == {0o600}
    skipped = {e["name"]: e["reason"] for e in manifest["skipped"]}
    assert "agent/metrics.txt" in skipped  # said, with why
    assert {"agent/agent.log", "state/cni/c0ffee.json"} <= {e["name"] for e in manifest["files"]}
    assert manifest["agent_running"] is True and manifest["audit_logs"]["included"] is True


def test_with_redact_no_original_ip_pod_namespace_node_label_or_policy_name_is_left_in_any_byte(node: Path) -> None:
    originals = {NODE, "payments", "ledger-7f", "ledger-app", "ledger-team", "allow-ledger", "10.77.3.9",
                 "10.77.3.1", "10.77.0.0", "10.96.0.10", "fd00::2", "10.96.1.11", "web-5c"}
    for i in range(N):
        record = sample_record(i)
        originals |= {record["source"]["ip"], record["destination"]["ip"], record["observer"]["hostname"],
                      record["rule"]["name"], record["labels"]["log_label"] if "labels" in record else "node-a"}
        for side in ("source", "destination"):
            pod = record["npaudit"].get(side, {}).get("pod", {})
            originals |= {pod.get("name", "db-0"), pod.get("namespace", "backend")}
    plain = gzip.decompress(_bundle(node).read_bytes())
    assert all(o.encode() in plain for o in originals - {"10.77.0.0"})  # the test data does carry them
    raw = gzip.decompress(_bundle(node, redact=True).read_bytes())  # every byte: headers, names, contents
    # As whole tokens: "rule-1" is inside the pseudonym "rule-1c40de2d" and "audit-b" inside "npaudit-bundle".
    left = sorted(o for o in originals if re.search(rb"(?<![\w.:-])" + re.escape(o.encode()) + rb"(?![\w:-]|\.\w)", raw))
    assert left == []
    distinctive = {o for o in originals if len(o) > 8}  # these must not appear even inside a longer word
    assert sorted(o for o in distinctive if o.encode() in raw) == []
    members = _members(node / "bundle.tar.gz")
    records = _records(members[AUDIT_NAME])
    assert len(records) == N
    # Consistent: one Pod keeps one pseudonym across the records, the store and the status.
    pseudonym = records[1]["npaudit"]["destination"]["pod"]["name"]  # web-5c
    assert all(r["npaudit"]["destination"]["pod"]["name"] == pseudonym for r in records[1::3] if
               "destination" in r["npaudit"])
    assert pseudonym.encode() in members["agent/status.json"]
    redaction = json.loads(members["manifest.json"])["redaction"]
    assert redaction["enabled"] and redaction["replaced"]["pod"] >= 2 and redaction["replaced"]["ip"] > 10


def test_audit_flag_without_the_config_allowing_it_is_refused_with_one_line(node: Path, capsys: Any) -> None:
    cfg = node / "npaudit.yaml"
    cfg.write_text(f"state_dir: {node}/state\nmetrics: {{listen: ''}}\n")
    out = node / "b.tar.gz"
    assert main(["bundle", "--config", str(cfg), "--include-audit", "--output-file", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bundle.allow_audit_logs" in err
    assert not out.exists()
    with pytest.raises(BundleRefused):
        plan(_config(node, allow=False), BundleOptions(now=NOW, max_bytes=1, include_audit=True),
             version="t", node=NODE)


def test_config_allowing_audit_logs_without_the_flag_puts_no_record_in_the_bundle(node: Path, capsys: Any) -> None:
    cfg = node / "npaudit.yaml"
    cfg.write_text(f"state_dir: {node}/state\nmetrics: {{listen: ''}}\naudit: {{path: {node}/logs/audit.jsonl}}\n"
                   f"bundle: {{allow_audit_logs: true}}\novs: {{run_dir: {node}/ovs}}\n")
    out = node / "b.tar.gz"
    assert main(["bundle", "--config", str(cfg), "-o", str(out)]) == 0
    assert "\r[" not in capsys.readouterr().err  # no progress bar when stderr is not a terminal
    raw = gzip.decompress(out.read_bytes())
    assert b"@timestamp" not in raw and b"client-0-7d9f" not in raw
    manifest = json.loads(_members(out)["manifest.json"])
    assert manifest["audit_logs"]["included"] is False and manifest["agent_running"] is False
    assert any(e["name"] == AUDIT_NAME and "--include-audit" in e["reason"] for e in manifest["skipped"])
    assert any(e["name"] == "agent/status.json" and "not running" in e["reason"] for e in manifest["skipped"])


def test_since_selects_the_records_from_that_time_on_across_rotated_files(node: Path, capsys: Any) -> None:
    cfg = node / "npaudit.yaml"
    cfg.write_text(f"state_dir: {node}/state\nmetrics: {{listen: ''}}\naudit: {{path: {node}/logs/audit.jsonl}}\n"
                   f"bundle: {{allow_audit_logs: true}}\novs: {{run_dir: {node}/ovs}}\n")
    out = node / "b.tar.gz"
    since = stamp(T0 + 100)
    assert main(["bundle", "--config", str(cfg), "--include-audit", "--since", since, "-o", str(out)]) == 0
    records = _records(_members(out)[AUDIT_NAME])
    assert [r["@timestamp"] for r in records] == [stamp(T0 + i) for i in range(100, N)]
    assert main(["bundle", "--config", str(cfg), "--since", "yesterday-ish", "-o", str(out)]) == 2


def _collected(*items: tuple[str, bytes, str]) -> tuple[Plan, list[Collected]]:
    its = [Item(name, Inline(data), keep) for name, data, keep in items]
    return Plan(tuple(its), (), NODE), [Collected(i, Fetched(((i.name, i.source.data),))) for i in its]  # type: ignore[union-attr]


def test_the_size_cap_cuts_at_line_boundaries_keeps_newest_records_and_says_so() -> None:
    lines = b"".join(b'{"n":%d}\n' % i for i in range(100))  # 8-9 bytes a line
    planned, got = _collected(("version.json", b"v" * 99 + b"\n", HEAD), ("ovs/x.log", lines, TAIL),
                              (AUDIT_NAME, lines, TAIL), ("late.txt", b"late\n", HEAD))
    options = BundleOptions(now=NOW, max_bytes=400)
    files, manifest_data = assemble(planned, got, _config(Path("/tmp"), True), options)
    manifest = json.loads(manifest_data)
    sizes = {name: len(data) for name, data in files}
    assert sum(sizes.values()) <= 400 and sizes["version.json"] == 100
    log = dict(files)["ovs/x.log"]
    assert log.endswith(b'{"n":99}\n') and log.startswith(b'{"n":') and lines.endswith(log)
    entry = next(e for e in manifest["files"] if e["name"] == "ovs/x.log")
    assert entry["truncated"]["original_bytes"] == len(lines)
    assert (entry["size"], entry["sha256"]) == (len(log), hashlib.sha256(log).hexdigest())  # of what is inside
    assert {e["name"] for e in manifest["skipped"]} == {AUDIT_NAME, "late.txt"}
    assert all("size cap" in e["reason"] for e in manifest["skipped"])


def test_a_bundle_that_would_fill_the_disk_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(BundleRefused, match="min_free_mb"):
        write_bundle(tmp_path / "b.tar.gz", [("x", b"x")], b"{}", now=NOW, min_free=1 << 60)
    assert list(tmp_path.iterdir()) == []


HOSTILE_NAMES = ["caf\u00e9-r\u00e8gle", 'say "hi"', "back\\slash", "two\nlines", "x" * 90 + " folded-by-yaml " + "y" * 20]
HOSTILE_APPLIED = {
    "apiVersion": "crd.antrea.io/v1beta1", "kind": "ClusterNetworkPolicy", "metadata": {"name": "acnp-hostile"},
    "spec": {"priority": 5, "appliedTo": [{"podSelector": {"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["only-in-an-expression"]}]}}],
             "ingress": [{"action": "Drop", "name": n, "from": [{"ipBlock": {"cidr": "10.77.3.9/32"}}]}
                         for n in HOSTILE_NAMES]}}


def test_with_redact_no_pod_address_or_name_survives_in_any_encoding_and_every_json_file_parses(node: Path) -> None:
    import yaml

    pod_true = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "true", "namespace": "payments"},
                "status": {"podIP": "10.77.3.10"}}
    (node / "state" / "applied.yaml").write_text(APPLIED + "---\n" + yaml.safe_dump_all([pod_true, HOSTILE_APPLIED]))
    ips = ["10.77.3.9", "10.77.3.10"]
    flows = "".join(f" cookie=0x1, table=70, priority=200,ip,nw_dst={ip} actions=set_field:02:00:"
                    + ":".join(f"{int(o):02x}" for o in ip.split(".")) + "->eth_dst,"
                    + f"load:0x{int.from_bytes(bytes(map(int, ip.split('.'))), 'big'):x}->NXM_NX_REG3[],output:7\n"
                    for ip in ips)
    metrics = "".join('npaudit_rule_packets{rule="%s"} 1\n' % n.replace("\\", "\\\\").replace('"', '\\"')
                      .replace("\n", "\\n") for n in HOSTILE_NAMES)

    class Collector(FakeCollector):
        def fetch(self, item: Item, limit: int) -> Fetched:
            if isinstance(item.source, Command) and "dump-flows" in item.source.argv:
                return Fetched(((item.name, flows.encode()),))
            if isinstance(item.source, HttpGet):
                return Fetched(((item.name, metrics.encode()),))
            return super().fetch(item, limit)

    cfg = _config(node, True)
    options = BundleOptions(now=NOW, max_bytes=1 << 24, since=None, include_audit=True, redact=True)
    planned = plan(cfg, options, version="test", node=NODE)
    files, manifest = assemble(planned, collect(planned, Collector(), 1 << 24), cfg, options, Redactor(os.urandom(32)))
    write_bundle(node / "b.tar.gz", files, manifest, now=NOW, min_free=0)
    members = _members(node / "b.tar.gz")
    raw = b"".join(members.values())
    for ip in ips:
        octets = bytes(map(int, ip.split(".")))
        for spelling in (ip, f"0x{int.from_bytes(octets, 'big'):x}", f"0x{int.from_bytes(octets, 'big'):08x}",
                         "02:00:" + ":".join(f"{o:02x}" for o in octets)):
            assert spelling.encode() not in raw, spelling
    for name in [*HOSTILE_NAMES, "only-in-an-expression", "acnp-hostile", "ledger-7f"]:
        spellings = {name, json.dumps(name)[1:-1], json.dumps(name, ensure_ascii=False)[1:-1],
                     name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")}
        spellings |= {line.strip() for line in yaml.safe_dump(name).splitlines() if len(line.strip()) > 12}
        for spelling in spellings:
            assert spelling.encode() not in raw, (name, spelling)
    pod_names = []
    for member, data in members.items():
        if member.endswith(".json"):
            json.loads(data)  # still parses (a Pod named "true" did not turn JSON's true into a name)
        elif member.endswith(".jsonl"):
            assert all(isinstance(json.loads(line), dict) for line in data.splitlines())
        elif member.endswith(".yaml"):
            pod_names += [d["metadata"]["name"] for d in yaml.safe_load_all(data) if d and d.get("kind") == "Pod"]
    assert len(pod_names) == 2 and all(name.startswith("pod-") for name in pod_names)  # "true" too
    assert json.loads(members["manifest.json"])["redaction"]["enabled"] is True


def test_an_interrupted_applys_intent_is_collected_and_its_names_are_redacted(node: Path) -> None:
    import yaml

    intent = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pending-ledger", "namespace": "vault-ns"},
              "status": {"podIP": "10.77.4.4"}}
    (node / "state" / "applied.intent").write_text("# generation 8\n" + yaml.safe_dump(intent))
    members = _members(_bundle(node))
    assert b"pending-ledger" in members["state/applied.intent.yaml"]  # what the next start settles
    redacted = _members(_bundle(node, redact=True))
    raw = b"".join(redacted.values())
    assert b"pending-ledger" not in raw and b"vault-ns" not in raw and b"10.77.4.4" not in raw
    assert [d["kind"] for d in yaml.safe_load_all(redacted["state/applied.intent.yaml"])] == ["Pod"]


def test_without_an_interrupted_apply_the_manifest_says_there_is_no_intent(node: Path) -> None:
    manifest = json.loads(_members(_bundle(node))["manifest.json"])
    assert "state/applied.intent.yaml" not in {e["name"] for e in manifest["files"]}
    assert "state/applied.intent.yaml" in json.dumps(manifest)  # named as unavailable, with why
