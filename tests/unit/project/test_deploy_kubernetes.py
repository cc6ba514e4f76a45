"""config/deploy/kubernetes: the manifests parse, RBAC grants exactly what the source requests,
the DaemonSet mounts what the config uses, and the ConfigMap and conflist pass the agent's own checks."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler
from pathlib import Path, PurePosixPath
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from kubernetes import client

from policy_agent.config import loader as config
from policy_agent.cni import plugin, wire
from policy_agent.cni.ipam import Ipam
from policy_agent.cni.subnet import NodeSubnet
from policy_agent.policy import kinds
from policy_agent.sources.kubernetes_own_node import list_own_node
from policy_agent.sources.kubernetes import KubernetesSource
from tests.support.fake_apiserver import FakeApiServer
from tests.support.promtool import check_config, promtool  # noqa: F401 (fixture: the binary)

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "config" / "deploy"
K8S = DEPLOY / "kubernetes"
CONFLIST = DEPLOY / "cni" / "10-npaudit.conflist"
# Not a Kubernetes object: a job for prometheus.yml's scrape_configs.
SCRAPE_CONFIG = K8S / "monitoring" / "prometheus-scrape-config.yaml"


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(set(DEPLOY.rglob("*.yaml")) - {SCRAPE_CONFIG}):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def _one(kind: str) -> dict[str, Any]:
    found = [d for d in _docs() if d["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} objects"
    return found[0]


def _agent_config() -> config.AgentConfig:
    return config.loads(_one("ConfigMap")["data"]["npaudit.yaml"], environ={"NODE_NAME": "node-a"})


def _container(name: str, init: bool = False) -> dict[str, Any]:
    spec = _one("DaemonSet")["spec"]["template"]["spec"]
    return next(c for c in spec["initContainers" if init else "containers"] if c["name"] == name)


def _host_mounts(container: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """mountPath -> (host path, the mount) for each hostPath volume the container mounts."""
    volumes = {v["name"]: v for v in _one("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    return {m["mountPath"]: (volumes[m["name"]]["hostPath"]["path"], m)
            for m in container["volumeMounts"] if "hostPath" in volumes[m["name"]]}


def test_every_manifest_parses_and_the_kinds_are_the_deployment() -> None:
    kinds_found = sorted(d["kind"] for d in _docs())
    assert kinds_found == ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "PodMonitor",
                           "ServiceAccount"]
    for d in _docs():
        assert d["apiVersion"] and d["metadata"]["name"] == "npaudit-agent", d["kind"]


def test_the_daemonset_runs_as_the_bound_service_account_on_the_host_network() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    sa, binding = _one("ServiceAccount"), _one("ClusterRoleBinding")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert binding["roleRef"]["name"] == _one("ClusterRole")["metadata"]["name"]
    assert pod["hostNetwork"] is True
    assert _one("DaemonSet")["metadata"]["namespace"] == sa["metadata"]["namespace"] \
        == _one("ConfigMap")["metadata"]["namespace"]


def test_node_name_comes_from_the_pods_spec_node_name() -> None:
    env = {e["name"]: e for e in _container("agent")["env"]}
    assert env[config.NODE_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_agent_runs_with_the_configmap_mounted_where_its_args_point() -> None:
    agent = _container("agent")
    config_path = PurePosixPath(agent["args"][agent["args"].index("--config") + 1])
    volumes = {v["name"]: v for v in _one("DaemonSet")["spec"]["template"]["spec"]["volumes"]}
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    assert volumes[mount["name"]]["configMap"]["name"] == _one("ConfigMap")["metadata"]["name"]
    assert config_path.name in _one("ConfigMap")["data"]


def test_the_configmap_config_passes_check_config(tmp_path: Path) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text(_one("ConfigMap")["data"]["npaudit.yaml"])
    env = dict(os.environ, PYTHONPATH=str(ROOT), NODE_NAME="node-a")
    out = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "check-config", str(path)],
                         capture_output=True, text=True, env=env)
    assert (out.returncode, out.stdout) == (0, f"{path}: OK\n"), out.stdout + out.stderr
    cfg = _agent_config()
    assert cfg.kubernetes.enabled and cfg.ovs.mode == "external" and cfg.node == "node-a"


def _under(path: str, mounts: dict[str, tuple[str, dict[str, Any]]]) -> tuple[str, dict[str, Any]] | None:
    """The host path the container sees at `path`, and the mount, when a hostPath covers it."""
    for mount_path, (host, mount) in mounts.items():
        rel = os.path.relpath(path, mount_path)
        if not rel.startswith(".."):
            return os.path.normpath(os.path.join(host, rel)), mount
    return None


def test_the_daemonset_mounts_every_host_path_the_config_uses_at_the_same_place() -> None:
    cfg = _agent_config()
    used = {
        "state_dir": cfg.state_dir,
        "cni socket": str(cfg.cni_socket.parent),
        "audit.path": os.path.dirname(cfg.audit.path),
        "syslog checkpoints": str(cfg.syslog_checkpoint_dir),
        "ovs rundir": str(cfg.ovs.ovs_rundir),
        "ovsdb socket": os.path.dirname(cfg.ovs.db_remote.removeprefix("unix:")),
        "openflow socket": os.path.dirname(cfg.openflow_target),
    }
    mounts = _host_mounts(_container("agent"))
    for what, path in used.items():
        found = _under(path, mounts)
        assert found is not None and found[0] == path, f"{what} {path} is not the host's {path}"
        assert not found[1].get("readOnly"), f"{what} {path} is mounted read-only"


def test_netns_propagates_host_to_container_and_bcc_sees_the_kernel_tree_read_only() -> None:
    agent = _container("agent")
    mounts = _host_mounts(agent)
    assert mounts["/run/netns"][0] == "/run/netns"
    # The runtime's new Pod namespaces come in; nothing the agent mounts needs to go out (Antrea's choice too).
    assert mounts["/run/netns"][1]["mountPropagation"] == "HostToContainer"
    assert agent["securityContext"]["privileged"] is True
    for path in ("/lib/modules", "/usr/src"):
        assert mounts[path][0] == path and mounts[path][1]["readOnly"] is True


def _pod_environ(host_ip: str) -> dict[str, str]:
    """The agent container's environment as kubelet makes it on a node with address `host_ip`."""
    fields = {"spec.nodeName": "node-a", "status.hostIP": host_ip}
    environ: dict[str, str] = {}
    for e in _container("agent")["env"]:
        value = fields[e["valueFrom"]["fieldRef"]["fieldPath"]] if "valueFrom" in e else e["value"]
        for name, known in environ.items():  # $(VAR) of a variable defined before it
            value = value.replace(f"$({name})", known)
        environ[e["name"]] = value
    return environ


def test_the_agent_listens_on_the_node_address_from_the_downward_api() -> None:
    environ = _pod_environ("192.0.2.7")
    cfg = config.loads(_one("ConfigMap")["data"]["npaudit.yaml"], environ=environ)
    assert cfg.metrics.listen == "192.0.2.7:9495"
    ports = {p["name"]: p for p in _container("agent")["ports"]}
    assert ports["metrics"]["containerPort"] == 9495 and ports["metrics"].get("protocol", "TCP") == "TCP"
    # Without the variable the ConfigMap's own value holds: loopback, nothing off the node.
    assert _agent_config().metrics.listen == "127.0.0.1:9495"


def test_check_config_applies_the_listen_override_as_the_agent_does(tmp_path: Path) -> None:
    path = tmp_path / "npaudit.yaml"
    path.write_text(_one("ConfigMap")["data"]["npaudit.yaml"])
    base = dict(os.environ, PYTHONPATH=str(ROOT))
    for environ, code, said in ((_pod_environ("192.0.2.7"), 0, f"{path}: OK\n"),
                                (dict(_pod_environ("192.0.2.7"), NPAUDIT_METRICS_LISTEN="192.0.2.7"), 1,
                                 "NPAUDIT_METRICS_LISTEN (environment, used as metrics.listen): must be HOST:PORT")):
        out = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", "check-config", str(path)],
                             capture_output=True, text=True, env={**base, **environ})
        assert out.returncode == code and said in out.stdout + out.stderr, out.stdout + out.stderr


def test_probes_reach_the_metrics_listener_on_the_node_address_on_the_probe_paths() -> None:
    agent = _container("agent")
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    _, port = config.loads(_one("ConfigMap")["data"]["npaudit.yaml"],
                           environ=_pod_environ("192.0.2.7")).metrics.listen.rsplit(":", 1)
    # Readiness is /readyz (OpenFlow, flows, CNI), not /metrics, which answers before any of them.
    # No host: kubelet probes the Pod's IP, the node's on the host network, where the agent listens.
    assert _one("DaemonSet")["spec"]["template"]["spec"]["hostNetwork"] is True
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert agent[probe]["httpGet"] == {"port": "metrics", "path": path}
        assert ports["metrics"] == int(port)


def _alert_jobs() -> set[str]:
    import re
    text = (ROOT / "config" / "prometheus" / "npaudit-alerts.yaml").read_text()
    return set(re.findall(r'up\{job="([^"]+)"\}', text))


def test_the_podmonitor_scrapes_the_agents_metrics_port_as_the_job_the_alerts_watch() -> None:
    monitor, daemonset = _one("PodMonitor"), _one("DaemonSet")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["namespaceSelector"] == {"matchNames": [daemonset["metadata"]["namespace"]]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in _container("agent")["ports"]}
    assert endpoint["path"] == "/metrics"
    jobs = {r["replacement"] for r in endpoint["relabelings"] if r.get("targetLabel") == "job"}
    assert jobs == _alert_jobs() == {"npaudit"}


def test_the_scrape_config_passes_promtool_and_keeps_only_the_agents_metrics_port(
        promtool: Path, tmp_path: Path) -> None:  # noqa: F811 (the imported fixture)
    document = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = document["scrape_configs"]
    assert {job["job_name"]} == _alert_jobs()
    keeps = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"] if r["action"] == "keep"}
    assert keeps == {"__meta_kubernetes_pod_label_app_kubernetes_io_name":
                     _one("DaemonSet")["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
                     "__meta_kubernetes_pod_container_port_name": "metrics"}
    (sd,) = job["kubernetes_sd_configs"]
    assert sd == {"role": "pod", "namespaces": {"names": [_one("DaemonSet")["metadata"]["namespace"]]}}
    # As a whole prometheus.yml, with the shipped alert rules loaded. Debian's Prometheus is built
    # without Kubernetes service discovery, so its promtool checks the job with a static target in its
    # place (everything else as shipped); the discovery block is held to its shape above.
    static = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
    static["static_configs"] = [{"targets": ["192.0.2.7:9495"]}]
    prometheus_yml = tmp_path / "prometheus.yml"
    rules = ROOT / "config" / "prometheus" / "npaudit-alerts.yaml"
    prometheus_yml.write_text(yaml.safe_dump({"rule_files": [str(rules)], "scrape_configs": [static]}))
    out = check_config(promtool, prometheus_yml)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_agent_starts_with_a_raised_descriptor_limit_then_runs_the_images_entrypoint() -> None:
    agent = _container("agent")
    entrypoint = json.loads(next(line.split(None, 1)[1] for line in (DEPLOY / "Containerfile").read_text().splitlines()
                                 if line.startswith("ENTRYPOINT ")))
    script = agent["command"][2]
    assert agent["command"][:2] == ["/bin/sh", "-c"] and f'exec {entrypoint[0]} "$@"' in script
    # Run the very command with the entrypoint swapped for a Python that prints its limits.
    probe = "import resource; print(*resource.getrlimit(resource.RLIMIT_NOFILE))"
    hard_before = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    out = subprocess.run([*agent["command"][:2], script.replace(entrypoint[0], sys.executable),
                          *agent["command"][3:], "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    soft, _ = (int(n) for n in out.stdout.split())
    # 65536 where the container may raise its hard limit (privileged: it may), else all the hard limit allows.
    assert soft >= min(65536, hard_before) and soft > 1024, out.stdout


def test_the_init_container_installs_into_the_host_cni_directories() -> None:
    init = _container("install-cni", init=True)
    env = {e["name"]: e["value"] for e in init["env"]}
    mounts = _host_mounts(init)
    destdir = env["DESTDIR"]
    for host_dir in ("/opt/cni/bin", "/etc/cni/net.d", "/opt/npaudit"):
        assert mounts[destdir + host_dir][0] == host_dir
    assert init["command"] == ["/opt/npaudit/deploy/install-cni.sh"]


# --- the conflist, through the plugin's and the agent's own checks --------------------------

def _plugin_netconfs() -> list[dict[str, Any]]:
    """Each plugin's netconf as libcni hands it over: the list's cniVersion and name injected."""
    conflist = json.loads(CONFLIST.read_text())
    return [dict(p, cniVersion=conflist["cniVersion"], name=conflist["name"]) for p in conflist["plugins"]]


@pytest.mark.parametrize("command", wire.COMMANDS)
def test_the_conflist_passes_the_cni_plugins_netconf_checks(command: str) -> None:
    (netconf,) = _plugin_netconfs()
    assert netconf["type"] == "npaudit"
    assert wire.netconf_version(netconf, command) == wire.CURRENT_VERSION
    # The socket the plugin dials is the one the agent of the ConfigMap serves.
    assert plugin.agent_socket(netconf) == str(_agent_config().cni_socket)
    ipam = Ipam(Path("/usr/lib/cni"), Path("/tmp/ipam"), NodeSubnet("10.244.3.0/24")).netconf(netconf)["ipam"]
    assert ipam["type"] == "host-local" and ipam["ranges"] == [[{"subnet": "10.244.3.0/24", "gateway": "10.244.3.1"}]]


# --- RBAC: exactly what the Kubernetes source asks the API server for -----------------------

class _RecordingApiServer(FakeApiServer):
    """Answers every list with an empty list and holds every watch open; records
    (API group, resource) -> verbs as the API server's authorizer would see them."""

    def __init__(self) -> None:
        super().__init__()
        self.verbs: dict[tuple[str, str], set[str]] = defaultdict(set)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        url = urlsplit(h.path)
        parts = url.path.strip("/").split("/")
        group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            rest = rest[2:]  # a namespaced path
        watching = parse_qs(url.query).get("watch", [""])[-1].lower() == "true"
        verb = "watch" if watching else ("list" if len(rest) == 1 else "get")
        self.verbs[(group, rest[0])].add(verb)
        if not watching:
            return self._reply(h, 200, {"kind": "List", "apiVersion": "v1", "items": [],
                                        "metadata": {"resourceVersion": "1"}})
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.flush()
        self._closing.wait()
        h.close_connection = True


class _NullEngine:
    async def apply(self, **objects: Any) -> None:
        pass

    async def delete(self, **objects: Any) -> None:
        pass


@pytest.fixture
def api_server() -> Iterator[_RecordingApiServer]:
    srv = _RecordingApiServer()
    srv.start()
    yield srv
    srv.close()


def _requested(srv: _RecordingApiServer) -> dict[tuple[str, str], set[str]]:
    cfg = client.Configuration(host=srv.url)
    cfg.proxy = None  # loopback only, whatever the environment says
    api = client.ApiClient(cfg)

    async def run() -> None:
        source = KubernetesSource(api, _NullEngine(), node_name="node-a", subnet=NodeSubnet())
        source.start()
        try:
            await asyncio.wait_for(source.synced.wait(), 5)
            deadline = time.monotonic() + 5
            while sum("watch" in v for v in srv.verbs.values()) < len(kinds.RESOURCES) + 1:  # + its Node
                if time.monotonic() > deadline:
                    raise AssertionError(f"not every resource was watched: {dict(srv.verbs)}")
                await asyncio.sleep(0.01)
        finally:
            await source.close()

    try:
        list_own_node(api, "node-a", 5.0)  # at start, its own Node's address (kubernetes_own_node.py)
        asyncio.run(run())
    finally:
        api.close()
    return dict(srv.verbs)


def test_the_cluster_role_grants_exactly_what_the_kubernetes_source_requests(
        api_server: _RecordingApiServer) -> None:
    granted: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rule in _one("ClusterRole")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, no URLs
        for group in rule["apiGroups"]:
            for kind in rule["resources"]:
                granted[(group, kind)] |= set(rule["verbs"])
    requested = _requested(api_server)
    assert dict(granted) == requested
    # And the source requests what the kinds module names, so a new kind lands here; and its Node.
    assert set(requested) == {(r.group, r.plural) for r in kinds.RESOURCES} | {("", "nodes")}
