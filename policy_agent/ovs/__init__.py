"""Open vSwitch for the agent: the node's switch (daemons, OVSDB, bridge), unixctl, counters, the table layout."""
