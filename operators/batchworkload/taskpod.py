"""The pod one attempt of one task index runs in.

The template and placement become the pod as for any workload (`pilotfish.podtemplate`),
with the batch job's own identity instead of a ServiceWorkload's: the job's name and the
index as labels (the spread counts the job's pods), the attempt and the index's counted
failures as annotations, the index in every container's environment (`JOB_COMPLETION_INDEX`
too, which programs written for indexed Jobs read), the tracking finalizer, and
`restartPolicy: Never`, since a task's retry is a new pod the operator counts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pilotfish.gates import GANG_GATE, LABEL_GANG
from pilotfish.operators.batchworkload.model import LABEL_TASK_RECORDED, task_name
from pilotfish.podtemplate import pod_body
from pilotfish.workloads import (
    ANNOTATION_TASK_ATTEMPT,
    ANNOTATION_TASK_FAILURES,
    ENV_COMPLETION_INDEX,
    ENV_TASK_INDEX,
    FINALIZER_TASK,
    LABEL_BATCH,
    LABEL_TASK_INDEX,
)

Obj = dict[str, Any]


def _with_env(container: Obj, index: int) -> Obj:
    ours = {ENV_TASK_INDEX, ENV_COMPLETION_INDEX}
    env = [e for e in container.get("env") or [] if e.get("name") not in ours]
    env += [{"name": n, "value": str(index)} for n in (ENV_TASK_INDEX, ENV_COMPLETION_INDEX)]
    return {**container, "env": env}


def task_pod(bw: Mapping[str, Any], index: int, attempt: int, failures: int, *, gang: bool) -> Obj:
    name = str(bw["metadata"]["name"])
    template = (bw.get("spec") or {}).get("template") or {}
    pod = task_name(name, index, attempt)
    body = pod_body(bw, template, "", pod, "batch", selector_labels={LABEL_BATCH: name})
    meta = body["metadata"]
    # Keys only the operator sets, whatever the template says: a template carrying the
    # recorded label would have unrecorded pods collected, and one carrying the gang's
    # label or gate would put every task in the gang.
    meta["labels"].pop(LABEL_TASK_RECORDED, None)
    meta["labels"].pop(LABEL_GANG, None)
    meta["labels"][LABEL_TASK_INDEX] = str(index)
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        ANNOTATION_TASK_ATTEMPT: str(attempt),
        ANNOTATION_TASK_FAILURES: str(failures),
    }
    meta["finalizers"] = [FINALIZER_TASK]
    spec = copy.deepcopy(body["spec"])
    spec["restartPolicy"] = "Never"
    for kind in ("containers", "initContainers"):
        if isinstance(spec.get(kind), list):
            spec[kind] = [_with_env(c, index) if isinstance(c, dict) else c for c in spec[kind]]
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GANG_GATE]
    if gang:
        meta["labels"][LABEL_GANG] = name
        gates.append({"name": GANG_GATE})
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    body["spec"] = spec
    return body
