"""Fixtures for tests against a real, private Open vSwitch in network namespaces of our own.

Everything here is created under names that include this run's tag and is
removed by those names and by the pids the daemons wrote, even on failure.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest

from tests.support.bridge import BRIDGE, PrivateBridge, private_bridge
from tests.support.podnet import PodNet, create_pod, delete_pod


OvsEnv = PrivateBridge


@pytest.fixture
def ovs_env() -> Iterator[OvsEnv]:
    with private_bridge("npat") as env:
        yield env


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
