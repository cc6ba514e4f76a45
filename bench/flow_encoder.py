#!/usr/bin/env python3
"""µs per flow_mod: os-ken's OFPFlowMod vs packetin.flow_encoder, same flows, same run. Prints JSON.

The flows are what the agent installs for bench/cni_latency.py's rule set
(default 1,000 rules, 10 per ClusterNetworkPolicy, with --pods bench Pods):
the compiled policy flows, the fixed tables and each Pod's flows. For ADD and
for DELETE_STRICT, each round serialises every flow both ways, the way the
channel serialises a batch (b"".join(messages.serialize(msg, xid) ...)):

  osken  the message built as before this encoder: os-ken's OFPFlowMod (FlowMod.to_ofp)
  fast   messages.flow_add / flow_delete_strict as they are now (the encoder)

The two take turns chunk by chunk (who goes first alternates), and the time is
this process's CPU time, so load from elsewhere on the shared machine hits both
alike; wall time is reported too. The ratio is the median of the per-round
ratios. Every flow's bytes are compared with os-ken's once before timing.
Run: `.venv/bin/python bench/flow_encoder.py [--rules 1000] [--pods 15] [--rounds 5]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cni_latency import BENCH_NS, CLIENTS, namespace_docs, policy_docs  # noqa: E402  (also puts the repo on the path)

from os_ken.ofproto import ofproto_v1_5 as ofp  # noqa: E402

from packetin import messages  # noqa: E402
from packetin.flow_encoder import Unsupported, encode_flow_mod  # noqa: E402
from packetin.messages import FlowSpec  # noqa: E402
from policy_agent.ovs import tables  # noqa: E402
from policy_agent.policy.compiler import ClusterState, Endpoint, compile_policies  # noqa: E402
from policy_agent.policy.manifests import load_text  # noqa: E402
from policy_agent.policy.model import STANDARD_TIERS, Pod  # noqa: E402

COMMANDS = {"add": (ofp.OFPFC_ADD, messages.flow_add), "delete_strict": (ofp.OFPFC_DELETE_STRICT,
                                                                         messages.flow_delete_strict)}


def agent_flows(n_rules: int, n_pods: int) -> list[FlowSpec]:
    """Everything the agent installs for the rule set with the client and `n_pods` bench Pods."""
    objs = load_text("\n---\n".join(namespace_docs() + policy_docs(n_rules)), "bench")
    eps: list[Endpoint] = []
    for ns, count in CLIENTS.items():
        eps += [Endpoint(Pod(ns, f"c{i}", (("app", "client"),)), "", "02:00:0a:f6:00:01", 0) for i in range(count)]
    eps += [Endpoint(Pod(BENCH_NS, f"p{i}", (("app", "bench"),)), "", "02:00:0a:f6:00:02", 0) for i in range(n_pods)]
    eps = [Endpoint(e.pod, f"10.246.{(i + 2) // 256}.{(i + 2) % 256}", e.mac, i + 2) for i, e in enumerate(eps)]
    state = ClusterState(namespaces={ns.name: ns for ns in objs.namespaces}, endpoints=tuple(eps),
                         policies=tuple(objs.policies), tiers=dict(STANDARD_TIERS), meters=True, round_=1)
    flows = tables.fixed_flows(1) + compile_policies(state).flows
    for e in eps:
        flows += tables.pod_flows(1, ip=e.ip, mac=e.mac, ofport=e.ofport)
    return flows


CHUNK = 500  # flows per turn


def timed_round(flows: list[FlowSpec], paths: dict[str, Callable[[FlowSpec, int], bytes]]
                ) -> dict[str, tuple[float, float]]:
    """{path: (CPU µs per flow, wall µs per flow)} for one pass of every path over every flow."""
    cpu = dict.fromkeys(paths, 0.0)
    wall = dict.fromkeys(paths, 0.0)
    names = list(paths)
    gc.collect()
    for n, start in enumerate(range(0, len(flows), CHUNK)):
        chunk = flows[start:start + CHUNK]
        for name in names if n % 2 == 0 else reversed(names):
            encode = paths[name]
            c0, w0 = time.process_time(), time.perf_counter()
            b"".join([encode(f, xid) for xid, f in enumerate(chunk, start=1)])
            cpu[name] += time.process_time() - c0
            wall[name] += time.perf_counter() - w0
    return {name: (cpu[name] / len(flows) * 1e6, wall[name] / len(flows) * 1e6) for name in paths}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    flows = agent_flows(args.rules, args.pods)
    out: dict[str, Any] = {"rules": args.rules, "bench_pods": args.pods, "flows": len(flows), "rounds": args.rounds,
                           "python": platform.python_version()}
    for name, (command, build) in COMMANDS.items():
        covered = 0
        for xid, f in enumerate(flows, start=1):
            reference = messages.serialize(build(f).to_ofp(), xid)
            if messages.serialize(build(f), xid) != reference:
                raise SystemExit(f"bytes differ from os-ken for {name} {f.describe()}")
            try:
                covered += encode_flow_mod(f, command, xid) == reference
            except Unsupported:
                pass

        def osken(f: FlowSpec, xid: int, build: Callable[[FlowSpec], Any] = build) -> bytes:
            return messages.serialize(build(f).to_ofp(), xid)

        def fast(f: FlowSpec, xid: int, build: Callable[[FlowSpec], Any] = build) -> bytes:
            return messages.serialize(build(f), xid)

        rounds = [timed_round(flows, {"osken": osken, "fast": fast}) for _ in range(args.rounds)]
        ratios = [r["osken"][0] / r["fast"][0] for r in rounds]
        out[name] = {
            "osken_us_per_flow": round(statistics.median(r["osken"][0] for r in rounds), 2),
            "fast_us_per_flow": round(statistics.median(r["fast"][0] for r in rounds), 2),
            "ratio": round(statistics.median(ratios), 1),
            "ratio_min": round(min(ratios), 1),
            "wall_osken_us_per_flow": round(statistics.median(r["osken"][1] for r in rounds), 2),
            "wall_fast_us_per_flow": round(statistics.median(r["fast"][1] for r in rounds), 2),
            "bytes_identical": True,
            "encoded_by_fast_path": f"{covered}/{len(flows)}",
        }
    out["target_ratio"] = 10
    out["meets_target"] = all(out[name]["ratio"] >= out["target_ratio"] for name in COMMANDS)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
