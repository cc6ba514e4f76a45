"""Fixtures for tests against a real, private Open vSwitch in network namespaces of our own.

Everything here is created under names that include this run's tag and is
removed by those names and by the pids the daemons wrote, even on failure.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

from policy_agent.ovs.embedded import EmbeddedOvs
from policy_agent.ovs.bridge import Ovsdb
from tests.support.podnet import PodNet, create_pod, delete_pod

BRIDGE = "br-int"


@dataclass
class OvsEnv:
    ovs: EmbeddedOvs
    db: Ovsdb
    tag: str
    target: str  # our controller socket

    @property
    def netns(self) -> str:
        return self.ovs.netns

    @property
    def mgmt(self) -> str:
        return f"unix:{self.ovs.run_dir / (BRIDGE + '.mgmt')}"


@pytest.fixture
def ovs_env() -> Iterator[OvsEnv]:
    tag = secrets.token_hex(3)
    # Short path: AF_UNIX socket paths are limited to 108 bytes.
    run_dir = Path(tempfile.mkdtemp(prefix=f"npa-{tag}-", dir="/tmp"))
    inst = EmbeddedOvs(run_dir, netns=f"npat-{tag}")
    db = None
    try:
        inst.up()
        db = Ovsdb(inst.db_remote)
        db.ensure_bridge(BRIDGE, "netdev")
        target = run_dir / f"{BRIDGE}.npaudit"
        db.ensure_controller(BRIDGE, f"punix:{target}", 512)
        db.wait_socket(target)
        yield OvsEnv(ovs=inst, db=db, tag=tag, target=str(target))
    finally:
        if db is not None:
            db.close()
        inst.down(purge=True)
        shutil.rmtree(run_dir, ignore_errors=True)


PodFactory = Callable[..., PodNet]


@pytest.fixture
def make_pod(ovs_env: OvsEnv) -> Iterator[PodFactory]:
    made: list[PodNet] = []

    def make(name: str, index: int) -> PodNet:
        pod = create_pod(ovs_env.db, BRIDGE, netns=f"npat-{ovs_env.tag}-{name}",
                         host_if=f"npt{ovs_env.tag}{index}", ip_cidr=f"10.244.0.{index + 1}/24",
                         mac=f"02:00:0a:f4:00:{index + 1:02x}", ofport=index, ovs_netns=ovs_env.netns)
        made.append(pod)
        return pod

    yield make
    for pod in made:
        delete_pod(None, BRIDGE, pod, ovs_netns=ovs_env.netns)
