"""`npaudit cluster`: its sub-verbs and options parse, bash completes them, and a DIR with no cluster is one
error line (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from policy_agent.cli import main

BIN = Path(sys.executable).parent  # the venv's `npaudit` script
ENV = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


def test_the_sub_verbs_parse() -> None:
    p = main.build_parser(["cluster"])
    up = p.parse_args(["cluster", "up", "--nodes", "3", "--dir", "/tmp/c", "--encapsulation", "routed"])
    assert (up.nodes, up.dir, up.encapsulation, up.cluster_command) == (3, Path("/tmp/c"), "routed", "up")
    pod = p.parse_args(["cluster", "pod", "add", "--dir", "/tmp/c", "--node", "n2", "x/a", "--label", "app=web",
                        "--label", "tier=1"])
    assert (pod.node, pod.pod, pod.label) == ("n2", "x/a", ["app=web", "tier=1"])
    assert p.parse_args(["cluster", "status", "--dir", "/c", "-o", "json"]).output == "json"
    with pytest.raises(SystemExit):
        p.parse_args(["cluster", "up", "--dir", "/c", "--encapsulation", "vxlan"])
    assert up.kubernetes_api == "" and pod.ip == ""
    kube = p.parse_args(["cluster", "up", "--dir", "/c", "--kubernetes-api", "http://127.0.0.1:6443"])
    assert kube.kubernetes_api == "http://127.0.0.1:6443"
    assert p.parse_args(["cluster", "pod", "add", "--dir", "/c", "--node", "n1", "--ip", "10.248.1.9",
                         "x/a"]).ip == "10.248.1.9"
    gone = p.parse_args(["cluster", "pod", "delete", "--dir", "/c", "x/a"])
    assert (gone.pod_command, gone.pod) == ("delete", "x/a")


@pytest.mark.parametrize(("words", "expected"), [
    ("npaudit cl", "cluster"),
    ("npaudit cluster ''", "up down status apply pod"),
    ("npaudit cluster up --enc", "--encapsulation"),
    ("npaudit cluster up --encapsulation ''", "geneve routed"),
    ("npaudit cluster pod ''", "add delete"),
    ("npaudit cluster status -o ''", "table json"),
])
def test_bash_completes_the_cluster_verb(words: str, expected: str) -> None:
    res = subprocess.run(["bash", "-c", "source <(npaudit completion bash)\n"
                          f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); _npaudit\n"
                          'echo "${COMPREPLY[*]}"'], capture_output=True, text=True, env=ENV, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == expected.split()


@pytest.mark.parametrize("verb", [["status"], ["down"], ["apply", "-f", "-"], ["pod", "add", "--node", "n1", "x/a"]])
def test_a_dir_without_a_cluster_is_one_line(tmp_path: Path, verb: list[str]) -> None:
    argv = ["cluster", *verb[:2], "--dir", str(tmp_path), *verb[2:]] if verb[0] == "pod" else \
        ["cluster", verb[0], "--dir", str(tmp_path), *verb[1:]]
    res = subprocess.run([sys.executable, "-m", "policy_agent.cli.main", *argv], capture_output=True, text=True,
                         input="", timeout=60)
    assert res.returncode == 1
    assert res.stderr == f"error: no cluster in {tmp_path} (cluster.json not found)\n"
