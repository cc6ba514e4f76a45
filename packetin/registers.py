"""The one place that says which OVS register and userdata byte carries what.

DESIGN.md §3 fixes reg7[0..3] (disposition) and reg6 (rule id); every other
register belongs to the agent and is allocated here so no two modules clash.
"""

from __future__ import annotations

# reg7[0..3]: disposition of the rule that judged the packet (see Disposition).
REG_DISPOSITION = 7
REG_DISPOSITION_FIELD = f"reg{REG_DISPOSITION}"  # its OVS match / set-field name
DISPOSITION_BITS = 0xF
# reg6: 32-bit rule id, unique per realised rule, stable across restarts for the
# same policy revision.
REG_RULE_ID = 6
REG_RULE_ID_FIELD = f"reg{REG_RULE_ID}"
# reg3[0..7]: traceflow (policy_agent/traceflow/flows.py). Bit 0 marks a traced packet from
# table 10 on (set before ct(), so its recirculation never shares a datapath flow with real
# traffic); bits 1..7 say which traceflow observation point the packet already passed, so
# the trace flow there, which resubmits to its own table, matches only once.
REG_TRACEFLOW = 3
REG_TRACEFLOW_FIELD = f"reg{REG_TRACEFLOW}"
TRACEFLOW_ACTIVE_BIT = 0x1
TRACEFLOW_SEEN_SHIFT = 1  # seen bit of observation point n: 1 << (TRACEFLOW_SEEN_SHIFT + n), n < 7
# reg4 / reg5: the Pod class (address-set id, policy_agent/policy/classes.py) of a new
# connection's source Pod (by in_port) and destination Pod (by address); 0 = none.
REG_SRC_CLASS = 4
REG_SRC_CLASS_FIELD = f"reg{REG_SRC_CLASS}"
REG_DST_CLASS = 5
REG_DST_CLASS_FIELD = f"reg{REG_DST_CLASS}"
# reg0..reg2 and reg3[8..31] are unallocated yet; claim them here with a comment before use.

# OpenFlow 1.5 carries registers in packet-in metadata as 64-bit packet
# registers: xreg N = (reg 2N << 32) | reg 2N+1, so reg6:reg7 arrive as xreg3.
XREG_RULE_AND_DISPOSITION = 3

# Layout of the controller action's userdata (DESIGN.md §3):
#   byte 0 layout version, byte 1 category, byte 2 flags, bytes 3..6 rule id.
# Category TRACEFLOW carries the trace's tag and the copy's phase in bytes 3..6 instead
# (policy_agent/traceflow/flows.py: TraceMark).
USERDATA_VERSION = 1
USERDATA_LENGTH = 7
