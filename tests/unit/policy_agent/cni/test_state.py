"""The CNI server's per-container state files: round trip, refusal of files it did not write, atomic replace."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from policy_agent.cni.state import (
    ATTACHED, READY, STATE_VERSION, ContainerState, ContainerStates, PodInterfaceInfo,
)
from policy_agent.cni.wire import ERR_INVALID_ENV, CniError

INFO = PodInterfaceInfo(namespace="shop", name="web-0", container_id="ctr-a", netns="/run/netns/pod-a",
                        ifname="eth0", ip="10.245.0.2", prefix_len=24, mac="02:00:0a:f5:00:02",
                        gateway="10.245.0.1", host_ifname="np0123456789a", ofport=7)
NETCONF = {"cniVersion": "1.0.0", "name": "npaudit", "type": "npaudit",
           "ipam": {"type": "host-local", "dataDir": "/var/lib/npaudit/cni/ipam"}}
RESULT = {"cniVersion": "1.0.0", "interfaces": [{"name": "np0123456789a", "mac": "aa:bb:cc:dd:ee:ff"}],
          "ips": [{"address": "10.245.0.2/24", "gateway": "10.245.0.1", "interface": 1}],
          "routes": [{"dst": "0.0.0.0/0", "gw": "10.245.0.1"}], "dns": {}}
ATTACHED_STATE = ContainerState(phase=ATTACHED, info=INFO, host_mac="aa:bb:cc:dd:ee:ff", ipam_netconf=NETCONF)
READY_STATE = dataclasses.replace(ATTACHED_STATE, phase=READY, result=RESULT)


@pytest.fixture
def states(tmp_path: Path) -> ContainerStates:
    return ContainerStates(tmp_path / "containers")


def test_saved_states_load_back_equal_in_both_phases(states: ContainerStates) -> None:
    states.save(ATTACHED_STATE)
    assert states.load("ctr-a") == ATTACHED_STATE
    states.save(READY_STATE)
    loaded = states.load("ctr-a")
    assert loaded == READY_STATE and loaded is not None and loaded.info == INFO
    assert states.container_ids() == ["ctr-a"]


def test_state_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        READY_STATE.phase = ATTACHED  # type: ignore[misc]


def test_a_file_written_by_the_previous_release_still_loads(states: ContainerStates) -> None:
    # The on-disk layout agents already wrote (dict-based state, version 1): a restart must recover it.
    states.directory.mkdir(parents=True)
    (states.directory / "ctr-a.json").write_text(json.dumps(
        {"version": 1, "phase": "ready", "info": dataclasses.asdict(INFO), "host_mac": "aa:bb:cc:dd:ee:ff",
         "ipam_netconf": NETCONF, "result": RESULT}, indent=1))
    assert states.load("ctr-a") == READY_STATE


def test_missing_state_is_none_and_remove_is_idempotent(states: ContainerStates) -> None:
    assert states.load("ctr-a") is None
    states.save(READY_STATE)
    states.remove("ctr-a")
    states.remove("ctr-a")
    assert states.load("ctr-a") is None and states.container_ids() == []


@pytest.mark.parametrize("content", [
    "{not json",
    json.dumps({**READY_STATE.to_json(), "version": STATE_VERSION + 1}),
    json.dumps({k: v for k, v in READY_STATE.to_json().items() if k != "version"}),
    json.dumps({**READY_STATE.to_json(), "phase": "half-done"}),
    json.dumps({**READY_STATE.to_json(), "result": None}),
    json.dumps({**READY_STATE.to_json(), "info": {"ip": "10.245.0.2"}}),
    json.dumps({**READY_STATE.to_json(), "ipam_netconf": "host-local"}),
    json.dumps([1, 2]),
], ids=["not-json", "newer-version", "no-version", "bad-phase", "ready-without-result", "short-info",
        "netconf-not-object", "not-object"])
def test_unreadable_or_foreign_version_state_is_moved_aside_and_treated_as_unknown(
        states: ContainerStates, content: str) -> None:
    states.directory.mkdir(parents=True)
    path = states.directory / "ctr-a.json"
    path.write_text(content)
    assert states.load("ctr-a") is None
    assert not path.exists()
    assert (states.directory / "ctr-a.corrupt").read_text() == content
    assert states.container_ids() == []


def test_save_replaces_atomically_and_leaves_no_temporary_file(states: ContainerStates) -> None:
    states.save(ATTACHED_STATE)
    inode = (states.directory / "ctr-a.json").stat().st_ino
    states.save(READY_STATE)
    # A new file renamed over the old one (never rewritten in place), and nothing else left.
    assert (states.directory / "ctr-a.json").stat().st_ino != inode
    assert sorted(os.listdir(states.directory)) == ["ctr-a.json"]
    assert json.loads((states.directory / "ctr-a.json").read_text())["phase"] == "ready"


def test_failed_save_keeps_the_old_file_and_removes_its_temporary(
        states: ContainerStates, monkeypatch: pytest.MonkeyPatch) -> None:
    states.save(ATTACHED_STATE)

    def crash(src: str, dst: str) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        states.save(READY_STATE)
    monkeypatch.undo()
    assert sorted(os.listdir(states.directory)) == ["ctr-a.json"]
    assert states.load("ctr-a") == ATTACHED_STATE


def test_staged_record_is_not_in_force_until_committed_and_fsyncs_only_when_durable(
        states: ContainerStates, monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    states.save(ATTACHED_STATE, durable=False)  # ADD's unfinished record: no fsync at all
    assert fsyncs == [] and states.load("ctr-a") == ATTACHED_STATE
    staged = states.stage(READY_STATE)  # written and fsynced while the hook runs
    assert len(fsyncs) == 1
    assert states.load("ctr-a") == ATTACHED_STATE and states.container_ids() == ["ctr-a"]
    states.commit("ctr-a", staged)  # the one fsync ADD waits for: the directory's
    assert len(fsyncs) == 2 and states.load("ctr-a") == READY_STATE
    assert sorted(os.listdir(states.directory)) == ["ctr-a.json"]


def test_remove_deletes_a_staged_record_left_behind_but_not_another_containers(states: ContainerStates) -> None:
    other = dataclasses.replace(ATTACHED_STATE, info=dataclasses.replace(INFO, container_id="ctr-a.b"))
    states.save(ATTACHED_STATE)
    left = states.stage(READY_STATE)  # an ADD that failed or died between stage and commit
    kept = states.stage(other)  # container "ctr-a.b": its temporary also starts with ".ctr-a."
    states.remove("ctr-a")
    assert not left.exists() and kept.exists()
    assert sorted(os.listdir(states.directory)) == [kept.name]
    states.remove("ctr-a")  # idempotent


def test_container_ids_that_are_not_file_names_are_refused(states: ContainerStates) -> None:
    for bad in ("../../etc/passwd", "", "a/b"):
        with pytest.raises(CniError) as exc:
            states.load(bad)
        assert exc.value.code == ERR_INVALID_ENV
