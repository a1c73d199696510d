"""`kubectl pilotfish rollout`: what status reports, history, undo's conditional write,
pause and resume, against the shared in-memory API, rolled out by the real controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pilotfish.api.serviceworkload import PROGRESSING, STALLED
from pilotfish.cli.kubectl_plugin import parser
from pilotfish.cli.rollout_cmd import (
    history_cmd,
    parse_duration,
    pause_cmd,
    render_history,
    rollout_state,
    status_cmd,
    undo_cmd,
)
from pilotfish.kube.rest import SERVICEWORKLOADS
from pilotfish.operators.serviceworkload.progress import (
    REASON_COMPLETE,
    REASON_DEADLINE_EXCEEDED,
    REASON_IN_PROGRESS,
    REASON_PAUSED,
)
from pilotfish.operators.serviceworkload.revisions import template_hash
from pilotfish.timeutil import FakeClock
from tests.fakeapi import wait_for
from tests.rollout_harness import (
    SW,
    T0,
    Lagging,
    Obj,
    set_template,
    start,
    template,
    workload,
)


def sw_with(progressing: tuple[str, str] | None, stalled: str = "False", **status: Any) -> Obj:
    conditions = []
    if progressing:
        conditions.append({"type": PROGRESSING, "status": progressing[0], "reason": progressing[1]})
    conditions.append({"type": STALLED, "status": stalled, "message": "no progress for 60s"})
    return {
        "metadata": {"name": "web", "generation": 2},
        "spec": {"replicas": 3},
        "status": {"observedGeneration": 2, "conditions": conditions, **status},
    }


def test_rollout_state_reads_the_conditions() -> None:
    assert rollout_state(sw_with(("True", REASON_COMPLETE)))[0] == "done"
    state, message = rollout_state(sw_with(("False", REASON_DEADLINE_EXCEEDED), stalled="True"))
    assert state == "stalled" and "no progress for 60s" in message
    state, message = rollout_state(
        sw_with(("True", REASON_IN_PROGRESS), updatedReplicas=1, availableReplicas=2)
    )
    assert state == "waiting" and "1 of 3 updated replicas, 2 available" in message
    assert "paused" in rollout_state(sw_with(("Unknown", REASON_PAUSED)))[1]
    stale = sw_with(("True", REASON_COMPLETE))
    stale["metadata"]["generation"] = 3
    assert rollout_state(stale) == (
        "waiting",
        "Waiting for the rollout to be observed by the controller...",
    ), "a complete status of an older generation is not this rollout's"


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bad_duration_is_refused() -> None:
    with pytest.raises(Exception, match="invalid duration"):
        parse_duration("5 minutes")


def test_the_plugin_registers_every_rollout_verb() -> None:
    p = parser()
    for verb in ("status", "history", "undo", "pause", "resume"):
        args = p.parse_args(["rollout", verb, "web", "-n", "team-a"])
        assert (args.rollout_cmd, args.name, args.namespace) == (verb, "web", "team-a")
    assert p.parse_args(["rollout", "undo", "web", "--to-revision", "2"]).to_revision == 2
    assert p.parse_args(["rollout", "status", "web", "--watch=false"]).watch is False


async def rolled_out(api: Lagging, *images: str) -> None:
    """A workload taken through `images` (each a completed rollout) by the real controller."""
    clock = FakeClock(T0)
    api.put(SERVICEWORKLOADS.path("ns"), workload(replicas=2))
    world = await start(api, clock, seed=3)
    try:
        for i, image in enumerate(images):
            if i:
                set_template(api, template(image))
            for _ in range(6):
                clock.advance(1)
                await world.converge()
                api.make_ready(clock)
                api.terminate()
        await world.converge()
    finally:
        await world.stop()


@pytest.fixture
def api() -> Lagging:
    return Lagging()


async def test_undo_writes_the_previous_template_conditionally(
    api: Lagging, capsys: pytest.CaptureFixture[str]
) -> None:
    await rolled_out(api, "app:1", "app:2", "app:3")
    assert await undo_cmd(api, "ns", "web", None) == 0
    assert api.sw()["spec"]["template"] == template("app:2")
    assert "rolled back to revision 2" in capsys.readouterr().out
    assert await undo_cmd(api, "ns", "web", 1) == 0
    assert api.sw()["spec"]["template"] == template()
    assert await undo_cmd(api, "ns", "web", 9) == 1
    assert "revision 9 not found" in capsys.readouterr().err


async def test_undo_refuses_to_overwrite_a_concurrent_edit(
    api: Lagging, capsys: pytest.CaptureFixture[str]
) -> None:
    await rolled_out(api, "app:1", "app:2")
    real_get = api.get

    async def get_then_someone_edits(path: str, **kw: Any) -> Obj:
        obj = await real_get(path, **kw)
        if "serviceworkloads" in path:
            set_template(api, template("someone-else:9"))
        return obj

    api.get = get_then_someone_edits  # type: ignore[method-assign]
    assert await undo_cmd(api, "ns", "web", None) == 1
    assert api.sw()["spec"]["template"] == template("someone-else:9")
    assert "changed while rolling back" in capsys.readouterr().err


async def test_history_lists_revisions_with_their_pods(
    api: Lagging, capsys: pytest.CaptureFixture[str]
) -> None:
    await rolled_out(api, "app:1", "app:2")
    assert await history_cmd(api, "ns", "web", None) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "serviceworkload.pilotfish.io/web"
    assert out[1].split() == ["REVISION", "HASH", "PODS", "CHANGE-CAUSE"]
    assert out[2].split()[:3] == ["1", template_hash(template()), "0"]
    assert out[3].split()[:3] == ["2", template_hash(template("app:2")), "2"]
    assert out[3].endswith("(current template)")
    assert await history_cmd(api, "ns", "web", 1) == 0
    assert "image: app:1" in capsys.readouterr().out


def test_render_history_aligns_columns() -> None:
    assert render_history("web", [], "x", {}).splitlines() == [
        "serviceworkload.pilotfish.io/web",
        "REVISION  HASH  PODS  CHANGE-CAUSE",
    ]


async def test_pause_and_resume_flip_the_spec(
    api: Lagging, capsys: pytest.CaptureFixture[str]
) -> None:
    api.put(SERVICEWORKLOADS.path("ns"), workload())
    assert await pause_cmd(api, "ns", "web", True) == 0
    assert api.sw()["spec"]["strategy"]["paused"] is True
    assert await pause_cmd(api, "ns", "web", True) == 0
    assert "already paused" in capsys.readouterr().out
    assert await pause_cmd(api, "ns", "web", False) == 0
    assert api.sw()["spec"]["strategy"]["paused"] is False


async def test_status_waits_on_the_watch_until_complete(
    api: Lagging, capsys: pytest.CaptureFixture[str]
) -> None:
    api.put(
        SERVICEWORKLOADS.path("ns"),
        sw_with(("True", REASON_IN_PROGRESS))
        | {"metadata": {"name": "web", "namespace": "ns", "generation": 2}},
    )
    waiting = asyncio.create_task(status_cmd(api, "ns", "web", 30, True))
    await wait_for("the command to watch", lambda: [c for c in api.calls if c.method == "WATCH"])
    assert not waiting.done()
    api.edit(
        SW,
        lambda sw: sw["status"]["conditions"].__setitem__(
            0, {"type": PROGRESSING, "status": "True", "reason": REASON_COMPLETE}
        ),
    )
    assert await asyncio.wait_for(waiting, 5) == 0
    out = capsys.readouterr().out
    assert "Waiting for" in out and 'serviceworkload "web" successfully rolled out' in out


async def test_status_exits_1_when_stalled_or_not_watching(api: Lagging) -> None:
    body = sw_with(("False", REASON_DEADLINE_EXCEEDED), stalled="True")
    body["metadata"] |= {"namespace": "ns"}
    api.put(SERVICEWORKLOADS.path("ns"), body)
    assert await status_cmd(api, "ns", "web", 0, True) == 1
    api.edit(
        SW,
        lambda sw: sw["status"].update(
            conditions=[{"type": PROGRESSING, "status": "True", "reason": REASON_IN_PROGRESS}]
        ),
    )
    assert await status_cmd(api, "ns", "web", 0, False) == 1
