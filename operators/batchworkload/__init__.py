"""BatchWorkload: N indexed tasks run to completion, paced to what the scheduler places.

The controller shape every Pilotfish controller has: `model` (what a sync observes),
`decide` (pure: observed → plan), `apply` (the one executor: status first, then finalizer
removals, then creates, then one deletecollection), `controller` (informers, handlers,
queue). `status` computes the status and the job's end, `pacing` the in-flight limit,
`creationRate` and the retry backoff, `production` the production pods waiting for
placement that hold every job's creates, `taskpod` the pod of one attempt of one index.
"""

from pilotfish.operators.batchworkload.controller import BatchWorkloadController

__all__ = ["BatchWorkloadController"]
