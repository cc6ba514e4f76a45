"""The forwarder's frames of runs of sealed lines made in one C call each, instead of a record and a frame per line.

The tailer reads a block of lines and the forwarder frames each record
(rfc5424.FrameEncoder); per line that was several Python calls and objects
(sealed_line.read_fields, a RecordFields, a TailRecord, a format), most of the
forwarder's CPU per record (bench/syslog_throughput.py, bench/agent_cpu.py
--syslog). `Framer.take` hands a run of the read-ahead lines to
auditlog._record_fast.sealed_frames (auditlog/_scan_fast.c), which proves each
line as sealed_line.scan_sealed does and appends its frame, the bytes
FrameEncoder.encode makes of the same record. What it cannot tell alone it asks
here, once per distinct value: a segment's disposition (sealed_line's rule) and
so its header parts, and a stamp text's TIMESTAMP; a line it does not take
(not sealed after its predecessor, a seq not the one expected, a record that may
state a loss) ends the run, and the tailer takes that line the Python way.
tests/unit/auditlog/syslog/test_framer.py holds both ways to the same frames.
"""

from __future__ import annotations

from typing import Any, Callable

from auditlog import record_fast
from auditlog.syslog.rfc5424 import FrameEncoder, Framing
from auditlog.syslog.sealed_line import (CACHED_SEGMENT, CHAIN_KEY_BYTES, FORMAT_MEMBER_BYTES, SEQ_KEY_BYTES,
                                         TIMESTAMP_KEY_BYTES, members_of, timestamp_of)

__all__ = ["Framer"]

_MISS_SEGMENT, _MISS_STAMP = 2, 3  # sealed_frames' miss kinds to learn from (0: a limit, 1: a line for Python)
_MAX_HEADS = 512  # distinct segments remembered (one per rule and Pods, say), as sealed_line's cache
_MAX_STAMPS = 256  # distinct stamp texts remembered: a new one each millisecond under load
_MAX_SEQ = 10**16 - 1  # the largest seq C reads (16 digits, sealed_line._SEQ_VALUE); a parsed line may hold more


class Framer:
    """Frames of sealed lines for one encoder; `for_encoder` gives one where the C part is built and the encoder
    frames a stream (no datagram cap), else None (the tailer's records are then framed one by one)."""

    def __init__(self, encoder: FrameEncoder, sealed_frames: Callable[..., tuple[int, int, str | None, int, Any]]):
        self._encoder = encoder
        self._frames = sealed_frames
        self._lf = encoder.framing is Framing.LF
        self._heads: dict[bytes, tuple[bytes, bytes] | None] = {}
        self._stamps: dict[bytes, bytes | None] = {}

    @classmethod
    def for_encoder(cls, encoder: FrameEncoder) -> Framer | None:
        sealed_frames = record_fast.sealed_frames()
        if sealed_frames is None or not encoder.fast:
            return None
        return cls(encoder, sealed_frames)

    def take(self, lines: list[bytes], out: list[Any], prev_chain: str, want: int, max_records: int,
             max_bytes: int) -> tuple[int, int, str | None]:
        """Take lines off the end of `lines` (the next one last) while each is the sealed record `want`, `want` + 1,
        ... after `prev_chain`, appending their frames to `out`, up to `max_records` records or once `max_bytes`
        bytes of lines were taken: (records taken, their line bytes, the last one's chain or None)."""
        if not prev_chain.isascii() or want > _MAX_SEQ:
            return 0, 0, None  # the Python way: it raises as scan_sealed does, or takes a seq C would not read
        taken = line_bytes = 0
        chain: str | None = None
        while True:
            n, nbytes, last, miss, key = self._frames(
                lines, out, prev_chain, want, max_records - taken, max_bytes - line_bytes, self._heads, self._stamps,
                self._lf, TIMESTAMP_KEY_BYTES, CHAIN_KEY_BYTES, FORMAT_MEMBER_BYTES, SEQ_KEY_BYTES)
            if last is not None:  # n > 0
                taken, line_bytes, want = taken + n, line_bytes + nbytes, want + n
                chain = prev_chain = last
            if miss == _MISS_SEGMENT:
                self._learn_segment(key)
            elif miss == _MISS_STAMP:
                self._learn_stamp(key)
            else:
                return taken, line_bytes, chain

    def _learn_segment(self, segment: bytes) -> None:
        disposition = members_of(segment)
        if len(self._heads) >= _MAX_HEADS:
            self._heads.clear()
        if disposition is False or len(segment) > CACHED_SEGMENT:
            self._heads[segment] = None  # a record that may state a loss, or too long to cache: the Python way
            return
        pri, after = self._encoder.head_parts(disposition)
        self._heads[segment] = (pri.encode("ascii"), after.encode("ascii"))

    def _learn_stamp(self, text: bytes) -> None:
        stamp = timestamp_of(text)
        if len(self._stamps) >= _MAX_STAMPS:
            self._stamps.clear()
        self._stamps[text] = None if stamp is None else stamp.encode("ascii")
