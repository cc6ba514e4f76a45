"""The agent's typed configuration: the loader (AgentConfig, load) and one module per config section."""
