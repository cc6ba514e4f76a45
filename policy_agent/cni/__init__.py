"""CNI: the `npaudit cni` plugin, its wire protocol, and the agent's server and Pod interface handler."""

# Only the light wire module is re-exported: the plugin process imports this
# package and must not pay for pyroute2 or ovsdbapp.
from policy_agent.cni.wire import CniError, CniRequest, WireError

__all__ = ["CniError", "CniRequest", "WireError"]
