"""What the CNI server remembers per container across agent restarts: one versioned JSON file each."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from auditlog import atomic_file
from policy_agent.cni.wire import ERR_INVALID_ENV, CniError, container_id_problem

log = logging.getLogger(__name__)

STATE_VERSION = 1
Phase = Literal["attached", "ready"]
# "attached": the port is on the bridge and pod_added may have run, so undoing
# it must call pod_deleted. "ready": the runtime got (or will get) a result.
ATTACHED: Phase = "attached"
READY: Phase = "ready"


@dataclass(frozen=True)
class PodInterfaceInfo:
    """One Pod's interface as the agent sees it: enough to compile its policy and forwarding flows."""

    namespace: str
    name: str
    container_id: str
    netns: str
    ifname: str
    ip: str
    prefix_len: int
    mac: str
    gateway: str | None
    host_ifname: str
    ofport: int


@dataclass(frozen=True)
class ContainerState:
    """One container's record: its interface, the netconf its IPAM DEL needs, and the result once READY."""

    phase: Phase
    info: PodInterfaceInfo
    host_mac: str
    ipam_netconf: Mapping[str, Any]
    result: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # A result exists exactly once ADD completed: ADD-again answers it, CHECK requires it.
        if (self.phase == READY) != (self.result is not None):
            raise ValueError(f"phase {self.phase!r} with{'out' if self.result is None else ''} a result")

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "phase": self.phase, "info": asdict(self.info),
                "host_mac": self.host_mac, "ipam_netconf": dict(self.ipam_netconf),
                "result": dict(self.result) if self.result is not None else None}

    @classmethod
    def from_json(cls, obj: Any) -> ContainerState:
        """The state a file holds; ValueError, KeyError or TypeError when it is not one we wrote."""
        if not isinstance(obj, dict):
            raise TypeError("state must be a JSON object")
        if obj.get("version") != STATE_VERSION:
            raise ValueError(f"version {obj.get('version')!r}, expected {STATE_VERSION}")
        phase = obj["phase"]
        if phase not in (ATTACHED, READY):
            raise ValueError(f"phase {phase!r}")
        if not isinstance(obj["ipam_netconf"], dict):
            raise TypeError("ipam_netconf must be an object")
        result = obj.get("result")
        if result is not None and not isinstance(result, dict):
            raise TypeError("result must be an object or null")
        return cls(phase=phase, info=PodInterfaceInfo(**obj["info"]), host_mac=str(obj.get("host_mac", "")),
                   ipam_netconf=obj["ipam_netconf"], result=result)


class ContainerStates:
    """The state files under `directory`, one `<container id>.json` per container."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, container_id: str) -> Path:
        problem = container_id_problem(container_id)
        if problem:  # the id becomes a file name
            raise CniError(ERR_INVALID_ENV, problem)
        return self.directory / f"{container_id}.json"

    def container_ids(self) -> list[str]:
        """Ids with a state file, sorted."""
        return sorted(p.stem for p in self.directory.glob("*.json"))

    def load(self, container_id: str) -> ContainerState | None:
        """None when there is no file, or when it is unreadable (then it is moved aside to .corrupt)."""
        path = self.path(container_id)
        try:
            return ContainerState.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Kept aside for a human; the container is then treated as unknown, whose
            # DEL still removes its veth, port and address.
            aside = path.with_suffix(".corrupt")
            with contextlib.suppress(OSError):
                os.replace(path, aside)
            log.error("state of container %s unreadable (%s); moved to %s", container_id, exc, aside)
            return None

    def save(self, state: ContainerState, durable: bool = True) -> None:
        """Write-to-temp, rename: a crash leaves the old or the new file. `durable` also fsyncs
        the file and the directory (survives a power loss); without it, an agent crash only."""
        self.commit(state.info.container_id, self.stage(state, durable), durable)

    def stage(self, state: ContainerState, durable: bool = True) -> Path:
        """The first half of save(): the record in a temporary file (fsynced if `durable`), not
        yet in force. commit() puts it in force; remove() also deletes an uncommitted one."""
        container_id = state.info.container_id
        path = self.path(container_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = json.dumps(state.to_json(), indent=1).encode()
        return atomic_file.stage(path, lambda f: f.write(data), durable=durable, prefix=f".{container_id}.")

    def commit(self, container_id: str, staged: Path, durable: bool = True) -> None:
        """Put a staged record in force (rename; with `durable`, then fsync the directory)."""
        atomic_file.commit(staged, self.path(container_id), durable=durable)

    def remove(self, container_id: str) -> None:
        """The record and any staged one left by a failed or interrupted ADD."""
        path = self.path(container_id)
        for tmp in path.parent.glob(f".{container_id}.*.tmp"):
            # ".<id>.<random>.tmp": the random part has no dot, container "a.b"'s is not "a"'s.
            if "." not in tmp.name[len(container_id) + 2:-len(".tmp")]:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        if path.exists():
            path.unlink()
            atomic_file.fsync_directory(path.parent)

