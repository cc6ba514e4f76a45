"""The applied store reads back exactly what it wrote, with the parser that validated it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy_agent.policy import documents, manifests
from policy_agent.sources import applied_store
from policy_agent.sources.applied_store import AppliedStore

ANTREA = "crd.antrea.io/v1beta1"

# Valid Unicode that is hard on writers: quotes, line breaks YAML knows (NEL, U+2028/9),
# a BOM, controls, YAML indicators and emoji as one code point.
HOSTILE = st.lists(st.one_of(
    st.characters(blacklist_categories=("Cs",)),
    st.sampled_from(list("'\"\\\n\r\t\x00\x85\u2028\u2029\ufeff #&*!|>%@`:-?,[]{}")
                    + ["\U0001F525", "\n---\n", "...", " \u2028 ", "\r\n "]),
), max_size=12).map("".join)
DNS = st.from_regex(r"[a-z]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
LABEL = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,6}[A-Za-z0-9])?", fullmatch=True)


@st.composite
def manifest_docs(draw: st.DrawFn) -> list[dict[str, Any]]:
    ns_name = draw(DNS)
    meta: dict[str, Any] = {"name": ns_name,
                            "labels": draw(st.dictionaries(LABEL, LABEL, max_size=3)),
                            "annotations": draw(st.dictionaries(LABEL, HOSTILE, max_size=3))}
    meta.update(draw(st.dictionaries(HOSTILE.filter(lambda k: k not in ("name", "namespace", "labels",
                                                                        "annotations")), HOSTILE, max_size=2)))
    names = draw(st.lists(HOSTILE, min_size=1, max_size=4, unique=True))
    policy = {"apiVersion": ANTREA, "kind": "ClusterNetworkPolicy", "metadata": {"name": draw(DNS)},
              "spec": {"priority": 5, "appliedTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/"
                                                                                          "metadata.name": ns_name}}}],
                       "ingress": [{"name": n, "action": "Drop", "ports": [{"port": 9}]} for n in names]}}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": meta}, policy]


def json_list(*docs: dict[str, Any], ensure_ascii: bool = True) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}, ensure_ascii=ensure_ascii)


def as_text(docs: list[dict[str, Any]], style: str) -> str:
    if style == "json-ascii":
        return json_list(*docs)  # emoji as \ud83d\udd25 escapes
    if style == "json-raw":
        return json_list(*docs, ensure_ascii=False)  # raw U+2028 and friends
    return yaml.safe_dump_all(docs, allow_unicode=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=manifest_docs(), style=st.sampled_from(["json-ascii", "json-raw", "yaml"]))
def test_what_the_store_writes_reads_back_as_the_same_set(tmp_path: Path, docs: list[dict[str, Any]],
                                                          style: str) -> None:
    text = as_text(docs, style)
    applied = manifests.read_text(text, "in")
    path = tmp_path / f"applied-{style}.yaml"
    path.unlink(missing_ok=True)
    AppliedStore(path).record("apply", text)
    reloaded = AppliedStore(path)
    assert reloaded.objects() == applied.objects
    assert manifests.load_text(reloaded.text(), str(path)) == applied.objects
    assert list(manifests.read_text(path.read_text(encoding="utf-8"), str(path)).documents) == list(applied.documents)


def namespace_with(annotation: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "annotations": {"a": annotation}}}


DROP_81 = ({"apiVersion": ANTREA, "kind": "ClusterNetworkPolicy", "metadata": {"name": "drop-81"},
                      "spec": {"priority": 1, "appliedTo": [{"podSelector": {}}],
                               "ingress": [{"action": "Drop", "ports": [{"port": 81}]}]}})


def test_an_apply_with_a_lone_surrogate_annotation_is_rejected_whole_at_validation() -> None:
    # Reported: validation accepted this set, the store's writer raised, yet port 81 stayed blocked.
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(json_list(DROP_81, namespace_with("\ud800")), "set.json")
    assert err.value.errors == ["Namespace/x (set.json#1.items[1]): metadata.annotations.a: invalid Unicode: "
                                "lone surrogate U+D800 at character 1"]


@pytest.mark.parametrize("bad", [json.dumps(namespace_with("\ud800")),
                                 'apiVersion: v1\nkind: Namespace\nmetadata: {name: y, annotations: {a: "\\udfff"}}',
                                 json_list(DROP_81, namespace_with("\ud83d"))])
def test_a_value_the_validator_rejects_never_reaches_the_store(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "applied.yaml"
    store = AppliedStore(path)
    store.record("apply", json.dumps(namespace_with("kept")))
    before = path.read_bytes()
    with pytest.raises(manifests.ManifestError):
        store.record("apply", bad)
    assert path.read_bytes() == before
    assert [dict(n.annotations) for n in AppliedStore(path).objects().namespaces] == [{"a": "kept"}]
    assert len(store) == 1
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_a_line_separator_applied_as_json_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "applied.yaml"
    AppliedStore(path).record("apply", json.dumps(namespace_with("x\u2028 y\U0001F525"), ensure_ascii=False))
    assert dict(AppliedStore(path).objects().namespaces[0].annotations) == {"a": "x\u2028 y\U0001F525"}


def test_delete_removes_what_apply_stored_across_api_groups(tmp_path: Path) -> None:
    path = tmp_path / "applied.yaml"
    store = AppliedStore(path)
    store.record("apply", json_list(DROP_81, namespace_with("a")))
    store.record("delete", json.dumps({**DROP_81, "apiVersion": "crd.antrea.io/v1alpha1"}))
    reloaded = AppliedStore(path).objects()
    assert (reloaded.policies, [n.name for n in reloaded.namespaces]) == ((), ["x"])


def test_a_store_file_that_does_not_parse_stops_start_up_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "applied.yaml"
    path.write_text("a: [\n")
    with pytest.raises(manifests.ManifestError) as err:
        AppliedStore(path)
    assert len(err.value.errors) == 1 and err.value.errors[0].startswith(f"{path}: invalid YAML at line 2")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["apply", "delete"]), manifest_docs()), min_size=1, max_size=6))
def test_a_change_rewrites_the_file_as_a_full_dump_of_the_set(tmp_path: Path,
                                                              steps: list[tuple[str, list[dict[str, Any]]]]) -> None:
    # The store dumps only the documents a change names and keeps the others' YAML:
    # the file must still be byte for byte what dumping the whole set gives.
    path = tmp_path / "applied.yaml"
    path.unlink(missing_ok=True)
    store = AppliedStore(path)
    model: dict[Any, Any] = {}  # what the set holds, in the order a full dump writes it
    for op, docs in steps:
        text = json_list(*docs)
        store.record(op, text)
        for doc in manifests.read_text(text, "in").documents:
            if op == "apply":
                model[applied_store._key(doc)] = doc
            else:
                model.pop(applied_store._key(doc), None)
        expected = documents.dump_yaml(model.values())
        assert store.text() == expected
        assert path.read_text(encoding="utf-8") == f"# npaudit applied store, generation {store.generation}\n" + expected
        assert AppliedStore(path).text() == expected and AppliedStore(path).generation == store.generation
