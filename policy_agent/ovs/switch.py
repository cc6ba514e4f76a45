"""The node's Open vSwitch as the agent uses it: the daemons (embedded, or external and watched), the OVSDB
connection, and the bridge with our controller on it, kept as configured after an OVS restart."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from policy_agent.config.ovs import OvsConfig
from policy_agent.errors import AgentError
from policy_agent.ovs.bridge import Ovsdb
from policy_agent.ovs.embedded import EmbeddedOvs, OvsPidFiles
from policy_agent.ovs.gateway import NodeGateway
from policy_agent.ovs.supervisor import OvsSupervisor
from policy_agent.ovs.tunnel import NodeUnderlay

log = logging.getLogger(__name__)


class NodeSwitch:
    """Started by the agent before anything talks OpenFlow; closed last (OVS keeps its flows: fail_mode=secure)."""

    def __init__(self, config: OvsConfig, *, controller: str | None, openflow_target: str,
                 gateway: NodeGateway | None = None, underlay: NodeUnderlay | None = None) -> None:
        self.config = config
        self.gateway = gateway  # the node's gateway port, address and masquerade (None: no Pod subnet set)
        self.underlay = underlay  # the way to the other nodes (None: one node)
        self._controller = controller  # the Controller row we put on the bridge; None: someone else's target
        self._openflow_target = openflow_target
        self.embedded = EmbeddedOvs(Path(config.run_dir), config.netns) if config.mode == "embedded" else None
        # The namespace OVS runs in, where Pod ports are plugged and XDP attached ('' = the agent's own).
        self.netns = config.netns if self.embedded is not None else ""
        self._started: list[str] = []  # what start() brought up itself (namespace, daemons): undo_start() stops it
        self.ovsdb: Ovsdb | None = None
        self.datapath_type: str | None = None
        # Embedded: restarts a dead daemon; external: reports it (the channel reconnects when it returns).
        self.supervisor = OvsSupervisor(
            self.embedded if self.embedded is not None else OvsPidFiles(config.ovs_rundir),
            config.supervise_interval, restarting=self.embedded is not None, after_restart=self.ensure_bridge)

    async def start(self) -> None:
        """The daemons up (embedded), OVSDB connected, the datapath type chosen, the bridge as configured."""
        if self.embedded is not None:
            await asyncio.to_thread(self.embedded.up, started=self._started)
        self.ovsdb = await asyncio.to_thread(Ovsdb, self.config.db_remote)
        self.datapath_type = await asyncio.to_thread(self.ovsdb.choose_datapath_type, self.config.datapath_type)
        await self.ensure_bridge()
        controller = self._controller
        if controller is not None and not controller.startswith("punix:") and self.config.mode == "external":
            log.warning("OpenFlow controller %s listens on the host's loopback: any local process "
                        "can connect to it; openflow.transport: unix avoids that", controller)

    async def ensure_bridge(self) -> None:
        """The bridge and our controller on it, as configured; at start and after an OVS restart."""
        if self.ovsdb is None or self.datapath_type is None:
            raise AgentError("the bridge is ensured only after start() connected to OVSDB")
        bridge = self.config.bridge
        await asyncio.to_thread(self.ovsdb.ensure_bridge, bridge, self.datapath_type)
        if self._controller is not None:
            # Our own controller on the bridge, so the packet-in queue size is ours.
            await asyncio.to_thread(self.ovsdb.ensure_controller, bridge, self._controller,
                                    self.config.controller_queue_size)
            if self._controller.startswith("punix:"):
                await asyncio.to_thread(self.ovsdb.wait_socket, Path(self._openflow_target))
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.ensure, self.ovsdb)
        if self.underlay is not None:
            await asyncio.to_thread(self.underlay.ensure, self.ovsdb, self.datapath_type)

    async def undo_start(self) -> None:
        """After a failed start of the agent: the OVSDB connection closed, and the daemons and namespace this
        start brought up stopped (those that ran before it keep running)."""
        await self.close()
        if self.embedded is not None and self._started:
            started, self._started = self._started, []
            log.warning("start failed: stopping what it started (%s)", ", ".join(started))
            await asyncio.to_thread(self.embedded.undo, started)

    async def close(self) -> None:
        """The OVSDB connection closed; the daemons keep running."""
        if self.ovsdb is not None:
            await asyncio.to_thread(self.ovsdb.close)
            self.ovsdb = None
