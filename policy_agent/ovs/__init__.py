"""Open vSwitch for the agent: the bridge over OVSDB, the embedded OVS, coverage counters, the table layout."""
