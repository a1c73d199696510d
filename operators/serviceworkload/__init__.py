"""ServiceWorkload: N replicas of a template, rolled out within a surge/unavailability budget.

The controller shape every Pilotfish controller has: `model` (what a round observes),
`decide` (pure: observed → plan), `apply` (the one executor: conditional writes, recorded
in `OwnWrites`), `controller` (informers, handlers, queue). `decide` runs the phases the
Deployment controller has, one module each: `sync` (the template's ControllerRevision, the
PodDisruptionBudget, history), `rolling` (the pure pod planner and its budget invariant),
`progress` (the progress deadline) and `status` (counts and conditions, computed last).
`revisions` and `pdb` are the objects' own rules (hashes, numbering, undo; the budget).
"""

from pilotfish.operators.serviceworkload.controller import ServiceWorkloadController

__all__ = ["ServiceWorkloadController"]
