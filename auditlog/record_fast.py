"""The record encoder's common case in C (auditlog/_record_fast.c), or, where it is not built, in Python.

`fast_encoder(encoder)` gives the `encode` the pipeline calls per record. The C part reads the Python
encoder's caches (RecordEncoder.c_parts) and hands every record they do not cover, and every unusual one,
to RecordEncoder.encode_positional, so the text is the Python encoder's either way
(tests/unit/auditlog/test_record_fast.py proves it). On this project's machines it takes the per-record
text from ~4.7 µs of CPU to ~1.8 warm, and the real agent's CPU per packet-in by 1.3-4.7 µs from 5k to 40k
packet-ins/s (bench/agent_cpu.py against NPAUDIT_PURE_PYTHON=1; bench/RESULTS.md).

`seal_run()` gives the writer the same module's sealer: RecordText.seal for a run of plain records (0.76 µs a record
in a batch against 1.42 in Python, 1.06 against 3.9 alone, warm, on this project's machines). Its SHA-256, the
Community ID's SHA-1 and the timestamp's text are the module's own code (auditlog/_digest_fast.c: the CPU's SHA
extensions where it has them), not OpenSSL's or libc's, whose code a lone record after a quiet spell pays to fetch.

`aggregator()` gives the pipeline auditlog.aggregate.Aggregator in C (auditlog/_aggregate_fast.c): the same windows,
emissions and counts (test_aggregate.py runs both, and both side by side), a new key's window opened without
Python objects, and add_run, the pipeline's take_run: a run of a read's packet-ins decoded, keyed and added in
one call (without it, as with the Python class, every packet-in goes through AuditPipeline.__call__).

`frame_decoder()` gives the pipeline packet.decode_frame with its common case (an untagged IPv4 UDP or TCP frame
without options, not a fragment) built in C (auditlog/_frame_fast.c) and every other frame decoded by
decode_frame itself (0.10 µs a frame against 0.34, warm, best of 5 on the agent's captured packet-ins).

`sealed_parts()` gives the syslog forwarder's scan of a sealed line (auditlog/syslog/sealed_line.py) its byte work
in C (auditlog/_scan_fast.c): the layout, the digest that proves it and the seq, in one call. `sealed_frames()`
gives it the frames of a run of such lines in one call (auditlog/syslog/framer.py), `lines_reversed()` the split
of the blocks it reads into lines.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, cast

from auditlog.aggregate import Aggregation, Aggregator, AggregatorStats, snapshot
from auditlog.chain import SEQ_KEY, TIMESTAMP_KEY, RecordText
from auditlog.jcs import SAFE_INTEGER
from auditlog.packet import PacketSummary, decode_frame
from auditlog.record import RecordEncoder
from packetin.layouts import PURE_PYTHON_ENV, pure_python  # the switch: every record in pure Python too
from packetin.registers import DISPOSITION_BITS

try:
    from auditlog import _record_fast
except ImportError:  # not built (no compiler at install time): fast_encoder says so
    _record_fast = None  # type: ignore[assignment]

__all__ = ["PURE_PYTHON_ENV", "aggregator", "built", "fast_encoder", "frame_decoder", "lines_reversed", "mode",
           "seal_run", "sealed_frames", "sealed_parts"]

log = logging.getLogger(__name__)


def built() -> bool:
    """Whether auditlog._record_fast is importable here."""
    return _record_fast is not None


def mode() -> str:
    """"c" where records are built in C here, "python" where the module is not built or NPAUDIT_PURE_PYTHON is
    set (npaudit_build_info's record_encoder label)."""
    return "python" if pure_python() or _record_fast is None else "c"


class _PythonOnly:
    """encode_positional with FastEncoder's counts: where the C part is not built, not wanted, or cannot
    serve the encoder (RecordEncoder.c_parts None)."""

    def __init__(self, encoder: RecordEncoder) -> None:
        self._encode = encoder.encode_positional
        self._python = 0

    def encode(self, *args: Any) -> RecordText:
        self._python += 1
        return self._encode(*args)

    def counts(self) -> dict[str, int]:
        return {"fast": 0, "python": self._python}


def fast_encoder(encoder: RecordEncoder) -> Any:
    """An object with `encode` (encode_positional's arguments) and `counts()` ({"fast": records built in C,
    "python": records built by `encoder`}): the C FastEncoder over `encoder` where it can be, else
    `encoder` alone, with a warning in the log when the module is missing or NPAUDIT_PURE_PYTHON is set."""
    if mode() == "python":
        if _record_fast is not None:
            log.warning("%s is set: audit records are encoded in pure Python (a few µs more CPU per record)",
                        PURE_PYTHON_ENV)
            return _PythonOnly(encoder)
        log.warning("auditlog._record_fast is not built (was there no C compiler when npaudit was installed?): "
                    "audit records are encoded in pure Python, a few µs more CPU per record; `make setup` "
                    "builds it")
        return _PythonOnly(encoder)
    parts = encoder.c_parts()
    if parts is None or _record_fast is None:
        return _PythonOnly(encoder)
    return _record_fast.FastEncoder(encoder, {**parts, "record_text": RecordText, "timestamp_key": TIMESTAMP_KEY,
                                              "seq_key": SEQ_KEY, "disposition_bits": DISPOSITION_BITS,
                                              "safe_integer": SAFE_INTEGER})


def seal_run() -> Callable[..., tuple[int, int, str]] | None:
    """The C sealer, auditlog._record_fast.seal_run(records, start, seq, chain, chain_key, lines), where records
    are built in C here (mode() "c"), else None: auditlog/sealing.py then seals every record in Python (what
    fast_encoder said in the log covers both). The same lines and chain either way
    (tests/unit/auditlog/test_seal_run.py)."""
    return _record_fast.seal_run if mode() == "c" and _record_fast is not None else None


def sealed_parts() -> Callable[[bytes, str, bytes, bytes, bytes, bytes], tuple[str, bytes, int, bytes] | None] | None:
    """auditlog._record_fast.sealed_parts (auditlog/_scan_fast.c), the byte work of the syslog forwarder's
    sealed_line.scan_sealed, where records are built in C here (mode() "c"), else None: then it is done in
    Python. The same parts either way (tests/unit/auditlog/syslog/test_sealed_parts.py)."""
    return _record_fast.sealed_parts if mode() == "c" and _record_fast is not None else None


def lines_reversed() -> Callable[[bytes], tuple[list[bytes], bytes]] | None:
    """auditlog._record_fast.lines_reversed (auditlog/_scan_fast.c): a block's lines without their newlines, the
    next one last, and the text after the last newline, where records are built in C here (mode() "c"), else
    None: the tailer then splits with bytes.split (the same lists: tests/unit/auditlog/syslog/test_tailer.py)."""
    return _record_fast.lines_reversed if mode() == "c" and _record_fast is not None else None


def sealed_frames() -> Callable[..., tuple[int, int, str | None, int, Any]] | None:
    """auditlog._record_fast.sealed_frames (auditlog/_scan_fast.c), the syslog forwarder's frames of a run of
    sealed lines, where records are built in C here (mode() "c"), else None: then each record is framed in
    Python. The same frames either way (tests/unit/auditlog/syslog/test_framer.py)."""
    return _record_fast.sealed_frames if mode() == "c" and _record_fast is not None else None


def frame_decoder() -> Callable[[bytes], PacketSummary]:
    """decode_frame, its common case in C (auditlog._record_fast.FrameDecoder, which hands every other frame to
    decode_frame) where records are built in C here (mode() "c"), else decode_frame itself. The same summary
    either way (tests/unit/auditlog/test_frame_fast.py)."""
    if mode() == "c" and _record_fast is not None:
        return cast("Callable[[bytes], PacketSummary]", _record_fast.FrameDecoder(PacketSummary, decode_frame).decode)
    return decode_frame


if _record_fast is not None:
    class _FastAggregator(_record_fast.Aggregator):
        """The C Aggregator with the one method that builds a Python value type (AggregatorStats)."""

        __slots__ = ()

        def snapshot(self) -> AggregatorStats:
            return snapshot(self)


def aggregator(window: float = 1.0, max_keys: int = 100_000) -> Aggregation:
    """An Aggregator(window, max_keys): in C (auditlog._record_fast.Aggregator) where records are built in C here
    (mode() "c"), else auditlog.aggregate's. The same emissions and counts either way
    (tests/unit/auditlog/test_aggregate.py)."""
    if mode() == "c" and _record_fast is not None:
        return _FastAggregator(window, max_keys)
    return Aggregator(window, max_keys)
