"""Exceptions raised by the packetin package."""

from __future__ import annotations


class PacketInError(Exception):
    """Base class for everything this package raises."""


class DecodeError(PacketInError):
    """Bytes that are not a well-formed message of the kind expected."""


class ChannelClosed(PacketInError):
    """The OpenFlow connection went away before the operation completed."""


class OpenFlowError(PacketInError):
    """The switch answered a request with OFPT_ERROR.

    `failed` names the message that failed (type, xid and a summary) so the
    caller can tell which flow or meter was refused.
    """

    def __init__(self, text: str, *, err_type: int, err_code: int, xid: int, failed: str) -> None:
        super().__init__(text)
        self.err_type = err_type
        self.err_code = err_code
        self.xid = xid
        self.failed = failed
        self.reply: object = None  # the parsed OFPT_ERROR, when there is one
