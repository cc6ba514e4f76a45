"""`npaudit agent`: run the node agent in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from policy_agent.cli.common import CONFIG_HELP, load_config, open_private, setup_logging
from policy_agent.errors import AgentError, one_line, printable

if TYPE_CHECKING:
    import asyncio  # loaded when the agent runs, not to parse its options


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    a = sub.add_parser("agent", help="run the node agent in the foreground (SIGTERM stops it)")
    a.add_argument("--config", help=f"YAML config, see config/npaudit.yaml {CONFIG_HELP}")
    a.add_argument("--tap", help="write one JSON line per packet-in to this path ('-' = stdout)")
    a.set_defaults(func=cmd_agent)


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

    def on_dump(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            dump_stacks(sys.stderr)

    signal.signal(signal.SIGUSR2, on_dump)


def dump_stacks(out: TextIO) -> None:
    """Every thread's stack to `out` (SIGUSR2: for an agent that seems stuck). Run by Python's handler in the
    main thread, under the GIL. Not faulthandler's dump of all threads from the signal itself: that reads
    the other threads' frames while they run, and it crashed the agent (SIGSEGV) once in 17 tries."""
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    text = "".join(f"Thread {ident:#x} ({names.get(ident, '?')}), most recent call last:\n"
                   + "".join(traceback.format_stack(frame)) for ident, frame in sys._current_frames().items())
    out.write(f"{text}(end of the stacks of {len(names)} threads)\n")  # one write: a reader sees it whole
    out.flush()


def cmd_agent(args: argparse.Namespace) -> int:
    import asyncio
    import json
    import logging

    from auditlog.errors import AuditLogError
    from packetin.demux import Handler
    from packetin.model import Category
    from packetin.quiet import new_event_loop
    from policy_agent.agent import Agent
    from policy_agent.policy_packetins import JsonTap
    from policy_agent.sources import kubernetes_own_node as own_node

    cfg = load_config(args.config)
    setup_logging(cfg.log_level)
    log = logging.getLogger("npaudit")
    tap_path = args.tap if args.tap is not None else cfg.packetin.tap
    handlers: dict[int, Handler] = {}
    tap_file: TextIO | None = None
    agents: list[Agent] = []

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(asyncio.get_running_loop(), stop)
        # Kubernetes mode with the host's OVS: this node's underlay address from its Node, before anything is built.
        resolved = await asyncio.to_thread(own_node.from_api, cfg)
        agents.append(Agent(resolved, handlers))
        await agents[0].run(stop)

    try:
        if tap_path:
            tap_file = sys.stdout if tap_path == "-" else open_private(tap_path)
            tap = JsonTap(tap_file)
            handlers = {Category.POLICY: tap, Category.TRACEFLOW: tap}
        with asyncio.Runner(loop_factory=new_event_loop) as runner:  # its wait arms a lone record (packetin/quiet.py)
            runner.run(main())
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
