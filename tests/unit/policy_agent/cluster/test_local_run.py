"""`npaudit cluster` machinery that needs no namespaces: the agent pid check `down` relies on and how an agent
ended (local_agents), `down` of a record whose things are gone, and the shared source's all-or-nothing writes."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from policy_agent.cluster.local import ClusterPlan, plan_cluster
from policy_agent.cluster.local_agents import agent_pid, how_it_ended, start_agent, started_here_running
from policy_agent.cluster.local_run import ClusterError, apply_shared, down, load_record, save_record

POLICY = """apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
"""


@pytest.fixture
def plan(tmp_path: Path) -> ClusterPlan:
    p = plan_cluster(tmp_path, 2, "geneve", "0f0f0f", [9201, 9202])
    p.shared_dir.mkdir()
    for node in p.nodes:
        node.path.mkdir()
    save_record(p)
    return p


@pytest.fixture
def lookalike(plan: ClusterPlan) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line names node n1's config after `agent`, as the real agent's does."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "agent", "--config",
                             str(plan.nodes[0].config_path)])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_record_is_read_back(plan: ClusterPlan) -> None:
    assert load_record(plan.path) == plan
    with pytest.raises(ClusterError, match="no cluster"):
        load_record(plan.path / "elsewhere")


def test_a_pid_file_names_the_agent_only_while_that_process_runs_it(plan: ClusterPlan,
                                                                   lookalike: subprocess.Popen[bytes]) -> None:
    n1, n2 = plan.nodes
    n1.pid_path.write_text(f"{lookalike.pid}\n")
    assert agent_pid(n1) == lookalike.pid
    n2.pid_path.write_text(f"{lookalike.pid}\n")  # a pid that is not n2's agent (reused, or a stale file)
    assert agent_pid(n2) is None
    import os

    n2.pid_path.write_text(f"{os.getpid()}\n")
    assert agent_pid(n2) is None
    lookalike.kill()
    lookalike.wait()
    assert agent_pid(n1) is None


def test_down_leaves_alone_a_process_a_pid_file_names_that_is_not_the_agent(
        plan: ClusterPlan, lookalike: subprocess.Popen[bytes]) -> None:
    plan.nodes[1].pid_path.write_text(f"{lookalike.pid}\n")
    said: list[str] = []
    down(plan.path, said.append)
    down(plan.path, said.append)  # again: nothing left to do, no error
    assert lookalike.poll() is None
    assert said == []  # no namespace of the record exists, no agent or OVS runs
    assert (plan.path / "cluster.json").exists()  # files stay


def test_cluster_apply_writes_the_file_whole(plan: ClusterPlan) -> None:
    target = apply_shared(plan.path, "/somewhere/deny.yaml", POLICY)
    assert target == plan.shared_dir / "apply-deny.yaml" and target.read_text() == POLICY
    assert sorted(p.name for p in plan.shared_dir.iterdir()) == ["apply-deny.yaml"]  # no temporary left
    again = POLICY.replace("Ingress", "Egress")
    assert apply_shared(plan.path, "deny.yaml", again).read_text() == again  # the same source replaces its file


def test_cluster_apply_refuses_a_bad_manifest_and_writes_nothing(plan: ClusterPlan) -> None:
    with pytest.raises(ClusterError, match="podSelector|spec"):
        apply_shared(plan.path, "bad.yaml", POLICY.replace("podSelector: {}", "podSelector: 3"))
    assert list(plan.shared_dir.iterdir()) == []


def test_cluster_apply_refuses_what_would_break_the_whole_shared_set(plan: ClusterPlan) -> None:
    tier = "apiVersion: crd.antrea.io/v1beta1\nkind: Tier\nmetadata: {name: %s}\nspec: {priority: 15}\n"
    apply_shared(plan.path, "t1.yaml", tier % "one")
    with pytest.raises(ClusterError, match="priority"):
        apply_shared(plan.path, "t2.yaml", tier % "two")  # valid alone; a duplicate priority with t1
    assert sorted(p.name for p in plan.shared_dir.iterdir()) == ["apply-t1.yaml"]


def test_a_pod_the_shared_source_holds_already_is_refused_before_anything_is_made(plan: ClusterPlan) -> None:
    from policy_agent.cluster.local_run import add_pod

    apply_shared(plan.path, "pods.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x}\n")
    with pytest.raises(ClusterError, match="rejected"):
        add_pod(plan.path, "n1", "x/a", [], lambda line: None)
    assert load_record(plan.path).pods == ()  # nothing recorded, so nothing made


def test_a_pod_address_outside_the_nodes_subnet_is_refused_before_anything_is_made(plan: ClusterPlan) -> None:
    from policy_agent.cluster.local_run import add_pod

    with pytest.raises(ClusterError, match="not a Pod address of node n1"):
        add_pod(plan.path, "n1", "x/a", [], lambda line: None, ip="10.248.2.5")
    assert load_record(plan.path).pods == ()


def test_deleting_a_pod_the_cluster_does_not_hold_says_so(plan: ClusterPlan) -> None:
    from policy_agent.cluster.local_run import delete_pod

    with pytest.raises(ClusterError, match="no Pod x/a in this cluster"):
        delete_pod(plan.path, "x/a", lambda line: None)


def test_a_cluster_on_a_kubernetes_api_takes_no_manifests_in_its_shared_directory(tmp_path: Path) -> None:
    p = plan_cluster(tmp_path, 2, "geneve", "0f0f0f", [9201, 9202], kubernetes_api="http://127.0.0.1:6443")
    save_record(p)
    with pytest.raises(ClusterError, match="from the Kubernetes API http://127.0.0.1:6443"):
        apply_shared(p.path, "deny.yaml", POLICY)
    assert not p.shared_dir.exists()


@pytest.mark.parametrize("script, said", [("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", " (ended by SIGTERM)"),
                                          ("raise SystemExit(3)", " (exit status 3)")])
def test_an_agent_that_ended_during_up_is_said_to_have_ended_how(plan: ClusterPlan, script: str, said: str) -> None:
    node = plan.nodes[0]
    proc = subprocess.Popen([sys.executable, "-c", script])
    node.pid_path.write_text(f"{proc.pid}\n")
    for _ in range(500):  # until it has ended (not reaped: how_it_ended reaps it, as `up`'s waiting does)
        if Path(f"/proc/{proc.pid}/stat").read_text().split(") ", 1)[1][:1] == "Z":
            break
        time.sleep(0.01)
    assert agent_pid(node) is None
    assert how_it_ended(node) == said
    proc.returncode = 0  # reaped above: Popen must not wait for it again


def test_an_agent_up_started_says_how_it_ended_though_another_popen_ran_after_it_ended(plan: ClusterPlan) -> None:
    """`up` starts each node's agent and then runs `ip` for the next: an agent that ended in between was reaped by
    that Popen's clean-up when start_agent let go of its own, and `up` said only "the agent exited"."""
    node = plan.nodes[0]  # no config written: the agent exits at once, saying why in its log
    pid = start_agent(node)
    for _ in range(1000):
        if Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] == "Z":
            break
        time.sleep(0.01)
    subprocess.run(["true"], check=True)  # what `up` does next: any Popen polls the ones let go of
    assert started_here_running(node) is False
    said = how_it_ended(node)
    assert said.startswith(" (exit status ") and said != " (exit status 0)", said
    assert node.log_path.read_text().strip()


def test_an_agent_up_started_is_running_while_it_runs_whatever_proc_says(plan: ClusterPlan,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether an agent `up` started still runs is its own status, not a look at /proc (which says "not alive"
    when it cannot read it)."""
    import policy_agent.cluster.local_agents as agents

    node = plan.nodes[1]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        monkeypatch.setitem(agents._STARTED, proc.pid, proc)
        node.pid_path.write_text(f"{proc.pid}\n")
        monkeypatch.setattr(agents, "pid_alive", lambda pid: False)  # as /proc read with EMFILE says
        assert agent_pid(node) is None
        assert started_here_running(node) is True
        assert how_it_ended(node) == ""
    finally:
        proc.kill()
        proc.wait()
    assert started_here_running(node) is False
    assert how_it_ended(node) == " (ended by SIGKILL)"


def test_how_it_ended_says_nothing_of_a_running_process_or_one_not_ours(plan: ClusterPlan) -> None:
    node = plan.nodes[0]
    node.pid_path.write_text("1\n")  # init: not our child
    assert how_it_ended(node) == ""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        node.pid_path.write_text(f"{proc.pid}\n")
        assert how_it_ended(node) == ""
    finally:
        proc.kill()
        proc.wait()
