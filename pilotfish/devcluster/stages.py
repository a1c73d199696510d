"""kwok stages that play batch tasks on the local control plane: run, then exit.

Upstream's `pod-complete` stage ends every Job pod the moment it runs, so nothing batch-shaped
(backoff, pacing, a job's completion time) can be exercised against it. Here a Running pod
owned by a Job or a BatchWorkload exits after `kwok.pilotfish.io/run-seconds` (immediately
when unset or unreadable) with `kwok.pilotfish.io/exit-code` (0 when unset or not a
positive integer up to 999): 0 makes it Succeeded, anything else Failed with that code.

The end of the run is an absolute time, the pod's `status.startTime` plus the run seconds:
kwok restarts a stage's delay on every change to the pod, so a relative delay would start
over each time a controller patched a running task. `startTime` has one-second precision,
so a task runs between `run-seconds - 1` and `run-seconds` seconds.

One more kubelet habit kwok lacks: a kubelet re-reports the status it holds when the API's
copy differs, so a pod that the node lifecycle controller marked not ready while its node was
silent (`NodeUnreachable`) is Ready again once the node is back. kwok does not re-sync a pod
it takes back, so `resync_stage` plays that.
"""

from __future__ import annotations

from typing import Any, Final

from pilotfish.workloads import POD_REASON_NODE_UNREACHABLE

ANNOTATION_RUN_SECONDS: Final = "kwok.pilotfish.io/run-seconds"
ANNOTATION_EXIT_CODE: Final = "kwok.pilotfish.io/exit-code"
# Owners whose pods are tasks that end; every other pod (a ServiceWorkload's) runs forever.
TASK_OWNER_KINDS: Final = ("Job", "BatchWorkload")
STAGE_SUCCEED: Final = "pilotfish-task-succeed"
STAGE_FAIL: Final = "pilotfish-task-fail"
STAGE_RESYNC: Final = "pilotfish-pod-resync"
REASON_NODE_UNREACHABLE: Final = POD_REASON_NODE_UNREACHABLE

# jq over the pod. A failing task names a positive exit code of at most three digits without
# leading zeros (exit codes are 0..255; more digits could overflow the API's int32, and a
# leading zero would be read as octal by the status template's YAML).
_FAILS = f'.metadata.annotations["{ANNOTATION_EXIT_CODE}"] // "0" | test("^[1-9][0-9]{{0,2}}$")'
# When the run ends, as RFC 3339 (kwok waits until then; a past time plays at once). Any
# error (annotation missing or not a number) yields nothing, and kwok falls back to 0 ms.
_RUN_ENDS = (
    f'.metadata.annotations["{ANNOTATION_RUN_SECONDS}"] as $s | select($s != null)'
    " | (.status.startTime | fromdateiso8601) + ($s | tonumber) | todateiso8601"
)


def _selector(fails: bool) -> dict[str, Any]:
    return {
        "matchExpressions": [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "In", "values": ["Running"]},
            {
                "key": ".metadata.ownerReferences.[].kind",
                "operator": "In",
                "values": list(TASK_OWNER_KINDS),
            },
            {"key": _FAILS, "operator": "In" if fails else "NotIn", "values": ["true"]},
        ]
    }


def _status_template(phase: str, reason: str, exit_code: str) -> str:
    """What a kubelet reports for a pod whose every container exited: containers terminated
    with `exit_code` (a template expression), Ready and ContainersReady false."""
    condition_reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
    return f"""{{{{ $now := Now }}}}
conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  reason: {condition_reason}
  type: Ready
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  reason: {condition_reason}
  type: ContainersReady
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: {exit_code}
      finishedAt: {{{{ $now | Quote }}}}
      reason: {reason}
      startedAt: {{{{ $now | Quote }}}}
{{{{ end }}}}
phase: {phase}
"""


def _stage(name: str, fails: bool, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": _selector(fails),
            "delay": {"durationMilliseconds": 0, "durationFrom": {"expressionFrom": _RUN_ENDS}},
            "next": {"statusTemplate": template},
        },
    }


def task_stages() -> list[dict[str, Any]]:
    """The two stages that end a task: Succeeded (exit 0) or Failed (exit N, reason Error)."""
    # `$`, the pod: inside the template's range over containers `.` is the container.
    exit_code = f'{{{{ index $.metadata.annotations "{ANNOTATION_EXIT_CODE}" }}}}'
    return [
        _stage(STAGE_SUCCEED, False, _status_template("Succeeded", "Completed", "0")),
        _stage(STAGE_FAIL, True, _status_template("Failed", "Error", exit_code)),
    ]


def resync_stage() -> dict[str, Any]:
    """A running pod marked not ready for its node's silence is Ready again once kwok plays
    its node again (kwok plays only the pods of nodes it manages)."""
    ready = '.status.conditions.[] | select( .type == "Ready" ) | .reason'
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": STAGE_RESYNC},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                    {"key": ready, "operator": "In", "values": [REASON_NODE_UNREACHABLE]},
                ]
            },
            "next": {
                "statusTemplate": """{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
"""
            },
        },
    }


def pod_stages() -> list[dict[str, Any]]:
    """Pilotfish's pod stages, after upstream's: the task ends and the kubelet's re-sync."""
    return [*task_stages(), resync_stage()]
