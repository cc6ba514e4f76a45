"""Read ovs-vswitchd coverage counters and version over its unixctl socket (no ovs-appctl subprocess).

Packet-ins OVS drops before they reach us show only here: `rconn_overflow`
(the per-controller queue of `controller_queue_size` was full) and
`packet_in_overflow` (the bridge's own queue of pending packet-ins was full).
Both are process-wide, across every bridge and controller of that vswitchd.
"""

from __future__ import annotations

import logging
from pathlib import Path

from policy_agent.errors import OvsError
from policy_agent.ovs import unixctl

log = logging.getLogger(__name__)

PACKET_IN_LOSS_COUNTERS = ("rconn_overflow", "packet_in_overflow")
# Packets the userspace datapath received and dropped before the OpenFlow pipeline saw them (dpif-netdev):
# a failed upcall, a lock it could not take, a frame it could not parse, a port it does not know.
# On this datapath a thread too busy to keep up loses frames on the port instead (ovs/port_stats.py).
DATAPATH_DROP_COUNTERS = ("datapath_drop_upcall_error", "datapath_drop_lock_error",
                          "datapath_drop_rx_invalid_packet", "datapath_drop_invalid_port")


def vswitchd_ctl_path(ovs_rundir: Path) -> Path:
    """The control socket of the vswitchd that uses `ovs_rundir`.

    Our embedded OVS names it ovs-vswitchd.ctl; a system OVS names it
    ovs-vswitchd.<pid>.ctl next to ovs-vswitchd.pid.
    """
    fixed = ovs_rundir / "ovs-vswitchd.ctl"
    if fixed.exists():
        return fixed
    try:
        pid = int((ovs_rundir / "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        return fixed
    return ovs_rundir / f"ovs-vswitchd.{pid}.ctl"


class CoverageReader:
    """Reads named coverage counters; None for a counter that cannot be read (said once)."""

    def __init__(self, ovs_rundir: Path, names: tuple[str, ...] = PACKET_IN_LOSS_COUNTERS,
                 missing: str = "npaudit_ovs_packetin_lost_total will be missing") -> None:
        self.ovs_rundir = ovs_rundir
        self.names = names
        self._missing = missing  # what the one warning says goes without them
        self._warned = False

    def read(self, names: tuple[str, ...] | None = None) -> dict[str, int | None]:
        """Every counter over one connection to vswitchd (it answers each in turn)."""
        names = self.names if names is None else names
        out: dict[str, int | None] = dict.fromkeys(names)
        ctl = vswitchd_ctl_path(self.ovs_rundir)  # each time: a restarted vswitchd has a new pid
        try:
            answers = unixctl.call_many(ctl, [("coverage/read-counter", [name]) for name in names])
        except OvsError as exc:
            self._warn(str(exc))
            return out
        for name, result in zip(names, answers):
            if isinstance(result, OvsError):
                self._warn(str(result))
            elif result.strip().isdigit():
                out[name] = int(result)
            else:
                self._warn(f"coverage/read-counter {name}: {result!r}")
        return out

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("OVS coverage counters %s unavailable: %s; %s", ", ".join(self.names), what, self._missing)

