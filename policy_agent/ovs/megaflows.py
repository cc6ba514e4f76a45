"""Purges ovs-vswitchd's datapath flow cache (megaflows) over its unixctl socket after a policy change.

The userspace datapath can keep a megaflow translated from an earlier table
version past the revalidation of a bundle commit: seen with OVS 3.1, a
`ct(commit),output` megaflow for one source Pod's new connections outlived the
policy that allowed it and let new connections through a fresh isolation for
seconds (`revalidator/wait` left it in place; tests/e2e/test_conntrack_e2e.py).
`revalidator/purge` drops every megaflow, so the next packet of any flow is
translated against the tables just committed. It is process-wide: every bridge
of that vswitchd re-upcalls its traffic once.
"""

from __future__ import annotations

from pathlib import Path

from policy_agent.errors import OvsError
from policy_agent.ovs import unixctl
from policy_agent.ovs.coverage import vswitchd_ctl_path


class MegaflowCache:
    """The engine's DatapathCache for one ovs-vswitchd (located through its run directory)."""

    def __init__(self, ovs_rundir: Path) -> None:
        self.ovs_rundir = ovs_rundir

    def purge(self) -> None:
        """Blocking (run it in a thread): returns once the vswitchd has deleted its megaflows."""
        ctl = vswitchd_ctl_path(self.ovs_rundir)  # each time: a restarted vswitchd has a new pid
        try:
            unixctl.call(ctl, "revalidator/purge")
        except OvsError as exc:
            raise OvsError(f"cannot purge the datapath flows: {exc}") from exc
