"""The CNI protocol between the `npaudit cni` plugin and the agent: spec error codes, validation, messages.

One request per connection, framed by policy_agent.rpc (4-byte length + JSON).
"""

from __future__ import annotations

import re

from policy_agent import rpc
from policy_agent.errors import AgentError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    import asyncio
    import _socket  # the C module: the CNI plugin uses it without `socket` (start-up time)
    from typing import Any, Mapping

# CNI spec 1.0.0 error codes (1-99 are reserved by the spec, 100+ are ours).
ERR_INCOMPATIBLE_VERSION = 1
ERR_UNSUPPORTED_FIELD = 2
ERR_UNKNOWN_CONTAINER = 3
ERR_INVALID_ENV = 4
ERR_IO = 5
ERR_DECODE = 6
ERR_INVALID_CONFIG = 7
ERR_TRY_AGAIN_LATER = 11
ERR_INTERNAL = 999

COMMANDS = ("ADD", "DEL", "CHECK")
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0")
CURRENT_VERSION = "1.0.0"

# CNI spec: container IDs and network names are alphanumerics, underscore, dot, hyphen.
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_MAX_ID = 256
# Kubernetes object names (k8s.io/apimachinery validation): Namespaces are DNS-1123 labels,
# Pods DNS-1123 subdomains. Checked because they reach log lines and records verbatim.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_POD_NAMES = {
    "K8S_POD_NAMESPACE": (re.compile(_DNS1123_LABEL), 63, "a DNS-1123 label (a-z, 0-9, '-'"),
    "K8S_POD_NAME": (re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"), 253,
                     "a DNS-1123 subdomain (a-z, 0-9, '-', '.'"),
}


class CniError(AgentError):
    """A failure to report to the container runtime as a CNI error object."""

    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(f"{msg}: {details}" if details else msg)
        self.code = code
        self.msg = msg
        self.details = details

    def to_cni(self, cni_version: str = CURRENT_VERSION) -> dict[str, Any]:
        """The error object the plugin prints on stdout (CNI spec "Error" section)."""
        out: dict[str, Any] = {"cniVersion": cni_version, "code": self.code, "msg": self.msg}
        if self.details:
            out["details"] = self.details
        return out


class WireError(CniError):
    """A frame or message that does not follow this protocol (framing errors wrapped as ERR_DECODE)."""

    def __init__(self, msg: str, details: str = "", code: int = ERR_DECODE) -> None:
        super().__init__(code, msg, details)


# ---- validation shared by the plugin and the server (neither trusts the other) ----

def container_id_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return "CNI_CONTAINERID is required"
    if len(value) > _MAX_ID or not _ID_RE.match(value):
        return f"CNI_CONTAINERID {value[:64]!r} must be alphanumerics, '_', '.', '-' (max {_MAX_ID})"
    return None


def ifname_problem(value: object) -> str | None:
    # Linux interface names: at most 15 bytes, no '/', ':' or whitespace, not . or ..
    if not isinstance(value, str) or not value:
        return "CNI_IFNAME is required"
    # Printable characters only: that also refuses a lone surrogate (JSON "\ud800"), which no
    # interface name can hold and which would not even encode.
    if (not value.isprintable() or len(value.encode("utf-8", "surrogatepass")) > 15 or value in (".", "..")
            or any(c in value for c in "/:") or any(c.isspace() for c in value)):
        return f"CNI_IFNAME {value[:32]!r} is not a valid interface name"
    return None


def pod_args_problem(args: Mapping[str, str]) -> str | None:
    """What is wrong with K8S_POD_NAMESPACE / K8S_POD_NAME in CNI_ARGS (absent is fine: standalone)."""
    for key, (pattern, longest, kind) in _POD_NAMES.items():
        value = args.get(key)
        if value is not None and (len(value) > longest or not pattern.fullmatch(value)):
            return f"CNI_ARGS {key} {value[:64]!r} must be {kind}; at most {longest} characters)"
    return None


def parse_cni_args(raw: str) -> dict[str, str]:
    """CNI_ARGS "K=V;K=V" -> dict; empty segments are tolerated, a segment without '=' is not."""
    args: dict[str, str] = {}
    for part in raw.split(";"):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise CniError(ERR_INVALID_ENV, "invalid CNI_ARGS", f"segment {part[:64]!r} is not KEY=VALUE")
        args[key] = value
    return args


def netconf_version(netconf: object, command: str = "ADD") -> str:
    """Validate the network configuration's required keys; return its cniVersion."""
    if not isinstance(netconf, dict):
        raise CniError(ERR_DECODE, "network configuration must be a JSON object")
    version = netconf.get("cniVersion")
    if not isinstance(version, str) or not version:
        raise CniError(ERR_INVALID_CONFIG, "network configuration has no cniVersion")
    if version not in SUPPORTED_VERSIONS:
        raise CniError(ERR_INCOMPATIBLE_VERSION, f"incompatible CNI version {version[:32]!r}",
                       f"supported: {', '.join(SUPPORTED_VERSIONS)}")
    if command == "CHECK" and version in ("0.3.0", "0.3.1"):
        # CHECK exists from spec 0.4.0 on.
        raise CniError(ERR_INCOMPATIBLE_VERSION, f"CHECK is not defined for cniVersion {version}")
    name = netconf.get("name")
    if not isinstance(name, str) or not _ID_RE.match(name) or len(name) > _MAX_ID:
        raise CniError(ERR_INVALID_CONFIG, "network configuration needs a valid name",
                       "alphanumerics, '_', '.', '-'")
    if not isinstance(netconf.get("type"), str) or not netconf["type"]:
        raise CniError(ERR_INVALID_CONFIG, "network configuration has no type")
    return version


# ---- messages ----

class CniRequest:
    """One CNI invocation as the plugin forwards it; immutable, `args` and `netconf` read-only by convention.

    Written out rather than a frozen dataclass: dataclasses loads inspect, a cost the
    plugin, exec'd once per Pod, would pay on every call.
    """

    __slots__ = ("command", "container_id", "netns", "ifname", "args", "netconf")
    command: str
    container_id: str
    netns: str
    ifname: str
    args: Mapping[str, str]
    netconf: Mapping[str, Any]

    def __init__(self, command: str, container_id: str, netns: str, ifname: str,
                 args: Mapping[str, str] | None = None, netconf: Mapping[str, Any] | None = None) -> None:
        for name, value in (("command", command), ("container_id", container_id), ("netns", netns),
                            ("ifname", ifname), ("args", {} if args is None else args),
                            ("netconf", {} if netconf is None else netconf)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"CniRequest is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"CniRequest is immutable: cannot delete {name}")

    def _fields(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is CniRequest and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # args and netconf are dicts

    def __repr__(self) -> str:
        return "CniRequest(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"

    @property
    def cni_version(self) -> str:
        version = self.netconf.get("cniVersion")
        return version if isinstance(version, str) else CURRENT_VERSION

    @property
    def pod(self) -> str:
        """namespace/name for log lines ("?" where kubelet did not say)."""
        return f"{self.args.get('K8S_POD_NAMESPACE', '?')}/{self.args.get('K8S_POD_NAME', '?')}"

    def to_wire(self) -> dict[str, Any]:
        return {"command": self.command, "container_id": self.container_id, "netns": self.netns,
                "ifname": self.ifname, "args": dict(self.args), "netconf": dict(self.netconf)}

    @classmethod
    def from_wire(cls, obj: Any) -> CniRequest:
        """Validate a decoded request; raise CniError with the code the runtime should see."""
        if not isinstance(obj, dict):
            raise WireError("request must be a JSON object")
        command = obj.get("command")
        if command not in COMMANDS:
            raise CniError(ERR_INVALID_ENV, f"unknown CNI command {str(command)[:16]!r}")
        problem = container_id_problem(obj.get("container_id")) or ifname_problem(obj.get("ifname"))
        if problem:
            raise CniError(ERR_INVALID_ENV, problem)
        netns = obj.get("netns", "")
        if not isinstance(netns, str) or (command != "DEL" and not netns):
            raise CniError(ERR_INVALID_ENV, "CNI_NETNS is required for ADD and CHECK")
        args = obj.get("args", {})
        if not isinstance(args, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in args.items()):
            raise WireError("args must map strings to strings")
        problem = pod_args_problem(args)
        if problem:
            raise CniError(ERR_INVALID_ENV, problem)
        netconf = obj.get("netconf")
        netconf_version(netconf, command)
        return cls(command=command, container_id=obj["container_id"], netns=netns,
                   ifname=obj["ifname"], args=args, netconf=netconf)


def ok_response(result: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"ok": True, "result": dict(result) if result is not None else None}


def error_response(err: CniError) -> dict[str, Any]:
    return {"ok": False, "code": err.code, "msg": err.msg, "details": err.details}


def parse_response(obj: Any) -> dict[str, Any] | None:
    """The result of a successful response; CniError for an error response; WireError if malformed."""
    if not isinstance(obj, dict) or not isinstance(obj.get("ok"), bool):
        raise WireError("malformed response from the npaudit agent", code=ERR_INTERNAL)
    if obj["ok"]:
        result = obj.get("result")
        if result is not None and not isinstance(result, dict):
            raise WireError("malformed result from the npaudit agent", code=ERR_INTERNAL)
        return result
    code, msg, details = obj.get("code"), obj.get("msg"), obj.get("details", "")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(msg, str):
        raise WireError("malformed error response from the npaudit agent", code=ERR_INTERNAL)
    raise CniError(code, msg, details if isinstance(details, str) else str(details))


# ---- messages over policy_agent.rpc framing; framing errors become CNI errors here ----

def _wire_error(exc: rpc.FrameError) -> WireError:
    return WireError(exc.msg, exc.details)


def send_request(sock: _socket.socket, request: CniRequest) -> None:
    """Plugin side: one request on a connected socket."""
    try:
        rpc.send_message(sock, request.to_wire())
    except rpc.FrameError as exc:
        raise _wire_error(exc) from exc


def recv_response(sock: _socket.socket) -> dict[str, Any] | None:
    """Plugin side: the agent's answer, as parse_response() reads it."""
    try:
        reply = rpc.recv_message(sock)
    except rpc.ConnectionClosed as exc:
        raise WireError("the npaudit agent closed the connection inside a frame", exc.details,
                        code=ERR_IO) from exc
    except rpc.FrameError as exc:
        raise _wire_error(exc) from exc
    return parse_response(reply)


async def read_request(reader: asyncio.StreamReader) -> CniRequest:
    """Server side: one validated request."""
    try:
        msg = await rpc.read_message(reader)
    except rpc.FrameError as exc:
        raise _wire_error(exc) from exc
    return CniRequest.from_wire(msg)


async def write_response(writer: asyncio.StreamWriter, response: Mapping[str, Any]) -> None:
    """Server side: an ok_response() or error_response()."""
    try:
        await rpc.write_message(writer, response)
    except rpc.FrameError as exc:
        raise _wire_error(exc) from exc
