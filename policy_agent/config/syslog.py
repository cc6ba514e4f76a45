"""The `syslog:` config section: forwarding destinations, and the forwarder's Destination built from one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from policy_agent.config.checks import bounded, checked, one_of, optional_file, optional_path

if TYPE_CHECKING:
    from auditlog.syslog.destination import Destination

# Linux keeps a socket's receive buffer size in an int.
RECEIVE_BUFFER_MAX = (1 << 31) - 1
# Far above any useful batch or window, far below what the sender's arithmetic and buffers take.
COUNT_MAX = 10_000_000
BYTES_MAX = 1 << 32


@dataclass(frozen=True)
class SyslogDestinationConfig:
    # udp://HOST:PORT, tcp://HOST:PORT, tls://HOST:PORT, relp://HOST:PORT or relp+tls://HOST:PORT
    # (514, 514, 6514, 2514, 2514; relp+tls: RELP inside TLS, rsyslog imrelp tls="on").
    url: str = field(default="", metadata=checked(lambda v: None if v else "is required"))
    # Facility name (local0..local7, daemon, ...) or number 0..23; severity comes from the disposition.
    facility: str = "local0"
    # tcp/tls only: octet-counting (RFC 6587 / RFC 5425) or lf.
    framing: str = field(default="octet-counting", metadata=checked(one_of("octet-counting", "lf")))
    # tls and relp+tls only: CA file the server must chain to ("" = the system's trust store), optional client
    # certificate and key, and the name the server certificate must carry ("" = the URL's host).
    ca: str = field(default="", metadata=checked(optional_file))
    cert: str = field(default="", metadata=checked(optional_file))
    key: str = field(default="", metadata=checked(optional_file))
    server_name: str = ""
    # udp only: longest datagram; a longer record is sent with a JSON stub as MSG (counted).
    udp_max_bytes: int = field(default=2048, metadata=checked(bounded(1024, 65507)))
    # One send: at most this many records and about this many bytes of them.
    batch_records: int = field(default=1000, metadata=checked(bounded(1, COUNT_MAX)))
    batch_bytes: int = field(default=1 << 20, metadata=checked(bounded(1, BYTES_MAX)))
    # tcp/tls: batches sent ahead while earlier ones are not yet acknowledged by the receiver's
    # TCP, at most this many and about this many bytes (one batch always goes). A dropped
    # connection resends from the last batch the receiver must have read: duplicates at most
    # the window plus a receive buffer (auditlog/syslog/window.py), never loss.
    window_batches: int = field(default=4, metadata=checked(bounded(1, COUNT_MAX)))
    window_bytes: int = field(default=8 << 20, metadata=checked(bounded(1, BYTES_MAX)))
    # tcp/tls: bytes the receiver may hold acknowledged by its TCP and not yet read. A batch is
    # delivered once this many bytes after it were acknowledged too. null = this host's
    # net.ipv4.tcp_rmem maximum (exact for a receiver on this host, a guess for another);
    # 0 = trust the TCP acknowledgement (a receiver that stops may lose what it acknowledged).
    receive_buffer_bytes: int | None = field(default=None, metadata=checked(
        lambda v: None if v is None or 0 <= v <= RECEIVE_BUFFER_MAX else
        f"must be between 0 and {RECEIVE_BUFFER_MAX} (or null for this host's tcp_rmem maximum), got {v}"))
    # The checkpoint (what was delivered) is saved once this many seconds or records have passed
    # since the last save, whenever the forwarder is idle or retrying, and at shutdown; a crash
    # sends at most that much again (duplicates, never loss). It never runs ahead of delivery.
    checkpoint_interval: float = field(default=1.0, metadata=checked(bounded(0, 86400)))
    checkpoint_records: int = field(default=50_000, metadata=checked(bounded(1, COUNT_MAX)))


@dataclass(frozen=True)
class SyslogConfig:
    # Forward every audit record to each destination (RFC 5424, one forwarder each).
    destinations: tuple[SyslogDestinationConfig, ...] = ()
    # Where each destination's checkpoint is kept; "" = <state_dir>/syslog. On a tmpfs
    # state_dir a reboot forgets it and the files on disk are sent again (duplicates, no loss).
    checkpoint_dir: str = field(default="", metadata=checked(optional_path))
    # Each destination's forwarder in a child process of its own (its own GIL, restarted if it
    # dies); false: a thread of the agent, sharing the GIL with the audit pipeline, which a
    # distinct-flow flood can then outrun (bench/syslog_throughput.py, the sustained phase).
    process: bool = True


def syslog_destination(dest: SyslogDestinationConfig, node: str) -> Destination:
    """The forwarder's Destination for one configured destination; SyslogConfigError if it cannot work."""
    from auditlog.syslog.destination import make_destination
    from auditlog.syslog.transport import TlsOptions

    tls = None
    if dest.url.startswith(("tls:", "relp+tls:")) or dest.ca or dest.cert or dest.key or dest.server_name:
        tls = TlsOptions(ca=Path(dest.ca) if dest.ca else None, cert=Path(dest.cert) if dest.cert else None,
                         key=Path(dest.key) if dest.key else None, server_name=dest.server_name or None)
    framing = None if dest.url.startswith("udp:") and dest.framing == "octet-counting" else dest.framing
    return make_destination(dest.url, node_name=node, facility=dest.facility, framing=framing, tls=tls,
                            udp_max_bytes=dest.udp_max_bytes, batch_records=dest.batch_records,
                            batch_bytes=dest.batch_bytes, checkpoint_interval=dest.checkpoint_interval,
                            checkpoint_records=dest.checkpoint_records, window_batches=dest.window_batches,
                            window_bytes=dest.window_bytes, receive_buffer_bytes=dest.receive_buffer_bytes)
