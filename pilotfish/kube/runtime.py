"""What every controller of a process shares, built once and handed to each (kueue's
`SetupControllers`): the API client, the informer factory, the Event poster, the clock and
who this process is. A controller takes a `Runtime` in its constructor, requests its
informers there, and runs; it never builds plumbing of its own, so one process has one
watch per view, one retry policy, one Event writer and one notion of time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pilotfish.kube.events import EventPoster
from pilotfish.kube.factory import InformerFactory
from pilotfish.kube.rest import Rest
from pilotfish.nodesilence import NodeSilence, SilenceSettings
from pilotfish.timeutil import SYSTEM_CLOCK, Clock


@dataclass
class Runtime:
    rest: Rest
    factory: InformerFactory
    events: EventPoster
    clock: Clock = SYSTEM_CLOCK
    identity: str = "pilotfish-operator"
    audit_log: Path | None = None
    # Who the batch operator's writes are made as (`Rest.impersonating`); None: this process's
    # own identity (unit tests, and a cluster installed without the batch account).
    batch_user: str | None = None
    # How long each node's lease has been silent (the node lifecycle controller and the
    # at-most-one release share one tracker, so they agree on when a machine went quiet).
    node_silence: NodeSilence | None = None

    def __post_init__(self) -> None:
        if self.node_silence is None:
            self.node_silence = NodeSilence(self.clock)

    @property
    def silence(self) -> NodeSilence:
        assert self.node_silence is not None  # set in __post_init__
        return self.node_silence

    @property
    def batch_rest(self) -> Rest:
        """The client the batch operator writes with: its own identity, so API Priority and
        Fairness queues a 100,000-task job's writes in their own level."""
        return self.rest.impersonating(self.batch_user) if self.batch_user else self.rest

    @classmethod
    def build(
        cls,
        rest: Rest,
        *,
        identity: str = "pilotfish-operator",
        audit_log: Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
        resync_seconds: float | None = 300.0,
        batch_user: str | None = None,
        silence: SilenceSettings | None = None,
    ) -> Runtime:
        return cls(
            rest=rest,
            factory=InformerFactory(rest, clock, resync_seconds),
            events=EventPoster(rest, identity, clock),
            clock=clock,
            identity=identity,
            audit_log=audit_log,
            batch_user=batch_user,
            node_silence=NodeSilence(clock, silence),
        )
