"""KubernetesSource against a fake API server on 127.0.0.1: recorded lists, scripted watch streams."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from policy_agent.policy import kinds
from policy_agent.sources.kubernetes import KubernetesConfigError, api_client_from_config
from policy_agent.sources.kubernetes_watch import SHORT_WATCH, backoff_delay
from policy_agent.policy.model import Action, PolicyKind, Tier
from tests.support.fake_apiserver import ACNP, ANP, DATA, NAMESPACES, NETPOL, PODS, RECORDED, TIERS, FakeApiServer, item
from tests.support.fake_apiserver import server  # noqa: F401 (fixture)
from tests.support.kubernetes_rig import FakeEngine, FakeTime, Rig, backoffs, fake_time_source, run, watch_threads
from tests.support.ports import free_port
from tests.support.waiting import eventually as until


ANTREA = (TIERS, ACNP, ANP)



# --- fake API server ----------------------------------------------------------------------

def bump(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = rv
    return out


def acnp(name: str, rv: str, tier: str = "securityops", action: str = "Drop") -> dict[str, Any]:
    return {"apiVersion": "crd.antrea.io/v1beta1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": rv, "generation": 1},
            "spec": {"tier": tier, "priority": 7, "appliedTo": [{"podSelector": {"matchLabels": {"app": "db"}}}],
                     "ingress": [{"name": "in", "action": action, "from": [{"namespaceSelector": {}}]}]}}


ACNP_KEY = PolicyKind.ACNP.value, ""


# --- tests --------------------------------------------------------------------------------

def test_initial_list_applies_everything_and_sets_synced(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            e = r.engine
            assert sorted(e.namespaces) == ["db", "default", "kube-system", "web"]
            assert e.namespaces["web"].logging_enabled
            assert set(e.policies) == {
                (PolicyKind.ACNP.value, "", "allow-dns"), (PolicyKind.ACNP.value, "", "isolate-db"),
                (PolicyKind.ANP.value, "web", "web-allow-http"),
                (PolicyKind.K8S.value, "db", "allow-frontend-to-db"),
                (PolicyKind.K8S.value, "web", "default-deny-egress")}
            # Antrea's own objects for the standard tiers are built into the model, not errors.
            assert e.tiers == {"security-team": Tier("security-team", 90)}
            isolate = e.policies[(PolicyKind.ACNP.value, "", "isolate-db")]
            assert isolate.tier == "security-team" and isolate.rules[0].action is Action.DROP
            assert isolate.rules[0].enable_logging and isolate.rules[0].log_label == "isolate-db"
            assert all(s["invalid"] == 0 and s["errors"] == 0 for s in r.source.stats.values())
            assert r.stat("namespaces", "applied") == 4 and r.source.skipped == set()
            # Each watch starts where its list left off.
            await until(lambda: all(server.watches(p) for p in RECORDED))
            for path, name in RECORDED.items():
                rv = json.loads((DATA / name).read_text())["metadata"]["resourceVersion"]
                assert server.watches(path)[0]["resourceVersion"] == rv
                assert server.watches(path)[0].get("allowWatchBookmarks") == "true"

    run(body())


def test_every_nodes_pods_with_only_the_fields_policy_reads(server: FakeApiServer) -> None:  # noqa: F811
    async def body() -> None:
        async with Rig(server) as r:
            assert sorted(r.engine.pods) == [("db", "postgres-0"), ("kube-system", "coredns-5d78c9869d-9vq4l"),
                                             ("web", "frontend-7d9c6b5f4-m8zrt"), ("web", "frontend-7d9c6b5f4-x2kqp")]
            pod = r.engine.pods[("web", "frontend-7d9c6b5f4-x2kqp")]
            assert pod.ports[0].name == "http" and pod.ports[0].port == 80
            remote = r.engine.pods[("web", "frontend-7d9c6b5f4-m8zrt")]
            assert (remote.node, remote.ips) == ("node-b", ("10.10.1.4",))
            new = bump(item(PODS, "frontend-7d9c6b5f4-x2kqp"), "49001")
            new["metadata"]["name"] = "frontend-7d9c6b5f4-q7wbn"
            elsewhere = bump(new, "49002")
            elsewhere["metadata"]["name"], elsewhere["spec"]["nodeName"] = "frontend-7d9c6b5f4-zz9k1", "node-b"
            elsewhere["status"] = {"phase": "Running", "podIP": "10.10.1.9", "podIPs": [{"ip": "10.10.1.9"}]}
            host = bump(elsewhere, "49003")
            host["metadata"]["name"], host["spec"]["hostNetwork"] = "kube-proxy-x1", True
            host["status"] = {"phase": "Running", "podIP": "192.0.2.20", "podIPs": [{"ip": "192.0.2.20"}]}
            server.send(PODS, "ADDED", elsewhere)
            server.send(PODS, "ADDED", host)
            server.send(PODS, "ADDED", new)
            await until(lambda: ("web", "frontend-7d9c6b5f4-q7wbn") in r.engine.pods)
            assert r.engine.pods[("web", "frontend-7d9c6b5f4-zz9k1")].ips == ("10.10.1.9",)
            # A host-network Pod holds its node's address, never one policy selects by.
            assert r.engine.pods[("web", "kube-proxy-x1")].ips == ()
            ended = bump(elsewhere, "49004")
            ended["status"]["phase"] = "Succeeded"  # its address is free for another Pod
            server.send(PODS, "MODIFIED", ended)
            await until(lambda: r.engine.pods[("web", "frontend-7d9c6b5f4-zz9k1")].ips == ())
            # Cluster-wide: neither the list nor the watch narrows Pods to a node.
            assert {q.get("fieldSelector") for q in server.lists_of(PODS) + server.watches(PODS)} == {None}

    run(body())


def test_watched_added_policy_is_applied(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            server.send(ACNP, "ADDED", acnp("block-scanner", "49010"))
            await until(lambda: (*ACNP_KEY, "block-scanner") in r.engine.policies)
            policy = r.engine.policies[(*ACNP_KEY, "block-scanner")]
            assert policy.tier == "securityops" and policy.rules[0].action is Action.DROP
            assert r.stat("clusternetworkpolicies.crd.antrea.io", "applied") == 3

    run(body())


def test_modified_replaces_and_unchanged_model_is_not_reapplied(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            changed = bump(item(NETPOL, "allow-frontend-to-db"), "49020")
            changed["spec"]["ingress"][0]["ports"] = [{"protocol": "TCP", "port": 5433}]
            server.send(NETPOL, "MODIFIED", changed)
            key = (PolicyKind.K8S.value, "db", "allow-frontend-to-db")
            await until(lambda: r.engine.policies[key].rules[0].ports[0].port == 5433)
            # A status-only update (a Pod's readiness) changes nothing the engine sees: no recompile.
            calls = len(r.engine.calls)
            status_only = bump(item(PODS, "postgres-0"), "49021")
            status_only["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
            relabelled = bump(item(PODS, "frontend-7d9c6b5f4-x2kqp"), "49022")
            relabelled["metadata"]["labels"]["version"] = "v2"
            server.send(PODS, "MODIFIED", status_only)
            server.send(PODS, "MODIFIED", relabelled)  # behind it on the same watch
            frontend = ("web", "frontend-7d9c6b5f4-x2kqp")
            await until(lambda: dict(r.engine.pods[frontend].labels).get("version") == "v2")
            assert r.engine.calls[calls:] == [("apply", [r.engine.pods[frontend]])]

    run(body())


def test_a_burst_of_pod_events_reaches_the_engine_as_one_net_change(server: FakeApiServer) -> None:  # noqa: F811
    def new_pod(name: str, rv: str) -> dict[str, Any]:
        doc = bump(item(PODS, "frontend-7d9c6b5f4-m8zrt"), rv)
        doc["metadata"]["name"] = name
        return doc

    async def body() -> None:
        async with Rig(server) as r:
            gate, engine_apply = asyncio.Event(), r.engine.apply

            async def held_apply(**objects: Any) -> None:  # the engine busy with a change meanwhile
                await gate.wait()
                await engine_apply(**objects)

            r.engine.apply = held_apply  # type: ignore[method-assign]
            calls = len(r.engine.calls)
            server.send(PODS, "ADDED", new_pod("p1", "49101"))
            await until(lambda: r.source._feeds[kinds.PODS.name].queue.empty())  # p1 taken, its apply held
            db, relabelled = bump(item(PODS, "postgres-0"), "49104"), bump(item(PODS, "frontend-7d9c6b5f4-x2kqp"), "49105")
            db["metadata"]["labels"]["app"] = "db2"
            relabelled["metadata"]["labels"]["version"] = "v2"
            server.send(PODS, "ADDED", new_pod("p2", "49102"))
            server.send(PODS, "DELETED", new_pod("p2", "49103"))       # came and went: nothing to do
            server.send(PODS, "DELETED", item(PODS, "postgres-0"))     # gone and back: one apply, no delete
            server.send(PODS, "ADDED", db)
            server.send(PODS, "MODIFIED", relabelled)
            server.send(PODS, "ADDED", new_pod("p3", "49106"))
            await until(lambda: r.source._feeds[kinds.PODS.name].queue.qsize() == 6)
            gate.set()
            await until(lambda: ("web", "p3") in r.engine.pods)
            assert [(op, sorted(o.name for o in objs)) for op, objs in r.engine.calls[calls:]] == [
                ("apply", ["p1"]), ("apply", ["frontend-7d9c6b5f4-x2kqp", "p3", "postgres-0"])]
            assert dict(r.engine.pods[("db", "postgres-0")].labels)["app"] == "db2"
            assert ("web", "p2") not in r.engine.pods

    run(body())


def test_deleted_deletes_the_last_known_object(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            original = item(ANP, "web-allow-http")
            changed = bump(original, "49030")
            changed["spec"]["priority"] = 9
            server.send(ANP, "MODIFIED", changed)
            key = (PolicyKind.ANP.value, "web", "web-allow-http")
            await until(lambda: r.engine.policies[key].priority == 9)
            # The DELETED event may carry any version; what the engine holds is what goes.
            server.send(ANP, "DELETED", bump(original, "49031"))
            await until(lambda: key not in r.engine.policies)
            assert [o.priority for o in r.engine.deleted()] == [9]
            server.send(NAMESPACES, "DELETED", bump(item(NAMESPACES, "db"), "49032"))
            await until(lambda: "db" not in r.engine.namespaces)
            assert r.stat("networkpolicies.crd.antrea.io", "deleted") == 1
            assert r.stat("namespaces", "deleted") == 1

    run(body())


def test_invalid_object_is_counted_and_the_previous_version_stays(server: FakeApiServer,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            key = (*ACNP_KEY, "allow-dns")
            before = r.engine.policies[key]
            bad = bump(item(ACNP, "allow-dns"), "49040")
            bad["spec"]["egress"][0]["action"] = "Deny"
            server.send(ACNP, "MODIFIED", bad)
            server.send(ACNP, "ADDED", acnp("also-bad", "49041", action="Permit"))
            stats = r.source.stats["clusternetworkpolicies.crd.antrea.io"]
            await until(lambda: stats["invalid"] == 2)
            assert r.engine.policies[key] == before
            assert (*ACNP_KEY, "also-bad") not in r.engine.policies
            # A later valid version goes in as usual.
            fixed = bump(bad, "49042")
            fixed["spec"]["egress"][0]["action"] = "Pass"
            server.send(ACNP, "MODIFIED", fixed)
            await until(lambda: r.engine.policies[key].rules[0].action is Action.PASS)

    with caplog.at_level(logging.ERROR, logger="policy_agent.sources.kubernetes"):
        run(body())
    lines = [rec.getMessage() for rec in caplog.records]
    assert any("ClusterNetworkPolicy/allow-dns (k8s:clusternetworkpolicies.crd.antrea.io#1): "
               "spec.egress[0].action: must be one of Allow, Drop, Reject, Pass; got 'Deny'" in m
               and "previous version stays in force" in m for m in lines)
    assert any("also-bad" in m and "not applied" in m for m in lines)


def test_expired_resource_version_relists_and_reconciles(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            kept = item(NETPOL, "default-deny-egress")
            changed = bump(item(NETPOL, "allow-frontend-to-db"), "49050")
            changed["spec"]["podSelector"] = {"matchLabels": {"app": "postgres"}}
            added = bump(kept, "49051")
            added["metadata"]["name"] = "deny-all"
            server.set_items(NETPOL, [kept, changed, added], "49060")
            server.expire(NETPOL)
            stats = r.source.stats["networkpolicies.networking.k8s.io"]
            await until(lambda: stats["relists"] == 1)
            keys = {k for k in r.engine.policies if k[0] == PolicyKind.K8S.value}
            assert keys == {(PolicyKind.K8S.value, "web", "default-deny-egress"),
                            (PolicyKind.K8S.value, "db", "allow-frontend-to-db"),
                            (PolicyKind.K8S.value, "web", "deny-all")}
            selector = r.engine.policies[(PolicyKind.K8S.value, "db", "allow-frontend-to-db")].applied_to[0]
            assert dict(selector.pod_selector.match_labels) == {"app": "postgres"}
            # Then a relist that lost an object deletes it.
            server.set_items(NETPOL, [kept, changed], "49070")
            server.expire(NETPOL)
            await until(lambda: stats["relists"] == 2)
            assert (PolicyKind.K8S.value, "web", "deny-all") not in r.engine.policies
            assert (PolicyKind.K8S.value, "web", "default-deny-egress") in r.engine.policies
            await until(lambda: server.watches(NETPOL)[-1]["resourceVersion"] == "49070")
            assert stats["errors"] == 0

    run(body())


def test_dropped_watch_is_resumed_from_the_last_resource_version(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            server.send(ACNP, "ADDED", acnp("first", "49080"))
            server.drop(ACNP)
            server.send(ACNP, "ADDED", acnp("second", "49081"))
            await until(lambda: (*ACNP_KEY, "second") in r.engine.policies)
            assert (*ACNP_KEY, "first") in r.engine.policies
            assert [w["resourceVersion"] for w in server.watches(ACNP)] == ["48221", "49080"]
            assert r.source.stats["clusternetworkpolicies.crd.antrea.io"]["errors"] == 1
            # One backoff before the watch was resumed; no other resource waited.
            assert dict(r.time.waits) == {"clusternetworkpolicies.crd.antrea.io": backoffs(1)}

    run(body())


def test_watch_ending_at_once_without_events_is_a_failure_but_a_quiet_timeout_is_not(
        server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            stats = r.source.stats["networkpolicies.networking.k8s.io"]
            await until(lambda: len(server.watches(NETPOL)) == 1)
            # The server-side timeout is drawn per watch from rand(): 300 s + JITTER * 300 s.
            assert server.watches(NETPOL)[0]["timeoutSeconds"] == "450"
            server.end(NETPOL)  # no time has passed on the source's clock
            await until(lambda: len(server.watches(NETPOL)) == 2 and stats["errors"] == 1)
            assert r.time.waits["networkpolicies.networking.k8s.io"] == backoffs(1)
            r.time.advance(SHORT_WATCH)
            server.end(NETPOL)  # a watch that ran its course quietly: resumed at once
            await until(lambda: len(server.watches(NETPOL)) == 3)
            assert stats["errors"] == 1
            assert r.time.waits["networkpolicies.networking.k8s.io"] == backoffs(1)
            rv = json.loads((DATA / RECORDED[NETPOL]).read_text())["metadata"]["resourceVersion"]
            assert [w["resourceVersion"] for w in server.watches(NETPOL)] == [rv, rv, rv]
            assert len(server.lists_of(NETPOL)) == 1  # resumed, never relisted

    run(body())


def test_failing_list_is_retried_until_it_answers(server: FakeApiServer) -> None:
    server.fail_lists[NAMESPACES] = 2

    async def body() -> None:
        async with Rig(server, resync_backoff_max=0.3) as r:
            assert len(r.engine.namespaces) == 4
            assert len(server.lists_of(NAMESPACES)) == 3
            assert r.stat("namespaces", "errors") == 2
            # Two growing waits between the three lists, the second at the cap.
            assert r.time.waits["namespaces"] == backoffs(2, cap=0.3) == pytest.approx([0.15, 0.225])

    run(body())


def test_unreachable_server_is_retried_and_close_still_prompt() -> None:
    port = free_port()  # a port nobody listens on

    async def body() -> None:
        cfg = client.Configuration(host=f"http://127.0.0.1:{port}")
        cfg.proxy = None
        api = client.ApiClient(cfg)
        fake = FakeTime()
        before = watch_threads()
        source = fake_time_source(api, FakeEngine(), fake)
        source.start()
        try:
            await until(lambda: all(s["errors"] >= 3 for s in source.stats.values()))
            await until(lambda: all(len(fake.waits[name]) >= 3 for name in source.stats))
            assert not source.synced.is_set()
            # Every resource retried after exponentially growing, jittered waits.
            for name in source.stats:
                assert fake.waits[name][:3] == backoffs(3) == pytest.approx([0.15, 0.3, 0.6])
            threads = watch_threads() - before
            assert len(threads) == len(source.stats)
        finally:
            await source.close()
        # close interrupted the waits itself instead of giving up at its timeout.
        assert not [t.name for t in threads if t.is_alive()]
        api.close()

    run(body())


def test_absent_antrea_crds_degrade_and_k8s_policies_still_work(server: FakeApiServer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    server.missing.update(ANTREA)

    async def body() -> None:
        async with Rig(server) as r:
            assert r.source.skipped == {"tiers.crd.antrea.io", "clusternetworkpolicies.crd.antrea.io",
                                        "networkpolicies.crd.antrea.io"}
            assert {k[0] for k in r.engine.policies} == {PolicyKind.K8S.value}
            added = bump(item(NETPOL, "default-deny-egress"), "49090")
            added["metadata"]["name"] = "deny-more"
            server.send(NETPOL, "ADDED", added)
            await until(lambda: (PolicyKind.K8S.value, "web", "deny-more") in r.engine.policies)
            # The source keeps checking quietly in case Antrea gets installed.
            await until(lambda: len(server.lists_of(ACNP)) >= 3)
            assert all(s["errors"] == 0 for s in r.source.stats.values())
            # Rechecks wait the full resync interval each time, without backing off further.
            waits = r.time.waits["clusternetworkpolicies.crd.antrea.io"]
            assert len(waits) >= 2 and set(waits) == {30.0}

    with caplog.at_level(logging.WARNING, logger="policy_agent.sources.kubernetes"):
        run(body())
    absent = [rec for rec in caplog.records if "does not serve" in rec.getMessage()]
    assert len(absent) == 3 and all(rec.levelno == logging.WARNING for rec in absent)
    assert any("crd.antrea.io/v1beta1/clusternetworkpolicies" in rec.getMessage() for rec in absent)


def test_crd_installed_later_is_picked_up(server: FakeApiServer) -> None:
    server.missing.update(ANTREA)

    async def body() -> None:
        async with Rig(server) as r:
            server.missing.clear()
            await until(lambda: (*ACNP_KEY, "isolate-db") in r.engine.policies)
            await until(lambda: not r.source.skipped)

    run(body())


def test_policy_naming_a_tier_not_seen_yet_goes_in_when_the_tier_does(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server) as r:
            server.send(ACNP, "ADDED", acnp("ops-freeze", "49100", tier="change-freeze"))
            stats = r.source.stats["clusternetworkpolicies.crd.antrea.io"]
            await until(lambda: stats["invalid"] == 1)
            assert (*ACNP_KEY, "ops-freeze") not in r.engine.policies
            tier = bump(item(TIERS, "security-team"), "49101")
            tier["metadata"]["name"], tier["spec"]["priority"] = "change-freeze", 60
            server.send(TIERS, "ADDED", tier)
            await until(lambda: (*ACNP_KEY, "ops-freeze") in r.engine.policies)
            assert r.engine.tiers["change-freeze"] == Tier("change-freeze", 60)

    run(body())


def test_list_in_pages_is_applied_whole(server: FakeApiServer) -> None:
    async def body() -> None:
        async with Rig(server, list_page_size=1) as r:
            assert len(r.engine.namespaces) == 4
            pages = server.lists_of(NAMESPACES)
            assert [p.get("continue") for p in pages] == [None, "1", "2", "3"]
            assert all(p["limit"] == "1" for p in pages)

    run(body())


def test_close_ends_every_watch_before_it_returns(server: FakeApiServer) -> None:
    async def body() -> None:
        before = watch_threads()
        r = Rig(server)
        await r.__aenter__()
        await until(lambda: all(server.watches(p) for p in RECORDED))
        threads = watch_threads() - before
        assert len(threads) == len(RECORDED)
        await r.source.close()
        # The watches' sockets were shut, so close did not give up at its timeout with
        # threads still reading (a server-side watch lasts minutes).
        assert not [t.name for t in threads if t.is_alive()]
        r.api.close()

    run(body())


def test_backoff_is_exponential_jittered_and_capped() -> None:
    low, high = (lambda: 0.0), (lambda: 1.0)
    assert [backoff_delay(n, 30.0, high) for n in (1, 2, 3)] == pytest.approx([0.2, 0.4, 0.8])
    assert backoff_delay(1, 30.0, low) == pytest.approx(0.1)
    assert backoff_delay(50, 30.0, high) == 30.0 and backoff_delay(50, 30.0, low) == 15.0


def test_api_client_from_kubeconfig_talks_to_its_server(server: FakeApiServer, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):  # loopback only
        monkeypatch.delenv(var, raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "agent", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "test", "context": {"cluster": "fake", "user": "agent"}}]}))
    api = api_client_from_config(str(kubeconfig), environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    try:
        names = [n.metadata.name for n in client.CoreV1Api(api).list_namespace().items]
        assert names == ["default", "kube-system", "web", "db"]
    finally:
        api.close()


def test_api_client_config_errors_name_the_source(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(KubernetesConfigError, match="nope"):
        api_client_from_config(str(missing))
    # In-cluster is chosen by the environment; outside a Pod its service account files are missing.
    with pytest.raises(KubernetesConfigError, match="in-cluster service account"):
        api_client_from_config(None, environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                              "KUBERNETES_SERVICE_PORT": "443"})
