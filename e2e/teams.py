"""Team quotas for e2e namespaces: a team no TeamQuota grants runs nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from e2e.conftest import Env, wait_until
from pilotfish import names

# Teams granted every band without limits whose TeamQuota admission has been seen to use.
_OPEN_TEAMS: set[str] = set()


def open_quota(env: Env, team: str, namespace: str) -> None:
    """Grant `team` every band without limits (a TeamQuota named after it) and wait until
    admission in `namespace`, one of the team's, uses it: every pod of a team namespace is
    charged to its band (batch when it names none), and a team no TeamQuota grants runs
    nothing."""
    if team in _OPEN_TEAMS:
        return
    body = {
        "apiVersion": names.API_VERSION,
        "kind": "TeamQuota",
        "metadata": {"name": team},
        "spec": {"team": team, "bands": {band: {} for band in names.BANDS}},
    }
    try:
        k8s.CustomObjectsApi(env.api).create_cluster_custom_object(
            names.GROUP, names.VERSION, "teamquotas", body
        )
    except ApiException as e:
        if e.status != 409:
            raise
    probe = {
        "metadata": {"name": "quota-probe"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }

    def admitted() -> bool:
        try:
            k8s.CoreV1Api(env.api).create_namespaced_pod(namespace, probe, dry_run="All")
        except ApiException as e:
            if e.status in (403, 500, 503):
                return False
            raise
        return True

    wait_until(f"admission to see TeamQuota {team}", admitted, timeout=30)
    _OPEN_TEAMS.add(team)


@contextmanager
def own_team(env: Env, namespace: str) -> Iterator[str]:
    """A fresh team owning `namespace` for one test (labelled as the platform would, by the
    admin); its TeamQuota, if the test made one, is deleted on the way out."""
    name = f"t{uuid.uuid4().hex[:8]}"
    k8s.CoreV1Api(env.api).patch_namespace(
        namespace, {"metadata": {"labels": {names.LABEL_TEAM: name}}}
    )
    try:
        yield name
    finally:
        try:
            k8s.CustomObjectsApi(env.api).delete_cluster_custom_object(
                names.GROUP, names.VERSION, "teamquotas", name
            )
        except ApiException as e:
            if e.status != 404:
                raise
