"""Bridge management through OVSDB (ovsdbapp), never by parsing ovs-vsctl output."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from ovsdbapp.backend.ovs_idl import connection, idlutils, transaction
from ovsdbapp.schema.open_vswitch import impl_idl

from policy_agent.errors import OvsError

log = logging.getLogger(__name__)


def kernel_datapath_available() -> bool:
    """True when the openvswitch kernel module is loaded (not the case on our VMs)."""
    return Path("/sys/module/openvswitch").exists()


def _scalar(value: Any) -> Any:
    """An optional column's value: the IDL gives [] or [x]."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


class _WatchingIdl(connection.OvsdbIdl):
    """The IDL, also telling watchers when vswitchd gave an Interface its OpenFlow port number.
    notify() runs in ovsdbapp's connection thread as each update arrives: no polling."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch_lock = threading.Lock()
        self._watches: dict[str, list[Callable[[int], object]]] = {}

    def watch(self, name: str, callback: Callable[[int], object]) -> Callable[[], None]:
        with self._watch_lock:
            self._watches.setdefault(name, []).append(callback)

        def cancel() -> None:
            with self._watch_lock:
                left = [cb for cb in self._watches.get(name, []) if cb is not callback]
                if left:
                    self._watches[name] = left
                else:
                    self._watches.pop(name, None)
        return cancel

    def notify(self, event: str, row: Any, updates: Any = None) -> None:
        # A create, or an update that changed ofport: not some other column of a row that had its
        # number already (a stale row of the same name, about to be deleted).
        if (self._watches and row._table.name == "Interface"
                and (event == "create" or (event == "update" and "ofport" in getattr(updates, "_data", ())))):
            with self._watch_lock:
                callbacks = list(self._watches.get(row.name, ()))
            ofport = _scalar(row.ofport) if callbacks else None
            if isinstance(ofport, int) and ofport > 0:
                for callback in callbacks:
                    try:
                        callback(ofport)
                    except Exception:  # a watcher's bug must not stop the IDL thread
                        log.exception("ofport watcher of %s failed", row.name)
        super().notify(event, row, updates)


# Columns vswitchd rewrites every few seconds whatever happens (counters every
# other_config:stats-update-interval, 5 s; controller connection status): the agent reads none of them,
# and monitoring them woke the IDL thread to parse an update each time, idle or not.
UNWATCHED_COLUMNS = {"Interface": {"statistics"}, "Port": {"statistics"}, "Mirror": {"statistics"},
                     "Open_vSwitch": {"statistics"}, "Controller": {"status"}, "Manager": {"status"}}


def watch_columns(helper: Any) -> None:
    """Registers every column of every table of `helper`'s schema but UNWATCHED_COLUMNS."""
    for table, spec in helper.schema_json["tables"].items():
        skip = UNWATCHED_COLUMNS.get(table, set())
        helper.register_columns(table, [c for c in spec["columns"] if c not in skip])


class _NoWaitTransaction(transaction.Transaction):
    """Done once ovsdb-server committed it, whatever vswitchd has made of it yet."""

    def pre_commit(self, txn: Any) -> None:
        txn.expected_ifaces = set()  # AddPortCommand records its interface there (for ovs-vsctl's wait)


class Ovsdb:
    """A connection to one ovsdb-server and the few operations the agent needs."""

    def __init__(self, remote: str, timeout: float = 10.0) -> None:
        self.remote = remote
        try:
            helper = idlutils.get_schema_helper(remote, "Open_vSwitch")
            watch_columns(helper)
            self._idl = _WatchingIdl(remote, helper)
            self._conn = connection.Connection(idl=self._idl, timeout=timeout)
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
        """Attach an interface; return its OpenFlow port number once vswitchd assigned it (not
        necessarily `ofport`, when that number is taken)."""
        got = threading.Event()
        number: list[int] = []

        def seen(value: int) -> None:
            number.append(value)
            got.set()

        with self.watch_ofport(port, seen):
            self.attach_port(bridge, port, ofport)
            deadline = time.monotonic() + timeout
            while True:
                # OVSDB is read as well (at once: a port that was there already; then every
                # 0.5 s), in case the number came before the watch.
                now = number[-1] if number else self.ofport(port)
                if now is not None:
                    return now
                if time.monotonic() > deadline:
                    raise self.no_ofport(bridge, port, timeout)
                got.wait(min(0.5, max(0.0, deadline - time.monotonic())))

    def ensure_internal_port(self, bridge: str, port: str, ofport: int, mac: str, timeout: float = 10.0) -> int:
        """An OVS internal port (vswitchd makes the interface) asking for OpenFlow port `ofport` and
        MAC `mac`; returns the number vswitchd gave it."""
        api = self.api
        try:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port(bridge, port, may_exist=True))
                txn.add(api.db_set("Interface", port, ("type", "internal"), ("ofport_request", ofport),
                                   ("mac", mac)))
        except Exception as exc:
            raise OvsError(f"OVSDB {self.remote}: add internal port {port} to {bridge} failed: {exc}") from exc
        return self.add_port(bridge, port, ofport, timeout)

    @contextlib.contextmanager
    def watch_ofport(self, port: str, callback: Callable[[int], object]) -> Iterator[None]:
        """While inside, `callback(ofport)` runs (in ovsdbapp's thread) whenever an OVSDB update
        shows interface `port` with an OpenFlow port number. Enter it before attach_port."""
        cancel = self._idl.watch(port, callback)
        try:
            yield
        finally:
            cancel()

    def attach_port(self, bridge: str, port: str, ofport: int | None = None) -> None:
        """Add the port (and interface) to the bridge, asking for OpenFlow port `ofport`; returns
        once OVSDB committed it, before vswitchd gave it a number (see watch_ofport)."""
        api = self.api
        # Not api.transaction(): like ovs-vsctl, that one waits until vswitchd has applied the
        # change (next_cfg), holding ovsdbapp's only thread meanwhile.
        txn = _NoWaitTransaction(api, api.ovsdb_connection, api.ovsdb_connection.timeout, check_error=True)
        try:
            with txn:
                txn.add(api.add_port(bridge, port, may_exist=True))
                if ofport is not None:
                    txn.add(api.db_set("Interface", port, ("ofport_request", ofport)))
        except Exception as exc:
            raise OvsError(f"OVSDB {self.remote}: add port {port} to {bridge} failed: {exc}") from exc

    def ofport(self, port: str) -> int | None:
        """The interface's OpenFlow port number as OVSDB has it now (None: not assigned yet)."""
        value = _scalar(self._do(self.api.db_get("Interface", port, "ofport"), f"read ofport of {port}"))
        return value if isinstance(value, int) and value > 0 else None

    def no_ofport(self, bridge: str, port: str, timeout: float) -> OvsError:
        """The error for a port vswitchd gave no number within `timeout`, with its reason."""
        error = self._do(self.api.db_get("Interface", port, "error"), f"read error of {port}")
        return OvsError(f"port {port} on {bridge} got no OpenFlow port within {timeout}s: {error}")

    def forget_ofport_request(self, port: str) -> None:
        """Drop the port's ofport_request: once vswitchd gave it another number, the request would
        make vswitchd renumber it as soon as the requested one is free."""
        self._do(self.api.db_clear("Interface", port, "ofport_request"), f"clear ofport_request of {port}")

    def ofports_in_use(self) -> set[int]:
        """Every OpenFlow port number an interface has or requests, on any bridge."""
        rows = self._do(self.api.db_list("Interface", columns=["ofport", "ofport_request"]), "list interfaces")
        out: set[int] = set()
        for row in rows:
            for column in ("ofport", "ofport_request"):
                value = _scalar(row.get(column))
                if isinstance(value, int) and value > 0:
                    out.add(value)
        return out

    def del_port(self, bridge: str, port: str) -> None:
        self._do(self.api.del_port(port, bridge=bridge, if_exists=True), f"delete port {port}")
