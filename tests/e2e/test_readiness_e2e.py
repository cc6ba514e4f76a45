"""The agent's /readyz against the real process: never 200 before OpenFlow, the flows and the CNI server are up.

The DaemonSet's readinessProbe asks /readyz; a node marked ready too early gets Pods whose
CNI ADD fails. The test polls from the moment the process starts and, at the first 200,
checks the CNI socket accepts a connection and OVS holds the agent's flows.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

from tests.support.cluster import Cluster
from tests.support.ports import free_port


def test_readyz_answers_200_only_once_openflow_flows_and_cni_are_up() -> None:
    port = free_port()
    cluster = Cluster()
    cluster.config.write_text(cluster.config.read_text().replace("listen: ''", f"listen: 127.0.0.1:{port}"))
    seen: list[tuple[int, str]] = []
    at_first_ready: dict[str, object] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                    seen.append((resp.status, resp.read().decode()))
            except urllib.error.HTTPError as exc:
                seen.append((exc.code, exc.read().decode()))
            except OSError:  # not listening yet
                time.sleep(0.005)
                continue
            if seen[-1][0] == 200 and not at_first_ready:
                with socket.socket(socket.AF_UNIX) as s:
                    try:
                        s.connect(str(cluster.state / "cni.sock"))
                        at_first_ready["cni"] = "accepts"
                    except OSError as exc:
                        at_first_ready["cni"] = str(exc)
                at_first_ready["flows"] = len(cluster.flows())
                return
            time.sleep(0.005)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        cluster.start()
        poller.join(30)
        assert at_first_ready.get("cni") == "accepts", (at_first_ready, seen[:5])
        assert at_first_ready["flows"] > 0, at_first_ready
        # Every answer before that one was a 503 naming what was still missing.
        for status, body in seen[:-1]:
            assert status == 503 and body.startswith("not ready: "), (status, body)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp:
            assert resp.status == 200
    finally:
        done.set()
        cluster.close()
