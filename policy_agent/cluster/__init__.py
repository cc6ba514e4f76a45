"""The cluster side of a node: the Pod directory of every node's Pods (subnets and tunnels between nodes to come)."""
