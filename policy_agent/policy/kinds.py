"""The API kinds the agent reads: groups and versions, resource names, scope.

Written once here and used by the manifest loader, the Kubernetes source and the
applied-manifest store, so a new Antrea version or kind is one edit.
"""

from __future__ import annotations

from dataclasses import dataclass

from policy_agent.policy.model import PolicyKind

K8S_NETWORKING = "networking.k8s.io/v1"
ANTREA_GROUP, ANTREA_VERSION = "crd.antrea.io", "v1beta1"
ANTREA_API = f"{ANTREA_GROUP}/{ANTREA_VERSION}"
# Current group first; the legacy groups are accepted identically so manifests written
# for older Antrea releases keep working after an upgrade.
ANTREA_GROUPS = (ANTREA_API, f"{ANTREA_GROUP}/v1alpha1", "security.antrea.tanzu.vmware.com/v1alpha1")
ANTREA_GROUP_NAMES = frozenset(api.rpartition("/")[0] for api in ANTREA_GROUPS)

# The model's kind names besides PolicyKind's.
NAMESPACE, POD, TIER = "Namespace", "Pod", "Tier"
CLUSTER_SCOPED = frozenset({NAMESPACE, TIER, PolicyKind.ACNP.value})


@dataclass(frozen=True)
class ApiResource:
    """One resource as the API server serves it, and the model kind it becomes."""

    api_version: str   # the served version this agent lists and watches
    kind: str          # as the API server names it (Antrea's NetworkPolicy is "NetworkPolicy")
    plural: str        # the resource's URL segment
    model_kind: str    # NAMESPACE | POD | TIER | a PolicyKind value

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def name(self) -> str:
        """`plural.group` as kubectl names it; just the plural for the core group."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_versions(self) -> tuple[str, ...]:
        """Every apiVersion a manifest of this kind may carry."""
        return ANTREA_GROUPS if self.group == ANTREA_GROUP else (self.api_version,)


NAMESPACES = ApiResource("v1", "Namespace", "namespaces", NAMESPACE)
PODS = ApiResource("v1", "Pod", "pods", POD)
K8S_NETWORK_POLICIES = ApiResource(K8S_NETWORKING, "NetworkPolicy", "networkpolicies", PolicyKind.K8S.value)
TIERS = ApiResource(ANTREA_API, "Tier", "tiers", TIER)
ANTREA_CLUSTER_POLICIES = ApiResource(ANTREA_API, "ClusterNetworkPolicy", "clusternetworkpolicies",
                                      PolicyKind.ACNP.value)
ANTREA_POLICIES = ApiResource(ANTREA_API, "NetworkPolicy", "networkpolicies", PolicyKind.ANP.value)
RESOURCES = (NAMESPACES, PODS, K8S_NETWORK_POLICIES, TIERS, ANTREA_CLUSTER_POLICIES, ANTREA_POLICIES)

# (apiVersion, kind) as written in a manifest -> the model's kind.
SERVED: dict[tuple[str, str], str] = {
    (api, r.kind): r.model_kind for r in RESOURCES for api in r.api_versions}
