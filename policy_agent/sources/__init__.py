"""Where policy and Pods come from: Kubernetes, a manifest directory, the local API, the applied store."""
