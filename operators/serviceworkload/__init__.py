"""ServiceWorkload: N replicas of a template, rolled out within a surge/unavailability budget.

Modules, in the order a sync uses them: `revisions` (ControllerRevisions, hashes, history,
undo), `pdb` (the disruption budget), `sync` (pods from the template and the planner's view
of them), `rolling` (the pure planner and its budget invariant), `progress` (the progress
deadline), `status` (counts and conditions), `expectations` (our writes until the watch shows
them) and `controller` (observe, decide, act).
"""

from pilotfish.operators.serviceworkload.controller import ServiceWorkloadController

__all__ = ["ServiceWorkloadController"]
