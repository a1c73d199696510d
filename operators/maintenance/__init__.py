"""Planned maintenance: a NodeMaintenance drains its nodes through the Eviction API, only as
fast as every disruption budget allows, and says what holds each node.

The first controller on kopf (`kopfwire`: it watches the NodeMaintenance objects alone and
owns their finalizer); everything it reads besides them comes from the shared informers.
`model` reads (pure), `blockers` and `decide` plan a round (pure), `apply` writes it
conditionally, `controller` wires them to kopf, the informers and the queue.
"""

from pilotfish.operators.maintenance.controller import MaintenanceController

__all__ = ["MaintenanceController"]
