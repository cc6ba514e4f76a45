"""The `ovs:` and `openflow:` config sections: the switch the agent runs or uses, and its connection to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from packetin.read_pacing import READ_DELAY_MAX
from policy_agent.config.checks import (absolute_path, checked, interface_name, netns_name, one_of, ovs_queue_size,
                                        positive)


@dataclass(frozen=True)
class OvsConfig:
    # embedded: the agent starts a private ovsdb-server + ovs-vswitchd (userspace
    # datapath) in run_dir, never touching a system OVS. external: use the OVS at `db`.
    mode: str = field(default="embedded", metadata=checked(one_of("embedded", "external")))
    # Where the embedded OVS keeps its database, sockets, pid and log files.
    run_dir: str = field(default="/var/run/npaudit/ovs", metadata=checked(absolute_path))
    # Network namespace the embedded ovs-vswitchd runs in, created if missing
    # ("" = the agent's own). Each netdev vswitchd claims a tap named ovs-netdev,
    # so two instances must not share a namespace.
    netns: str = field(default="npaudit-ovs", metadata=checked(netns_name))
    # OVSDB remote. "" = <run_dir>/db.sock when embedded,
    # unix:/var/run/openvswitch/db.sock when external. External: the directory of a
    # unix socket is taken as the OVS run dir (pid files, ovs-vswitchd.<pid>.ctl, and
    # the controller socket with openflow.transport unix); /var/run/openvswitch for tcp.
    db: str = ""
    # At most 15 characters (an interface of this name is made).
    bridge: str = field(default="br-int", metadata=checked(interface_name))
    # auto = system when the openvswitch kernel module is loaded and vswitchd
    # supports it, else netdev (userspace).
    datapath_type: str = field(default="auto", metadata=checked(one_of("auto", "netdev", "system")))
    # Packet-ins OVS queues for the agent's connection before dropping
    # (rconn_overflow). OVS allows 1..512; its own default is 100.
    controller_queue_size: int = field(default=512, metadata=checked(ovs_queue_size))
    # Seconds between looks at the OVS daemons' pid files while a daemon's death is not notified
    # (it is dead, waiting for its restart, or no pidfd here); with notices a death is seen at once
    # and the files are looked at once a minute only (ovs/supervisor.py). Embedded: a dead daemon is
    # restarted (ovsdb-server together with ovs-vswitchd), with backoff and a cap per
    # window. External: a dead daemon is only reported (log, npaudit_ovs_up).
    supervise_interval: float = field(default=1.0, metadata=checked(positive))

    @property
    def db_remote(self) -> str:
        if self.db:
            return self.db
        if self.mode == "embedded":
            return f"unix:{Path(self.run_dir) / 'db.sock'}"
        return "unix:/var/run/openvswitch/db.sock"

    @property
    def ovs_rundir(self) -> Path:
        """Where the switch's pid files and control sockets are. External: beside its OVSDB socket
        (`db` unix:/x/db.sock -> /x, as OVS_RUNDIR puts them), else /var/run/openvswitch."""
        if self.mode == "embedded":
            return Path(self.run_dir)
        if self.db.startswith("unix:"):
            return Path(self.db[len("unix:"):]).parent
        return Path("/var/run/openvswitch")


@dataclass(frozen=True)
class OpenFlowConfig:
    # Where the agent connects: a unix socket path or tcp:HOST:PORT. "" = a
    # controller the agent configures on the bridge itself (with
    # ovs.controller_queue_size), over `transport`.
    target: str = ""
    # auto = tcp when the embedded OVS has a namespace of its own (its 127.0.0.1
    # is reachable only from inside that namespace), unix otherwise.
    # tcp: ptcp:<tcp_port>:127.0.0.1. TCP buffers absorb bursts that overflow a
    # unix socket (bench/packetin_throughput.py measures both). On a host
    # namespace any local process could connect to it: prefer unix there.
    # unix: punix:<ovs rundir>/<bridge>.npaudit, protected by file permissions.
    transport: str = field(default="auto", metadata=checked(one_of("auto", "unix", "tcp")))
    tcp_port: int = field(default=6653,
                          metadata=checked(lambda v: None if 0 < v < 65536 else f"must be 1..65535, got {v}"))
    # Seconds between echo requests; the connection is dropped after
    # echo_timeout seconds without any message from the switch.
    echo_interval: float = field(default=5.0, metadata=checked(positive))
    echo_timeout: float = field(default=15.0, metadata=checked(positive))
    # Reconnect backoff cap in seconds (jittered, doubling from 50 ms).
    reconnect_max: float = field(default=2.0, metadata=checked(positive))
    # Seconds: in a flood of packet-ins, the longest the agent waits between two reads so that one
    # wake-up handles many (packetin/read_pacing.py). Packet-ins READ_TRICKLE (20 ms) apart or more
    # (up to 50 a second) are read at once; in a flood a record's time can be up to this much later
    # than the packet's. 0 = off. At most 0.2: the default, and the bound on that lateness.
    read_pace_max: float = field(default=READ_DELAY_MAX, metadata=checked(
        lambda v: None if 0 <= v <= READ_DELAY_MAX else f"must be 0..{READ_DELAY_MAX} seconds, got {v}"))
