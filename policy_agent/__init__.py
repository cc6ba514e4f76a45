"""Policy agent: composition root, embedded OVS, config, CLI (policy compiler and CNI: issue 3)."""
