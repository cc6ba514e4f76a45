"""`npaudit bundle` against the running agent of an e2e cluster (issue 13): Pods, a logged policy, real traffic.

Without opt-in no audit record is in the archive; the manifest's sizes and sha256 match every
file; with --include-audit (and the node's opt-in) and --redact, no Pod IP, Pod name or
Namespace name of the cluster remains anywhere in the archive, names of tar members included.
Names are distinctive on purpose, so a leftover cannot hide among other text.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from tests.support.cluster import Cluster, logged_udp_drop

NAMESPACES = ("tenant-alpha-q7", "tenant-bravo-k3")
PODS = {"tenant-alpha-q7": "ledger-db-zx9", "tenant-bravo-k3": "web-client-mv4"}
MANIFESTS = "---\n".join(
    f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels:\n    kubernetes.io/metadata.name: {ns}\n"
    f"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {PODS[ns]}\n  namespace: {ns}\n  labels:\n    app: {ns}\n"
    for ns in NAMESPACES) + "---\n" + logged_udp_drop("bundle-drop-udp", to_ns="tenant-alpha-q7",
                                                        from_ns="tenant-bravo-k3", label="bundle-e2e")


def _bundle(config: Path, out: Path, *extra: str) -> dict[str, bytes]:
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "bundle", "--config", str(config), "-o", str(out),
                          *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr  # no progress bar: not on a terminal
    with tarfile.open(out) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _manifest_matches(members: dict[str, bytes]) -> dict:
    root = next(name.split("/", 1)[0] for name in members)
    manifest = json.loads(members[f"{root}/manifest.json"])
    listed = {e["name"]: e for e in manifest["files"]}
    assert set(listed) == {name.split("/", 1)[1] for name in members} - {"manifest.json"}
    for name, entry in listed.items():
        data = members[f"{root}/{name}"]
        assert (entry["size"], entry["sha256"]) == (len(data), hashlib.sha256(data).hexdigest()), name
    return manifest


def _is_record(line: bytes) -> bool:
    try:
        value = json.loads(line)
    except ValueError:
        return False
    return isinstance(value, dict) and isinstance(value.get("npaudit"), dict) and "seq" in value["npaudit"]


def test_bundle_of_a_running_agent_opt_in_audit_and_redaction(cluster: Cluster) -> None:
    cluster.apply(MANIFESTS)
    server = cluster.add_pod("tenant-alpha-q7", PODS["tenant-alpha-q7"])
    client = cluster.add_pod("tenant-bravo-k3", PODS["tenant-bravo-k3"], server=False)
    assert cluster.probe(client.ref, [f"{server.ip}:53/udp"]) == {f"{server.ip}:53/udp": "timeout"}
    deadline = time.monotonic() + 10
    while not cluster.audit_records() and time.monotonic() < deadline:
        time.sleep(0.1)
    records = cluster.audit_records()
    assert records and records[0]["npaudit"]["source"]["pod"]["name"] == PODS["tenant-bravo-k3"]

    # No opt-in: the agent's state is there, no audit record is.
    members = _bundle(cluster.config, cluster.dir / "plain.tar.gz")
    manifest = _manifest_matches(members)
    assert manifest["agent_running"] is True and manifest["audit_logs"]["included"] is False
    raw = gzip.decompress((cluster.dir / "plain.tar.gz").read_bytes())
    # (The chain head may be there, in the agent's status: a hash, not a record.)
    for record in records:
        assert record["event"]["id"].encode() not in raw, record["event"]["id"]
    for name, data in members.items():
        assert not [line for line in data.splitlines() if _is_record(line)], name
    assert PODS["tenant-alpha-q7"].encode() in raw  # the Pod inventory is in (what --redact must hide)

    # Opted in by the node and asked for, redacted: records inside, no original name or IP anywhere.
    opted = cluster.dir / "opted.yaml"
    opted.write_text(cluster.config.read_text() + "bundle:\n  allow_audit_logs: true\n")
    out = cluster.dir / "redacted.tar.gz"
    members = _bundle(opted, out, "--include-audit", "--redact")
    manifest = _manifest_matches(members)
    assert manifest["audit_logs"]["included"] is True and manifest["redaction"]["enabled"] is True
    audit = next(data for name, data in members.items() if name.endswith("audit/audit.jsonl"))
    assert audit.count(b"\n") >= len(records)
    raw = gzip.decompress(out.read_bytes())  # tar headers (member names) included
    originals = [*NAMESPACES, *PODS.values(), server.ip, client.ip]
    left = [name for name in originals if name.encode() in raw]
    assert not left, left
