"""What the `npaudit` verbs share: the config, logging, the version, private files, the agent's status."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

if TYPE_CHECKING:
    from policy_agent.config.client import AgentAddress
    from policy_agent.config.loader import AgentConfig

# Where a verb finds its config without --config: this variable, else this file when it exists.
CONFIG_ENV = "NPAUDIT_CONFIG"
DEFAULT_CONFIG = Path("/etc/npaudit/npaudit.yaml")
CONFIG_HELP = f"(default: ${CONFIG_ENV}, else {DEFAULT_CONFIG} when it exists, else built-in defaults)"

# One request to the agent's local API (policy_agent.sources.local_api.call), injectable in tests.
ApiCall = Callable[[Path, dict[str, Any]], dict[str, Any]]


def setup_logging(level: str) -> None:
    import logging

    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def config_path(given: str | None) -> str | None:
    """--config, else $NPAUDIT_CONFIG, else /etc/npaudit/npaudit.yaml when it exists; None: the defaults."""
    if given:
        return given
    if os.environ.get(CONFIG_ENV):
        return os.environ[CONFIG_ENV]  # named explicitly: a missing file is an error, not the defaults
    return str(DEFAULT_CONFIG) if DEFAULT_CONFIG.is_file() else None


def load_config(given: str | None) -> AgentConfig:
    """The config named by --config (`given`), $NPAUDIT_CONFIG or the default path, else the built-in
    defaults; exit status 2 with one line per error otherwise."""
    from policy_agent.config import loader

    path = config_path(given)
    try:
        # No file: the defaults, still with the node name from NODE_NAME when that is set.
        return loader.loads("", "<defaults>") if path is None else loader.load(path)
    except loader.ConfigError as exc:
        for line in exc.errors:
            print(f"config error: {line}", file=sys.stderr)
        raise SystemExit(2) from exc


def agent_address(given: str | None) -> AgentAddress:
    """Where the running agent listens, for a verb that only talks to it: state_dir from the config `given`
    (see config_path) without building the rest (policy_agent/config/client.py); a file that reader cannot
    vouch for is loaded whole, so its errors are the loader's (exit status 2)."""
    from policy_agent.config.client import AgentAddress, read

    path = config_path(given)
    address = read(path)
    return address if address is not None else AgentAddress(load_config(given).state_dir)


def audit_paths(paths: list[Path], config: str | None, base: str) -> tuple[list[Path], str]:
    """The audit files to read and the live file's name to look for in a directory: `paths` and
    `base` as given, else audit.path of the config (see config_path), else /var/log/npaudit."""
    if paths:
        return paths, base
    from auditlog.fileset import DEFAULT_BASE, DEFAULT_DIR

    live = Path(load_config(config).audit.path) if config_path(config) else DEFAULT_DIR / DEFAULT_BASE
    return [live.parent], live.name


def version() -> str:
    """The installed npaudit's version."""
    # The installed distribution's directory names it: a listing of sys.path is far cheaper than
    # importing importlib.metadata (email, zipfile, csv...), which `npaudit --version` paid before.
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith("npaudit-") and name.endswith(".dist-info"):
                return name[len("npaudit-"):-len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("npaudit")
    except PackageNotFoundError:
        return "unknown (not installed)"


def quiet_stdout() -> None:
    """After stdout's reader went away: point stdout at /dev/null (the Python docs' recipe), so the
    flush of what is still buffered at exit cannot fail again and print a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def open_private(path: str) -> TextIO:
    """Append to `path`, created (or narrowed to) 0600: the debug tap holds packet bytes."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return open(fd, "a", buffering=1)


def ask_status(cfg: AgentAddress | AgentConfig, api: ApiCall | None) -> tuple[dict[str, Any] | None, str]:
    """The running agent's status snapshot, or None and one line saying why there is none."""
    from policy_agent.rpc import STATUS_OP, call

    try:
        reply = (api or call)(cfg.api_socket, {"op": STATUS_OP})
    except OSError as exc:
        return None, (f"no agent answers at {cfg.api_socket} ({exc.strerror or exc}); is `npaudit agent` "
                      "running with this config?")
    except Exception as exc:  # OutcomeUnknown, a bad frame: still one line
        return None, f"agent at {cfg.api_socket}: {exc}"
    status = reply.get("status")
    if not reply.get("ok") or not isinstance(status, dict):
        errors = reply.get("errors") or ["no status in the reply"]
        return None, f"agent at {cfg.api_socket}: {'; '.join(map(str, errors))}"
    return status, ""


def dig(data: Any, *keys: str) -> Any:
    """data[k1][k2]..., None where a level is missing or not a mapping (agent replies are data, not trusted)."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def duration(seconds: float) -> str:
    """A duration as an operator reads it: 3d4h, 2h05m, 4m09s, 7s."""
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{days}d{hours}h" if days else f"{hours}h{minutes:02d}m" if hours else
            f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")
