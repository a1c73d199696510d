"""Whatever order the cluster's events come in, and however far the controller's view lags,
no index ever has two live pods, and the job still ends with every index succeeded once."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilotfish.kube.rest import PODS
from pilotfish.timeutil import FakeClock
from tests.batch_harness import KEY, NS, Cluster, batch, start

ACTIONS = (
    "sync",
    "stale-sync",
    "bind",
    "succeed",
    "fail",
    "disrupt",
    "delete",
    "kubelet",
    "wait",
    "suspend",
)
COMPLETIONS = 6


async def scenario(actions: list[tuple[str, int]]) -> None:
    api, clock = Cluster(), FakeClock()
    spec = batch(completions=COMPLETIONS, parallelism=3, backoffLimit=1000)
    w = await start(api, clock, backoff_base=1.0, create=spec)
    failures = 0
    try:
        for action, n in actions:
            live = [p["metadata"]["name"] for p in api.live()]
            pick = live[n % len(live)] if live else None
            if action == "sync":
                await w.step()
            elif action == "stale-sync":
                await w.ctrl.reconcile(KEY)  # the watches may be behind the API
            elif action == "wait":
                clock.advance(5)
            elif action == "kubelet":
                failures += api.kubelet_ends()
            elif action == "suspend":
                api.edit_spec(suspend=not api.bw()["spec"].get("suspend", False))
            elif pick is None:
                continue
            elif action == "bind":
                api.bind(pick)
            elif action == "succeed":
                api.finish(pick, "Succeeded")
            elif action in ("fail", "disrupt"):
                api.finish(pick, "Failed", disrupted=action == "disrupt")
                failures += 1
            elif action == "delete":  # counts as a failure unless a disruption was set
                await api.delete(PODS.path(NS, pick))
                failures += 1
            assert all(c <= 1 for c in api.live_per_index().values()), api.live_per_index()
            await asyncio.sleep(0)
        api.edit_spec(suspend=False)
        for _ in range(40):
            await w.converge()
            assert all(c <= 1 for c in api.live_per_index().values())
            if api.condition("Complete"):
                break
            failures += api.kubelet_ends()
            api.run_all()
            clock.advance(60)
        status = api.status()
        assert api.condition("Complete") == ("True", "Completed"), status
        assert status["succeeded"] == COMPLETIONS
        assert status["completedIndexes"] == f"0-{COMPLETIONS - 1}"
        assert status["failed"] + status["disrupted"] <= failures
        assert api.tracked() == []
    finally:
        await w.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 10)), max_size=60))
def test_never_two_live_pods_on_an_index(actions: list[tuple[str, int]]) -> None:
    asyncio.run(scenario(actions))
