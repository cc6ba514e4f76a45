"""Bridge management through OVSDB (ovsdbapp), never by parsing ovs-vsctl output."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ovsdbapp.backend.ovs_idl import connection, idlutils
from ovsdbapp.schema.open_vswitch import impl_idl

from policy_agent.errors import OvsError

log = logging.getLogger(__name__)


def kernel_datapath_available() -> bool:
    """True when the openvswitch kernel module is loaded (not the case on our VMs)."""
    return Path("/sys/module/openvswitch").exists()


class Ovsdb:
    """A connection to one ovsdb-server and the few operations the agent needs."""

    def __init__(self, remote: str, timeout: float = 10.0) -> None:
        self.remote = remote
        try:
            helper = idlutils.get_schema_helper(remote, "Open_vSwitch")
            helper.register_all()
            self._conn = connection.Connection(idl=connection.OvsdbIdl(remote, helper), timeout=timeout)
            # ovsdbapp keeps the connection in a class attribute (a process-wide
            # singleton); a subclass per instance lets two Ovsdb objects coexist.
            api_cls = type("OvsdbApi", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
            self.api = api_cls(self._conn)
        except Exception as exc:  # ovsdbapp raises a variety of errors for "not there"
            cause = exc.__cause__ or exc
            raise OvsError(f"cannot connect to OVSDB at {remote}: {type(cause).__name__}: {cause}") from exc

    def close(self) -> None:
        self._conn.stop()

    def _do(self, cmd: Any, what: str) -> Any:
        try:
            return cmd.execute(check_error=True)
        except Exception as exc:
            raise OvsError(f"OVSDB {self.remote}: {what} failed: {exc}") from exc

    def datapath_types(self) -> list[str]:
        return list(self._do(self.api.db_get("Open_vSwitch", ".", "datapath_types"), "read datapath_types"))

    def choose_datapath_type(self, requested: str) -> str:
        """auto -> system if the kernel module is loaded and vswitchd supports it, else netdev."""
        if requested != "auto":
            return requested
        if kernel_datapath_available() and "system" in self.datapath_types():
            return "system"
        return "netdev"

    def ensure_bridge(self, name: str, datapath_type: str) -> None:
        """Create or fix the bridge: datapath type, fail_mode=secure, OpenFlow 1.5 only."""
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_br(name, may_exist=True, datapath_type=datapath_type))
            txn.add(api.db_set("Bridge", name, ("fail_mode", "secure"), ("protocols", ["OpenFlow15"])))
        current = self._do(api.db_get("Bridge", name, "datapath_type"), f"read bridge {name}")
        if current != datapath_type:
            raise OvsError(f"bridge {name} has datapath_type {current!r}, wanted {datapath_type!r}: "
                           "delete the bridge or set ovs.datapath_type to match")
        log.info("bridge %s ready (datapath_type=%s, fail_mode=secure, OpenFlow15)", name, datapath_type)

    def ensure_controller(self, bridge: str, target: str, queue_size: int) -> None:
        """Make `target` one of the bridge's controllers with the given packet-in queue size.

        Other controllers are kept. Done before any flow is installed: changing the
        controller set of a bridge that had none can clear its flow table.
        """
        api = self.api
        targets = list(self._do(api.get_controller(bridge), f"read controllers of {bridge}"))
        if target not in targets:
            self._do(api.set_controller(bridge, targets + [target]), f"set controller {target} on {bridge}")
        rows = self._do(api.db_find("Controller", ("target", "=", target), columns=["_uuid"]),
                        f"find controller {target}")
        for row in rows:
            # out-of-band: in-band control would add hidden flows that bypass policy.
            self._do(api.db_set("Controller", row["_uuid"], ("controller_queue_size", queue_size),
                                ("connection_mode", "out-of-band")),
                     f"set controller_queue_size/connection_mode on {target}")

    def wait_socket(self, path: Path, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise OvsError(f"ovs-vswitchd did not create {path} within {timeout}s")
            time.sleep(0.02)

    def add_port(self, bridge: str, port: str, ofport: int | None = None, timeout: float = 10.0) -> int:
        """Attach an interface; return its OpenFlow port number once vswitchd assigned it."""
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_port(bridge, port, may_exist=True))
            if ofport is not None:
                txn.add(api.db_set("Interface", port, ("ofport_request", ofport)))
        deadline = time.monotonic() + timeout
        # vswitchd assigns the number a few ms after the commit; CNI ADD waits for it, so the
        # first polls are short rather than one 20 ms sleep.
        pause = 0.001
        while True:
            got = self._do(api.db_get("Interface", port, "ofport"), f"read ofport of {port}")
            value = got[0] if isinstance(got, list) and got else got
            if isinstance(value, int) and value > 0:
                return value
            if time.monotonic() > deadline:
                error = self._do(api.db_get("Interface", port, "error"), f"read error of {port}")
                raise OvsError(f"port {port} on {bridge} got no OpenFlow port within {timeout}s: {error}")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def del_port(self, bridge: str, port: str) -> None:
        self._do(self.api.del_port(port, bridge=bridge, if_exists=True), f"delete port {port}")
