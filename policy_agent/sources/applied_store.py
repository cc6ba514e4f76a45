"""The manifests applied through the local API, kept in the state directory.

A restarted agent applies them again before it re-realises its Pods and only
then deletes the previous run's flows, so a restart never removes enforcement.
The file's first line names its generation (one more per change written), which the
switch's generation marker is compared with after a crash (sources/apply_intent.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
FILE_MODE = 0o640

_HEADER = re.compile(r"# npaudit applied store, generation (\d+)\n")


def generation_of(text: str) -> int:
    """The generation a store file's text names in its first line (0: none, a file of an older agent)."""
    found = _HEADER.match(text)
    return int(found[1]) if found else 0


@dataclass(frozen=True)
class StoreChange:
    """A store content computed and validated, not yet written: `content` is the whole file."""

    generation: int
    content: bytes
    docs: dict[Key, dict[str, Any]]
    dumped: dict[Key, str]


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
        self.generation = 0  # of what the file holds
        self._issued = 0  # the newest generation a change was given (never given twice in a run)
        if path.exists():
            problems: list[str] = []
            text = path.read_text(encoding="utf-8")
            self.generation = self._issued = generation_of(text)
            docs = documents.parse_text(text, str(path), problems)
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
        """Remember an apply or delete that the agent has carried out (change, then written)."""
        change = self.change(op, text, known_tiers)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, change.content, mode=FILE_MODE)
        self.took(change)

    def change(self, op: str, text: str, known_tiers: Iterable[str] = ()) -> StoreChange:
        """The store after an apply or delete, with the next generation; nothing is written. The
        text is validated again here (ManifestError) so nothing the validator rejects is stored;
        `known_tiers` are the Tiers its policies may name beyond its own (as at the apply)."""
        docs, dumped = dict(self._docs), dict(self._yaml)
        for doc in read_text(text, "<record>", known_tiers).documents:
            key = _key(doc)
            dumped.pop(key, None)
            if op == "apply":
                docs[key] = doc
            else:
                docs.pop(key, None)
        self._issued += 1
        content = f"# npaudit applied store, generation {self._issued}\n" + self._text(docs, dumped)
        return StoreChange(self._issued, content.encode("utf-8"), docs, dumped)

    def took(self, change: StoreChange) -> None:
        """The file now holds `change` (written by record, or an intent put in place): memory follows,
        only then, so memory and disk never disagree."""
        self._docs, self._yaml = change.docs, {k: v for k, v in change.dumped.items() if k in change.docs}
        self.generation = change.generation
