"""`npaudit apply|delete -f FILE|DIR|-`: manifests to the running agent, all or nothing."""

from __future__ import annotations

import argparse
import sys

from policy_agent.cli.common import CONFIG_HELP, agent_address
from policy_agent.errors import AgentError, printable

# `npaudit apply|delete` exit status when the agent went away before answering.
EXIT_OUTCOME_UNKNOWN = 3


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for op in ("apply", "delete"):
        ap = sub.add_parser(op, help=f"{op} manifests (file, directory or '-') on the running agent",
                            description=f"{op.capitalize()} manifests on the running agent, all or nothing.",
                            epilog="exit status: 0 done; 1 rejected or failed, nothing changed; "
                                   f"{EXIT_OUTCOME_UNKNOWN} outcome unknown: the agent went away before "
                                   "answering (its next start keeps what OVS enforced; `npaudit status` says which)")
        ap.add_argument("-f", "--filename", required=True)
        ap.add_argument("--config", help=f"the agent's config (for its state_dir) {CONFIG_HELP}")
        ap.set_defaults(func=cmd_apply, op=op)


class ManifestInputError(AgentError):
    """`npaudit apply -f` input that is not sent to the agent; the text is the one line to print."""


def read_manifests(filename: str) -> str:
    """The text `npaudit apply -f` sends: a file, a directory's manifests joined as one stream,
    or stdin; strict UTF-8 and at most documents.MAX_MANIFEST_BYTES."""
    from pathlib import Path

    from policy_agent.policy.documents import MAX_MANIFEST_BYTES, size_problem

    path = Path(filename)
    try:
        if filename == "-":
            sources = [("<stdin>", sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1))]
        elif path.is_dir():
            files = sorted(f for f in path.iterdir() if f.suffix in (".yaml", ".yml", ".json") and f.is_file())
            sources = [(str(f), f.read_bytes()) for f in files]
        else:
            sources = [(str(path), path.read_bytes())]
    except OSError as exc:
        raise ManifestInputError(f"cannot read {exc.filename or filename}: {exc.strerror}") from exc
    too_big = size_problem(sum(len(data) for _, data in sources), filename)
    if too_big:
        raise ManifestInputError(too_big)
    texts = []
    for name, data in sources:
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ManifestInputError(f"{name}: not UTF-8 at line {line} (byte {exc.start}): "
                                     f"{data[exc.start:exc.end]!r} {exc.reason}") from exc
    # Bare `---` lines keep each file its own document(s), JSON files included (documents.parse_text).
    return "\n---\n".join(texts)


def cmd_apply(args: argparse.Namespace) -> int:
    from policy_agent.rpc import FrameError
    from policy_agent.rpc import OutcomeUnknown, call

    cfg = agent_address(args.config)
    try:
        text = read_manifests(args.filename)
    except ManifestInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        reply = call(cfg.api_socket, {"op": args.op, "manifests": text, "source": printable(args.filename)})
    except OutcomeUnknown as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_OUTCOME_UNKNOWN
    except FrameError as exc:
        print(f"error: {args.filename}: too large for one request to the agent: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: agent API at {cfg.api_socket} unreachable: {exc}", file=sys.stderr)
        return 1
    if not reply.get("ok"):
        for line in reply.get("errors", []):  # escaped: names in them come from manifests
            print(f"error: {printable(str(line))}", file=sys.stderr)
        return 1
    done = reply.get(args.op, {})
    counts = ", ".join(f"{n} {k}" for k, n in done.items() if n)
    print(f"{args.op}: {counts} ({reply.get('rules')} rules active)")
    return 0
