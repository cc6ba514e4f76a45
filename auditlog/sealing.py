"""Sealing a batch of records onto the chain, and cutting the sealed lines into write-sized chunks (pure)."""

from __future__ import annotations

from typing import Callable, Sequence

from auditlog.chain import CHAIN_KEY, RecordText

SealRun = Callable[[list, int, int, str, str, list], tuple[int, int, str]]


def seal_records(records: Sequence[RecordText], seq: int, chain: str, skipped: Callable[[Exception], None],
                 run: SealRun | None = None) -> tuple[list[RecordText], list[str], int, str]:
    """The records sealed (`records` itself when all were) and their lines, two lists in step, and the
    (seq, chain) after the last one.
    A record that cannot be sealed (not ASCII: a bug upstream; not a RecordText) is told to `skipped`
    and takes no seq.

    `run`: the C sealer (auditlog.record_fast.seal_run()), which seals the plain records (ASCII texts) of a
    list and stops at any other, sealed here; the same lines, ~1 µs less CPU a record."""
    sealed: list[RecordText] = []
    lines: list[str] = []
    if run is not None and isinstance(records, list):
        return _seal_with(run, records, seq, chain, skipped)
    lone = len(records) == 1
    for record in records:
        try:
            line, next_chain = record.seal(chain, seq + 1, lone)
        except (ValueError, AttributeError) as exc:
            skipped(exc)
            continue
        seq += 1
        chain = next_chain
        sealed.append(record)
        lines.append(line)
    return sealed, lines, seq, chain


def _seal_with(run: SealRun, records: list[RecordText], seq: int, chain: str, skipped: Callable[[Exception], None]
               ) -> tuple[list[RecordText], list[str], int, str]:
    lines: list[str] = []
    start, end, n = 0, 0, len(records)
    sealed: list[RecordText] | None = None  # None while every record so far was sealed in C
    while True:
        end, seq, chain = run(records, start, seq, chain, CHAIN_KEY, lines)
        if end >= n:
            break
        if sealed is None:
            sealed = records[:end]
        else:
            sealed += records[start:end]
        record = records[end]  # one the C sealer does not take: as the loop above does it
        try:
            line, chain = record.seal(chain, seq + 1, n == 1)
        except (ValueError, AttributeError) as exc:
            skipped(exc)
        else:
            seq += 1
            sealed.append(record)
            lines.append(line)
        start = end + 1
    if sealed is None:
        return records, lines, seq, chain
    sealed += records[start:end]
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
