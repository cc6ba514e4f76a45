"""Record lines of a SIEM copy for `npaudit logs` and `stats`: RFC 5424 messages unwrapped, re-sent duplicates dropped.

A receiver's copy holds forwarded messages (``<PRI>1 … [npaudit@32473 …] MSG``,
one a line, as `npaudit verify --from-syslog` reads them) or the records
themselves, and at-least-once delivery puts some records in twice. Readers
want each record once, as the node wrote it:

- a line starting with ``<`` that is an RFC 5424 message becomes its MSG
  (auditlog.syslog.rfc5424.decode_message, the reader verify uses); an
  `npaudit syslog test` message is dropped (it is not an audit record);
- a record whose npaudit.chain was already shown from this file set is dropped.
  The chain value hashes the previous chain and the record, so equal chains
  mean the same node, seq and content; a different record under a seen seq
  (an edit) has another chain and is shown (`npaudit verify` names it).

A node's own file set (its writer's lock file beside it, fileset.set_lock_path)
holds each record once by construction and is not searched for repeats, so
`npaudit logs` on a node pays nothing for this. Memory is bounded: the chains of about
`window_bytes` of the latest record
lines of each set are remembered (auditlog.verify_nodes explains why the
default covers the forwarder's re-sends), 16 hex digits of each, forgotten a
block at a time. The common case, a block of lines with one new chain each,
costs a split of the block on the chain member and set operations, with only a
slice per line in Python.
"""

from __future__ import annotations

import re
from collections import deque

import orjson

from auditlog.syslog.rfc5424 import TEST_PARAM, decode_message
from auditlog.verify_nodes import DEFAULT_WINDOW_BYTES

__all__ = ["CopyLines"]

_CHAIN = re.compile(rb'"chain":"([0-9a-f]{16})[0-9a-f]{48}"')
_CHAIN_MEMBER = b'"chain":"'
_PRINT = 16  # hex digits of a chain remembered: a chance collision among a window's records is ~1e-9
_HEX = b"0123456789abcdef"


def _prints(block: bytes) -> list[bytes]:
    """The first _PRINT characters of every chain member's value in `block` (found with bytes.find: no copies)."""
    found, find, size = [], block.find, len(_CHAIN_MEMBER)
    pos = find(_CHAIN_MEMBER)
    while pos >= 0:
        found.append(block[pos + size:pos + size + _PRINT])
        pos = find(_CHAIN_MEMBER, pos + size)  # not past a short value: a real member may follow closely
    return found


class CopyLines:
    """One file set's lines, block by block (runs of complete lines), as record lines without repeats."""

    def __init__(self, window_bytes: int = DEFAULT_WINDOW_BYTES, *, dedup: bool = True) -> None:
        self.window_bytes = window_bytes
        self.dedup = dedup  # False for a node's own files: one writer sealed each record once
        self.duplicates = 0      # records dropped as re-sent copies
        self.test_messages = 0   # `npaudit syslog test` messages dropped
        self._seen: set[bytes] = set()
        self._order: deque[tuple[list[bytes], int]] = deque()  # (chain prints, their lines' bytes), oldest first
        self._bytes = 0

    def block(self, block: bytes) -> bytes:
        """The record lines of `block` (complete lines, each ending in b"\\n"), each record once."""
        if block.startswith(b"<") or b"\n<" in block:
            block = self._unwrapped(block)
        if not self.dedup:
            return block
        # A line without a chain member is no record and never a repeat; one with two (a member of the
        # same name inside the record) only adds a print no later record can have by chance.
        prints = _prints(block)
        if (self._seen.isdisjoint(prints) and len(set(prints)) == len(prints)
                and not b"".join(prints).translate(None, _HEX)):
            self._remember(prints, len(block))
            return block
        kept = [line for line in block.split(b"\n")[:-1] if self._new(line)]
        return b"".join(line + b"\n" for line in kept)

    def _unwrapped(self, block: bytes) -> bytes:
        out = []
        for line in block.split(b"\n")[:-1]:
            if line.startswith(b"<"):
                try:
                    msg, params = decode_message(line)
                except ValueError:
                    msg, params = line, {}  # not a message after all: shown as it is
                if params.get(TEST_PARAM) == "true":
                    self.test_messages += 1
                    continue
                line = msg
            out.append(line + b"\n")
        return b"".join(out)

    def _new(self, line: bytes) -> bool:
        """False for a record whose chain was seen (it is remembered otherwise); True for a line without one."""
        found = _CHAIN.findall(line)
        if len(found) != 1:  # no chain, or a member called "chain" elsewhere in the record: read it exactly
            try:
                record = orjson.loads(line)
                chain = record["npaudit"]["chain"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return True
            if not isinstance(chain, str) or len(chain) != 64:
                return True
            found = [chain[:_PRINT].encode("ascii")]
        if found[0] in self._seen:
            self.duplicates += 1
            return False
        self._remember(found[:1], len(line) + 1)
        return True

    def _remember(self, prints: list[bytes], size: int) -> None:
        """Remember `prints` (new ones, from lines of `size` bytes); forget the oldest beyond the window."""
        self._seen.update(prints)
        self._order.append((prints, size))
        self._bytes += size
        while self._bytes > self.window_bytes and len(self._order) > 1:
            old, old_size = self._order.popleft()
            self._seen.difference_update(old)
            self._bytes -= old_size
