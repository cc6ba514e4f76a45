"""`npaudit bundle`: what a support bundle holds (a plan), then its caps, redaction and manifest.

Pure: `plan` turns the config and options into items, `assemble` turns what was collected into
the files and manifest.json. The I/O (commands, files, the agent's API, the tar.gz) is in
policy_agent/bundle/archive.py behind `Collector.fetch`.

Size cap: the content (before compression, after redaction) is at most `max_bytes`. Items are
taken in plan order, audit records last; an item larger than what is left is cut at a line
boundary (logs and audit records keep their newest end, everything else its start) and, once
nothing is left, items are left out. manifest.json names each cut or left-out file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Union

from policy_agent.config.loader import AgentConfig
from policy_agent.errors import AgentError

ROOT = "npaudit-bundle"
AUDIT_NAME = "audit/audit.jsonl"
MANIFEST = "manifest.json"
HEAD, TAIL = "head", "tail"
AGENT_UNIT = "npaudit-agent.service"  # config/deploy/npaudit-agent.service


class BundleRefused(AgentError):
    """The bundle is not written; the text is the one line to print."""


class Unavailable(AgentError):
    """One item could not be collected; the text (one line) goes into manifest.json."""


@dataclass(frozen=True)
class BundleOptions:
    now: dt.datetime
    max_bytes: int
    since: dt.datetime | None = None
    include_audit: bool = False
    redact: bool = False


# --- sources: what to fetch for one item ---

@dataclass(frozen=True)
class Inline:
    data: bytes


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    timeout: float = 10.0


@dataclass(frozen=True)
class FileCopy:
    path: Path


@dataclass(frozen=True)
class DirectoryCopy:
    """Every `pattern` file of `path`, as `<item name>/<file name>`."""
    path: Path
    pattern: str


@dataclass(frozen=True)
class ApiCall:
    socket: Path
    op: str


@dataclass(frozen=True)
class HttpGet:
    url: str


@dataclass(frozen=True)
class AuditRecords:
    """The records of the set whose live file is `live`, from `since` on, oldest first."""
    live: Path
    since: dt.datetime | None


Source = Union[Inline, Command, FileCopy, DirectoryCopy, ApiCall, HttpGet, AuditRecords]


@dataclass(frozen=True)
class Item:
    name: str
    source: Source
    keep: str = HEAD  # which end survives a cut


@dataclass(frozen=True)
class Plan:
    items: tuple[Item, ...]
    skipped: tuple[tuple[str, str], ...]  # (name, why it is not collected)
    node: str


@dataclass(frozen=True)
class Fetched:
    """What a collector got for an item: files (a DirectoryCopy gives several) and facts for the manifest."""
    files: tuple[tuple[str, bytes], ...]
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)


class Collector(Protocol):
    def fetch(self, item: Item, limit: int) -> Fetched:
        """The item's content (at most about `limit` bytes of it, from its `keep` end); Unavailable if none."""


def audit_refusal(cfg: AgentConfig, options: BundleOptions) -> str | None:
    """Why audit logs may not be added (both the node's config and the flag must ask), or None."""
    if options.include_audit and not cfg.bundle.allow_audit_logs:
        return ("--include-audit: refused, the agent's config does not allow audit logs in bundles "
                "(bundle.allow_audit_logs: false)")
    return None


def _version_info(version: str, options: BundleOptions) -> bytes:
    info = {"npaudit": version, "python": sys.version.split()[0], "kernel": platform.release(),
            "created": options.now.astimezone(dt.timezone.utc).isoformat(),
            "options": {"since": options.since.isoformat() if options.since else None,
                        "include_audit": options.include_audit, "redact": options.redact,
                        "max_bytes": options.max_bytes}}
    return _json(info)


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=2, sort_keys=True, default=str).encode() + b"\n"


def plan(cfg: AgentConfig, options: BundleOptions, *, version: str, node: str) -> Plan:
    """What this bundle collects, and what it leaves out and why."""
    from policy_agent.ovs.coverage import vswitchd_ctl_path

    refusal = audit_refusal(cfg, options)
    if refusal:
        raise BundleRefused(refusal)
    rundir = cfg.ovs.ovs_rundir
    mgmt = f"unix:{rundir / (cfg.ovs.bridge + '.mgmt')}"
    db = f"--db={cfg.ovs.db_remote}"
    state = Path(cfg.state_dir)
    items = [
        Item("version.json", Inline(_version_info(version, options))),
        # Paths only: the bundle never reads the files a config names (TLS keys, kubeconfig).
        Item("config.json", Inline(_json(dataclasses.asdict(cfg)))),
        Item("agent/status.json", ApiCall(cfg.api_socket, "status")),
        Item("agent/syslog-status.json", ApiCall(cfg.api_socket, "syslog-status")),
    ]
    skipped: list[tuple[str, str]] = []
    if cfg.metrics.listen:
        items.append(Item("agent/metrics.txt", HttpGet(f"http://{cfg.metrics.listen}/metrics")))
    else:
        skipped.append(("agent/metrics.txt", "metrics.listen is empty"))
    items += [
        Item("ovs/version.txt", Command(("ovs-vsctl", "--version"))),
        Item("ovs/vsctl-show.txt", Command(("ovs-vsctl", db, "--timeout=5", "show"))),
        *(Item(f"ovs/{what}.txt", Command(("ovs-ofctl", "-O", "OpenFlow15", "--timeout=5", what, mgmt)))
          for what in ("dump-flows", "dump-groups", "dump-meters", "meter-stats", "dump-ports-desc",
                       "dump-ports")),
        Item("ovs/coverage.txt", Command(("ovs-appctl", "-t", str(vswitchd_ctl_path(rundir)),
                                          "--timeout=5", "coverage/show"))),
        Item("state/applied.yaml", FileCopy(state / "applied.yaml")),
        # Present only when an apply was interrupted (sources/apply_intent.py): what it was about to
        # make the store, and what the next start settles; absent says no apply is pending.
        Item("state/applied.intent.yaml", FileCopy(state / "applied.intent")),
        Item("state/cni", DirectoryCopy(state / "cni" / "containers", "*.json")),
        # The agent logs to stderr: under the shipped unit that is its journal; in a Pod, `kubectl logs`.
        Item("agent/agent.log", Command(("journalctl", "--unit", AGENT_UNIT, "--lines", "5000", "--no-pager",
                                         "--output", "short-iso-precise")), keep=TAIL),
    ]
    logdir = rundir if cfg.ovs.mode == "embedded" else Path("/var/log/openvswitch")
    items += [Item(f"ovs/{daemon}.log", FileCopy(logdir / f"{daemon}.log"), keep=TAIL)
              for daemon in ("ovs-vswitchd", "ovsdb-server")]
    if not options.include_audit:
        skipped.append((AUDIT_NAME, "not requested (--include-audit"
                        + ("" if cfg.bundle.allow_audit_logs else "; and bundle.allow_audit_logs is false") + ")"))
    elif not cfg.audit.enabled:
        skipped.append((AUDIT_NAME, "audit.enabled is false"))
    else:  # last: the size cap leaves it whatever the diagnostics did not use
        items.append(Item(AUDIT_NAME, AuditRecords(Path(cfg.audit.path), options.since), keep=TAIL))
    return Plan(tuple(items), tuple(skipped), node)


# --- assembly: learn names, redact, cap, hash ---

def learn_names(redactor: Any, cfg: AgentConfig, node: str, files: Iterable[tuple[str, bytes]]) -> None:
    """Teach `redactor` (bundle/redact.py) every name the collected files hold in a known structure."""
    import yaml

    redactor.learn("node", node)
    redactor.learn("node", cfg.node_name)
    redactor.learn("cluster", cfg.cluster_name)
    for name, data in files:
        redactor.learn_addresses(data.decode("utf-8", "surrogateescape"))
        if name == AUDIT_NAME:
            for line in data.splitlines():
                record = _loads(line)
                if isinstance(record, dict):
                    redactor.learn_record(record)
        elif name.startswith("state/cni/"):
            for found in _walk_dicts(_loads(data)):
                if "namespace" in found and "name" in found:
                    redactor.learn("namespace", found["namespace"])
                    redactor.learn("pod", found["name"])
        elif name in ("state/applied.yaml", "state/applied.intent.yaml"):
            try:
                docs = list(yaml.safe_load_all(data))
            except yaml.YAMLError:
                continue
            for doc in docs:
                _learn_manifest(redactor, doc)


def _learn_manifest(redactor: Any, doc: Any) -> None:
    if not isinstance(doc, dict):
        return
    for item in doc.get("items") or []:
        _learn_manifest(redactor, item)
    kind = str(doc.get("kind", ""))
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    redactor.learn("namespace", meta.get("namespace"))
    if kind == "Pod":
        redactor.learn("pod", meta.get("name"))
    elif kind == "Namespace":
        redactor.learn("namespace", meta.get("name"))
    elif kind.endswith("NetworkPolicy"):
        redactor.learn("policy", meta.get("name"))
    for found in _walk_dicts(doc):
        for key in ("labels", "matchLabels"):
            labels = found.get(key)
            if isinstance(labels, dict):
                for value in labels.values():
                    redactor.learn("label", value)
        for expression in found.get("matchExpressions") or []:  # values named only in a selector too
            if isinstance(expression, dict) and isinstance(expression.get("values"), list):
                for value in expression["values"]:
                    redactor.learn("label", value)
    spec = s if isinstance(s := doc.get("spec"), dict) else {}
    for direction in ("ingress", "egress"):
        for rule in spec.get(direction) or []:
            if isinstance(rule, dict):
                redactor.learn("rule", rule.get("name"))


def _walk_dicts(value: Any) -> Iterable[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _walk_dicts(child)
    elif isinstance(value, list):
        for child in value:
            yield from _walk_dicts(child)


def _loads(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def cut(data: bytes, limit: int, keep: str) -> bytes:
    """At most `limit` bytes of `data`, whole lines, from its `keep` end."""
    if len(data) <= limit:
        return data
    if keep == TAIL:
        part = data[len(data) - limit:]
        newline = part.find(b"\n")
        return part[newline + 1:] if newline >= 0 else b""
    part = data[:limit]
    newline = part.rfind(b"\n")
    return part[:newline + 1] if newline >= 0 else b""


@dataclass(frozen=True)
class Collected:
    item: Item
    fetched: Fetched | None
    error: str = ""


def assemble(plan_: Plan, collected: list[Collected], cfg: AgentConfig, options: BundleOptions,
             redactor: Any = None) -> tuple[list[tuple[str, bytes]], bytes]:
    """The bundle's files (manifest.json last) from what was collected."""
    files: list[tuple[str, bytes, Item, dict[str, Any]]] = []
    skipped = [{"name": n, "reason": r} for n, r in plan_.skipped]
    for got in collected:
        if got.fetched is None:
            skipped.append({"name": got.item.name, "reason": got.error})
            continue
        files += [(name, data, got.item, got.fetched.notes) for name, data in got.fetched.files]
    if redactor is not None:
        learn_names(redactor, cfg, plan_.node, [(name, data) for name, data, _, _ in files])
        files = [(redactor.data(name.encode()).decode(), redactor.file(name, data), item, notes)
                 for name, data, item, notes in files]
    left = options.max_bytes
    entries = []
    out = []
    for name, data, item, notes in files:
        entry: dict[str, Any] = {"name": name}
        if left <= 0:
            skipped.append({"name": name, "reason": f"size cap: --max-size {options.max_bytes} bytes used up"})
            continue
        kept = cut(data, left, item.keep)
        if data and not kept:  # not even one whole line fits
            skipped.append({"name": name, "reason": f"size cap: --max-size {options.max_bytes} bytes used up"})
            continue
        if name == AUDIT_NAME:
            entry["records"] = kept.count(b"\n")
        if len(kept) < len(data):
            entry["truncated"] = {"original_bytes": len(data), "kept": f"whole lines from the {item.keep}",
                                  "reason": "size cap"}
        left -= len(kept)
        entry.update(size=len(kept), sha256=hashlib.sha256(kept).hexdigest(), **notes)
        entries.append(entry)
        out.append((name, kept))
    manifest = {
        "format": 1,
        "created": options.now.astimezone(dt.timezone.utc).isoformat(),
        "agent_running": _agent_running(collected),
        "files": entries,
        "skipped": skipped,
        "size_cap": {"max_bytes": options.max_bytes, "content_bytes": options.max_bytes - left,
                     "rule": "items in order, audit records last; a cut keeps whole lines from the newest "
                             "end of logs and audit records, the start of anything else"},
        "audit_logs": {"included": any(e["name"] == AUDIT_NAME for e in entries),
                       "since": options.since.isoformat() if options.since else None,
                       "rule": "only with --include-audit and bundle.allow_audit_logs: true"},
        "redaction": {"enabled": False} if redactor is None else {
            "enabled": True, **redactor.summary(),
            "note": "pseudonyms are keyed per bundle (key not included); redacted audit records "
                    "no longer verify with npaudit verify"},
    }
    if redactor is not None:  # reasons quote paths and addresses; the rest of the manifest is ours
        manifest["skipped"] = [{"name": redactor.text(e["name"]), "reason": redactor.text(e["reason"])}
                               for e in skipped]
    return out, _json(manifest)


def _agent_running(collected: list[Collected]) -> bool:
    """Whether the agent's API answered (any reply, even to an op it does not know)."""
    return any(isinstance(c.item.source, ApiCall) and c.fetched is not None for c in collected)
