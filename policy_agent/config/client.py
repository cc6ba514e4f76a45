"""What a verb that only talks to the running agent reads of the config: where the agent's API socket is.

Building and validating the whole config (every section's classes) cost such a verb more than everything
else it does; it needs state_dir alone. `read` takes that from the file as strictly as the agent would
where it matters to the verb: UTF-8 YAML with no key given twice, a mapping whose top-level names are
all the agent's (a misspelt `state_dir` is never silently the default), state_dir an absolute path.
Anything else about the file is for the full loader (policy_agent.config.loader) to say, in its own
words; the sections such a verb does not use are the agent's and `npaudit check-config`'s to validate.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEFAULT_STATE_DIR", "TOP_LEVEL", "AgentAddress", "read"]

# AgentConfig's default state_dir and its top-level field names (tests hold them equal to the loader's).
DEFAULT_STATE_DIR = "/var/run/npaudit"
TOP_LEVEL = frozenset((
    "node_name", "cluster_name", "log_level", "state_dir", "ovs", "openflow", "packetin", "meters", "offload",
    "policy", "cni", "kubernetes", "audit", "syslog", "metrics", "bundle", "node_network", "cluster"))


class AgentAddress:
    """Where the running agent listens (AgentConfig has the same `state_dir` and `api_socket`)."""

    __slots__ = ("state_dir",)

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR) -> None:
        self.state_dir = state_dir

    @property
    def api_socket(self) -> Path:
        return Path(self.state_dir) / "api.sock"

    def __repr__(self) -> str:
        return f"AgentAddress(state_dir={self.state_dir!r})"


def read(path: str | None) -> AgentAddress | None:
    """The agent's address from the config file at `path` (None: the built-in default), or None when the
    file is not one this can vouch for: the full loader then reads it and names what is wrong."""
    if path is None:
        return AgentAddress()
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    import yaml

    from policy_agent.config.strict_yaml import ConfigError, strict_load

    try:
        data = strict_load(text)
    except (yaml.YAMLError, ConfigError, RecursionError):
        return None
    if data is None:
        return AgentAddress()
    if not isinstance(data, dict) or not all(isinstance(key, str) and key in TOP_LEVEL for key in data):
        return None
    state_dir = data.get("state_dir", DEFAULT_STATE_DIR)
    if not isinstance(state_dir, str):
        return None
    from policy_agent.config.checks import absolute_path

    return None if absolute_path(state_dir) else AgentAddress(state_dir)
