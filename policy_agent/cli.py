"""The `npaudit` command line."""

from __future__ import annotations

import os
import sys

from policy_agent.errors import AgentError, one_line, printable

# `npaudit cni` is exec'd for every Pod start and goes through this module: the top
# imports only what that path needs; each command imports its own modules
# (tests/unit/test_rpc.py holds the cni path to its list).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse
    import asyncio
    from typing import TextIO

    from policy_agent import config as config_mod


def _setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _load_config(path: str | None) -> "config_mod.AgentConfig":
    from policy_agent import config as config_mod

    try:
        # No file: the defaults, still with the node name from NODE_NAME when that is set.
        return config_mod.loads("", "<defaults>") if path is None else config_mod.load(path)
    except config_mod.ConfigError as exc:
        for line in exc.errors:
            print(f"config error: {line}", file=sys.stderr)
        raise SystemExit(2) from exc


def cmd_check_config(args: argparse.Namespace) -> int:
    from policy_agent import config as config_mod

    try:
        config_mod.load(args.file)
    except config_mod.ConfigError as exc:
        for line in exc.errors:
            print(f"{args.file}: {line}")
        return 1
    print(f"{args.file}: OK")
    return 0


def install_stop_signals(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set `stop`, in this process only.

    Not loop.add_signal_handler: its wakeup socket is inherited by children that
    libraries fork (pyroute2 does, to enter network namespaces), and a signal
    such a child receives is then read by our loop as if the agent had got it:
    the agent stopped in the middle of CNI ADDs. The pid check makes a forked
    child's signal the child's business.
    """
    import signal

    main_pid = os.getpid()

    def on_signal(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            loop.call_soon_threadsafe(stop.set)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging

    from auditlog.errors import AuditLogError
    from packetin.model import Category
    from policy_agent.agent import Agent
    from policy_agent.policy_packetins import JsonTap

    cfg = _load_config(args.config)
    _setup_logging(cfg.log_level)
    log = logging.getLogger("npaudit")
    tap_path = args.tap if args.tap is not None else cfg.packetin.tap
    handlers = {}
    tap_file = None
    agents: list[Agent] = []

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(asyncio.get_running_loop(), stop)
        agents.append(Agent(cfg, handlers))
        await agents[0].run(stop)

    try:
        if tap_path:
            tap_file = sys.stdout if tap_path == "-" else _open_private(tap_path)
            tap = JsonTap(tap_file)
            handlers = {Category.POLICY: tap, Category.TRACEFLOW: tap}
        asyncio.run(main())
    except Exception as exc:  # one line for the operator; the traceback only at debug level
        log.debug("agent stopped by an error", exc_info=True)
        known = isinstance(exc, (AgentError, AuditLogError))
        print(f"error: {printable(str(exc)) if known else 'agent stopped: ' + one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if tap_file is not None and tap_file is not sys.stdout:
            tap_file.close()
    writer = agents[0].audit_writer
    lost = writer.snapshot().lost() if writer is not None else {}
    stats = json.dumps(agents[0].demux.stats())
    if lost:  # never "cleanly" over records that are not in the audit file
        log.error("stopped, %d audit records NOT written (%s): %s", sum(lost.values()),
                  ", ".join(f"{reason} {n}" for reason, n in lost.items()), stats)
        return 1
    log.info("stopped cleanly: %s", stats)
    return 0


def _open_private(path: str) -> TextIO:
    """Append to `path`, created (or narrowed to) 0600: the debug tap holds packet bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return open(fd, "a", buffering=1)


def cmd_ovs(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from policy_agent.errors import OvsError
    from policy_agent.ovs.embedded import EmbeddedOvs

    cfg = _load_config(args.config)
    _setup_logging(cfg.log_level)
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
    print(json.dumps(ovs.status(), indent=2))
    if args.action == "status":
        return 0 if ovs.status()["ovs_vswitchd_pid"] else 3
    return 0


class ManifestInputError(AgentError):
    """`npaudit apply -f` input that is not sent to the agent; the text is the one line to print."""


def _read_manifests(filename: str) -> str:
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


# `npaudit apply|delete` exit status when the agent went away before answering.
EXIT_OUTCOME_UNKNOWN = 3


def cmd_apply(args: argparse.Namespace) -> int:
    from policy_agent.rpc import FrameError
    from policy_agent.sources.local_api import OutcomeUnknown, call

    cfg = _load_config(args.config)
    try:
        text = _read_manifests(args.filename)
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
    print(f"{args.op}: " + ", ".join(f"{n} {k}" for k, n in done.items() if n) + f" ({reply.get('rules')} rules active)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from policy_agent.demo import run_demo

    _setup_logging("info")
    return run_demo(duration=args.duration, keep=args.keep)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("npaudit")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(prog="npaudit", description="Network-policy audit trail for Open vSwitch")
    p.add_argument("--version", action="version", version=f"npaudit {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("agent", help="run the node agent in the foreground (SIGTERM stops it)")
    a.add_argument("--config", help="YAML config (default: built-in defaults, see config/npaudit.yaml)")
    a.add_argument("--tap", help="write one JSON line per packet-in to this path ('-' = stdout)")
    a.set_defaults(func=cmd_agent)

    c = sub.add_parser("check-config", help="validate a config file; print each error with its field")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)

    o = sub.add_parser("ovs", help="manage the embedded Open vSwitch")
    o.add_argument("action", choices=["up", "down", "status"])
    o.add_argument("--config")
    o.add_argument("--run-dir", help="override ovs.run_dir")
    o.add_argument("--netns", help="override ovs.netns ('' = current namespace)")
    o.add_argument("--purge", action="store_true", help="with down: delete the run directory too")
    o.set_defaults(func=cmd_ovs)

    for op in ("apply", "delete"):
        ap = sub.add_parser(op, help=f"{op} manifests (file, directory or '-') on the running agent",
                            description=f"{op.capitalize()} manifests on the running agent, all or nothing.",
                            epilog="exit status: 0 done; 1 rejected or failed, nothing changed; "
                                   f"{EXIT_OUTCOME_UNKNOWN} outcome unknown: the agent went away before "
                                   "answering (its next start keeps what OVS enforced; `npaudit status` says which)")
        ap.add_argument("-f", "--filename", required=True)
        ap.add_argument("--config", help="the agent's config (for its state_dir)")
        ap.set_defaults(func=cmd_apply, op=op)

    # Listed for --help only: main() hands `cni` to the plugin before any parsing.
    sub.add_parser("cni", help="CNI plugin (ADD/DEL/CHECK/VERSION from CNI_* env and stdin), "
                               "forwarded to the agent's CNI socket")

    sub.add_parser("verify", add_help=False,
                   help="check the audit log's hash chain (live and rotated files); exit 1 on a break "
                        "(npaudit verify --help)")

    from policy_agent.syslog_commands import add_parser as add_syslog_parser

    add_syslog_parser(sub, _load_config)
    from policy_agent.logs_cli import add_parser as add_logs_parser

    add_logs_parser(sub)
    from policy_agent.status_cli import add_parser as add_status_parsers

    add_status_parsers(sub, _load_config)
    from policy_agent.bundle_cli import add_parser as add_bundle_parser

    add_bundle_parser(sub)
    from policy_agent.trace_cli import add_parser as add_trace_parser

    add_trace_parser(sub, _load_config)

    d = sub.add_parser("demo", help="private OVS, two Pods, logged flows, real traffic, live packet-ins")
    d.add_argument("--duration", type=float, default=0.0, help="keep running this many seconds after the traffic")
    d.add_argument("--keep", action="store_true", help="leave OVS and the Pod namespaces up afterwards")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cni"]:  # a runtime starts this for every Pod: import as little as possible
        from policy_agent.cni.plugin import run

        return run(os.environ, sys.stdin.buffer.read(), sys.stdout)
    import warnings

    # ovs.poller probes for eventlet (it never monkey-patches); its import warning is noise.
    warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated")
    if argv[:1] == ["verify"]:  # verify has options of its own: hand it the rest untouched
        from auditlog.verify import main as verify_main

        return verify_main(argv[1:] or ["/var/log/npaudit"])
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
