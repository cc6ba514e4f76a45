"""Sealing in C (auditlog._record_fast.seal_run, through auditlog/sealing.py): the lines, seqs and chain the
Python sealer gives, for every record the C part takes and around every one it leaves to Python."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from auditlog import record_fast
from auditlog.chain import CHAIN_KEY, GENESIS, RecordText
from auditlog.sealing import seal_records
from auditlog.verify import verify
from auditlog.writer import AuditWriter


def _run() -> Any:
    run = record_fast.seal_run()
    assert run is not None, "auditlog._record_fast is not built: `make setup` compiles it (gcc, python3-dev, libssl-dev)"
    return run


def _records(n: int, odd: dict[int, Any] | None = None) -> list[Any]:
    """n records of different sizes; at the indexes of `odd`, that object instead."""
    out: list[Any] = [RecordText.of({"message": "m" * (i * 37 % 300), "n": i, "x": {"y": [i, "z"]}})
                      for i in range(n)]
    for i, o in (odd or {}).items():
        out[i] = o
    return out


def _both(records: list[Any], seq: int, chain: str) -> tuple[tuple, tuple]:
    """(C sealer's result, Python sealer's result) over copies of the same records, each with the seqs set."""
    def copy(r: Any) -> Any:
        return RecordText(r.head, r.mid, r.tail) if isinstance(r, RecordText) else r

    told_c: list[str] = []
    told_py: list[str] = []
    a = [copy(r) for r in records]
    b = [copy(r) for r in records]
    sealed_c, lines_c, seq_c, chain_c = seal_records(a, seq, chain, lambda e: told_c.append(type(e).__name__), _run())
    sealed_py, lines_py, seq_py, chain_py = seal_records(b, seq, chain, lambda e: told_py.append(type(e).__name__))
    seqs_c = [getattr(r, "seq", None) for r in sealed_c]
    seqs_py = [getattr(r, "seq", None) for r in sealed_py]
    return (lines_c, seq_c, chain_c, seqs_c, told_c, len(sealed_c)), \
        (lines_py, seq_py, chain_py, seqs_py, told_py, len(sealed_py))


@pytest.mark.parametrize("n", [1, 2, 7, 300])
def test_c_seals_plain_records_as_python_does(n: int) -> None:
    c, py = _both(_records(n), 41, GENESIS)
    assert c == py
    lines, seq, chain = c[0], c[1], c[2]
    assert seq == 41 + n and len(lines) == n
    first = _records(1)[0]
    assert chain if n > 1 else chain == hashlib.sha256(f"{GENESIS}\n{first.body(42)}".encode()).hexdigest()
    assert f'{CHAIN_KEY}{hashlib.sha256(f"{GENESIS}{chr(10)}{first.body(42)}".encode()).hexdigest()}",' in lines[0]


def test_the_c_part_takes_every_plain_record_and_leaves_the_chain_where_python_would() -> None:
    records = _records(50)
    lines: list[str] = []
    end, seq, chain = _run()(records, 0, 9, GENESIS, CHAIN_KEY, lines)
    assert end == 50 and seq == 59 and len(lines) == 50
    assert [r.seq for r in records] == list(range(10, 60))
    again = _records(50)
    _, py_lines, py_seq, py_chain = seal_records(again, 9, GENESIS, pytest.fail)
    assert (lines, seq, chain) == (py_lines, py_seq, py_chain)
    # nothing to seal: the chain given back, the same object
    end, seq, same = _run()([], 0, 3, chain, CHAIN_KEY, lines)
    assert (end, seq) == (0, 3) and same is chain


def test_records_the_c_part_does_not_take_are_sealed_in_python_between_c_runs() -> None:
    not_ascii = RecordText.of({"message": "café ☕", "n": -1})
    surrogate = RecordText("{\"a\":\"\ud800\",", "\"chain_format\":2,\"seq\":", "}}")
    odd = {0: not_ascii, 3: object(), 4: not_ascii, 9: surrogate, 19: not_ascii}
    records = _records(20, odd)
    c, py = _both(records, 0, GENESIS)
    assert c == py
    lines, seq, _, seqs, told, sealed = c
    assert told == ["AttributeError", "UnicodeEncodeError"] and sealed == 18 and seq == 18
    assert seqs == list(range(1, 19)) and all(line.isascii() for line in lines)
    stopped: list[str] = []
    end, _, _ = _run()(records, 1, 0, GENESIS, CHAIN_KEY, stopped)
    assert end == 3 and len(stopped) == 2  # the C part stops at the first record it does not take


def test_a_chain_that_is_not_ascii_is_left_to_python() -> None:
    records = _records(3)
    lines: list[str] = []
    assert _run()(records, 0, 0, "é", CHAIN_KEY, lines) == (0, 0, "é") and lines == []
    c, py = _both(records, 0, "é")
    assert c == py
    with pytest.raises(ValueError):
        _run()(records, -1, 0, GENESIS, CHAIN_KEY, lines)


def test_the_writer_seals_in_c_and_its_file_verifies(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit.jsonl")
    assert writer._seal_run is not None  # what the writer's own tests then exercise
    writer.start()
    for _ in range(5):
        writer.hold()
        for r in _records(40):
            writer.submit(r)
        writer.release()
    writer.submit(_records(1, {0: RecordText.of({"message": "naïve"})})[0])
    assert writer.flush_wait()
    writer.close(timeout=10)
    result = verify([tmp_path])
    assert result.ok and result.records == 201 and result.head_chain == writer.head[1]


def test_npaudit_pure_python_seals_in_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "1")
    assert record_fast.seal_run() is None
    assert AuditWriter(tmp_path / "audit.jsonl")._seal_run is None
    monkeypatch.setattr(record_fast, "_record_fast", None)
    monkeypatch.setenv(record_fast.PURE_PYTHON_ENV, "0")
    assert record_fast.seal_run() is None  # not built


def test_random_batches_of_every_size_and_text_seal_alike() -> None:
    """Records from a few bytes to 200 KB (past the C buffer's first 2 KB, so it grows and is reused),
    ASCII or not, with lone surrogates and foreign objects among them, in batches of 1 to 40."""
    import random

    rnd = random.Random(22)
    alphabet = "abc \"\\/\t\n\x00\x7f" + "é☕𝄞"

    def text(n: int) -> str:
        return "".join(rnd.choices(alphabet[:12] if rnd.random() < 0.8 else alphabet, k=n))

    for _ in range(60):
        batch: list[Any] = []
        for _ in range(rnd.randint(1, 40)):
            roll = rnd.random()
            if roll < 0.05:
                batch.append(object())
            elif roll < 0.08:
                batch.append(RecordText("{\"a\":\"\udc80" + text(5), "\"chain_format\":2,\"seq\":", "}}"))
            else:
                size = rnd.choice([3, 300, 300, 2100, 5000, 200_000 if rnd.random() < 0.1 else 700])
                batch.append(RecordText.of({"message": text(size), "n": rnd.randint(0, 10**9)}))
        c, py = _both(batch, rnd.randint(0, 10**12), rnd.choice([GENESIS, "0" * 64, "f" * 64]))
        assert c == py


def test_a_record_that_empties_the_list_while_sealed_ends_the_run_safely() -> None:
    """The C part reads the list's size at every record and holds the one it seals: a record whose text
    changes the list (no writer's record does) cannot make it read past the end."""
    records: list[Any] = []

    class Emptying(RecordText):
        __slots__ = ()

        @property  # type: ignore[override]
        def head(self) -> str:
            records.clear()
            return '{"npaudit":{"aggregate":false,'

    emptying = Emptying.__new__(Emptying)  # RecordText.__init__ would set head
    emptying.mid, emptying.tail, emptying.seq = '"chain_format":2,"seq":', "}}", 0
    records += [emptying] + _records(50)
    lines: list[str] = []
    end, seq, _ = _run()(records, 0, 0, GENESIS, CHAIN_KEY, lines)
    assert (end, seq, len(lines), records) == (1, 1, 1, [])
