"""Sealing a batch onto the chain and cutting it into chunks: what the writer appends, one chunk a write."""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import pytest

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


def test_a_lone_record_is_sealed_as_one_of_a_batch_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of one takes CPython's own SHA-256 (auditlog/chain.py), a longer one OpenSSL's: the same
    digests, so the same lines and chain."""
    from auditlog import chain as chain_module

    used: list[str] = []

    def spy(name: str, real: Any) -> Any:
        def digest(data: bytes) -> Any:
            used.append(name)
            return real(data)
        return digest

    monkeypatch.setattr(chain_module, "_sha256_lone", spy("lone", chain_module._sha256_lone))
    monkeypatch.setattr(chain_module, "_sha256", spy("batch", chain_module._sha256))
    records = [RecordText.of({"message": "one", "n": i}) for i in range(3)]
    _, alone, seq, chain = seal_records(records[:1], 4, GENESIS, pytest.fail)
    assert used == ["lone"]
    _, together, _, _ = seal_records(records, 4, GENESIS, pytest.fail)
    assert used == ["lone", "batch", "batch", "batch"]
    assert alone == together[:1] and seq == 5
    assert chain == hashlib.sha256(f"{GENESIS}\n{records[0].body(5)}".encode()).hexdigest()


def test_python_3_11_has_its_own_sha256_for_lone_records() -> None:
    from auditlog import chain as chain_module

    if sys.version_info < (3, 12):  # CPython 3.11 builds _sha256 in (3.12 renamed it: OpenSSL's then)
        assert chain_module._sha256_lone is not hashlib.sha256
