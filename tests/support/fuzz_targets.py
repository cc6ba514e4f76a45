"""Fuzz targets for hostile input (issue 14), shared by `make test` (a small sample) and bench/fuzz.py (>= 100k).

Each target is a hypothesis strategy and a check: the input goes through the real
parser, which may refuse it only with its own one-line error type; any other
exception is a failure. The parsers are pure (nothing is applied), so a refused
input cannot leave a partial state behind.
  manifests    documents of every kind with arbitrary data put into any field, as objects and
               as YAML text; arbitrary text (lone surrogates, control characters) and YAML built
               from anchors and aliases, as text and as non-UTF-8 bytes read from a file
  cni_request  requests with the real keys and arbitrary values, and arbitrary objects
  config       the agent config with arbitrary values in any section, arbitrary text and bytes
  api_frame    local API frames: arbitrary bytes, and well-framed arbitrary payloads
"""

from __future__ import annotations

import json
import struct
import tempfile
from dataclasses import fields, is_dataclass
from typing import Any, Callable

import yaml
from hypothesis import HealthCheck, given, seed as hseed, settings, strategies as st

from policy_agent.config import loader as config_mod
from policy_agent import rpc
from policy_agent.cni.wire import CniError, CniRequest
from policy_agent.policy import manifests

# Every code point; lone surrogates and control characters often (drawn from all of Unicode they are rare).
ANY_CHAR = (st.characters(blacklist_categories=()) | st.sampled_from(["\ud800", "\udbff", "\udc80", "\udfff"])
            | st.characters(max_codepoint=0x1F))


def any_text(max_size: int) -> st.SearchStrategy[str]:
    """Text over ANY_CHAR (st.text drops lone surrogates, so the characters are joined here)."""
    return st.lists(ANY_CHAR, max_size=max_size).map("".join)
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
           | any_text(30) | st.sampled_from(["", "*", "-1", "1e400", ".inf", "0x10", "~"]))
KEYS = st.text(max_size=10) | st.sampled_from(["name", "namespace", "from", "to", "ports", "port", "action"])
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
                      max_leaves=20)

_POLICY_DOCS = [
    {"apiVersion": "crd.antrea.io/v1beta1", "kind": "ClusterNetworkPolicy", "metadata": {"name": "p"},
     "spec": {"tier": "securityops", "priority": 5,
              "appliedTo": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}}],
              "ingress": [{"name": "r", "action": "Drop", "enableLogging": True, "logLabel": "l",
                           "from": [{"podSelector": {"matchLabels": {"app": "a"}}},
                                    {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                           "ports": [{"protocol": "TCP", "port": 80, "endPort": 90}]}]}},
    {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "n", "namespace": "z"},
     "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
              "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}],
                           "ports": [{"protocol": "UDP", "port": "dns"}]}],
              "egress": [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}},
    {"apiVersion": "crd.antrea.io/v1beta1", "kind": "Tier", "metadata": {"name": "t"}, "spec": {"priority": 7}},
    {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "x", "labels": {"app": "a"}}},
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "labels": {"team": "x"}}},
]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, path + (i,))
    return out


_WHERE = [(i, path) for i, doc in enumerate(_POLICY_DOCS) for path in _paths(doc)]


def _replace(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = list(data) if isinstance(data, list) else dict(data)
    copy[path[0]] = _replace(copy[path[0]], path[1:], value)
    return copy


@st.composite
def _aliased_yaml(draw: st.DrawFn) -> str:
    """YAML whose anchors are reused by aliases, nested a few levels (alias bombs in small)."""
    lines = [f"a0: &a0 {json.dumps(draw(any_text(8)))}"]
    for level in range(1, draw(st.integers(1, 7)) + 1):
        refs = ", ".join(f"*a{level - 1}" for _ in range(draw(st.integers(1, 9))))
        lines.append(f"a{level}: &a{level} [{refs}]")
    head = draw(st.sampled_from(["", "kind: Pod\napiVersion: v1\nmetadata: *a1\n",
                                 "kind: NetworkPolicy\napiVersion: networking.k8s.io/v1\nspec: *a2\n"]))
    return head + "\n".join(lines) + "\n"


def _manifest_input() -> st.SearchStrategy[Any]:
    mutated = st.builds(lambda where, value: ("doc", _replace(_POLICY_DOCS[where[0]], where[1], value)),
                        st.sampled_from(_WHERE), VALUES)
    text = st.tuples(st.just("text"), any_text(300) | _aliased_yaml())
    raw = st.tuples(st.just("bytes"), st.binary(max_size=200)
                    | st.builds(lambda t, b: t.encode("utf-8", "surrogatepass") + b,
                                any_text(50), st.binary(max_size=8)))
    return st.one_of(mutated, text, raw)


def _check_manifest(case: tuple[str, Any]) -> None:
    kind, value = case
    try:
        if kind == "doc":
            manifests.load_documents([value], "fuzz.yaml")
            manifests.load_text(yaml.safe_dump(value), "fuzz.yaml")
        elif kind == "text":
            manifests.load_text(value, "fuzz.yaml")
        else:
            with tempfile.NamedTemporaryFile(suffix=".yaml") as f:
                f.write(value)
                f.flush()
                manifests.load_path(f.name)
    except manifests.ManifestError as err:
        assert err.errors and all(isinstance(e, str) and e for e in err.errors), err.errors


def _cni_input() -> st.SearchStrategy[Any]:
    real = st.fixed_dictionaries({}, optional={
        "command": st.sampled_from(["ADD", "DEL", "CHECK", "VERSION", "add", ""]) | SCALARS,
        "container_id": any_text(70) | SCALARS,
        "netns": st.sampled_from(["/run/netns/x", ""]) | SCALARS,
        "ifname": st.sampled_from(["eth0", "a" * 16, "a/b"]) | SCALARS,
        "args": st.dictionaries(st.sampled_from(["K8S_POD_NAME", "K8S_POD_NAMESPACE", "IgnoreUnknown"]) | KEYS,
                                any_text(70) | SCALARS, max_size=4) | VALUES,
        "netconf": st.fixed_dictionaries({}, optional={"cniVersion": st.sampled_from(["1.0.0", "0.4.0"]) | SCALARS,
                                                       "name": SCALARS, "type": SCALARS, "ipam": VALUES}) | VALUES,
    })
    return real | VALUES


def _check_cni(obj: Any) -> None:
    try:
        CniRequest.from_wire(obj)
    except CniError as err:
        assert isinstance(err.msg, str) and err.msg, err


def _config_paths(cls: type, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key of the config, nested sections included (a section itself is a key too)."""
    out = []
    for f in fields(cls):
        kind = f.type if isinstance(f.type, type) else getattr(config_mod, str(f.type), None)
        out.append(prefix + (f.name,))
        if is_dataclass(kind):
            out += _config_paths(kind, prefix + (f.name,))
    return out


_CONFIG_PATHS = _config_paths(config_mod.AgentConfig)


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(node.get(key, {}), dict) else node
    node[path[-1]] = value
    return config


def _config_input() -> st.SearchStrategy[Any]:
    # One to three keys anywhere in the config set to arbitrary data.
    doc = st.lists(st.tuples(st.sampled_from(_CONFIG_PATHS), VALUES), min_size=1, max_size=3).map(
        lambda changes: _apply_all(changes))
    return st.one_of(st.tuples(st.just("doc"), doc),
                     st.tuples(st.just("text"), any_text(300) | _aliased_yaml()),
                     st.tuples(st.just("bytes"), st.binary(max_size=200)))


def _apply_all(changes: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for path, value in changes:
        _set(config, path, value)
    return config


def _check_config(case: tuple[str, Any]) -> None:
    kind, value = case
    try:
        if kind == "bytes":
            with tempfile.NamedTemporaryFile(suffix=".yaml") as f:
                f.write(value)
                f.flush()
                config_mod.load(f.name, environ={})
        else:
            text = value if kind == "text" else yaml.safe_dump(value)
            config_mod.loads(text, "fuzz.yaml", environ={})
    except config_mod.ConfigError as err:
        assert err.errors and all(isinstance(e, str) and e for e in err.errors), err.errors


def _frame_input() -> st.SearchStrategy[bytes]:
    payload = st.binary(max_size=80) | st.builds(lambda v: json.dumps(v).encode(), VALUES) \
        | st.builds(lambda t: t.encode("utf-8", "surrogatepass"), any_text(40))
    # Mostly the length the payload has; sometimes more than it (cut short) or past the size limit.
    framed = st.builds(lambda p, extra: struct.pack(">I", len(p) + extra) + p, payload,
                       st.sampled_from([0, 0, 0, 1, rpc.MAX_FRAME]))
    return st.binary(max_size=64) | framed


def _check_frame(data: bytes) -> None:
    try:
        rpc.decode_frame(data)
    except rpc.FrameError:
        pass


TARGETS: dict[str, tuple[Callable[[], st.SearchStrategy[Any]], Callable[[Any], None]]] = {
    "manifests": (_manifest_input, _check_manifest),
    "cni_request": (_cni_input, _check_cni),
    "config": (_config_input, _check_config),
    "api_frame": (_frame_input, _check_frame),
}


def run_target(name: str, examples: int, seed: int | None = None) -> int:
    """Run `examples` generated cases through target `name`; the count run. Raises what a case raised."""
    strategy, check = TARGETS[name]
    count = [0]

    def body(value: Any) -> None:
        count[0] += 1
        check(value)

    test = settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))(given(strategy())(body))
    if seed is not None:
        test = hseed(seed)(test)
    test()
    return count[0]
