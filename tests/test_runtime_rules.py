"""One runtime: the plumbing exists once, and nothing outside it builds its own.

Checked on the source text of the product (not tests): a second informer, work queue,
retry loop, Event writer, RFC 3339 formatter or own-writes cache is how the five retry
policies and three write caches of the past came about.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [
    p
    for top in ("pilotfish", "operators", "scheduler-extender", "admission-webhooks")
    for p in (ROOT / top).rglob("*.py")
]


def calls(path: Path) -> list[tuple[str, int]]:
    """(callee name, line) of every call in the file: `Name(...)` or `x.name(...)`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            )
            out.append((name, node.lineno))
    return out


# callee -> the only files allowed to call it
ONLY_IN: dict[str, set[str]] = {
    "Informer": {"pilotfish/kube/factory.py"},
    # One factory per process: the operator's Runtime, and each server's entry point.
    "InformerFactory": {
        "pilotfish/kube/runtime.py",
        "scheduler-extender/server.py",
        "admission-webhooks/server.py",
    },
    # The poster's recorders; the kubectl plugin writes its one Event synchronously, so it
    # can tell the person when that failed.
    "EventRecorder": {"pilotfish/kube/events.py", "pilotfish/cli/gates_cmd.py"},
    "EventPoster": {"pilotfish/kube/runtime.py"},
    "add_rate_limited": set(),
    "strftime": {"pilotfish/timeutil.py"},
    "isoformat": {"pilotfish/timeutil.py"},
    "create_task": {"pilotfish/tasks.py"},
    "ensure_future": {"pilotfish/tasks.py", "pilotfish/kube/factory.py"},  # factory: waits
}


@pytest.mark.parametrize("callee", sorted(ONLY_IN))
def test_plumbing_is_built_in_one_place(callee: str) -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in SOURCES
        for name, line in calls(path)
        if name == callee and str(path.relative_to(ROOT)) not in ONLY_IN[callee]
    ]
    assert found == [], f"{callee} outside {sorted(ONLY_IN[callee]) or 'anywhere'}: {found}"


def test_no_resource_version_is_ordered_or_invented() -> None:
    """resourceVersions are opaque: `int(...resourceVersion...)` is the tell of ordering."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("int", "float")
                and "resourceversion" in ast.unparse(node).lower().replace("_", "")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_one_definition_of_each_resource() -> None:
    """`SERVICEWORKLOADS = Resource(...)` and friends are defined once, in pilotfish.kube.rest."""
    seen: dict[str, list[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "Resource"
            ):
                key = ast.unparse(node.value)
                seen.setdefault(key, []).append(str(path.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
