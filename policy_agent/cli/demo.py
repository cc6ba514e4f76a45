"""`npaudit demo`: its options; the demo itself is policy_agent/demo.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from policy_agent.cli.common import setup_logging


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("demo", help="private OVS, two Pods, logged flows, real traffic, live packet-ins")
    d.add_argument("--duration", type=float, default=0.0, help="keep running this many seconds after the traffic")
    d.add_argument("--keep", action="store_true", help="leave OVS and the Pod namespaces up afterwards")
    d.add_argument("--nodes", type=int, default=1,
                   help="N >= 2: a cluster of N nodes on this machine (npaudit cluster), Pods spread over them")
    d.add_argument("--output-dir", type=Path, help="with --nodes: keep each node's files in DIR/<node>/")
    d.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.nodes != 1 or args.output_dir is not None:
        return _cluster_demo(args)
    from policy_agent.demo import run_demo

    setup_logging("info")
    return run_demo(duration=args.duration, keep=args.keep)


def _cluster_demo(args: argparse.Namespace) -> int:
    from policy_agent.cluster.local_demo import run_cluster_demo
    from policy_agent.errors import AgentError

    if args.nodes < 2:
        print("error: --output-dir goes with --nodes N (N >= 2)" if args.nodes == 1 else
              f"error: --nodes must be 2 or more, got {args.nodes}", file=sys.stderr)
        return 2
    try:
        return run_cluster_demo(args.nodes, args.output_dir, args.keep, lambda line: print(line, flush=True))
    except (AgentError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
