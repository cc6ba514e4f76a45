"""The `npaudit cni` executable side: validate a CNI call, forward it to the agent, print its answer."""

from __future__ import annotations

import json

from policy_agent.cni.wire import (
    COMMANDS, CURRENT_VERSION, ERR_DECODE, ERR_INTERNAL, ERR_INVALID_CONFIG, ERR_INVALID_ENV, ERR_IO,
    ERR_TRY_AGAIN_LATER, ERR_UNKNOWN_CONTAINER, SUPPORTED_VERSIONS, CniError, CniRequest,
    container_id_problem, ifname_problem, netconf_version, parse_cni_args, pod_args_problem, recv_response,
    send_request,
)

# Exec'd once per Pod start: load only what VERSION needs; ADD/DEL/CHECK import _socket
# (tests/unit/policy_agent/test_rpc.py holds both paths to their module lists).
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any, Mapping, TextIO

DEFAULT_AGENT_SOCKET = "/var/run/npaudit/cni.sock"
CONNECT_TIMEOUT = 5.0
# The agent answers ADD only after every policy selecting the Pod is realised,
# which can take a while on a busy node. Below kubelet's default
# --runtime-request-timeout (2 min), so the runtime gets our error, not a kill.
RESPONSE_TIMEOUT = 110.0


def run(env: Mapping[str, str], stdin: bytes, stdout: TextIO) -> int:
    """One CNI invocation; returns the process exit code (errors go to stdout as the spec says)."""
    command = env.get("CNI_COMMAND", "")
    version = _error_version(stdin)
    try:
        if command == "VERSION":
            _emit(stdout, {"cniVersion": CURRENT_VERSION, "supportedVersions": list(SUPPORTED_VERSIONS)})
            return 0
        request = build_request(env, stdin)
        result = call_agent(agent_socket(request.netconf), request)
    except CniError as err:
        if command == "DEL" and err.code == ERR_UNKNOWN_CONTAINER:
            # Nothing of this container is left on the node: DEL has succeeded.
            return 0
        _emit(stdout, err.to_cni(version))
        return 1
    except Exception as exc:  # the runtime must get a CNI error object, never a traceback
        _emit(stdout, CniError(ERR_INTERNAL, "npaudit cni failed", f"{type(exc).__name__}: {exc}")
              .to_cni(version))
        return 1
    if command == "ADD":
        if not isinstance(result, dict) or "cniVersion" not in result:
            _emit(stdout, CniError(ERR_INTERNAL, "the npaudit agent returned no CNI result").to_cni(version))
            return 1
        _emit(stdout, result)
    return 0


def build_request(env: Mapping[str, str], stdin: bytes) -> CniRequest:
    """Validate the environment, then the network configuration; CniError names what is wrong."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        raise CniError(ERR_INVALID_ENV, "CNI_COMMAND is required")
    if command not in COMMANDS:
        raise CniError(ERR_INVALID_ENV, f"unknown CNI_COMMAND {command[:16]!r}",
                       "expected ADD, DEL, CHECK or VERSION")
    container_id = env.get("CNI_CONTAINERID", "")
    ifname = env.get("CNI_IFNAME", "")
    problem = container_id_problem(container_id) or ifname_problem(ifname)
    if problem:
        raise CniError(ERR_INVALID_ENV, problem)
    netns = env.get("CNI_NETNS", "")
    if command != "DEL" and not netns:
        # DEL may come after the runtime already destroyed the namespace.
        raise CniError(ERR_INVALID_ENV, f"CNI_NETNS is required for {command}")
    args = parse_cni_args(env.get("CNI_ARGS", ""))
    problem = pod_args_problem(args)
    if problem:  # CNI spec: code 4 for an invalid environment variable, which CNI_ARGS is
        raise CniError(ERR_INVALID_ENV, problem)
    netconf = decode_netconf(stdin)
    netconf_version(netconf, command)
    return CniRequest(command=command, container_id=container_id, netns=netns, ifname=ifname,
                      args=args, netconf=netconf)


def decode_netconf(stdin: bytes) -> dict[str, Any]:
    try:
        netconf = json.loads(stdin.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CniError(ERR_DECODE, "network configuration on stdin is not JSON", str(exc)[:200]) from exc
    if not isinstance(netconf, dict):
        raise CniError(ERR_DECODE, "network configuration must be a JSON object")
    return netconf


def agent_socket(netconf: Mapping[str, Any]) -> str:
    path = netconf.get("agentSocket", DEFAULT_AGENT_SOCKET)
    if not isinstance(path, str) or not path.startswith("/"):
        raise CniError(ERR_INVALID_CONFIG, "agentSocket must be an absolute path", repr(path)[:200])
    return path


def call_agent(path: str, request: CniRequest) -> dict[str, Any] | None:
    """One request on a fresh connection; the agent's result, or CniError."""
    # The C module: `socket` would add selectors, array and enum classes (~2 ms per Pod start).
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError, TimeoutError) as exc:
            # The agent is (re)starting or not deployed yet: the runtime retries on 11.
            raise CniError(ERR_TRY_AGAIN_LATER, "the npaudit agent is not reachable",
                           f"{path}: {exc}") from exc
        except OSError as exc:
            raise CniError(ERR_IO, "cannot connect to the npaudit agent", f"{path}: {exc}") from exc
        sock.settimeout(RESPONSE_TIMEOUT)
        try:
            send_request(sock, request)
            result = recv_response(sock)
        except TimeoutError as exc:
            raise CniError(ERR_TRY_AGAIN_LATER, f"the npaudit agent did not answer {request.command} "
                           f"within {RESPONSE_TIMEOUT:.0f}s", path) from exc
        except OSError as exc:
            raise CniError(ERR_IO, "lost the connection to the npaudit agent", f"{path}: {exc}") from exc
    finally:
        sock.close()
    return result


def _error_version(stdin: bytes) -> str:
    """The cniVersion to put in an error object: the caller's when we speak it."""
    try:
        version = json.loads(stdin.decode("utf-8")).get("cniVersion")
    except Exception:
        return CURRENT_VERSION
    return version if version in SUPPORTED_VERSIONS else CURRENT_VERSION


def _emit(stdout: TextIO, obj: Mapping[str, Any]) -> None:
    stdout.write(json.dumps(obj, indent=2) + "\n")
    stdout.flush()
