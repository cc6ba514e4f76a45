"""`npaudit ovs up|down|status`: manage the embedded Open vSwitch."""

from __future__ import annotations

import argparse
import os
import sys

from policy_agent.cli.common import CONFIG_HELP, load_config, setup_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    o = sub.add_parser("ovs", help="manage the embedded Open vSwitch")
    o.add_argument("action", choices=["up", "down", "status"])
    o.add_argument("--config", help=f"the agent's config {CONFIG_HELP}")
    o.add_argument("--run-dir", help="override ovs.run_dir")
    o.add_argument("--netns", help="override ovs.netns ('' = current namespace)")
    o.add_argument("--purge", action="store_true", help="with down: delete the run directory too")
    o.set_defaults(func=cmd_ovs)


def cmd_ovs(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from policy_agent.errors import OvsError
    from policy_agent.ovs.embedded import EmbeddedOvs

    cfg = load_config(args.config)
    setup_logging(cfg.log_level)
    if cfg.ovs.mode != "embedded":
        print("npaudit ovs manages the embedded OVS only (ovs.mode is external)", file=sys.stderr)
        return 2
    ovs = EmbeddedOvs(Path(args.run_dir or cfg.ovs.run_dir),
                      cfg.ovs.netns if args.netns is None else args.netns)
    try:
        if args.action == "up":
            ovs.up()
        elif args.action == "down":
            ovs.down(purge=args.purge)
    except OvsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the daemons, their run directory or the namespace are root's
        where = f"{exc.filename}: " if exc.filename else ""
        hint = " (npaudit ovs needs root)" if os.geteuid() != 0 else ""
        print(f"error: ovs {args.action}: {where}{exc.strerror or exc}{hint}", file=sys.stderr)
        return 1
    print(json.dumps(ovs.status(), indent=2))
    if args.action == "status":
        return 0 if ovs.status()["ovs_vswitchd_pid"] else 3
    return 0
