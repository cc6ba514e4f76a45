"""Per-node bookkeeping for `npaudit verify` and for readers of SIEM copies: each node's own chain, and re-sends.

A SIEM copy holds the records of many nodes (one merged file, or one file per
node), and the forwarder delivers at least once, so a copy holds some records
twice. Each node (``observer.hostname`` of its records, within one file set)
keeps its own chain; `verify` walks the files once and hands every record to
its node's `NodeChain`.

How much is remembered, and why that is enough
----------------------------------------------
Per node: the last seq and chain (to check the next record) and a window of
the most recent records' chain values (`RecentChains`: 32 bytes and a size per
record, about `DEFAULT_WINDOW_BYTES` of record lines). A record whose seq the
node has already passed is then judged against that window:

- the same seq, the same chain value, and a content that seals after the
  chain of seq - 1 (so the same record, byte for byte in the JSON data model):
  a duplicate, counted, never a break;
- the same seq with other content or another chain value: an edit (a break);
- a seq older than the window: a distinct finding (`BEYOND_WINDOW`), since
  whether it is the same record can no longer be told without the record it
  repeats.

Where re-sends come from (auditlog/syslog/forwarder.py): after a dropped
connection or a receiver restart the forwarder sends again what followed its
newest confirmed batch: at most its send window (``window_bytes``, 8 MiB by
default) plus what the receiver may hold acknowledged and unread
(``receive_buffer_bytes``: the receiver's ``net.ipv4.tcp_rmem`` maximum, 6 MiB
by Linux's default, 32 MiB on some hosts). Those counts are bytes of frames,
and every frame is longer than its record line, so a window of 64 MiB of
record lines covers the defaults with room to spare. Memory: 36 bytes per
record in the window, about 8 MB per node at the smallest records (~300
bytes). A forwarder (or agent) that crashed re-sends from its last saved
checkpoint as well, which can be older (issue 23: with a large receive buffer
the checkpoint may not move at low rates); such a copy verifies with a larger
``--duplicate-window``, and without one it is reported, never silently passed.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from auditlog.chain import GENESIS, digest, seals

if TYPE_CHECKING:
    from auditlog.verify import Break

__all__ = ["BEYOND_WINDOW", "DEFAULT_WINDOW_BYTES", "DIFFERS", "DUPLICATE", "NodeChain", "NodeKey", "NodeResult",
           "NodeTable", "RecentChains", "break_json", "node_label", "node_of"]

DEFAULT_WINDOW_BYTES = 64 << 20  # record-line bytes remembered per node (see the module docstring)

# What a record with an already passed seq is (RecentChains.judge).
DUPLICATE = "duplicate"          # the same record again: an at-least-once re-send
DIFFERS = "differs"              # the same seq, other content or chain: an edit
BEYOND_WINDOW = "beyond_window"  # older than the window: cannot be told
UNSEEN = "unseen"                # lower than anything this node had: not a repeat of a record seen here

NodeKey = tuple[str, "str | None"]  # (file set, observer.hostname or None)

_COMPACT = 1 << 16  # evicted slots kept before the arrays are shifted (amortised O(1) eviction)


def node_of(record: dict[str, Any]) -> str | None:
    """observer.hostname of a record, or None when it has none (a record from before nodes were named)."""
    observer = record.get("observer")
    name = observer.get("hostname") if isinstance(observer, dict) else None
    return name if isinstance(name, str) else None


def node_label(name: str | None) -> str:
    return "(no observer.hostname)" if name is None else name


class RecentChains:
    """The chain values of one node's latest consecutive seqs, about `max_bytes` of record lines of them.

    Also keeps the chain of the seq just before the oldest kept, so the oldest
    one's content can still be checked (it seals after that chain).
    """

    def __init__(self, max_bytes: int = DEFAULT_WINDOW_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"duplicate window: {max_bytes} bytes, need at least 1")
        self.max_bytes = max_bytes
        self._chains = bytearray()  # 32 bytes per seq, from self._start
        self._sizes = array("I")
        self._start = 0             # index of the oldest kept seq in _sizes
        self._bytes = 0
        self.first: int | None = None  # oldest kept seq
        self.last: int | None = None
        self.evicted = False        # seqs before `first` were seen and dropped from the window
        self._before: bytes | None = None  # chain of first - 1, if known

    def clear(self, before: str | None = None) -> None:
        """Forget everything; `before` is the chain preceding the next seq added, if known."""
        self._chains, self._sizes, self._start, self._bytes = bytearray(), array("I"), 0, 0
        self.first = self.last = None
        self.evicted = False
        self._before = bytes.fromhex(before) if before is not None else None

    def add(self, seq: int, chain: str, size: int) -> None:
        """Remember `seq` (the one after `last`, or the first one) and its chain; drop the oldest over the bound."""
        if self.last is not None and seq != self.last + 1:
            self.clear()
        if self.first is None:
            self.first = seq
            if seq == 1:
                self._before = bytes.fromhex(GENESIS)
        self.last = seq
        self._chains += bytes.fromhex(chain)
        self._sizes.append(min(size, 0xFFFFFFFF))
        self._bytes += size
        while self._bytes > self.max_bytes and self.last > self.first:
            i = self._start
            self._before = bytes(self._chains[32 * i:32 * i + 32])
            self._bytes -= self._sizes[i]
            self._start += 1
            self.first += 1
            self.evicted = True
        if self._start >= _COMPACT and 2 * self._start >= len(self._sizes):
            del self._chains[:32 * self._start]
            del self._sizes[:self._start]
            self._start = 0

    def chain(self, seq: int) -> str | None:
        """The chain value of `seq` if it is in the window (or is the one just before it), else None."""
        if self.first is None or self.last is None or not self.first - 1 <= seq <= self.last:
            return None
        if seq == self.first - 1:
            return None if self._before is None else self._before.hex()
        i = self._start + seq - self.first
        return self._chains[32 * i:32 * i + 32].hex()

    def judge(self, seq: int, chain: str, record: dict[str, Any], text: bytes | str | None,
              anchor_print: str | None = None) -> str:
        """DUPLICATE, DIFFERS, BEYOND_WINDOW or UNSEEN for a record whose `seq` is at or before `last`.

        `anchor_print`: the content print (`content_print`) of the node's first record when it was
        taken on trust (its predecessor's chain unknown), to judge a repeat of that one.
        """
        if self.first is None or seq < self.first:
            return BEYOND_WINDOW if self.evicted else UNSEEN
        if self.chain(seq) != chain:
            return DIFFERS
        prev = self.chain(seq - 1)
        if prev is not None:
            return DUPLICATE if seals(prev, record, text) else DIFFERS
        if anchor_print is not None:
            return DUPLICATE if content_print(record) == anchor_print else DIFFERS
        return DIFFERS


def content_print(record: dict[str, Any]) -> str | None:
    """A hash of a record's content alone (its chain as if it followed GENESIS): equal for equal records."""
    try:
        return digest(GENESIS, record)
    except ValueError:
        return None


@dataclass
class NodeChain:
    """One node's chain in one verify run: where it stands, what it counted, and its break, if any."""

    key: NodeKey
    window_bytes: int = DEFAULT_WINDOW_BYTES
    prev_seq: int | None = None
    prev_chain: str = GENESIS
    prev_pos: tuple[int, int] = (0, 0)       # (file index, line) of the last good record
    records: int = 0
    first_seq: int | None = None
    first: tuple[int, int, dict[str, Any]] | None = None  # file index, line, record of the anchor
    duplicates: int = 0
    brk: Break | None = None                 # the break that ended this node's chain
    anchor_print: str | None = None
    recent: RecentChains = field(init=False)

    def __post_init__(self) -> None:
        self.recent = RecentChains(self.window_bytes)

    @property
    def name(self) -> str | None:
        return self.key[1]

    @property
    def set_path(self) -> Path:
        return Path(self.key[0])

    def accepted(self, fi: int, lineno: int, record: dict[str, Any], seq: int, chain: str, size: int) -> None:
        """A record that continues this node's chain (or starts it)."""
        if self.first is None:
            self.first, self.first_seq = (fi, lineno, record), seq
            if seq != 1:
                self.anchor_print = content_print(record)
        self.prev_seq, self.prev_chain, self.prev_pos = seq, chain, (fi, lineno)
        self.records += 1
        self.recent.add(seq, chain, size)

    def repeat(self, seq: int, chain: str, record: dict[str, Any], text: bytes | str | None) -> str:
        """How a record with a seq at or before this node's last one relates to what was verified."""
        anchor = self.anchor_print if seq == self.first_seq else None
        return self.recent.judge(seq, chain, record, text, anchor)

    def result(self) -> NodeResult:
        return NodeResult(self.name, self.set_path, self.records, self.first_seq, self.prev_seq,
                          self.prev_chain if self.records else None, self.duplicates, self.brk)


class NodeTable:
    """The nodes of one verify run, by (file set, observer.hostname), in order of appearance."""

    def __init__(self, window_bytes: int = DEFAULT_WINDOW_BYTES) -> None:
        self.window_bytes = window_bytes
        self.nodes: dict[NodeKey, NodeChain] = {}
        self._aliases: dict[NodeKey, NodeChain] = {}  # other names a node's records carry

    def node(self, file_set: str, record: dict[str, Any], seq: int, text: bytes | str | None) -> NodeChain:
        """The chain `record` (number `seq`, parsed from `text`) belongs to.

        A name not seen before whose record continues another node's chain (records
        from before the node had a name, or a renamed node) joins that chain: a chain
        is the writer's, whatever its records call the node.
        """
        key = (file_set, node_of(record))
        node = self.nodes.get(key) or self._aliases.get(key)
        if node is not None:
            return node
        for other in self.nodes.values():
            if (other.key[0] == file_set and other.brk is None and other.prev_seq == seq - 1
                    and seals(other.prev_chain, record, text)):
                self._aliases[key] = other
                return other
        node = self.nodes[key] = NodeChain(key, self.window_bytes)
        return node


@dataclass(frozen=True)
class NodeResult:
    """One node's chain (observer.hostname, within one file set): what was checked, and its break if any."""

    node: str | None
    file_set: Path
    records: int                 # records checked (up to its break); duplicates not counted
    first_seq: int | None
    last_seq: int | None
    head_chain: str | None
    duplicates: int              # exact re-sent copies of records verified before (at-least-once delivery)
    brk: Break | None

    def summary(self) -> str:
        seqs = f", seq {self.first_seq}..{self.last_seq}" if self.records else ""
        dups = f", {self.duplicates} duplicates" if self.duplicates else ""
        state = f"BREAK at {self.brk.file} line {self.brk.line}" if self.brk else "ok"
        return f"node {node_label(self.node)}: {self.records} records{seqs}{dups}: {state}"

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "file_set": str(self.file_set), "records": self.records,
                "first_seq": self.first_seq, "last_seq": self.last_seq, "head_chain": self.head_chain,
                "duplicates": self.duplicates, "ok": self.brk is None, "break": break_json(self.brk)}


def break_json(brk: Break | None) -> dict[str, Any] | None:
    """A verify break as `npaudit verify --json` prints it."""
    return None if brk is None else {
        "kind": brk.kind, "node": brk.node, "file": str(brk.file), "line": brk.line, "detail": brk.detail,
        "expected_seq": brk.expected_seq, "found_seq": brk.found_seq}
