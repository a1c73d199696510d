"""Pilotfish's kwok task stages: which pods they end, how, and when.

kwok evaluates the jq and renders the templates; here the documents' shape is checked and the
status templates are rendered for one container by substituting the few template actions
they use, so an indentation slip or a wrong field shows up before a cluster runs them.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from pilotfish.devcluster import stages

NOW = "2026-01-01T00:00:00Z"


def _by_name() -> dict[str, dict[str, Any]]:
    return {s["metadata"]["name"]: s for s in stages.task_stages()}


def _render(template: str, exit_code: str = "3") -> dict[str, Any]:
    """The status a one-container pod gets, the Go template actions replaced by values."""
    text = template.replace("{{ $now := Now }}", "").replace("{{ $now | Quote }}", f'"{NOW}"')
    text = re.sub(r"^\{\{ (range \.spec\.containers|end) \}\}\n", "", text, flags=re.M)
    text = text.replace("{{ .image | Quote }}", '"example/task:1"')
    text = text.replace("{{ .name | Quote }}", '"task"')
    # inside the range `.` is the container: the annotation must be read from `$`, the pod
    text = re.sub(r"\{\{ index \$\.metadata\.annotations \"[^\"]+\" \}\}", exit_code, text)
    assert "{{" not in text, text
    status: dict[str, Any] = yaml.safe_load(text)
    return status


def _expressions(stage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}


def test_both_stages_end_running_task_pods_of_jobs_and_batchworkloads_only() -> None:
    for stage in stages.task_stages():
        exprs = _expressions(stage)
        assert exprs[".status.phase"] == {
            "key": ".status.phase",
            "operator": "In",
            "values": ["Running"],
        }
        owners = exprs[".metadata.ownerReferences.[].kind"]
        assert owners["operator"] == "In" and owners["values"] == ["Job", "BatchWorkload"]
        assert "ServiceWorkload" not in owners["values"]
        assert exprs[".metadata.deletionTimestamp"]["operator"] == "DoesNotExist"


def test_exit_code_splits_the_two_stages() -> None:
    succeed, fail = (_by_name()[n] for n in (stages.STAGE_SUCCEED, stages.STAGE_FAIL))
    [key] = [k for k in _expressions(fail) if stages.ANNOTATION_EXIT_CODE in k]
    assert _expressions(fail)[key]["operator"] == "In"
    assert _expressions(succeed)[key]["operator"] == "NotIn"
    assert _expressions(succeed)[key]["values"] == _expressions(fail)[key]["values"] == ["true"]
    # the regular expression the jq test applies: positive, no leading zero, at most 3 digits
    [pattern] = re.findall(r'test\("([^"]+)"\)', key)
    for code, fails in [("1", True), ("137", True), ("0", False), ("007", False), ("1000", False)]:
        assert bool(re.match(pattern, code)) is fails, code


def test_delay_is_the_run_seconds_after_the_pod_started() -> None:
    for stage in stages.task_stages():
        delay = stage["spec"]["delay"]
        assert delay["durationMilliseconds"] == 0  # unset or unreadable: at once
        expr = delay["durationFrom"]["expressionFrom"]
        assert stages.ANNOTATION_RUN_SECONDS in expr and ".status.startTime" in expr
        assert "jitter" not in str(delay).lower()


def test_succeeded_status_is_what_a_kubelet_reports() -> None:
    status = _render(_by_name()[stages.STAGE_SUCCEED]["spec"]["next"]["statusTemplate"])
    assert status["phase"] == "Succeeded"
    [c] = status["containerStatuses"]
    assert c["name"] == "task" and c["ready"] is False
    assert c["state"]["terminated"]["exitCode"] == 0
    assert c["state"]["terminated"]["reason"] == "Completed"
    ready = {x["type"]: x for x in status["conditions"]}
    assert ready["Ready"]["status"] == "False" and ready["Ready"]["reason"] == "PodCompleted"


def test_failed_status_carries_the_annotated_exit_code() -> None:
    template = _by_name()[stages.STAGE_FAIL]["spec"]["next"]["statusTemplate"]
    assert stages.ANNOTATION_EXIT_CODE in template
    status = _render(template, exit_code="42")
    assert status["phase"] == "Failed"
    [c] = status["containerStatuses"]
    assert c["state"]["terminated"]["exitCode"] == 42
    assert c["state"]["terminated"]["reason"] == "Error"
    assert {x["type"]: x["reason"] for x in status["conditions"]}["Ready"] == "PodFailed"


def test_stage_documents_survive_the_yaml_kwok_reads() -> None:
    docs = stages.task_stages()
    assert list(yaml.safe_load_all(yaml.safe_dump_all(docs))) == docs


def test_the_resync_stage_makes_a_pod_marked_for_its_node_silence_ready_again() -> None:
    stage = stages.resync_stage()
    exprs = {e["key"]: e for e in stage["spec"]["selector"]["matchExpressions"]}
    ready = next(k for k in exprs if "Ready" in k)
    assert exprs[ready]["values"] == [stages.REASON_NODE_UNREACHABLE]
    assert exprs[".status.phase"]["values"] == ["Running"]
    status = yaml.safe_load(
        stage["spec"]["next"]["statusTemplate"]
        .replace("{{ $now := Now }}", "")
        .replace("{{ $now | Quote }}", "t")
    )
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "ContainersReady": "True",
    }
    assert [s["metadata"]["name"] for s in stages.pod_stages()] == [
        stages.STAGE_SUCCEED,
        stages.STAGE_FAIL,
        stages.STAGE_RESYNC,
    ]
