"""The `npaudit` command line: every verb's parser (each in its own module here) and the entry point."""

from __future__ import annotations

import os
import sys

# `npaudit cni` is exec'd for every Pod start and goes through this module: the top
# imports only what that path needs; the verbs are imported by build_parser
# (tests/unit/policy_agent/test_rpc.py holds the cni path to its list).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import argparse
    from types import ModuleType
    from typing import Any, Collection


# Every verb: the module here that builds its parser, and its line in `npaudit --help`. Only the
# module of the verb being run is imported, so `--version`, `--help` and each verb start without
# the others' imports (tests/unit/policy_agent/cli/test_startup.py holds these lines equal to the
# modules' own). `cni` has no module: main() hands it to the plugin before any parsing.
VERBS: dict[str, tuple[str | None, str]] = {
    "agent": ("agent", "run the node agent in the foreground (SIGTERM stops it)"),
    "check-config": ("check_config", "validate a config file; print each error with its field"),
    "ovs": ("ovs", "manage the embedded Open vSwitch"),
    "apply": ("apply", "apply manifests (file, directory or '-') on the running agent"),
    "delete": ("apply", "delete manifests (file, directory or '-') on the running agent"),
    "cni": (None, "CNI plugin (ADD/DEL/CHECK/VERSION from CNI_* env and stdin), forwarded to the agent's CNI socket"),
    "verify": ("verify", "check the audit log's hash chain (live and rotated files); exit 1 on a break"),
    "syslog": ("syslog", "operate the syslog forwarder: status, test"),
    "logs": ("logs", "show audit records, filtered, and follow them (like hubble observe)"),
    "observe": ("logs", "`logs` with hubble observe's spellings (--verdict, --from-pod, --to-pod, "
                        "--traffic-direction, ...)"),
    "status": ("status", "the running agent: OpenFlow, OVS, meters, eBPF tier, traces, policy, audit chain head, "
                         "syslog, recent problems"),
    "stats": ("stats", "counts over a window of the audit files (by disposition, policy, rule, Pod), plus the "
                       "running agent's packet-in drops, meter drops and packets the eBPF offload dropped"),
    "bundle": ("bundle", "write a support bundle (tar.gz with manifest.json)"),
    "get": ("get", "list what the running agent has in force: policies, rules with their ids and tiers, Pods "
                   "(classes, flows)"),
    "trace": ("trace", "trace one packet from a Pod through the OVS pipeline: each table, the deciding rule, "
                       "the outcome"),
    "demo": ("demo", "private OVS, two Pods, logged flows, real traffic, live packet-ins"),
    "completion": ("completion", "print a shell completion script: source <(npaudit completion bash)"),
    "cluster": ("cluster", "a cluster of N nodes on this machine (namespaces, embedded OVS, agents): up, down, "
                           "status, apply, pod add|delete"),
}


def build_parser(verbs: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every verb; given `verbs`, only their modules are imported and built and every
    other verb is its help line alone (enough for `npaudit --help` and for naming a verb wrongly)."""
    import argparse

    class _Version(argparse.Action):  # the installed version is looked up only when asked for
        def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
            from policy_agent.cli.common import version

            print(f"npaudit {version()}")  # on stdout, as argparse's own version action does
            parser.exit()

    p = argparse.ArgumentParser(prog="npaudit", description="Network-policy audit trail for Open vSwitch")
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    p.set_defaults(build_parser=build_parser)  # for `npaudit completion`, which needs every verb
    sub = p.add_subparsers(dest="command", required=True)
    load = {VERBS[v][0] for v in VERBS} if verbs is None else {VERBS[v][0] for v in verbs if v in VERBS}
    for name, (module, text) in VERBS.items():
        if name in sub.choices:
            continue  # its module added it with another verb (apply and delete)
        if module is None or module not in load:
            sub.add_parser(name, help=text, add_help=False)
        else:
            _verb_module(module).add_parser(sub)
    return p


def _verb_module(module: str) -> ModuleType:
    """One verb's module, by an import statement of its own (the layer checks read import statements)."""
    if module == "agent":
        from policy_agent.cli import agent

        return agent
    if module == "apply":
        from policy_agent.cli import apply

        return apply
    if module == "bundle":
        from policy_agent.cli import bundle

        return bundle
    if module == "check_config":
        from policy_agent.cli import check_config

        return check_config
    if module == "cluster":
        from policy_agent.cli import cluster

        return cluster
    if module == "completion":
        from policy_agent.cli import completion

        return completion
    if module == "demo":
        from policy_agent.cli import demo

        return demo
    if module == "get":
        from policy_agent.cli import get

        return get
    if module == "logs":
        from policy_agent.cli import logs

        return logs
    if module == "ovs":
        from policy_agent.cli import ovs

        return ovs
    if module == "stats":
        from policy_agent.cli import stats

        return stats
    if module == "status":
        from policy_agent.cli import status

        return status
    if module == "syslog":
        from policy_agent.cli import syslog

        return syslog
    if module == "trace":
        from policy_agent.cli import trace

        return trace
    if module == "verify":
        from policy_agent.cli import verify

        return verify
    raise ValueError(f"no verb module {module!r}")


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
    verb = next((word for word in argv if not word.startswith("-")), None)  # no top-level option takes a value
    args = build_parser([verb] if verb else []).parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
