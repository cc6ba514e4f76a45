"""What is kept of a Pod object: everything policy reads, nothing else; no address for a Pod whose
address is not a Pod address (host network) or no longer its own (ended)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from policy_agent.policy.manifests import ManifestError, load_documents
from policy_agent.sources.kubernetes_pods import pod_fields
from tests.support.fake_apiserver import DATA
from tests.support.k8s_objects import pod


def _recorded() -> list[dict[str, Any]]:
    body = json.loads((DATA / "pods.json").read_text())
    return [{"apiVersion": "v1", "kind": "Pod", **i} for i in body["items"]]


@pytest.mark.parametrize("doc", _recorded(), ids=lambda d: d["metadata"]["name"])
def test_the_kept_fields_load_as_the_whole_object_does(doc: dict[str, Any]) -> None:
    assert load_documents([pod_fields(doc)], source="t").pods == load_documents([doc], source="t").pods
    kept = json.dumps(pod_fields(doc))
    assert "uid" not in kept and "image" not in kept and "creationTimestamp" not in kept


def test_managed_fields_and_the_rest_of_the_spec_are_dropped() -> None:
    doc = pod("x", "a", "node-b", "10.244.1.5", {"app": "web"})
    assert pod_fields(doc) == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "a", "namespace": "x", "resourceVersion": "7", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-b", "containers": [{"ports": [{"name": "http", "containerPort": 80}]}]},
        "status": {"podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}]}}


@pytest.mark.parametrize("change", [{"spec": {"hostNetwork": True}}, {"status": {"phase": "Succeeded"}},
                                    {"status": {"phase": "Failed"}}])
def test_a_host_network_or_ended_pod_holds_no_pod_address(change: dict[str, Any]) -> None:
    doc = pod("x", "a", "node-b", "10.244.1.5")
    for part, fields in change.items():
        doc[part].update(fields)
    (loaded,) = load_documents([pod_fields(doc)], source="t").pods
    assert loaded.ips == () and loaded.node == "node-b"


def test_a_malformed_pod_stays_malformed_so_the_loader_says_why() -> None:
    doc = pod("x", "a", "node-b")
    for broken in ({"spec": "junk"}, {"metadata": 7}, {"status": ["x"]}, {"spec": {"containers": "junk"}}):
        bad = {**copy.deepcopy(doc), **broken}
        with pytest.raises(ManifestError):
            load_documents([pod_fields(bad)], source="t")


def test_a_deletion_begun_is_kept_and_loads_as_a_pod_being_deleted() -> None:
    doc = pod("x", "a", "node-b", "10.244.1.5", {"app": "web"})
    doc["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", deletionGracePeriodSeconds=30)
    kept = pod_fields(doc)
    assert kept["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:00Z"
    assert "deletionGracePeriodSeconds" not in kept["metadata"]
    loaded, = load_documents([kept], source="t").pods
    assert loaded.terminating and loaded.ips == ("10.244.1.5",)
    assert not load_documents([pod("x", "a", "node-b", "10.244.1.5")], source="t").pods[0].terminating

