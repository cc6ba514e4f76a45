"""Compile the XDP drop offload with bcc, attach it to Pod veths, and read and write its maps."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from meters.ebpf.maps import (STAT_NAMES, OffloadCounts, OffloadKey, OffloadRule, decode_key, decode_rule,
                              decode_state, encode_key, encode_rule)
from meters.netns import call_in_netns
from meters.errors import OffloadError, OffloadUnavailable

log = logging.getLogger(__name__)

DEFAULT_SOURCE = Path(__file__).with_name("xdp_offload.c")
DEFAULT_MAX_ENTRIES = 65536
FUNCTION = "xdp_offload"
# bcc's XDPFlags, by name so that this module imports without bcc.
_XDP_MODES = {"native": 1 << 2, "generic": 1 << 1}

# bcc reads BCC_KERNEL_SOURCE from the process environment while it compiles.
_compile_lock = threading.Lock()

KeyMatch = Callable[[OffloadKey, OffloadRule | None], bool]


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether the eBPF tier can run here; `reason` says why not in one line."""

    ok: bool
    reason: str = ""


@contextlib.contextmanager
def _output_lines() -> Iterator[list[str]]:
    """Collect what is written to file descriptors 1 and 2 meanwhile: libbcc and clang
    print their diagnostics there (missing headers on stdout), not into the exception."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        for fd in saved:
            os.dup2(tmp.fileno(), fd)
        try:
            yield lines
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            tmp.seek(0)
            lines.extend(line.strip() for line in tmp.read().decode(errors="replace").splitlines() if line.strip())


def _one_line_reason(exc: BaseException, diagnostics: list[str]) -> str:
    """The most telling diagnostic: a compiler error, missing headers, or the exception itself."""
    for marker in ("error:", "Unable to find kernel headers", "Permission denied", "Operation not permitted"):
        for line in diagnostics:
            if marker in line:
                return f"{exc}: {line}"
    return str(exc)


@contextlib.contextmanager
def _kernel_source(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    saved = os.environ.get("BCC_KERNEL_SOURCE")
    os.environ["BCC_KERNEL_SOURCE"] = str(path)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["BCC_KERNEL_SOURCE"]
        else:
            os.environ["BCC_KERNEL_SOURCE"] = saved


class XdpOffload:
    """One compiled program and its maps; attached to any number of veths.

    Build it with `compile()`; it raises OffloadUnavailable (one line) when the
    tier cannot run here. Entries are written by `put` and removed by `delete`,
    `flush` and `sweep`, which return the final counts of what they removed so
    the caller can fold them into its records.
    """

    def __init__(self, bpf: Any, fn: Any, mode: str) -> None:
        self._bpf = bpf
        self._fn = fn
        self._flags = _XDP_MODES[mode]
        self._rules = bpf["offload_rules"]
        self._state = bpf["offload_state"]
        self._stats = bpf["offload_stats"]
        self._attached: dict[tuple[str | None, str], int] = {}

    @classmethod
    def compile(cls, *, source: Path = DEFAULT_SOURCE, max_entries: int = DEFAULT_MAX_ENTRIES,
                kernel_source: Path | None = None, mode: str = "native") -> XdpOffload:
        """Compile and load the program. `kernel_source` overrides bcc's header directory
        (default /lib/modules/$(uname -r)/build); `mode` is "native" (driver) or "generic"."""
        if mode not in _XDP_MODES:
            raise OffloadUnavailable(f"XDP mode {mode!r} is neither 'native' nor 'generic'")
        if not 0 < max_entries <= 1 << 24:
            raise OffloadUnavailable(f"XDP offload max_entries must be in 1..{1 << 24}, got {max_entries}")
        try:
            from bcc import BPF
        except ImportError as exc:
            raise OffloadUnavailable(f"bcc is not importable (python3-bpfcc): {exc}") from exc
        if not source.is_file():
            raise OffloadUnavailable(f"XDP program source {source} does not exist")
        with _compile_lock, _kernel_source(kernel_source), _output_lines() as diagnostics:
            try:
                bpf = BPF(src_file=str(source).encode(), cflags=[f"-DOFFLOAD_MAX_ENTRIES={max_entries}"])
                fn = bpf.load_func(FUNCTION.encode(), BPF.XDP)
            except Exception as exc:  # bcc raises bare Exception for every failure
                failure: BaseException | None = exc
            else:
                failure = None
        if failure is not None:
            log.debug("bcc output for %s:\n%s", source, "\n".join(diagnostics))
            reason = _one_line_reason(failure, diagnostics)
            raise OffloadUnavailable(f"XDP offload {source.name}: {reason}") from failure
        return cls(bpf, fn, mode)

    # --- attaching -------------------------------------------------------------

    def attach(self, ifname: str, netns: str | None = None) -> int:
        """Attach to `ifname` (in network namespace `netns`, if given); its ifindex there,
        which is what keys for packets entering through it carry."""
        from bcc import BPF

        def attach_here() -> int:
            ifindex = socket.if_nametoindex(ifname)
            BPF.attach_xdp(ifname.encode(), self._fn, self._flags)
            return ifindex

        try:
            ifindex = call_in_netns(netns, attach_here)
        except Exception as exc:
            raise OffloadError(f"XDP attach to {ifname} (netns {netns or 'current'}): {exc}") from exc
        self._attached[(netns, ifname)] = ifindex
        return ifindex

    def detach(self, ifname: str, netns: str | None = None) -> bool:
        """Detach from `ifname`; False if the interface is already gone (the Pod was deleted)."""
        from bcc import BPF

        def detach_here() -> bool:
            try:
                socket.if_nametoindex(ifname)
            except OSError:
                return False
            BPF.remove_xdp(ifname.encode(), self._flags)
            return True

        self._attached.pop((netns, ifname), None)
        try:
            return call_in_netns(netns, detach_here)
        except Exception as exc:
            raise OffloadError(f"XDP detach from {ifname} (netns {netns or 'current'}): {exc}") from exc

    @property
    def attached(self) -> dict[tuple[str | None, str], int]:
        """(netns, ifname) -> ifindex of every interface this object attached to."""
        return dict(self._attached)

    # --- entries ---------------------------------------------------------------

    def _key(self, key: OffloadKey) -> Any:
        return self._rules.Key.from_buffer_copy(encode_key(key))

    def put(self, key: OffloadKey, rule: OffloadRule) -> None:
        """Add or refresh an entry; refreshing keeps the program's counts and bucket."""
        raw_key, raw_rule = self._key(key), self._rules.Leaf.from_buffer_copy(encode_rule(rule))
        try:
            self._rules[raw_key] = raw_rule
        except Exception as exc:
            raise OffloadError(f"XDP offload put {key.describe()} rule {rule.rule_id}: {exc}") from exc

    def rules(self) -> dict[OffloadKey, OffloadRule]:
        return {decode_key(bytes(k)): decode_rule(bytes(v)) for k, v in self._rules.items()}

    def counters(self) -> dict[OffloadKey, OffloadCounts]:
        """Counts since each entry was first hit (cumulative; removing an entry returns its last)."""
        return {decode_key(bytes(k)): decode_state(bytes(v)).counts for k, v in self._state.items()}

    def delete(self, key: OffloadKey) -> OffloadCounts:
        """Remove one entry; its final counts (zero if it was never hit)."""
        return self._remove([self._key(key)]).get(key, OffloadCounts())

    def flush(self, match: KeyMatch | None = None) -> dict[OffloadKey, OffloadCounts]:
        """Remove every entry (or those `match(key, rule)` selects) before a change that
        could alter a cached verdict; the final counts of what was removed."""
        rules = self.rules()
        keys = set(rules) | set(self.counters())
        chosen = [k for k in keys if match is None or match(k, rules.get(k))]
        return self._remove([self._key(k) for k in chosen])

    def sweep(self, now_ns: int) -> dict[OffloadKey, OffloadCounts]:
        """Remove entries expired at `now_ns` (monotonic) and counts whose rule the LRU
        evicted; their final counts."""
        return self.flush(lambda _key, rule: rule is None or rule.expires_ns <= now_ns)

    def _remove(self, raw_keys: list[Any]) -> dict[OffloadKey, OffloadCounts]:
        # The rule goes first: from then on the program passes the key and stops
        # counting, so the state read next holds the final counts (± a packet the
        # program is handling on another CPU at that instant).
        removed: dict[OffloadKey, OffloadCounts] = {}
        for raw in raw_keys:
            with contextlib.suppress(KeyError):
                del self._rules[raw]
            key = decode_key(bytes(raw))
            try:
                removed[key] = decode_state(bytes(self._state[raw])).counts
            except KeyError:
                continue
            with contextlib.suppress(KeyError):
                del self._state[raw]
        return removed

    def stats(self) -> dict[str, int]:
        """Program-wide counts summed over CPUs: keys found expired, passes for a full state map."""
        out = {}
        for index, name in enumerate(STAT_NAMES):
            per_cpu = self._stats[ctypes.c_int(index)]
            out[name] = int(sum(per_cpu))
        return out

    def close(self) -> None:
        """Detach from every interface still attached and free the program and maps."""
        for netns, ifname in list(self._attached):
            with contextlib.suppress(OffloadError):
                self.detach(ifname, netns)
        self._bpf.cleanup()


def probe(*, source: Path = DEFAULT_SOURCE, kernel_source: Path | None = None) -> Probe:
    """Can the eBPF tier run here? Compiles and loads the program once to find out."""
    try:
        offload = XdpOffload.compile(source=source, kernel_source=kernel_source, max_entries=16)
    except OffloadUnavailable as exc:
        return Probe(False, str(exc))
    offload.close()
    return Probe(True)
