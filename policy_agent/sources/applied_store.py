"""The manifests applied through the local API, kept in the state directory.

A restarted agent applies them again before it re-realises its Pods and only
then deletes the previous run's flows, so a restart never removes enforcement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from auditlog.atomic_file import write_atomically
from policy_agent.policy import documents
from policy_agent.policy.kinds import ANTREA_GROUP_NAMES, CLUSTER_SCOPED
from policy_agent.policy.manifests import ManifestError, ObjectSet, load_documents, read_text


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    kind = str(doc.get("kind", ""))
    meta = doc.get("metadata") or {}
    namespace = "" if kind in CLUSTER_SCOPED else str(meta.get("namespace") or "default")
    # The legacy Antrea groups name the same objects as crd.antrea.io.
    if group in ANTREA_GROUP_NAMES:
        group = "antrea"
    return (group, kind, namespace, str(meta.get("name", "")))


Key = tuple[str, str, str, str]


class AppliedStore:
    """One YAML file of documents, written by documents.dump_yaml and read back by
    documents.parse_text: the parser that validated them when they were applied.

    Each document's YAML is kept from when it was written, so a change dumps only the
    documents it names (dumping every policy again took ~50 ms at 1,000 rules); the
    file is still rewritten whole, atomically, as the same bytes a full dump gives."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._docs: dict[Key, dict[str, Any]] = {}
        self._yaml: dict[Key, str] = {}  # each document's dump_yaml, filled as needed
        if path.exists():
            problems: list[str] = []
            docs = documents.parse_text(path.read_text(encoding="utf-8"), str(path), problems)
            if problems:
                raise ManifestError(problems)
            for doc in docs:
                if doc is None:
                    continue
                items = (doc.get("items") or []) if doc.get("kind") == "List" else [doc]
                for item in items:
                    self._docs[_key(item)] = item

    def text(self) -> str:
        return self._text(self._docs, self._yaml)

    @staticmethod
    def _text(docs: dict[Key, dict[str, Any]], dumped: dict[Key, str]) -> str:
        """documents.dump_yaml(docs.values()), from each document's own dump (adds missing ones
        to `dumped`): a stream of mappings is those dumps joined by document markers."""
        for key in docs.keys() - dumped.keys():
            dumped[key] = documents.dump_yaml([docs[key]])
        return "---\n".join(dumped[key] for key in docs)

    def objects(self) -> ObjectSet:
        """What the store holds, validated as one set."""
        return load_documents(self._docs.values(), str(self.path))

    def __len__(self) -> int:
        return len(self._docs)

    def record(self, op: str, text: str, known_tiers: Iterable[str] = ()) -> None:
        """Remember an apply or delete that the agent has carried out. The text is validated
        again here (ManifestError, nothing written) so nothing the validator rejects is stored;
        `known_tiers` are the Tiers its policies may name beyond its own (as at the apply)."""
        docs, dumped = dict(self._docs), dict(self._yaml)
        for doc in read_text(text, "<record>", known_tiers).documents:
            key = _key(doc)
            dumped.pop(key, None)
            if op == "apply":
                docs[key] = doc
            else:
                docs.pop(key, None)
        self._write(self._text(docs, dumped))
        # Only once the file holds it: memory and disk never disagree.
        self._docs, self._yaml = docs, {k: v for k, v in dumped.items() if k in docs}

    def _write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, text.encode("utf-8"), mode=0o640)
