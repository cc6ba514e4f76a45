"""`npaudit demo`: its options; the demo itself is policy_agent/demo.py."""

from __future__ import annotations

import argparse

from policy_agent.cli.common import setup_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("demo", help="private OVS, two Pods, logged flows, real traffic, live packet-ins")
    d.add_argument("--duration", type=float, default=0.0, help="keep running this many seconds after the traffic")
    d.add_argument("--keep", action="store_true", help="leave OVS and the Pod namespaces up afterwards")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from policy_agent.demo import run_demo

    setup_logging("info")
    return run_demo(duration=args.duration, keep=args.keep)
