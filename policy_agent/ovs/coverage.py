"""Read ovs-vswitchd coverage counters and version over its unixctl socket (no ovs-appctl subprocess).

Packet-ins OVS drops before they reach us show only here: `rconn_overflow`
(the per-controller queue of `controller_queue_size` was full) and
`packet_in_overflow` (the bridge's own queue of pending packet-ins was full).
Both are process-wide, across every bridge and controller of that vswitchd.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

PACKET_IN_LOSS_COUNTERS = ("rconn_overflow", "packet_in_overflow")


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

    def __init__(self, ovs_rundir: Path) -> None:
        self.ovs_rundir = ovs_rundir
        self._warned = False

    def read(self, names: tuple[str, ...] = PACKET_IN_LOSS_COUNTERS) -> dict[str, int | None]:
        from ovs.unixctl.client import UnixctlClient

        out: dict[str, int | None] = dict.fromkeys(names)
        ctl = vswitchd_ctl_path(self.ovs_rundir)  # each time: a restarted vswitchd has a new pid
        error, client = UnixctlClient.create(str(ctl))
        if error:
            self._warn(f"cannot open {ctl} (errno {error})")
            return out
        try:
            for name in names:
                err, result = _transact(client, name)
                if err is None and result is not None and result.strip().isdigit():
                    out[name] = int(result)
                else:
                    self._warn(f"coverage/read-counter {name}: {err or result!r}")
        finally:
            client.close()
        return out

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("OVS packet-in loss counters unavailable: %s; "
                        "npaudit_ovs_packetin_lost_total will be missing", what)


def _transact(client: object, name: str) -> tuple[str | None, str | None]:
    code, err, result = client.transact("coverage/read-counter", [name])  # type: ignore[attr-defined]
    if code:
        return f"errno {code}", None
    return err, result

