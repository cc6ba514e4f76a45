"""The cluster side of a node: the Pod directory of every node's Pods, and the routes to the other nodes."""
