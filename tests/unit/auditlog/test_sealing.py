"""Sealing a batch onto the chain and cutting it into chunks: what the writer appends, one chunk a write."""

from __future__ import annotations

from auditlog.chain import GENESIS, RecordText
from auditlog.sealing import chunk_bounds, seal_records


def test_chunks_cover_every_line_once_and_stay_under_the_cap_unless_one_line_is_longer() -> None:
    lines = ["a" * 9, "b" * 9, "c" * 30, "d" * 4, "e" * 4]
    bounds = list(chunk_bounds(lines, 20))
    assert bounds == [(0, 2, 20), (2, 3, 31), (3, 5, 10)]
    assert list(chunk_bounds([], 20)) == []


def test_a_record_that_cannot_be_sealed_is_told_and_takes_no_seq() -> None:
    good = RecordText.of({"message": "one"})
    told: list[Exception] = []
    sealed, lines, seq, chain = seal_records([good, object(), good], 7, GENESIS, told.append)  # type: ignore[list-item]
    assert sealed == [good, good] and len(lines) == 2 and seq == 9 and len(told) == 1
    assert chain != GENESIS and lines[0] != lines[1]  # each line sealed at its own seq
