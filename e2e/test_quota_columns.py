"""TeamQuota as a person reads it: `kubectl get teamquota` columns and `kubectl pilotfish why`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from e2e.conftest import Env, run, wait_until
from e2e.teams import own_team
from e2e.test_quota import make_quota, pod


@pytest.fixture
def team(env: Env, namespace: str) -> Iterator[str]:
    with own_team(env, namespace) as name:
        yield name


def columns(table: str, name: str) -> dict[str, str]:
    """The row of `name` in a kubectl table, by column header: values hold spaces, so the
    row is cut where each header starts (kubectl aligns every column under its header)."""
    header, *rows = table.splitlines()
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    titles = header.split()
    assert len(starts) == len(titles), header
    row = next((r for r in rows if r.split()[0] == name), None)
    assert row is not None, table
    bounds = [*starts[1:], len(row)]
    return {t: row[s:e].strip() for t, s, e in zip(titles, starts, bounds, strict=True)}


def test_get_teamquota_shows_held_against_limit_per_band_and_why_says_what_the_pod_holds(
    env: Env, namespace: str, team: str
) -> None:
    make_quota(
        env,
        team,
        {"production": {"cpu": "2", "memory": "4Gi", "pods": 10}, "batch": {"cpu": "4"}},
    )
    core = k8s.CoreV1Api(env.api)
    core.create_namespaced_pod(namespace, pod("holder", "production", "1"))
    core.create_namespaced_pod(namespace, pod("other", "production", "500m"))

    def shown() -> dict[str, str] | None:
        row = columns(env.kubectl("get", "teamquota", team).stdout, team)
        return row if row["PRODUCTION"] == "cpu 1500m/2, memory 128Mi/4Gi, pods 2/10" else None

    row = wait_until("kubectl get teamquota to show the production band held", shown, 60)
    assert row["TEAM"] == team
    assert row["BATCH"] == "cpu 0/4, memory 0/unlimited, pods 0/unlimited"
    assert row["BEST-EFFORT"] == "not granted"

    plugin = Path(sys.executable).parent / "kubectl-pilotfish"
    why = run([str(plugin), "--kubeconfig", str(env.kubeconfig), "why", "holder", "-n", namespace])
    assert (
        "production cpu: this pod holds 1; others use 500m of 2. "
        "production memory: this pod holds 64Mi; others use 64Mi of 4Gi. "
        "production pods: this pod holds 1; others use 1 of 10."
    ) in why.stdout, why.stdout
