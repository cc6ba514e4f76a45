"""config/deploy outside Kubernetes: the image recipe installs the Makefile's packages, the systemd
unit verifies, and install-cni.sh installs a working plugin wrapper, idempotently."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from policy_agent.cni import wire

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "config" / "deploy"
UNIT = DEPLOY / "npaudit-agent.service"
INSTALL_CNI = DEPLOY / "install-cni.sh"
AGENT_BIN = "/opt/npaudit/venv/bin/npaudit"
HOST_PYTHON = "/usr/bin/python3"  # what the wrapper runs on a node: no venv, no site packages


def _continued(text: str) -> str:
    return re.sub(r"\\\n", " ", text)


def _makefile_packages() -> list[str]:
    match = re.search(r"^APT_PACKAGES\s*:=(.*)$", _continued((ROOT / "Makefile").read_text()), re.M)
    assert match, "Makefile: no APT_PACKAGES"
    return match.group(1).split()


def _stages() -> list[str]:
    """The Containerfile's stages, each from its FROM line on."""
    text = _continued((DEPLOY / "Containerfile").read_text())
    return ["FROM " + part for part in re.split(r"^FROM ", text, flags=re.M)[1:]]


def _stage_packages(stage: str) -> list[str]:
    runs = [line for line in stage.splitlines() if line.startswith("RUN ") and "apt-get install" in line]
    assert len(runs) == 1, runs
    words = shlex.split(runs[0].split("apt-get install", 1)[1].split("&&", 1)[0])
    return [w for w in words if not w.startswith("-")]


# What the agent runs in the image (policy_agent/: ovs/embedded.py, ovs/bridge.py, ovs/gateway.py,
# ovs/unixctl.py, cni/ipam.py, bundle/collector.py, policy_packetins.py) and the Python it imports
# from Debian rather than PyPI.
RUNTIME_FILES = ("/usr/sbin/ovs-vswitchd", "/usr/sbin/ovsdb-server", "/usr/bin/ovs-vsctl", "/usr/bin/ovs-ofctl",
                 "/usr/bin/ovs-appctl", "/usr/bin/ovsdb-tool", "/usr/sbin/ip", "/usr/sbin/iptables",
                 "/usr/sbin/sysctl", "/usr/lib/cni/host-local", "/usr/lib/python3/dist-packages/bcc/__init__.py",
                 "/usr/lib/python3/dist-packages/ovs/__init__.py")
# Compilers, build headers and runtimes of the tests: never in the image that runs.
BUILD_OR_TEST_ONLY = ("gcc", "clang", "python3-dev", "nodejs", "jq", "rsyslog", "rsyslog-openssl",
                      "linux-headers-amd64", "bpfcc-tools", "build-essential")


def _owner(path: str) -> str:
    """The Debian package that installed `path` here (make setup installed the Makefile's packages)."""
    real = os.path.realpath(path)
    for candidate in dict.fromkeys((path, real, re.sub(r"^/usr", "", path), re.sub(r"^/usr", "", real))):
        out = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if out.returncode == 0:
            return out.stdout.split(":", 1)[0].split(",")[0].strip()
    raise AssertionError(f"{path}: no installed package owns it")


def test_the_image_is_built_in_a_stage_of_its_own_and_runs_without_compilers() -> None:
    build, run = _stages()
    assert build.startswith("FROM debian:12 AS build\n") and run.startswith("FROM debian:12\n")
    assert {"gcc", "python3-dev", "python3-venv"} <= set(_stage_packages(build))
    assert "COPY --from=build /opt/npaudit /opt/npaudit" in run
    assert not set(_stage_packages(run)) & set(BUILD_OR_TEST_ONLY)
    assert set(_stage_packages(run)) <= set(_makefile_packages())  # the tests run on these


def test_every_program_the_agent_runs_comes_from_a_package_of_the_run_stage() -> None:
    _, run = _stages()
    packages = set(_stage_packages(run))
    missing = {path: owner for path in RUNTIME_FILES if (owner := _owner(path)) not in packages}
    assert not missing, missing


def test_the_containerfile_runs_the_agent_from_a_venv_with_system_site_packages() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert text.startswith("#") and "\nFROM debian:12\n" in text
    assert "python3 -m venv --system-site-packages /opt/npaudit/venv" in text
    for needed in ("config/deploy/install-cni.sh", "config/deploy/cni/10-npaudit.conflist"):
        assert f"COPY {needed} " in text and (ROOT / needed).exists()
    for line in text.splitlines():  # every COPY source exists in the build context (the repo)
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), line


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_the_systemd_unit_runs_the_agent_on_the_standard_config_and_restarts_on_failure() -> None:
    service = _unit()["Service"]
    assert service["ExecStart"] == f"{AGENT_BIN} agent --config /etc/npaudit/npaudit.yaml"
    assert service["ExecStartPre"] == f"{AGENT_BIN} check-config /etc/npaudit/npaudit.yaml"
    assert service["Restart"] == "on-failure"
    caps = set(service["CapabilityBoundingSet"].split())
    assert {"CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_RESOURCE"} <= caps
    # What would break the agent: hidden kernel tree (bcc), read-only /proc/sys (netns set-up).
    for key in ("ProtectKernelModules", "ProtectKernelTunables", "PrivateDevices", "MemoryDenyWriteExecute",
                "SystemCallFilter", "PrivateNetwork", "DeviceAllow", "ProtectClock"):
        assert key not in service, key
    assert service["ProtectSystem"] == "full" and service["NoNewPrivileges"] == "yes"


def test_the_systemd_unit_stops_only_the_agent_so_an_embedded_ovs_outlives_its_restarts() -> None:
    # mixed or control-group would SIGKILL the detached ovs-vswitchd and ovsdb-server on every restart.
    assert _unit()["Service"]["KillMode"] == "process"


def test_the_systemd_unit_raises_the_descriptor_limit_above_the_default_1024() -> None:
    # The metrics listener leaves metrics.fd_reserve descriptors below this limit to the agent's own work.
    assert int(_unit()["Service"]["LimitNOFILE"]) >= 65536


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is part of this machine's set-up (systemd)"
    # verify checks that the ExecStart programs exist: point them at one that does, nothing else changes.
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace(AGENT_BIN, "/bin/true"))
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


# --- install-cni.sh -------------------------------------------------------------------------

def test_install_cni_sh_is_valid_bash() -> None:
    subprocess.run(["bash", "-n", str(INSTALL_CNI)], check=True)
    assert os.access(INSTALL_CNI, os.X_OK)


def _install(**env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([str(INSTALL_CNI)], capture_output=True, text=True, env=full, timeout=60)


def _tree(root: Path) -> dict[str, tuple[bytes, int, int, int]]:
    """Every file under root: content, mode, inode, mtime."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode & 0o7777, p.stat().st_ino,
                                       p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_install_cni_writes_the_wrapper_zipapp_and_conflist_under_destdir_and_a_rerun_changes_nothing(
        tmp_path: Path) -> None:
    first = _install(DESTDIR=str(tmp_path))
    assert first.returncode == 0, first.stderr
    tree = _tree(tmp_path)
    assert sorted(tree) == ["etc/cni/net.d/10-npaudit.conflist", "opt/cni/bin/npaudit",
                            "opt/npaudit/npaudit-cni.pyz"]
    wrapper, mode = tree["opt/cni/bin/npaudit"][:2]
    assert wrapper == f"#!/bin/sh\nexec {HOST_PYTHON} -I /opt/npaudit/npaudit-cni.pyz cni\n".encode()
    assert mode == 0o755
    assert tree["etc/cni/net.d/10-npaudit.conflist"][0] == (DEPLOY / "cni" / "10-npaudit.conflist").read_bytes()

    second = _install(DESTDIR=str(tmp_path))
    assert second.returncode == 0, second.stderr
    assert _tree(tmp_path) == tree  # same bytes, same inodes, same mtimes: kubelet sees no change
    assert second.stdout.count("unchanged: ") == 3 and "installed: " not in second.stdout


def test_install_cni_replaces_a_stale_wrapper(tmp_path: Path) -> None:
    stale = tmp_path / "opt/cni/bin/npaudit"
    stale.parent.mkdir(parents=True)
    stale.write_text("#!/bin/sh\nexec /old/npaudit cni\n")
    assert _install(DESTDIR=str(tmp_path)).returncode == 0
    assert b"npaudit-cni.pyz" in stale.read_bytes()


def _cni(wrapper: Path, command: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    netconf = {"cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit",
               "agentSocket": str(tmp_path / "absent.sock")}
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "eth0",
           "CNI_PATH": str(wrapper.parent), "PATH": "/usr/bin:/bin"}  # a runtime's environment, no venv
    return subprocess.run([str(wrapper)], input=json.dumps(netconf), capture_output=True, text=True, env=env,
                          timeout=60)


def test_the_installed_wrapper_runs_the_plugin_with_the_hosts_bare_python(tmp_path: Path) -> None:
    assert os.access(HOST_PYTHON, os.X_OK), "Debian 12 ships /usr/bin/python3"
    dirs = {"CNI_BIN_DIR": tmp_path / "bin", "CNI_CONF_DIR": tmp_path / "net.d", "NPAUDIT_DIR": tmp_path / "lib"}
    assert _install(**{k: str(v) for k, v in dirs.items()}).returncode == 0
    wrapper = dirs["CNI_BIN_DIR"] / "npaudit"

    version = _cni(wrapper, "VERSION", tmp_path)
    assert version.returncode == 0, version.stderr
    assert json.loads(version.stdout)["supportedVersions"] == list(wire.SUPPORTED_VERSIONS)
    # ADD loads the socket path of the plugin too; no agent: the runtime is told to try again.
    add = _cni(wrapper, "ADD", tmp_path)
    assert add.returncode == 1 and add.stderr == "", add.stderr
    assert json.loads(add.stdout)["code"] == wire.ERR_TRY_AGAIN_LATER
