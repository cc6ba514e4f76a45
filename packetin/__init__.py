"""OpenFlow packet-in channel: connection, NXT_PACKET_IN2 decoding, demux by category."""

from meters.ovs import MeterSpec, MeterSupport
from packetin.channel import ChannelSettings, OpenFlowChannel
from packetin.demux import Demux
from packetin.errors import ChannelClosed, DecodeError, OpenFlowError, PacketInError
from packetin.messages import Conjunction, Controller, Ct, FlowSpec, Output, Resubmit, SetField
from packetin.model import Category, Disposition, Flags, PacketIn, Userdata

__all__ = [
    "Category", "ChannelClosed", "ChannelSettings", "Conjunction", "Controller", "Ct", "DecodeError", "Demux",
    "Disposition", "Flags", "FlowSpec", "MeterSpec", "MeterSupport",
    "OpenFlowChannel", "OpenFlowError", "Output", "PacketIn", "PacketInError", "Resubmit",
    "SetField", "Userdata",
]
