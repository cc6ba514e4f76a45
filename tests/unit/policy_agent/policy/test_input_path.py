"""One input path: invalid Unicode, alias bombs, oversized policies and JSON are settled at validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policy_agent.cli import main as cli
from policy_agent.policy import documents, manifests, priorities, validation
from policy_agent.policy.compiler import ClusterState, compile_policies

ANTREA = "crd.antrea.io/v1beta1"


def acnp_yaml(rules: str, name: str = "fire") -> str:
    return (f"apiVersion: {ANTREA}\nkind: ClusterNetworkPolicy\nmetadata: {{name: {name}}}\n"
            f"spec:\n  priority: 1\n  appliedTo: [{{podSelector: {{}}}}]\n  ingress:\n{rules}")


def acnp(name: str, rules: list[dict[str, Any]], tier: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": 1, "appliedTo": [{"podSelector": {}}], "ingress": rules}
    if tier:
        spec["tier"] = tier
    return {"apiVersion": ANTREA, "kind": "ClusterNetworkPolicy", "metadata": {"name": name}, "spec": spec}


def namespace(**meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", **meta}}


def errors_of(text: str, source: str = "in.yaml") -> list[str]:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_text(text, source)
    return err.value.errors


def drop(port: int) -> dict[str, Any]:
    return {"action": "Drop", "ports": [{"port": port}]}


# --- invalid Unicode ----------------------------------------------------------------------------

def test_a_rule_name_escaped_as_a_utf16_surrogate_pair_in_yaml_is_rejected_naming_the_rule() -> None:
    # The reported rule: accepted, stored, then every compile raised UnicodeEncodeError.
    text = acnp_yaml('  - {name: "fire-\\ud83d\\udd25", action: Drop, ports: [{port: 9}]}\n')
    errors = errors_of(text)
    assert len(errors) == 1
    assert errors[0].startswith("ClusterNetworkPolicy/fire (in.yaml#1): spec.ingress[0].name: invalid Unicode")
    assert "\\U0001F525" in errors[0]
    errors[0].encode("utf-8")  # the line itself can be printed and sent


def test_the_same_escape_in_json_is_one_character_and_compiles() -> None:
    text = json.dumps(acnp("fire", [{"name": "fire-\U0001F525", **drop(9)}]))  # ensure_ascii: \ud83d\udd25
    assert "\\ud83d\\udd25" in text
    objs = manifests.load_text(text, "in.json")
    assert objs.policies[0].rules[0].name == "fire-\U0001F525"
    compiled = compile_policies(ClusterState(namespaces={}, endpoints=(), policies=objs.policies))
    assert [r.rule_name for r in compiled.rules.values()] == ["fire-\U0001F525"]


@pytest.mark.parametrize("meta, field", [
    ({"annotations": {"note": "\ud800"}}, "metadata.annotations.note"),
    ({"annotations": {"note": "ok \udfff tail"}}, "metadata.annotations.note"),
    ({"uid": "\ud83d"}, "metadata.uid"),  # an ignored field is still written to the store
    ({"managedFields": [{"x\ud800": 1}]}, "metadata.managedFields[0].x\\ud800"),
])
def test_a_lone_surrogate_anywhere_in_a_document_is_rejected_naming_the_field(meta: dict[str, Any],
                                                                              field: str) -> None:
    text = json.dumps(namespace(**meta))
    errors = errors_of(text, "-")
    assert errors == [errors[0]]
    assert errors[0].startswith(f"Namespace/x (-#1): {field}: ")
    assert "invalid Unicode" in errors[0] and "surrogate" in errors[0]


def test_a_surrogate_in_the_object_name_is_named_printably() -> None:
    errors = errors_of(json.dumps({**namespace(), "metadata": {"name": "x\ud800"}}), "-")
    assert errors[0].startswith("Namespace/x\\ud800 (-#1): metadata.name: invalid Unicode")
    "\n".join(errors).encode("utf-8")


def test_a_surrogate_in_yaml_escapes_is_named_in_any_document_of_a_stream() -> None:
    text = json.dumps(namespace()) + "\n---\n" + \
        'apiVersion: v1\nkind: Namespace\nmetadata: {name: y, annotations: {a: "\\ud800"}}\n'
    assert errors_of(text) == ["Namespace/y (in.yaml#2): metadata.annotations.a: invalid Unicode: "
                               "lone surrogate U+D800 at character 1"]


def test_a_surrogate_in_the_text_itself_is_one_line_with_its_position() -> None:
    errors = errors_of("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, annotations: {a: \ud800}}\n")
    assert errors == ["in.yaml: invalid Unicode at line 3, column 38: lone surrogate U+D800 in the text (not UTF-8)"]


def test_a_surrogate_in_a_kubernetes_object_is_rejected_by_the_same_check() -> None:
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_documents([namespace(annotations={"a": "\udc00"})], "k8s:namespaces")
    assert err.value.errors[0].startswith("Namespace/x (k8s:namespaces#1): metadata.annotations.a: invalid Unicode")


# --- aliases ------------------------------------------------------------------------------------

def test_a_flat_alias_bomb_of_sixty_thousand_rules_is_rejected_naming_the_field() -> None:
    # The reported file: one rule written once, referenced 60,000 times (~240 kB).
    text = acnp_yaml("    [" + ",".join(["&r {action: Drop, ports: [{port: 9}]}"] + ["*r"] * 60_000) + "]\n")
    assert len(text) < 250_000
    errors = errors_of(text)
    assert len(errors) == 1
    assert errors[0].startswith("ClusterNetworkPolicy/fire (in.yaml#1): spec.ingress: YAML aliases expand")
    assert f"at most {documents.MAX_ALIAS_NODES:,}" in errors[0]


@pytest.mark.parametrize("bomb", [
    # billion laughs: 10^9 leaves from 100 aliases
    "l0: &l0 [a,a,a,a,a,a,a,a,a,a]\n" + "".join(
        f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]\n" for i in range(1, 10)),
    # the same through merge keys, which PyYAML expands while it builds the mapping
    "m0: &m0 {a: 1}\n" + "".join(f"m{i}: &m{i} {{<<: [" + ",".join([f"*m{i - 1}"] * 10) + "]}\n"
                                 for i in range(1, 10)),
])
def test_exponential_alias_bombs_are_rejected_before_they_are_built(bomb: str) -> None:
    errors = errors_of("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\nstatus:\n" +
                       "".join(f"  {line}\n" for line in bomb.splitlines()))
    assert len(errors) == 1
    assert errors[0].startswith("Namespace/x (in.yaml#1): status: YAML aliases expand the document to ")


def test_a_recursive_alias_is_rejected() -> None:
    errors = errors_of("apiVersion: v1\nkind: Namespace\nmetadata: &m {name: x, labels: {a: *m}}\n")
    assert errors == ["Namespace/x (in.yaml#1): a YAML alias refers to a node that contains it (a recursive structure)"]


def test_anchors_shared_across_many_rules_stay_accepted() -> None:
    rules = "".join(f"  - {{name: r{i}, action: Drop, ports: *ports}}\n" for i in range(2000))
    text = acnp_yaml(rules).replace("  ingress:\n", "  ingress:\n  - {name: first, action: Drop, "
                                                  "ports: &ports [{port: 80}, {port: 81}, {port: 82}]}\n")
    assert len(manifests.load_text(text, "in.yaml").policies[0].rules) == 2001


# --- size ---------------------------------------------------------------------------------------

def test_a_policy_over_the_rule_cap_is_rejected_without_reading_its_rules() -> None:
    n = validation.MAX_RULES_PER_POLICY + 1
    errors = errors_of(json.dumps(acnp("big", [drop(9)] * n)), "in.json")
    assert errors == [f"ClusterNetworkPolicy/big (in.json#1): spec.ingress: {n:,} rules ({n:,} ingress); "
                      f"a policy may have at most {validation.MAX_RULES_PER_POLICY:,}"]


def test_the_table_capacity_is_what_the_priority_allocator_can_spread() -> None:
    fits = [str(i) for i in range(validation.RULES_PER_TABLE)]
    assert len(set(priorities.spread(fits).values())) == len(fits)
    with pytest.raises(ValueError):
        priorities.spread(fits + ["one more"])


def test_a_set_that_overfills_a_priority_table_is_rejected_naming_the_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(validation, "RULES_PER_TABLE", 5)
    docs = [acnp("a", [drop(p) for p in range(1, 4)]), acnp("b", [drop(p) for p in range(1, 4)]),
            acnp("base", [drop(p) for p in range(1, 4)], tier="baseline")]
    text = "\n".join(json.dumps(d) for d in docs)
    assert errors_of(text, "-") == ["ClusterNetworkPolicy/b (-#2): spec.ingress: brings the Antrea ingress rules "
                                    "to 6; one table orders at most 5 rules"]
    # Rules in separate tables (baseline tier, egress, Kubernetes) do not add up.
    manifests.load_text("\n".join(json.dumps(d) for d in docs[::2]), "-")


def test_a_manifest_file_over_the_size_cap_is_rejected_in_one_line(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_MANIFEST_BYTES", 100)
    (tmp_path / "big.yaml").write_text(json.dumps(namespace(annotations={"a": "x" * 250})))
    with pytest.raises(manifests.ManifestError) as err:
        manifests.load_path(tmp_path)
    assert err.value.errors == ["big.yaml: 344 bytes; one manifest input may have at most 100"]


# --- JSON as JSON -------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["in.json", "-", "dir", "dir-crlf"])
def test_a_raw_line_separator_in_a_json_string_keeps_the_following_space(source: str) -> None:
    # YAML 1.1 reads U+2028 as a line break and folds the space after it away.
    text = json.dumps(namespace(annotations={"a": "x\u2028 y"}), ensure_ascii=False)
    if source.startswith("dir"):  # how `npaudit apply -f DIR` joins a directory's files
        text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: w}\n\n---\n" + text
        if source == "dir-crlf":
            text = text.replace("\n", "\r\n")
    objs = manifests.load_text(text, source)
    assert dict(objs.namespaces[-1].annotations) == {"a": "x\u2028 y"}


def test_json_documents_may_follow_each_other_and_yaml_flow_style_is_still_yaml() -> None:
    text = json.dumps(namespace()) + "\n" + json.dumps({**namespace(), "metadata": {"name": "y"}})
    assert [n.name for n in manifests.load_text(text, "-").namespaces] == ["x", "y"]
    assert manifests.load_text("{apiVersion: v1, kind: Namespace, metadata: {name: z}}", "-").namespaces[0].name == "z"


def test_invalid_json_in_a_json_file_names_line_and_column() -> None:
    assert errors_of('{"apiVersion": "v1",\n "kind": }', "in.json") == [
        "in.json: invalid JSON at line 2, column 10: Expecting value"]


def test_yaml_errors_in_a_mixed_stream_name_the_line_of_the_whole_text() -> None:
    text = json.dumps(namespace()) + "\n---\napiVersion: v1\nkind: [\n"
    assert errors_of(text)[0].startswith("in.yaml: invalid YAML at line 5")


# --- npaudit apply's reading --------------------------------------------------------------------

def run_apply(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[str]]:
    rc = cli.main(["apply", "-f", str(path)])
    return rc, capsys.readouterr().err.splitlines()


def test_apply_of_a_file_that_is_not_utf8_prints_one_line(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"apiVersion: v1\nkind: Namespace\nmetadata: {name: caf\xe9}\n")  # \xe9 at byte 51
    rc, err = run_apply(capsys, bad)
    assert rc == 1
    assert err == [f"error: {bad}: not UTF-8 at line 3 (byte 51): b'\\xe9' invalid continuation byte"]


def test_apply_of_an_oversized_input_prints_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(documents, "MAX_MANIFEST_BYTES", 1000)
    (tmp_path / "a.yaml").write_text("#" * 600)
    (tmp_path / "b.json").write_text(" " * 600)
    rc, err = run_apply(capsys, tmp_path)
    assert rc == 1
    assert err == [f"error: {tmp_path}: 1,200 bytes; one manifest input may have at most 1,000"]
