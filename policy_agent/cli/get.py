"""`npaudit get policies|rules|pods`: what the running agent has in force, as kubectl lists it (read over the
local API; policy_agent/sources/inventory.py builds the answer)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from policy_agent.cli.common import CONFIG_HELP, ApiCall, agent_address

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing's names here
if TYPE_CHECKING:
    from policy_agent.config.client import AgentAddress
    from policy_agent.config.loader import AgentConfig

HELP = "list what the running agent has in force: policies, rules with their ids and tiers, Pods (classes, flows)"
# kubectl's names and short names for the kinds (singular, plural, short), and ours for rules.
KIND_NAMES = {"policies": ("policies", "policy", "pol", "netpol", "networkpolicies", "acnp", "anp"),
              "rules": ("rules", "rule"), "pods": ("pods", "pod", "po")}
_KIND = {alias: kind for kind, aliases in KIND_NAMES.items() for alias in aliases}
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

# (heading, key in an item) per kind; wide adds the second list.
COLUMNS: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {
    "policies": ([("NAMESPACE", "namespace"), ("NAME", "name"), ("KIND", "kind"), ("TIER", "tier"),
                  ("PRIORITY", "priority"), ("RULES", "rules")],
                 [("LOGGED", "logged"), ("APPLIED-TO", "applied_to")]),
    "rules": ([("ID", "id"), ("TIER", "tier"), ("POLICY", "policy"), ("RULE", "name"), ("DIRECTION", "direction"),
               ("ACTION", "action")],
              [("PRIORITY", "priority"), ("LOGGED", "logged"), ("LOG-LABEL", "log_label")]),
    "pods": ([("NAMESPACE", "namespace"), ("NAME", "name"), ("IP", "ip"), ("CLASS", "class")],
             [("OFPORT", "ofport"), ("LABELS", "labels"), ("GROUPS", "groups")]),
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("get", help=HELP, description=HELP + ". The rule ids are those audit records carry "
                       "(rule.id).", epilog="exit status: 0 listed; 1 no agent answers or nothing by that name; "
                       "2 usage error")
    p.add_argument("kind", choices=sorted(_KIND), metavar="{policies,rules,pods}",
                   help="what to list (also: policy, pol, netpol, rule, pod, po)")
    p.add_argument("name", nargs="?", help="only this one (a Pod or a policy; NAMESPACE/NAME also works); for a "
                                           "rule: its rule name or its policy's name")
    p.add_argument("-n", "--namespace", help="only this namespace")
    p.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table")
    p.add_argument("--flows", action="store_true", help="pods: each Pod's flows in force (forwarding, class, "
                                                        "and every policy flow matching it)")
    p.add_argument("--config", help=f"the agent's config (for its state_dir, where the API socket is) {CONFIG_HELP}")
    p.set_defaults(func=lambda args: run_get(agent_address(args.config), request_of(args), args.output))


def request_of(args: Any) -> dict[str, Any]:
    """The local API request for the parsed arguments ("ns/name" split into namespace and name)."""
    req: dict[str, Any] = {"op": "get", "kind": _KIND[args.kind]}
    namespace, name = args.namespace, args.name
    if name and "/" in name:
        namespace, name = name.split("/", 1)
    if namespace:
        req["namespace"] = namespace
    if name:
        req["name"] = name
    if args.flows:
        req["flows"] = True
    return req


def run_get(cfg: AgentAddress | AgentConfig, request: dict[str, Any], output: str = "table", *,
            api: ApiCall | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    from policy_agent.rpc import call

    out, err = out or sys.stdout, err or sys.stderr
    try:
        reply = (api or call)(cfg.api_socket, request)
    except OSError as exc:
        print(f"npaudit get: no agent answers at {cfg.api_socket} ({exc.strerror or exc}); is `npaudit agent` "
              "running with this config?", file=err)
        return EXIT_ERROR
    except Exception as exc:  # OutcomeUnknown, a bad frame: still one line
        print(f"npaudit get: agent at {cfg.api_socket}: {exc}", file=err)
        return EXIT_ERROR
    items = reply.get("items")
    if not reply.get("ok") or not isinstance(items, list):
        errors = "; ".join(map(str, reply.get("errors") or ["no items in the reply"]))
        print(f"npaudit get: {_safe(errors)}", file=err)
        return EXIT_ERROR
    kind = str(request.get("kind"))
    if output == "json":
        print(json.dumps({"kind": kind, "items": items}, indent=2), file=out)
    elif output == "yaml":
        import yaml

        out.write(yaml.safe_dump({"kind": kind, "items": items}, sort_keys=False, allow_unicode=False))
    else:
        print(table(kind, items, wide=output == "wide"), file=out)
    return EXIT_OK


def table(kind: str, items: list[Any], *, wide: bool = False) -> str:
    """kubectl-like columns; a Pod's flows (when asked for) follow the table, indented under its name."""
    narrow, more = COLUMNS[kind]
    columns = narrow + (more if wide else [])
    rows = [[h for h, _ in columns]]
    for item in items:
        rows.append([_cell(item.get(key)) if isinstance(item, dict) else "?" for _, key in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = ["   ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if len(rows) == 1:
        lines = [f"no {kind} in force"]
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("flows"), list):
            lines.append(f"\nflows of {_safe(item.get('namespace'))}/{_safe(item.get('name'))}:")
            lines += [f"  {_safe(flow)}" for flow in item["flows"]] or ["  (none)"]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-" if value is None else "<none>"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return _safe(",".join(f"{k}={v}" for k, v in value.items())) or "<none>"
    if isinstance(value, list):
        return _safe("; ".join(map(str, value))) or "<none>"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _safe(str(value))


def _safe(value: Any) -> str:
    from policy_agent.errors import printable

    return printable(str(value))
