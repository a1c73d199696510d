"""Emulated usage on kwok's nodes: the per-pod cpu and memory a real kubelet would report.

kwok computes each pod's usage from its `kwok.x-k8s.io/usage-cpu` / `usage-memory`
annotations (the ClusterResourceUsage `usage-from-annotation`) and serves the same series a
kubelet's `/metrics/resource` has (the Metric `metrics-resource`) at
`/metrics/nodes/<node>/metrics/resource`. Both are kwok's upstream documents, kept as
objects in the API (kwok's CRDs) rather than in its --config, so a test or a developer can
add a ResourceUsage for one pod without restarting kwok.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from kubernetes import client as k8s

GROUP = "kwok.x-k8s.io"
VERSION = "v1alpha1"
# kwok's --enable-crds names and the CRD files (kwok's kustomize/crd/bases) defining them.
CRDS = {
    "Metric": "kwok.x-k8s.io_metrics.yaml",
    "ClusterResourceUsage": "kwok.x-k8s.io_clusterresourceusages.yaml",
    "ResourceUsage": "kwok.x-k8s.io_resourceusages.yaml",
}
# kwok's documents (its kustomize/metrics), by kind's plural.
OBJECTS = {
    "metrics": "resource/metrics-resource.yaml",
    "clusterresourceusages": "usage/usage-from-annotation.yaml",
}
ANNOTATION_USAGE_CPU = "kwok.x-k8s.io/usage-cpu"
ANNOTATION_USAGE_MEMORY = "kwok.x-k8s.io/usage-memory"


def crd_documents(crd_dir: Path) -> list[dict[str, Any]]:
    return [yaml.safe_load((crd_dir / f).read_text()) for f in CRDS.values()]


def usage_objects(metrics_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object) for each of kwok's metrics and usage documents."""
    return [
        (plural, yaml.safe_load((metrics_dir / f).read_text())) for plural, f in OBJECTS.items()
    ]


def _established(crd: Any) -> bool:
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def install(api: k8s.ApiClient, crd_dir: Path, metrics_dir: Path, timeout: float = 60.0) -> None:
    """Install kwok's CRDs, then its Metric and ClusterResourceUsage; what exists is kept."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    ext = k8s.ApiextensionsV1Api(api)
    for doc in crd_documents(crd_dir):
        try:
            ext.create_custom_resource_definition(doc)
        except ApiException as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for doc in crd_documents(crd_dir):
        name = doc["metadata"]["name"]
        while not _established(ext.read_custom_resource_definition(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f}s")
            time.sleep(0.2)
    custom = k8s.CustomObjectsApi(api)
    for plural, obj in usage_objects(metrics_dir):
        try:
            custom.create_cluster_custom_object(GROUP, VERSION, plural, obj)
        except ApiException as e:
            if e.status != 409:
                raise
