"""Manifest text to documents: JSON as JSON, YAML with one safe loader, alias expansion and Unicode bounded.

Every input path (`npaudit apply`, the manifest directory, the applied store) parses
here, so what was validated is exactly what the store reads back. Problems are
appended as one line each, naming the document (and, where it can, the object
and field) so that nothing after this point meets a value it cannot encode.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import yaml


# Caps, each named with its number in the error it causes.
# One input file or `npaudit apply` text; the local API frame (rpc.MAX_FRAME) is smaller still.
MAX_MANIFEST_BYTES = 8 << 20
# Nodes of one document with every alias expanded: what validation will walk.
MAX_DOCUMENT_NODES = 1_000_000
# Nodes that aliases (and `<<` merge keys) add to one document beyond what is written:
# sharing a selector or a port list across rules stays far below this, an alias bomb does not.
MAX_ALIAS_NODES = 100_000

# libyaml when present (what PyPI's wheels ship); the pure loader otherwise. The same
# class reads apply input, manifest files and the applied store.
YAML_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER: type = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

_SURROGATE = re.compile("[\ud800-\udfff]")
_BARE_DOC_START = re.compile(r"^---[ \t\r]*$", re.M)

Problems = list[str]


def parse_text(text: str, source: str, problems: Problems) -> list[Any]:
    """The documents of `text`, in order; a rejected document is None so later ones keep their index.

    `.json` sources are JSON. Otherwise each part between bare `---` lines that is
    valid JSON is read as JSON (JSON is not YAML 1.1: a raw U+2028 is a line break to
    YAML), and the rest as YAML, so `npaudit apply -f DIR` may mix both.
    """
    if source.endswith(".json"):
        return parse_json(text, source, problems)
    parts = _split(text)
    if not any(_looks_json(part) for _, part in parts):
        return parse_yaml(text, source, problems)
    docs: list[Any] = []
    for first_line, part in parts:
        as_json = _json_stream(part) if _looks_json(part) else None
        if as_json is not None:
            docs += [checked(doc, f"{source}#{len(docs) + i + 1}", problems) for i, doc in enumerate(as_json)]
        else:
            docs += parse_yaml(part, source, problems, first_line=first_line, first_index=len(docs))
    return docs


def parse_json(text: str, source: str, problems: Problems) -> list[Any]:
    """A JSON value, or several separated by whitespace (as kubectl accepts)."""
    try:
        docs = _json_stream(text, strict=True) or []
    except json.JSONDecodeError as exc:
        problems.append(f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")
        return []
    except (ValueError, RecursionError) as exc:
        problems.append(f"{source}: invalid JSON: {exc}")
        return []
    return [checked(doc, f"{source}#{i}", problems) for i, doc in enumerate(docs, start=1)]


def parse_yaml(text: str, source: str, problems: Problems, first_line: int = 0,
               first_index: int = 0) -> list[Any]:
    """YAML documents; each one's alias expansion is measured on the node graph, before
    anything is built from it (a `<<` merge bomb grows while it is built)."""
    raw = _SURROGATE.search(text)
    if raw:
        line = text.count("\n", 0, raw.start()) + first_line + 1
        column = raw.start() - text.rfind("\n", 0, raw.start())
        problems.append(f"{source}: invalid Unicode at line {line}, column {column}: lone surrogate "
                        f"U+{ord(raw.group()):04X} in the text (not UTF-8)")
        return []
    try:
        return _compose_and_build(YAML_LOADER, text, source, problems, first_index)
    except yaml.YAMLError as exc:
        if YAML_LOADER is not yaml.SafeLoader and "escape" in str(getattr(exc, "problem", "")):
            # libyaml refuses surrogate escapes ("\ud83d") with a position only; the pure
            # loader decodes them, so the Unicode check can name the object and field.
            found = _surrogate_escapes(text, source, first_index)
            if found:
                problems += found
                return []
        problems.append(_yaml_error(exc, source, first_line))
    # PyYAML raises ValueError for impossible dates and over-long integers.
    except (ValueError, TypeError, RecursionError) as exc:
        problems.append(f"{source}: invalid YAML: {exc}")
    return []


def dump_yaml(docs: Iterable[Any]) -> str:
    """YAML that parse_yaml reads back as `docs`: non-ASCII escaped, so no character
    (U+2028, NEL, BOM) can be folded or dropped on the way back."""
    return yaml.dump_all(list(docs), Dumper=YAML_DUMPER, sort_keys=False, allow_unicode=False)


def size_problem(size: int, source: str) -> str | None:
    """One line when an input of `size` bytes exceeds MAX_MANIFEST_BYTES."""
    if size <= MAX_MANIFEST_BYTES:
        return None
    return f"{source}: {size:,} bytes; one manifest input may have at most {MAX_MANIFEST_BYTES:,}"


def unicode_problems(doc: Any) -> list[tuple[str, str]]:
    """(field path, reason) for every key or string value holding a lone surrogate,
    which no UTF-8 writer (store, audit log, OVS) can encode."""
    found: list[tuple[str, str]] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                found.append((path, _surrogate_reason(value)))
            continue
        if not isinstance(value, (dict, list)) or id(value) in seen:
            continue
        seen.add(id(value))  # aliases share containers: walk each once
        if isinstance(value, dict):
            children = []
            for key, item in value.items():
                child = _join(path, printable(str(key)))
                if isinstance(key, str) and _SURROGATE.search(key):
                    found.append((child, f"key: {_surrogate_reason(key)}"))
                children.append((child, item))
        else:
            children = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        stack += reversed(children)
    return found


def describe(doc: Any, where: str) -> str:
    """How messages name a document: "<Kind>/<namespace>/<name> (<source>#<index>)"."""
    if not isinstance(doc, dict):
        return f"Document ({where})"
    from policy_agent.policy.kinds import CLUSTER_SCOPED, SERVED  # here: `npaudit apply` reads sizes without the model

    api, raw_kind = doc.get("apiVersion"), doc.get("kind")
    kind = SERVED.get((api, raw_kind)) if isinstance(api, str) and isinstance(raw_kind, str) else None
    meta = m if isinstance(m := doc.get("metadata"), dict) else {}
    name = meta.get("name") if isinstance(meta.get("name"), str) and meta.get("name") else "<unnamed>"
    shown = kind or (raw_kind if isinstance(raw_kind, str) else "<no kind>")
    if kind in CLUSTER_SCOPED or kind is None and "namespace" not in meta:
        return printable(f"{shown}/{name} ({where})")
    ns = meta.get("namespace") if isinstance(meta.get("namespace"), str) and meta.get("namespace") else "default"
    return printable(f"{shown}/{ns}/{name} ({where})")


def printable(text: str) -> str:
    """`text` with lone surrogates written as \\udXXX, so a message about them can be printed."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8") if _SURROGATE.search(text) else text


# --- YAML ----------------------------------------------------------------------------------------

def _compose_and_build(loader_class: type, text: str, source: str, problems: Problems,
                       first_index: int) -> list[Any]:
    docs: list[Any] = []
    loader = loader_class(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            where = f"{source}#{first_index + len(docs) + 1}"
            problem = _expansion_problem(node)
            if problem:
                problems.append(f"{describe(_node_summary(node), where)}: {problem}")
                docs.append(None)
            else:
                docs.append(checked(loader.construct_document(node), where, problems))
    finally:
        loader.dispose()
    return docs


def _surrogate_escapes(text: str, source: str, first_index: int) -> Problems:
    """The Unicode problems the pure loader finds in `text` (empty when it finds none)."""
    found: Problems = []
    try:
        _compose_and_build(yaml.SafeLoader, text, source, found, first_index)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return []
    return [line for line in found if "surrogate" in line]


def _yaml_error(exc: yaml.YAMLError, source: str, first_line: int) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1 + first_line}, column {mark.column + 1}" if mark else ""
        return f"{source}: invalid YAML{where}: {exc.problem or exc.context or exc}"
    return f"{source}: invalid YAML: {exc}"


def _children(node: yaml.Node) -> list[tuple[str, yaml.Node]]:
    if isinstance(node, yaml.SequenceNode):
        return [(f"[{i}]", item) for i, item in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        out: list[tuple[str, yaml.Node]] = []
        for key, value in node.value:
            label = printable(str(key.value)) if isinstance(key, yaml.ScalarNode) else "?"
            out += [("", key), (label, value)]
        return out
    return []


def _expansion_problem(root: yaml.Node) -> str | None:
    """Why the document's node graph is too big once aliases are expanded, or None.

    Sizes are summed over the graph with each node visited once, so measuring a
    billion-node bomb costs only the nodes actually written."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            open_nodes.discard(nid)
            size[nid] = 1 + sum(size[id(child)] for _, child in _children(node))
        elif nid in open_nodes:
            return "a YAML alias refers to a node that contains it (a recursive structure)"
        elif nid not in size:
            open_nodes.add(nid)
            stack.append((node, True))
            stack += [(child, False) for _, child in _children(node) if id(child) not in size]
    total, written = size[id(root)], len(size)
    if total - written > MAX_ALIAS_NODES:
        return (f"{_heaviest_field(root, size)}YAML aliases expand the document to {total:,} nodes from "
                f"{written:,} written; aliases may add at most {MAX_ALIAS_NODES:,}")
    if total > MAX_DOCUMENT_NODES:
        return (f"{_heaviest_field(root, size)}the document has {total:,} nodes; "
                f"at most {MAX_DOCUMENT_NODES:,} are allowed")
    return None


def _heaviest_field(root: yaml.Node, size: dict[int, int]) -> str:
    """"<path>: " of the deepest field holding nine tenths of the document, to point at the bomb."""
    path, node = "", root
    while True:
        children = [(label, child) for label, child in _children(node) if label]
        if not children:
            break
        label, child = max(children, key=lambda c: size[id(c[1])])
        if size[id(child)] * 10 < size[id(node)] * 9:
            break
        path = f"{path}{label}" if label.startswith("[") else _join(path, label)
        node = child
    return f"{path}: " if path else ""


def _node_summary(node: yaml.Node) -> dict[str, Any]:
    """apiVersion, kind and metadata name/namespace read from a node without building it."""
    def scalars(mapping: yaml.Node) -> dict[str, Any]:
        if not isinstance(mapping, yaml.MappingNode):
            return {}
        return {k.value: (v.value if isinstance(v, yaml.ScalarNode) else v) for k, v in mapping.value
                if isinstance(k, yaml.ScalarNode)}
    top = scalars(node)
    meta = scalars(m) if isinstance(m := top.get("metadata"), yaml.Node) else {}
    return {"apiVersion": top.get("apiVersion"), "kind": top.get("kind"),
            "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace") and isinstance(v, str)}}


# --- JSON and shared -----------------------------------------------------------------------------

def _json_stream(text: str, strict: bool = False) -> list[Any] | None:
    """Every JSON value of `text`; None (or, strict, the decoder's error) when it is not JSON."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    pos = _skip_space(text, 0)
    try:
        while pos < len(text):
            doc, pos = decoder.raw_decode(text, pos)
            docs.append(doc)
            pos = _skip_space(text, pos)
    except (ValueError, RecursionError):
        if strict:
            raise
        return None
    return docs


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _split(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each part between bare `---` lines."""
    parts: list[tuple[int, str]] = []
    start, line = 0, 0
    for marker in _BARE_DOC_START.finditer(text):
        parts.append((line, text[start:marker.start()]))
        line += text.count("\n", start, marker.end()) + 1
        start = marker.end() + 1
    parts.append((line, text[start:]))
    return [(first, part) for first, part in parts if part.strip()]


def _looks_json(part: str) -> bool:
    return part.lstrip()[:1] in ("{", "[")


def checked(doc: Any, where: str, problems: Problems) -> Any:
    """`doc`, or None with one line per field when it holds invalid Unicode (a List's
    items are named as objects of their own, as the loader names them)."""
    parts = [(doc, where)]
    if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
        parts = [({k: v for k, v in doc.items() if k != "items"}, where)] + \
            [(item, f"{where}.items[{i}]") for i, item in enumerate(doc["items"])]
    found = [(describe(part, at), field) for part, at in parts for field in unicode_problems(part)]
    problems += [f"{header}: {path}: {reason}" if path else f"{header}: {reason}" for header, (path, reason) in found]
    return None if found else doc


def _surrogate_reason(text: str) -> str:
    pair = re.search("[\ud800-\udbff][\udc00-\udfff]", text)
    if pair:
        joined = pair.group().encode("utf-16-le", "surrogatepass").decode("utf-16-le")
        escaped = "".join(f"\\u{ord(c):04x}" for c in pair.group())
        return (f"invalid Unicode: {escaped} is a UTF-16 surrogate pair, which YAML reads as two lone "
                f"surrogates; write the character itself or \\U{ord(joined):08X}")
    bad = _SURROGATE.search(text)
    return f"invalid Unicode: lone surrogate U+{ord(bad.group()):04X} at character {bad.start() + 1}" if bad \
        else "invalid Unicode"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
