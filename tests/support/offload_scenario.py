"""The drop-offload scenario's Namespaces, flooding sender and policies, shared by its e2e tests
and the flood benches."""

from __future__ import annotations

import textwrap

PORT = 5353


# Sends UDP datagrams "phase:seq" at a steady rate; prints how many it sent.
SENDER = r"""
import socket, sys, time
ip, port, rate, count, phase = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = time.monotonic()
for n in range(count):
    ahead = n / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
    s.sendto(b"%s:%d" % (phase.encode(), n), (ip, port))
print(count, flush=True)
"""


NAMESPACES = textwrap.dedent("""
    apiVersion: v1
    kind: Namespace
    metadata: {name: x, labels: {kubernetes.io/metadata.name: x}}
    ---
    apiVersion: v1
    kind: Namespace
    metadata: {name: y, labels: {kubernetes.io/metadata.name: y}}
    ---
    apiVersion: v1
    kind: Pod
    metadata: {name: a, namespace: x, labels: {app: client}}
""")


def pod_y(app: str) -> str:
    return f"apiVersion: v1\nkind: Pod\nmetadata: {{name: a, namespace: y, labels: {{app: {app}}}}}\n"


def policy(action: str) -> str:
    return textwrap.dedent(f"""
        apiVersion: crd.antrea.io/v1beta1
        kind: ClusterNetworkPolicy
        metadata: {{name: flood-guard}}
        spec:
          tier: securityops
          priority: 1
          appliedTo: [{{podSelector: {{matchLabels: {{app: web}}}}}}]
          ingress:
          - name: no-udp-{PORT}
            action: {action}
            enableLogging: true
            logLabel: flood
            from: [{{namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: x}}}}}}]
            ports: [{{protocol: UDP, port: {PORT}}}]
    """)
