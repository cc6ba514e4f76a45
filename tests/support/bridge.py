"""A private OVS with br-int and the agent's controller socket, for tests and benches; removed on exit."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from policy_agent.ovs.bridge import Ovsdb
from policy_agent.ovs.embedded import EmbeddedOvs

BRIDGE = "br-int"


@dataclass
class PrivateBridge:
    ovs: EmbeddedOvs
    db: Ovsdb
    tag: str       # in every name this bridge's user creates, so cleanup finds exactly those
    run_dir: Path
    target: str    # the agent's controller socket (punix)

    @property
    def netns(self) -> str:
        return self.ovs.netns

    @property
    def mgmt(self) -> str:
        return f"unix:{self.run_dir / (BRIDGE + '.mgmt')}"


@contextlib.contextmanager
def private_bridge(prefix: str, *, extra_controllers: tuple[str, ...] = ()) -> Iterator[PrivateBridge]:
    """OVS in a run dir and network namespace named `<prefix>-<tag>`; both removed on the way out.

    The run dir is short on purpose: AF_UNIX socket paths are limited to 108 bytes.
    """
    tag = secrets.token_hex(3)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-{tag}-", dir="/tmp"))
    ovs = EmbeddedOvs(run_dir, netns=f"{prefix}-{tag}")
    db = None
    try:
        ovs.up()
        db = Ovsdb(ovs.db_remote)
        db.ensure_bridge(BRIDGE, "netdev")
        target = run_dir / f"{BRIDGE}.npaudit"
        for controller in (f"punix:{target}", *extra_controllers):
            db.ensure_controller(BRIDGE, controller, 512)
        db.wait_socket(target)
        yield PrivateBridge(ovs=ovs, db=db, tag=tag, run_dir=run_dir, target=str(target))
    finally:
        if db is not None:
            db.close()
        ovs.down(purge=True)
        shutil.rmtree(run_dir, ignore_errors=True)
