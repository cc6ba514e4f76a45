"""OpenFlow packet-in channel: connection, NXT_PACKET_IN2 decoding, demux by category.

The names below load on first use (PEP 562): importing one light submodule (frames, protocol_numbers,
wire) must not import os-ken and the channel with it, or every `npaudit` verb that reads audit
records would pay for OpenFlow at start-up (bench/cli_startup.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meters.ovs import MeterSpec, MeterSupport
    from packetin.channel import ChannelSettings, OpenFlowChannel
    from packetin.demux import Demux
    from packetin.errors import ChannelClosed, DecodeError, OpenFlowError, PacketInError
    from packetin.messages import Conjunction, Controller, Ct, FlowSpec, Output, Resubmit, SetField
    from packetin.model import Category, Disposition, Flags, PacketIn, Userdata

_HOMES = {
    "MeterSpec": "meters.ovs", "MeterSupport": "meters.ovs",
    "ChannelSettings": "packetin.channel", "OpenFlowChannel": "packetin.channel",
    "Demux": "packetin.demux",
    "ChannelClosed": "packetin.errors", "DecodeError": "packetin.errors", "OpenFlowError": "packetin.errors",
    "PacketInError": "packetin.errors",
    **dict.fromkeys(("Conjunction", "Controller", "Ct", "FlowSpec", "Output", "Resubmit", "SetField"),
                    "packetin.messages"),
    **dict.fromkeys(("Category", "Disposition", "Flags", "PacketIn", "Userdata"), "packetin.model"),
}

__all__ = ["Category", "ChannelClosed", "ChannelSettings", "Conjunction", "Controller", "Ct", "DecodeError",
           "Demux", "Disposition", "Flags", "FlowSpec", "MeterSpec", "MeterSupport", "OpenFlowChannel",
           "OpenFlowError", "Output", "PacketIn", "PacketInError", "Resubmit", "SetField", "Userdata"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    module: Any
    # One import statement per home (tests/unit/project/test_layers.py reads import statements).
    if home == "meters.ovs":
        from meters import ovs as module
    elif home == "packetin.channel":
        from packetin import channel as module
    elif home == "packetin.demux":
        from packetin import demux as module
    elif home == "packetin.errors":
        from packetin import errors as module
    elif home == "packetin.messages":
        from packetin import messages as module
    elif home == "packetin.model":
        from packetin import model as module
    else:
        raise AttributeError(f"module 'packetin' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
