"""`npaudit cluster up|down|status|apply|pod add|delete`: a cluster of N nodes on this machine, each node a network
namespace with its own embedded OVS and agent, joined by an underlay namespace (policy_agent/cluster/local.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from policy_agent.errors import AgentError

HELP = ("a cluster of N nodes on this machine (namespaces, embedded OVS, agents): up, down, status, apply, "
        "pod add|delete")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("cluster", help=HELP, description=HELP,
                       epilog="each node's config is DIR/<node>/npaudit.yaml: `npaudit apply|logs|status|trace "
                              "--config DIR/n1/npaudit.yaml` work per node")
    verbs = c.add_subparsers(dest="cluster_command", required=True)

    def verb(name: str, text: str) -> argparse.ArgumentParser:
        p = verbs.add_parser(name, help=text, description=text)
        p.add_argument("--dir", required=True, type=Path,
                       help="the cluster's directory (DIR/cluster.json, DIR/<node>/, DIR/shared)")
        return p

    u = verb("up", "start N nodes and the shared policy source; return once every node is ready")
    u.add_argument("--nodes", type=int, default=2, help="how many nodes (n1..nN; default 2)")
    u.add_argument("--encapsulation", choices=("geneve", "routed"), default="geneve")
    u.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for every node's readiness")
    u.add_argument("--kubernetes-api", default="", metavar="URL",
                   help="every node watches this Kubernetes API server (Namespaces, Pods, Nodes, policies) instead "
                        "of DIR/shared; create the Node objects of DIR/nodes.yaml there")
    u.add_argument("--deny-unknown-sources", action=argparse.BooleanOptionalAction, default=True,
                   help="every node's cluster.deny_unknown_sources (geneve; default on): a new Pod's packets to "
                        "another node are refused there until its object has reached that node")
    u.set_defaults(func=cmd_up)
    d = verb("down", "stop exactly what `up` started (agents, OVS, namespaces); DIR's files stay; idempotent")
    d.set_defaults(func=cmd_down)
    s = verb("status", "nodes, Pod subnets, underlay addresses, agent pid alive, ready")
    s.epilog = "exit status: 0 every node ready; 1 a node is not (or DIR holds no cluster)"
    s.add_argument("-o", "--output", choices=("table", "json"), default="table")
    s.set_defaults(func=cmd_status)
    a = verb("apply", "write manifests into the shared source (DIR/shared), which every node watches")
    a.add_argument("-f", "--filename", required=True, help="a file, a directory or '-'")
    a.set_defaults(func=cmd_apply)
    pod = verbs.add_parser("pod", help="Pods on the cluster's nodes", description="Pods on the cluster's nodes")
    pods = pod.add_subparsers(dest="pod_command", required=True)
    pa = pods.add_parser("add", help="a Pod netns on one node through its `npaudit cni`, its object shared",
                         description="make a Pod on NODE through that node's `npaudit cni` and publish its object "
                                     "(labels, spec.nodeName, status.podIP) in DIR/shared for every node")
    pa.add_argument("--dir", required=True, type=Path)
    pa.add_argument("--node", required=True, help="n1, n2, ...")
    pa.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    pa.add_argument("--ip", default="", help="ask the node's IPAM for this address of its Pod subnet")
    pa.add_argument("pod", metavar="NAMESPACE/NAME")
    pa.set_defaults(func=cmd_pod_add)
    pa.epilog = ("with a Kubernetes API (up --kubernetes-api) the Pod's object is the API's: create it there "
                 "(spec.nodeName NODE, its labels) first, as a scheduler would; set its status.podIP after")
    pd = pods.add_parser("delete", help="undo `pod add`: CNI DEL on its node, its namespace and object gone",
                         description="give back a Pod's port and address through its node's `npaudit cni` DEL, "
                                     "delete its network namespace and its object in DIR/shared (with a "
                                     "Kubernetes API: delete the object there)")
    pd.add_argument("--dir", required=True, type=Path)
    pd.add_argument("pod", metavar="NAMESPACE/NAME")
    pd.set_defaults(func=cmd_pod_delete)


def _say(line: str) -> None:
    print(line, flush=True)


def _fail(exc: BaseException) -> int:
    print(f"error: {exc}", file=sys.stderr)
    return 1


def cmd_up(args: argparse.Namespace) -> int:
    from policy_agent.cluster.local_run import up

    try:
        plan = up(args.dir, args.nodes, args.encapsulation, args.timeout, _say, kubernetes_api=args.kubernetes_api,
                  deny_unknown_sources=args.deny_unknown_sources)
    except (AgentError, OSError) as exc:
        return _fail(exc)
    print(f"cluster up: {len(plan.nodes)} nodes ready in {plan.dir}; `npaudit cluster down --dir {plan.dir}` "
          "stops it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from policy_agent.cluster.local_run import down

    try:
        down(args.dir, _say)
    except (AgentError, OSError) as exc:
        return _fail(exc)
    print("cluster down")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 when every node is ready, 1 otherwise (or with no cluster in DIR)."""
    from policy_agent.cluster.local_run import status

    try:
        plan, nodes = status(args.dir)
    except (AgentError, OSError) as exc:
        return _fail(exc)
    if args.output == "json":
        print(json.dumps({"dir": plan.dir, "encapsulation": plan.encapsulation, "underlay_netns": plan.underlay_netns,
                          "nodes": [n.to_json() for n in nodes],
                          "pods": [{"pod": p.ref, "node": p.node, "ip": p.ip, "netns": p.netns} for p in plan.pods]},
                         indent=2))
    else:
        print(f"{'NODE':<6} {'POD SUBNET':<16} {'ADDRESS':<18} {'PID':>8}  {'READY':<5} {'POLICIES':>8}  NETNS")
        for n in nodes:
            print(f"{n.name:<6} {n.pod_cidr:<16} {n.address:<18} {n.pid or '-':>8}  {'yes' if n.ready else 'no':<5} "
                  f"{'-' if n.policies is None else n.policies:>8}  {n.netns}"
                  + (f"  ({n.waiting})" if not n.ready and n.waiting else ""))
        for p in plan.pods:
            print(f"pod {p.ref} on {p.node}: {p.ip or '-'} ({p.netns})")
    return 0 if all(n.ready for n in nodes) else 1


def cmd_apply(args: argparse.Namespace) -> int:
    from policy_agent.cli.apply import read_manifests
    from policy_agent.cluster.local_run import apply_shared

    try:
        target = apply_shared(args.dir, args.filename, read_manifests(args.filename))
    except (AgentError, OSError) as exc:  # ManifestInputError is one
        return _fail(exc)
    print(f"written to {target}: every node's manifest directory picks it up")
    return 0


def cmd_pod_add(args: argparse.Namespace) -> int:
    from policy_agent.cluster.local_run import add_pod

    try:
        add_pod(args.dir, args.node, args.pod, args.label, _say, ip=args.ip)
    except (AgentError, OSError) as exc:
        return _fail(exc)
    return 0


def cmd_pod_delete(args: argparse.Namespace) -> int:
    from policy_agent.cluster.local_run import delete_pod

    try:
        delete_pod(args.dir, args.pod, _say)
    except (AgentError, OSError) as exc:
        return _fail(exc)
    return 0
