"""Sealing a batch of records onto the chain, and cutting the sealed lines into write-sized chunks (pure)."""

from __future__ import annotations

from typing import Callable, Sequence

from auditlog.chain import CHAIN_KEY, RecordText

SealRun = Callable[[list, int, int, str, str, list], tuple[int, int, str]]


def seal_records(records: Sequence[RecordText], seq: int, chain: str, skipped: Callable[[Exception], None],
                 run: SealRun | None = None) -> tuple[list[RecordText], list[str], int, str]:
    """The records sealed and their lines (two lists, in step), and the (seq, chain) after the last one.
    A record that cannot be sealed (not ASCII: a bug upstream; not a RecordText) is told to `skipped`
    and takes no seq.

    `run`: the C sealer (auditlog.record_fast.seal_run()), given a list: it seals the plain records (ASCII
    texts) from where it is told to start and stops at any other, which is sealed here; the same lines,
    ~1 µs less CPU a record. Without it every record is sealed here."""
    sealed: list[RecordText] = []
    lines: list[str] = []
    lone = len(records) == 1
    as_list = records if run is not None and isinstance(records, list) else None  # what the C part takes
    start = 0
    while start < len(records):
        end = start
        if as_list is not None and run is not None:
            end, seq, chain = run(as_list, start, seq, chain, CHAIN_KEY, lines)
            sealed += records[start:end]
            if end >= len(records):
                break
        record = records[end]
        try:
            line, next_chain = record.seal(chain, seq + 1, lone)
        except (ValueError, AttributeError) as exc:
            skipped(exc)
        else:
            seq += 1
            chain = next_chain
            sealed.append(record)
            lines.append(line)
        start = end + 1
    return sealed, lines, seq, chain


def chunk_bounds(lines: Sequence[str], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, bytes with newlines) of consecutive chunks of `lines`, each at most `chunk_bytes`
    unless one line alone is longer. Most batches (one read's records) fit one chunk: no walk then."""
    total = sum(map(len, lines)) + len(lines)
    if lines and (total <= chunk_bytes or len(lines) == 1):
        return [(0, len(lines), total)]
    bounds: list[tuple[int, int, int]] = []
    start = 0
    while start < len(lines):
        end, size = start + 1, len(lines[start]) + 1
        while end < len(lines) and size + len(lines[end]) + 1 <= chunk_bytes:
            size += len(lines[end]) + 1
            end += 1
        bounds.append((start, end, size))
        start = end
    return bounds
