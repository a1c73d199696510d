"""TeamQuota usage: count `status.used` from pods and settle the ledger's reservations.

Admission and the gate controller spend quota by adding reservations to the TeamQuota's
status (`pilotfish.reservations`); this controller closes the loop (`pilotfish.ledger`
has the rules): a reservation whose pod is now counted in `used` is dropped in the same
write that counts it, one whose pod finished or is leaving is dropped, and one whose pod
never appeared is returned RESERVATION_TTL_SECONDS after this controller first saw it.
`used + reserved` therefore never under-counts what runs.

It also writes `summary`: per band one line of held/limit amounts, the only form a printer
column (a JSONPath, which cannot join fields) can show in `kubectl get teamquota`.

`model` keeps each pod's charge by namespace, `decide` (pure) plans the status, `apply`
writes it conditionally, `controller` wires them to the shared informers and the queue.
"""

from pilotfish.operators.quota.controller import QuotaController

__all__ = ["QuotaController"]
