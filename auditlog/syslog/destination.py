"""A syslog destination as configured: its endpoint, header, framing, TLS and batch settings, validated; the
checkpoint file it names; and the marked test message `npaudit syslog test` sends it.

The forwarder (forwarder.py) sends to one; the configuration (policy_agent/config/syslog.py) and the CLI make
them. Kept apart from the forwarder so that those need not load the forwarder's tailer and framer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from auditlog.syslog.errors import SyslogConfigError
from auditlog.syslog.rfc5424 import (DEFAULT_FACILITY, DEFAULT_UDP_MAX_BYTES, MIN_UDP_MAX_BYTES, Framing, Header,
                                     encode_test_message, frame, rfc3339_millis)
from auditlog.syslog.transport import (RELP_SCHEMES, TLS_SCHEMES, Endpoint, Sender, TlsOptions, open_sender,
                                       parse_endpoint, wait_acked)
from auditlog.syslog.window import WINDOW_BATCHES, WINDOW_BYTES

__all__ = ["BATCH_BYTES", "BATCH_RECORDS", "CHECKPOINT_INTERVAL", "CHECKPOINT_RECORDS", "Destination",
           "checkpoint_name", "make_destination", "send_test_message"]

# Defaults, documented in config/npaudit.yaml (syslog.destinations) and policy_agent/config/loader.py.
# A batch is one read, one encode and one write, and the unit of acknowledgement: large
# enough that the per-batch work is small next to the records, small enough to re-send.
BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20
# A save is a write, an fsync and a rename: cheap once a second, not after every batch.
# Both bound what a crash sends again.
CHECKPOINT_INTERVAL = 1.0
CHECKPOINT_RECORDS = 50_000


@dataclass(frozen=True)
class Destination:
    """One validated destination; `make_destination` builds it from configuration values."""

    endpoint: Endpoint
    header: Header
    framing: Framing
    tls: TlsOptions | None = None
    max_bytes: int | None = None      # UDP only: datagram cap
    batch_records: int = BATCH_RECORDS            # records per send at most
    batch_bytes: int = BATCH_BYTES                # record bytes per send, about
    checkpoint_interval: float = CHECKPOINT_INTERVAL  # seconds between checkpoint saves, at least
    checkpoint_records: int = CHECKPOINT_RECORDS  # ... unless this many records were delivered since
    window_batches: int = WINDOW_BATCHES          # TCP/TLS: batches sent and not yet acknowledged, at most
    window_bytes: int = WINDOW_BYTES              # ... and about this many bytes of them
    # TCP/TLS: what the receiver may hold acknowledged and unread (None: transport.receive_buffer_bound)
    receive_buffer_bytes: int | None = None

    @property
    def name(self) -> str:
        return str(self.endpoint)


def make_destination(url: str, *, node_name: str, facility: int | str = DEFAULT_FACILITY,
                     framing: str | None = None, tls: TlsOptions | None = None,
                     udp_max_bytes: int = DEFAULT_UDP_MAX_BYTES, batch_records: int = BATCH_RECORDS,
                     batch_bytes: int = BATCH_BYTES, checkpoint_interval: float = CHECKPOINT_INTERVAL,
                     checkpoint_records: int = CHECKPOINT_RECORDS, window_batches: int = WINDOW_BATCHES,
                     window_bytes: int = WINDOW_BYTES, receive_buffer_bytes: int | None = None) -> Destination:
    """A Destination from configuration values; SyslogConfigError naming the field that is wrong."""
    endpoint = parse_endpoint(url)
    if endpoint.scheme == "udp":
        if framing not in (None, Framing.DATAGRAM.value):
            raise SyslogConfigError(f"syslog destination {url}: framing {framing!r} does not apply to udp")
        if not MIN_UDP_MAX_BYTES <= udp_max_bytes <= 65507:
            raise SyslogConfigError(f"syslog destination {url}: udp_max_bytes must be in "
                                    f"{MIN_UDP_MAX_BYTES}..65507, got {udp_max_bytes}")
        chosen = Framing.DATAGRAM
    elif endpoint.scheme in RELP_SCHEMES:  # each RELP frame carries its length: "DATALEN SP DATA" is octet-counting
        if framing not in (None, Framing.OCTET_COUNTING.value):
            raise SyslogConfigError(f"syslog destination {url}: framing {framing!r} does not apply to relp")
        chosen = Framing.OCTET_COUNTING
    else:
        names = (Framing.OCTET_COUNTING.value, Framing.LF.value)
        if framing not in (None, *names):
            raise SyslogConfigError(f"syslog destination {url}: framing must be one of {', '.join(names)}")
        chosen = Framing(framing or Framing.OCTET_COUNTING.value)
    if tls is not None and endpoint.scheme not in TLS_SCHEMES:
        raise SyslogConfigError(f"syslog destination {url}: ca/cert/key need a tls:// or relp+tls:// URL")
    for name, value, least in (("batch_records", batch_records, 1), ("batch_bytes", batch_bytes, 1),
                               ("checkpoint_interval", checkpoint_interval, 0),
                               ("checkpoint_records", checkpoint_records, 1),
                               ("window_batches", window_batches, 1), ("window_bytes", window_bytes, 1)):
        if not value >= least:
            raise SyslogConfigError(f"syslog destination {url}: {name} must be >= {least}, got {value}")
    if receive_buffer_bytes is not None and not receive_buffer_bytes >= 0:
        raise SyslogConfigError(f"syslog destination {url}: receive_buffer_bytes must be >= 0, "
                                f"got {receive_buffer_bytes}")
    return Destination(endpoint, Header.for_node(node_name, facility), chosen,
                       tls if endpoint.scheme in TLS_SCHEMES else None,
                       udp_max_bytes if endpoint.scheme == "udp" else None, batch_records, batch_bytes,
                       checkpoint_interval, checkpoint_records, window_batches, window_bytes, receive_buffer_bytes)


def send_test_message(destination: Destination, *, now: float, test_id: str, sender: Sender | None = None,
                      timeout: float = 10.0) -> None:
    """Send one marked test message (rfc5424.encode_test_message) to `destination` on a connection of its own.

    Returns once TCP/TLS receivers acknowledged it (UDP: once it left the socket);
    SyslogError (transport, TLS or a TLS file that cannot be read) otherwise.
    Touches neither the audit files nor any checkpoint.
    """
    message = encode_test_message(destination.header, timestamp=rfc3339_millis(now), test_id=test_id)
    if sender is None:
        sender = open_sender(destination.endpoint, destination.tls, timeout)
    try:
        sender.connect()
        sender.send([frame(message, destination.framing)])
        wait_acked(sender, destination.name, timeout)
    finally:
        sender.close()


def checkpoint_name(endpoint: Endpoint) -> str:
    """The checkpoint file name of a destination: one file per scheme, host and port."""
    host = re.sub(r"[^A-Za-z0-9.-]", "_", endpoint.host)
    return f"{endpoint.scheme}_{host}_{endpoint.port}.json"
