"""The sync phase: the template's revision, the disruption budget and the history.

As the Deployment controller's `sync.go` makes sure the new ReplicaSet exists before any
rolling, this phase makes sure the current template is recorded as a ControllerRevision
before any pod of it exists, and that the workload's PodDisruptionBudget says what the
strategy says. A round that records a revision does nothing else: the pods wait for the
next round, which starts once the informer shows the revision (so no pod ever refers to a
revision the API does not have).

Pure: observed objects in, writes out (`RecordRevision`, `PdbWrite`), each conditional on
what it was decided from, and the Events that explain what is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pilotfish.operators.serviceworkload import pdb as pdbs
from pilotfish.operators.serviceworkload import revisions as revs
from pilotfish.operators.serviceworkload.model import Event, Observed
from pilotfish.operators.serviceworkload.rolling import Budget

Obj = dict[str, Any]

EVENT_REVISION_CREATED: Final = "RevisionCreated"
EVENT_REVISION_REACTIVATED: Final = "RevisionReactivated"
EVENT_REVISION_COLLISION: Final = "RevisionHashCollision"
EVENT_PDB_NOT_OWNED: Final = "PodDisruptionBudgetNotOwned"


@dataclass(frozen=True)
class RecordRevision:
    """Create `body`; first delete `replaces` (a renumbering: see `revisions` for why a
    revision is never patched), conditional on the resourceVersion it was read at."""

    body: Obj
    event: Event
    replaces: revs.RevisionInfo | None = None

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])


@dataclass(frozen=True)
class PdbWrite:
    """Create the budget (`create`) or JSON-patch it (`patch`, with a `test` of the
    resourceVersion read)."""

    name: str
    create: Obj | None = None
    patch: list[Obj] | None = None


@dataclass(frozen=True)
class SyncPlan:
    revision: RecordRevision | None = None
    pdb: PdbWrite | None = None
    events: tuple[Event, ...] = ()
    # A hash collision: nothing can be rolled out until a person changes the template.
    blocked: bool = False


def collision_event(message: str) -> Event:
    return Event(EVENT_REVISION_COLLISION, message, "RecordRevision", "Warning")


def revision_step(obs: Observed, now: str) -> RecordRevision | None:
    """The revision to record for the current template; None when it is the newest.
    Raises `revisions.RevisionCollision`."""
    template = obs.template
    step = revs.next_revision(obs.revisions, template)
    if step is None:
        return None
    if isinstance(step, revs.ActivateRevision):
        hash_, number = step.revision.hash, step.number
        note = f"template is revision {hash_} again; it is now revision {number}"
        event = Event(EVENT_REVISION_REACTIVATED, note, "RecordRevision")
        body = revs.revision_body(obs.sw, hash_, number, template, now)
        return RecordRevision(body, event, replaces=step.revision)
    body = revs.revision_body(obs.sw, step.hash, step.number, template, now)
    note = (
        f"revision {step.number} ({step.hash}) recorded as ControllerRevision "
        f"{body['metadata']['name']}"
    )
    return RecordRevision(body, Event(EVENT_REVISION_CREATED, note, "RecordRevision"))


def pdb_not_owned(name: str) -> Event:
    return Event(
        EVENT_PDB_NOT_OWNED,
        f"PodDisruptionBudget {name} exists and is not this workload's; it is left alone, "
        "and node drains follow it instead of the workload's strategy",
        "EnsureDisruptionBudget",
        "Warning",
    )


def pdb_step(obs: Observed, budget: Budget) -> tuple[PdbWrite | None, Event | None]:
    """Create the budget, bring ours to the strategy, or leave someone else's alone."""
    existing = obs.pdb
    if existing is None:
        return PdbWrite(obs.name, create=pdbs.pdb_body(obs.sw, budget)), None
    if not pdbs.is_ours(existing, obs.uid):
        return None, pdb_not_owned(obs.name)
    ops = pdbs.pdb_patch(existing, pdbs.desired_spec(obs.name, budget))
    return (PdbWrite(obs.name, patch=ops) if ops is not None else None), None


def decide_sync(obs: Observed, budget: Budget, now: str) -> SyncPlan:
    try:
        revision = revision_step(obs, now)
    except revs.RevisionCollision as e:
        return SyncPlan(events=(collision_event(str(e)),), blocked=True)
    pdb, note = pdb_step(obs, budget)
    return SyncPlan(revision, pdb, (note,) if note else ())


def prune(obs: Observed, update_hash: str, in_use: set[str]) -> Sequence[revs.RevisionInfo]:
    """History beyond `strategy.revisionHistoryLimit` (see `revisions.to_prune`)."""
    limit = obs.model.spec.strategy.revision_history_limit
    return revs.to_prune(obs.revisions, limit, update_hash, in_use)
