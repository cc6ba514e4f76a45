"""The `npaudit` command line: every verb's parser (each in its own module here) and the entry point."""

from __future__ import annotations

import os
import sys

# `npaudit cni` is exec'd for every Pod start and goes through this module: the top
# imports only what that path needs; the verbs are imported by build_parser
# (tests/unit/test_rpc.py holds the cni path to its list).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse


def build_parser() -> argparse.ArgumentParser:
    import argparse

    from policy_agent.cli import (agent, apply, bundle, check_config, completion, demo, logs, ovs, stats, status,
                                  syslog, trace, verify)
    from policy_agent.cli.common import version

    p = argparse.ArgumentParser(prog="npaudit", description="Network-policy audit trail for Open vSwitch")
    p.add_argument("--version", action="version", version=f"npaudit {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for verb in (agent, check_config, ovs, apply):
        verb.add_parser(sub)
    # Listed for --help only: main() hands `cni` to the plugin before any parsing.
    sub.add_parser("cni", help="CNI plugin (ADD/DEL/CHECK/VERSION from CNI_* env and stdin), "
                               "forwarded to the agent's CNI socket")
    for verb in (verify, syslog, logs, status, stats, bundle, trace, demo, completion):
        verb.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one verb; when stdout's reader goes away (`npaudit logs | head -1`), stop quietly."""
    finished: list[int] = []
    try:
        try:
            finished.append(_dispatch(sys.argv[1:] if argv is None else argv))
        finally:
            sys.stdout.flush()  # inside the try: a pipe closed early fails here, not at interpreter exit
    except BrokenPipeError:
        # The reader has what it wanted: exit 0, or the status of a verb that had finished and
        # only its last output failed to reach the reader (verify keeps its own verdict itself).
        from policy_agent.cli.common import quiet_stdout

        quiet_stdout()
        return finished[0] if finished else 0
    return finished[0]


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["cni"]:  # a runtime starts this for every Pod: import as little as possible
        from policy_agent.cni.plugin import run

        return run(os.environ, sys.stdin.buffer.read(), sys.stdout)
    import warnings

    # ovs.poller probes for eventlet (it never monkey-patches); its import warning is noise.
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
