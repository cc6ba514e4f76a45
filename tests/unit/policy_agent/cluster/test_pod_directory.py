"""The cluster Pod directory: remote Pods named by their address, unknown addresses named by no one,
a reused address never named after the Pod that held it before."""

from __future__ import annotations

import asyncio
import threading

import pytest

from policy_agent.engine import PolicyEngine
from policy_agent.cluster.pod_directory import RemoteDirectory, pod_directory, with_remote
from policy_agent.policy.manifests import ManifestError, load_text
from policy_agent.policy.model import Namespace, Pod
from policy_agent.policy.rules import RuleRegistry
from policy_agent.policy.selection import Endpoint
from tests.support.engine_doubles import Info, RecordingChannel


def _pods(text: str) -> list[Pod]:
    return list(load_text(text, "test").pods)


REMOTE = """
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: y, labels: {app: client}}
spec: {nodeName: node-b, containers: [{name: c, image: i}]}
status: {podIP: 10.245.0.7, podIPs: [{ip: 10.245.0.7}, {ip: "fd00::7"}]}
"""


def test_a_pod_object_carries_its_addresses_and_node() -> None:
    pod, = _pods(REMOTE % "client-1")
    assert (pod.key, pod.ips, pod.node) == (("y", "client-1"), ("10.245.0.7",), "node-b")
    only_ip, = _pods("apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: y}\nstatus: {podIP: 10.245.0.8}\n")
    assert only_ip.ips == ("10.245.0.8",) and only_ip.node == ""
    with pytest.raises(ManifestError, match=r"status.podIP: must be an IP address"):
        _pods("apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: y}\nstatus: {podIP: 10.245.0.999}\n")


def test_the_directory_names_remote_pods_and_no_one_for_an_unknown_address() -> None:
    local = Endpoint(Pod("x", "server"), "10.246.0.2", "02:00:0a:f6:00:02", 100)
    remote = Pod("y", "client-1", ips=("10.245.0.7",), node="node-b")
    d = pod_directory([local], [Pod("x", "server", ips=("10.246.0.2",)), remote])
    assert d == {"10.246.0.2": ("x", "server"), "10.245.0.7": ("y", "client-1")}
    assert d.get("10.245.0.8") is None


def test_an_address_two_pods_claim_is_unknown_and_a_local_interface_wins() -> None:
    old, new = Pod("y", "old", ips=("10.245.0.7",)), Pod("z", "new", ips=("10.245.0.7",))
    assert "10.245.0.7" not in pod_directory([], [old, new])
    local = Endpoint(Pod("x", "here"), "10.245.0.7", "02:00:0a:f5:00:07", 100)
    assert pod_directory([local], [old])["10.245.0.7"] == ("x", "here")


def test_an_address_only_a_pod_being_deleted_claims_is_unknown_yet_rules_still_match_it() -> None:
    """Kubernetes gives a deleted Pod's address back (CNI DEL on its node) before its object goes, and a
    new Pod may start there with it before its own status.podIP is known: the address is named by no one
    from the moment the deletion begins (its deletionTimestamp), not with the old name."""
    deleting, = _pods(REMOTE.replace("labels:", "deletionTimestamp: '2026-01-01T00:00:00Z', labels:") % "old")
    assert deleting.terminating and not _pods(REMOTE % "running")[0].terminating
    assert "10.245.0.7" not in pod_directory([], [deleting])
    # Rules match it by that address until its object goes (only the name is withheld).
    assert [(ep.pod.key, ep.ip) for ep in with_remote([], [deleting])] == [(("y", "old"), "10.245.0.7")]
    # On its own node its interface says who holds the address, as for any Pod.
    local = Endpoint(Pod("y", "old"), "10.245.0.7", "02:00:0a:f5:00:07", 100)
    assert pod_directory([local], [deleting])["10.245.0.7"] == ("y", "old")
    # The new Pod's address known too: two claims, unknown; the deletion final: the new Pod's alone.
    new = Pod("z", "new", ips=("10.245.0.7",), node="node-b")
    assert "10.245.0.7" not in pod_directory([], [deleting, new])
    assert pod_directory([], [new])["10.245.0.7"] == ("z", "new")


def test_a_deletion_begun_renames_the_address_incrementally_as_from_scratch() -> None:
    running, = _pods(REMOTE % "old")
    deleting, = _pods(REMOTE.replace("labels:", "deletionTimestamp: '2026-01-01T00:00:00Z', labels:") % "old")
    before = RemoteDirectory.build({}, {running.key: running})
    assert before.by_ip == {"10.245.0.7": ("y", "old")}
    after = before.update({}, {deleting.key: deleting}, [deleting.key])
    assert after.by_ip == RemoteDirectory.build({}, {deleting.key: deleting}).by_ip == {}
    assert [ep.pod.key for ep in after.with_remote()] == [("y", "old")]


def test_a_reused_address_never_carries_the_old_pods_name() -> None:
    """The engine's by_ip across delete + apply, read from another thread all along (as records are
    written on the writer's thread): only the old name, unknown, or the new name, in that order."""
    eng = PolicyEngine(RecordingChannel(), RuleRegistry(), round_=1, meters=lambda: True)
    seen: list[object] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.append(eng.by_ip("10.245.0.7"))

    async def main() -> None:
        old, = _pods(REMOTE % "client-1")
        await eng.apply(namespaces=[Namespace("y")], pods=[old])
        assert eng.by_ip("10.245.0.7") == ("y", "client-1") and eng.by_ip("10.245.0.9") is None
        t = threading.Thread(target=reader)
        t.start()
        try:
            for _ in range(20):
                await eng.delete(pods=[old])
                assert eng.by_ip("10.245.0.7") is None
                new, = _pods(REMOTE % "client-2")
                await eng.apply(pods=[new])
                assert eng.by_ip("10.245.0.7") == ("y", "client-2")
                await eng.delete(pods=[new])
                await eng.apply(pods=[old])
        finally:
            stop.set()
            t.join()
        # A Pod started here with that address wins over a stale remote object.
        await eng.pod_added(Info("x", "here", "10.245.0.7", "02:00:0a:f5:00:07", 7))
        assert eng.by_ip("10.245.0.7") == ("x", "here")

    asyncio.run(main())
    assert set(seen) <= {("y", "client-1"), ("y", "client-2"), None}
