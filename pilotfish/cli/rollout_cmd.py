"""`kubectl pilotfish rollout`: status, history, undo, pause and resume of a ServiceWorkload.

  kubectl pilotfish rollout status SW [--timeout 5m] [--watch=false]
  kubectl pilotfish rollout history SW [--revision N]
  kubectl pilotfish rollout undo SW [--to-revision N]
  kubectl pilotfish rollout pause SW
  kubectl pilotfish rollout resume SW

The same verbs as `kubectl rollout` for Deployments, reading the same things the controller
writes: the workload's status conditions and its ControllerRevisions. Undo writes an old
revision's template into spec, conditional on the resourceVersion it read (a JSON patch
`test`), so an edit made meanwhile is never overwritten; the controller then recognises the
template by its hash and reuses that revision. Pause and resume set `spec.strategy.paused`
with a merge patch, which needs no precondition: it sets a value, whatever was there.
`status` waits with a watch, not by polling, and exits 0 when the rollout is complete, 1 when
it stalled (ProgressDeadlineExceeded) or the timeout passed.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

import aiohttp
import yaml
from kubernetes_asyncio.config import ConfigException

from pilotfish.api.serviceworkload import PROGRESSING, STALLED
from pilotfish.cli.connect import Target, default_namespace, rest_client
from pilotfish.kube.rest import JSON_PATCH, MERGE_PATCH, PODS, SERVICEWORKLOADS, ApiError, Rest
from pilotfish.operators.serviceworkload.progress import REASON_COMPLETE, REASON_PAUSED
from pilotfish.operators.serviceworkload.revisions import (
    CONTROLLER_REVISIONS,
    RevisionInfo,
    UndoError,
    owned_revisions,
    template_hash,
    undo_patch,
    undo_target,
)
from pilotfish.workloads import LABEL_REVISION, LABEL_WORKLOAD

KIND = "serviceworkload.pilotfish.io"
State = Literal["done", "stalled", "waiting"]
Common = Callable[..., None]


# -- decisions (pure) -------------------------------------------------------------------------


def _conditions(sw: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = sw.get("status") or {}
    return {str(c.get("type")): c for c in status.get("conditions") or []}


def rollout_state(sw: Mapping[str, Any]) -> tuple[State, str]:
    """Where a rollout stands, as `rollout status` reports it."""
    meta = sw.get("metadata") or {}
    name = meta.get("name")
    status = sw.get("status") or {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return "waiting", "Waiting for the rollout to be observed by the controller..."
    conds = _conditions(sw)
    stalled = conds.get(STALLED)
    if stalled and stalled.get("status") == "True":
        return "stalled", f'error: serviceworkload "{name}" stalled: {stalled.get("message", "")}'
    progressing = conds.get(PROGRESSING) or {}
    if progressing.get("status") == "True" and progressing.get("reason") == REASON_COMPLETE:
        return "done", f'serviceworkload "{name}" successfully rolled out'
    replicas = (sw.get("spec") or {}).get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    if progressing.get("reason") == REASON_PAUSED:
        return "waiting", (
            f"Waiting: the rollout is paused ({updated} of {replicas} updated); "
            f"resume with `kubectl pilotfish rollout resume {name}`..."
        )
    return "waiting", (
        f'Waiting for serviceworkload "{name}" rollout to finish: {updated} of {replicas} '
        f"updated replicas, {available} available..."
    )


def render_history(
    name: str,
    revisions: Sequence[RevisionInfo],
    current_hash: str,
    pods_by_revision: Mapping[str, int],
) -> str:
    rows = [("REVISION", "HASH", "PODS", "CHANGE-CAUSE")]
    for r in revisions:
        mark = " (current template)" if r.hash == current_hash else ""
        rows.append(
            (
                str(r.number),
                r.hash,
                str(pods_by_revision.get(r.hash, 0)),
                (r.change_cause or "<none>") + mark,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{KIND}/{name}"]
    for *cells, last in rows:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(cells, widths, strict=True)), last]))
    return "\n".join(lines)


def parse_duration(text: str) -> float:
    """kubectl's durations: 90, 90s, 5m, 1h30m; 0 means no limit."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 90s, 5m, 1h)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)


# -- API calls -----------------------------------------------------------------------------


async def _workload(rest: Rest, ns: str, name: str) -> dict[str, Any]:
    return await rest.get(SERVICEWORKLOADS.path(ns, name))


async def _revisions(rest: Rest, ns: str, sw: Mapping[str, Any]) -> list[RevisionInfo]:
    items, _ = await rest.list_pages(
        CONTROLLER_REVISIONS.path(ns),
        {"labelSelector": f"{LABEL_WORKLOAD}={sw['metadata']['name']}"},
    )
    return owned_revisions(items, str(sw["metadata"]["uid"]))


async def status_cmd(rest: Rest, ns: str, name: str, limit: float, watch: bool) -> int:
    deadline = time.monotonic() + limit if limit > 0 else None
    sw = await _workload(rest, ns, name)
    last = ""

    def show(obj: Mapping[str, Any]) -> State:
        nonlocal last
        state, message = rollout_state(obj)
        if message != last:
            print(message, file=sys.stderr if state == "stalled" else sys.stdout, flush=True)
            last = message
        return state

    state = show(sw)
    rv = str(sw["metadata"]["resourceVersion"])
    while state == "waiting" and watch:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            print(f"error: timed out waiting for the rollout of {name}", file=sys.stderr)
            return 1
        window = 300 if remaining is None else max(1, min(300, int(remaining) + 1))
        try:
            async for event in rest.watch(
                SERVICEWORKLOADS.path(ns),
                rv,
                {"fieldSelector": f"metadata.name={name}"},
                timeout_seconds=window,
            ):
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                if event.get("type") == "BOOKMARK":
                    continue
                if event.get("type") == "DELETED":
                    print(f"error: serviceworkload {name} was deleted", file=sys.stderr)
                    return 1
                state = show(obj)
                if state != "waiting":
                    break
        except ApiError as e:
            if not e.gone:
                raise
            sw = await _workload(rest, ns, name)
            rv = str(sw["metadata"]["resourceVersion"])
            state = show(sw)
    if state == "waiting":
        return 1
    return 0 if state == "done" else 1


async def history_cmd(rest: Rest, ns: str, name: str, revision: int | None) -> int:
    sw = await _workload(rest, ns, name)
    history = await _revisions(rest, ns, sw)
    if revision is not None:
        chosen = next((r for r in history if r.number == revision), None)
        if chosen is None:
            print(f"error: revision {revision} not found", file=sys.stderr)
            return 1
        print(f"{KIND}/{name} revision {revision} ({chosen.hash})")
        print(yaml.safe_dump({"template": dict(chosen.template)}, sort_keys=False), end="")
        return 0
    pods, _ = await rest.list_pages(PODS.path(ns), {"labelSelector": f"{LABEL_WORKLOAD}={name}"})
    counts = Counter(
        (p["metadata"].get("labels") or {}).get(LABEL_REVISION, "")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    )
    current = template_hash((sw.get("spec") or {}).get("template") or {})
    print(render_history(name, history, current, counts))
    return 0


async def undo_cmd(rest: Rest, ns: str, name: str, to_revision: int | None) -> int:
    sw = await _workload(rest, ns, name)
    history = await _revisions(rest, ns, sw)
    current = template_hash((sw.get("spec") or {}).get("template") or {})
    try:
        target = undo_target(history, current, to_revision)
    except UndoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if target.hash == current:
        print(f"{KIND}/{name} skipped rollback (the template already is revision {target.number})")
        return 0
    try:
        await rest.patch(SERVICEWORKLOADS.path(ns, name), undo_patch(sw, target), JSON_PATCH)
    except ApiError as e:
        if e.status in (409, 422):
            print(
                f"error: serviceworkload {name} changed while rolling back ({e.message}); "
                "nothing was written, run the command again",
                file=sys.stderr,
            )
            return 1
        raise
    print(f"{KIND}/{name} rolled back to revision {target.number} ({target.hash})")
    return 0


async def pause_cmd(rest: Rest, ns: str, name: str, paused: bool) -> int:
    sw = await _workload(rest, ns, name)
    now = bool(((sw.get("spec") or {}).get("strategy") or {}).get("paused"))
    verb = "paused" if paused else "resumed"
    if now == paused:
        print(f"{KIND}/{name} already {verb}")
        return 0
    body = {"spec": {"strategy": {"paused": paused}}}
    await rest.patch(SERVICEWORKLOADS.path(ns, name), body, MERGE_PATCH)
    print(f"{KIND}/{name} {verb}")
    return 0


# -- argparse -------------------------------------------------------------------------------


def _run(args: argparse.Namespace, body: Callable[[Rest, str], Awaitable[int]]) -> int:
    target = Target.from_args(args)
    ns = default_namespace(target)

    async def go() -> int:
        try:
            rest = await rest_client(target)
        except (OSError, ConfigException) as e:
            print(f"error: cannot load the kubeconfig: {e}", file=sys.stderr)
            return 1
        try:
            return await body(rest, ns)
        except ApiError as e:
            print(f"error: {e.status} {e.reason}: {e.message}", file=sys.stderr)
            return 1
        except (OSError, aiohttp.ClientError, TimeoutError) as e:
            print(f"error: cannot reach the API server: {e}", file=sys.stderr)
            return 1
        finally:
            await rest.api.close()

    return asyncio.run(go())


def _status(args: argparse.Namespace) -> int:
    return _run(args, lambda r, ns: status_cmd(r, ns, args.name, args.timeout, args.watch))


def _history(args: argparse.Namespace) -> int:
    return _run(args, lambda r, ns: history_cmd(r, ns, args.name, args.revision))


def _undo(args: argparse.Namespace) -> int:
    return _run(args, lambda r, ns: undo_cmd(r, ns, args.name, args.to_revision))


def _pause(args: argparse.Namespace) -> int:
    return _run(args, lambda r, ns: pause_cmd(r, ns, args.name, True))


def _resume(args: argparse.Namespace) -> int:
    return _run(args, lambda r, ns: pause_cmd(r, ns, args.name, False))


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_parser(sub: Any, common: Common) -> None:
    """Register `rollout` under the plugin's subcommands; `common` adds kubectl's
    connection flags (--kubeconfig, --context, -n) to a subcommand."""
    r = sub.add_parser(
        "rollout",
        help="status, history, undo, pause and resume of a ServiceWorkload rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(r, top=False)
    rsub = r.add_subparsers(dest="rollout_cmd", required=True)

    st = rsub.add_parser("status", help="wait for the rollout to finish (exit 1 if it stalls)")
    common(st, top=False)
    st.add_argument("name")
    st.add_argument(
        "--timeout", type=parse_duration, default=0.0, help="give up after this long (0: never)"
    )
    st.add_argument(
        "-w",
        "--watch",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="watch until done (--watch=false: print once)",
    )
    st.set_defaults(func=_status)

    hi = rsub.add_parser("history", help="the recorded revisions (ControllerRevisions)")
    common(hi, top=False)
    hi.add_argument("name")
    hi.add_argument("--revision", type=int, help="show this revision's template")
    hi.set_defaults(func=_history)

    un = rsub.add_parser("undo", help="go back to the previous (or a given) revision")
    common(un, top=False)
    un.add_argument("name")
    un.add_argument("--to-revision", type=int, help="the revision number to go back to")
    un.set_defaults(func=_undo)

    pa = rsub.add_parser("pause", help="stop rolling out template changes (scaling continues)")
    common(pa, top=False)
    pa.add_argument("name")
    pa.set_defaults(func=_pause)

    re_ = rsub.add_parser("resume", help="resume a paused rollout")
    common(re_, top=False)
    re_.add_argument("name")
    re_.set_defaults(func=_resume)
