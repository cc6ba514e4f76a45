"""`npaudit check-config FILE`: validate a config file, one line per error naming its field."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("check-config", help="validate a config file; print each error with its field")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)


def cmd_check_config(args: argparse.Namespace) -> int:
    from policy_agent.config import loader

    try:
        loader.load(args.file)
    except loader.ConfigError as exc:
        for line in exc.errors:
            print(f"{args.file}: {line}")
        return 1
    print(f"{args.file}: OK")
    return 0
