"""Addresses for Pods: running the IPAM plugin (host-local) as a CNI child, and the CNI result built from its lease."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from policy_agent.cni.state import PodInterfaceInfo
from policy_agent.cni.subnet import NodeSubnet
from policy_agent.cni.wire import CURRENT_VERSION, ERR_INTERNAL, ERR_INVALID_CONFIG, ERR_TRY_AGAIN_LATER, CniError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_IPAM_TIMEOUT = 30.0
# Children get this PATH and the CNI variables, nothing else of the agent's environment.
CHILD_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class IpamLease:
    """What the IPAM plugin handed out, reduced to what a Pod interface needs."""

    address: ipaddress.IPv4Interface
    gateway: str | None
    routes: list[dict[str, str]]
    dns: dict[str, Any]


class Ipam:
    """Runs the IPAM plugin named by a netconf's ipam.type from `bin_dir`; its dataDir defaults to `data_dir`,
    its range (when the netconf names none) to the node's Pod subnet."""

    def __init__(self, bin_dir: Path, data_dir: Path, subnet: NodeSubnet | None = None) -> None:
        self.bin_dir = Path(bin_dir)
        self.data_dir = Path(data_dir)
        self.subnet = subnet

    def netconf(self, netconf: Mapping[str, Any]) -> dict[str, Any]:
        """The netconf for the IPAM plugin: ours verbatim, dataDir under data_dir unless given, and the
        node's Pod subnet as host-local's range when it names no ranges."""
        ipam = netconf.get("ipam")
        kind = ipam.get("type") if isinstance(ipam, dict) else None
        # The type names a binary we execute: a plain file name inside bin_dir only.
        if not isinstance(kind, str) or not _SAFE_NAME.match(kind):
            raise CniError(ERR_INVALID_CONFIG, "network configuration needs ipam.type naming an IPAM plugin")
        conf = copy.deepcopy(dict(netconf))
        if self.subnet is not None:
            try:
                conf["ipam"] = self.subnet.ipam(conf["ipam"])
            except LookupError as exc:
                raise CniError(ERR_TRY_AGAIN_LATER, f"no address range for the Pod: {exc}") from exc
        conf["ipam"].setdefault("dataDir", str(self.data_dir))
        return conf

    def run(self, command: str, netconf: Mapping[str, Any], container_id: str, netns: str,
            ifname: str) -> dict[str, Any] | None:
        """One IPAM call (blocking); ADD returns the plugin's result, DEL and CHECK None; CniError on failure."""
        kind = netconf["ipam"]["type"]
        binary = self.bin_dir / kind
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": container_id, "CNI_NETNS": netns,
               "CNI_IFNAME": ifname, "CNI_PATH": str(self.bin_dir), "PATH": CHILD_PATH}
        what = f"IPAM {kind} {command} for {container_id}"
        try:
            proc = subprocess.run([str(binary)], input=json.dumps(netconf).encode(), env=env,
                                  capture_output=True, timeout=_IPAM_TIMEOUT)
        except FileNotFoundError as exc:
            raise CniError(ERR_INVALID_CONFIG, f"IPAM plugin {kind} not found in {self.bin_dir}") from exc
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CniError(ERR_INTERNAL, f"{what} failed", str(exc)) from exc
        if proc.returncode != 0:
            try:
                err = json.loads(proc.stdout)
                code, msg = int(err["code"]), str(err["msg"])
                details = str(err.get("details", ""))
            except (ValueError, KeyError, TypeError):
                code, msg = ERR_INTERNAL, (proc.stdout or proc.stderr).decode(errors="replace")[:500]
                details = ""
            raise CniError(code, f"{what} failed: {msg}", details)
        if command != "ADD":
            return None
        try:
            result = json.loads(proc.stdout)
        except ValueError as exc:
            raise CniError(ERR_INTERNAL, f"{what} printed no JSON result", str(exc)) from exc
        if not isinstance(result, dict):
            raise CniError(ERR_INTERNAL, f"{what} printed no JSON object")
        return result


def parse_ipam_result(raw: Any, netconf: Mapping[str, Any]) -> IpamLease:
    """The first IPv4 address of an IPAM result (any spec version), its routes and DNS."""
    try:
        ips = [ip for ip in raw["ips"] if ipaddress.ip_interface(ip["address"]).version == 4]
        if not ips:
            raise CniError(ERR_INVALID_CONFIG, "npaudit supports IPv4 Pods only",
                           f"IPAM returned {[ip.get('address') for ip in raw['ips']]}")
        address = ipaddress.IPv4Interface(ips[0]["address"])
        gateway = str(ipaddress.IPv4Address(ips[0]["gateway"])) if ips[0].get("gateway") else None
        routes: list[dict[str, str]] = []
        for route in raw.get("routes") or []:
            dst = ipaddress.ip_network(route["dst"], strict=False)
            if dst.version != 4:
                continue
            gw = route.get("gw") or gateway
            routes.append({"dst": str(dst), "gw": str(gw)} if gw else {"dst": str(dst)})
    except CniError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CniError(ERR_INTERNAL, "IPAM result not understood", f"{type(exc).__name__}: {exc}") from exc
    if gateway and not any(r["dst"] == "0.0.0.0/0" for r in routes):
        routes.append({"dst": "0.0.0.0/0", "gw": gateway})
    dns = netconf.get("dns") or raw.get("dns") or {}
    return IpamLease(address=address, gateway=gateway, routes=routes, dns=dict(dns))


def build_result(info: PodInterfaceInfo, host_mac: str, lease: IpamLease) -> dict[str, Any]:
    """The CNI 1.0.0 result; versioned() adapts it to what the runtime asked for."""
    ip: dict[str, Any] = {"address": f"{info.ip}/{info.prefix_len}"}
    if info.gateway:
        ip["gateway"] = info.gateway
    ip["interface"] = 1
    return {"cniVersion": CURRENT_VERSION,
            "interfaces": [{"name": info.host_ifname, "mac": host_mac},
                           {"name": info.ifname, "mac": info.mac, "sandbox": info.netns}],
            "ips": [ip], "routes": lease.routes, "dns": lease.dns}


def versioned(result: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A copy of a 1.0.0 result in the spec version the runtime asked for."""
    out = copy.deepcopy(dict(result))
    out["cniVersion"] = version
    if version != "1.0.0":
        for ip in out["ips"]:  # 0.3.x and 0.4.0 results carry the address family
            ip["version"] = "4"
    return out
