"""`kubectl pilotfish drain NODE...`: planned maintenance as one NodeMaintenance, followed.

  kubectl pilotfish drain NODE... [--name N] [--max-concurrent K] [--one-per-zone]
      [--order Given|FewestProductionFirst] [--reason TEXT] [--wait [--timeout 30m]]

Unlike `kubectl drain`, the command does not evict anything itself: it writes the request
(a cluster-scoped NodeMaintenance) and the maintenance controller drains, at the pace every
disruption budget allows, with its progress in the object's status. So the drain survives
the terminal closing and the operator restarting, and `kubectl get nm` or `kubectl pilotfish
why nm/NAME` show it to anyone. `--wait` follows the status with a watch (not by polling),
printing each node's state changes and what blocks its pods as they happen; it exits 0 once
the phase is Done and 1 when it is Failed, the object is deleted or the timeout passes, the
last naming what still blocks. Stopping the wait (Ctrl-C) leaves the drain running; deleting
the NodeMaintenance stops it and uncordons what it cordoned.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, TextIO

from pilotfish import names
from pilotfish.api.nodemaintenance import BLOCKED
from pilotfish.cli.rollout_cmd import _run as run_with_rest
from pilotfish.cli.rollout_cmd import parse_duration
from pilotfish.kube.rest import NODEMAINTENANCES, NODES, ApiError, Rest

ORDERS: Final = ("Given", "FewestProductionFirst")
GENERATE_PREFIX_MAX: Final = 50  # the API server keeps at most 58 characters of generateName
State = Literal["done", "failed", "waiting"]
Obj = dict[str, Any]
Common = Callable[..., None]


# -- decisions (pure) -------------------------------------------------------------------------


def maintenance_body(
    nodes: Sequence[str],
    *,
    name: str | None = None,
    max_concurrent: int = 1,
    one_per_zone: bool = False,
    order: str = "Given",
    reason: str | None = None,
) -> Obj:
    """The NodeMaintenance to create; ValueError naming the node given twice. Without a
    name, the API server picks one from `drain-<first node>-`."""
    seen: set[str] = set()
    for n in nodes:
        if n in seen:
            raise ValueError(f"node {n} is given twice: each node is drained once")
        seen.add(n)
    if not nodes:
        raise ValueError("no node given: name at least one node to drain")
    spec: Obj = {"nodes": list(nodes), "maxConcurrent": max_concurrent, "order": order}
    if one_per_zone:
        spec["onePerZone"] = True
    if reason:
        spec["reason"] = reason
    meta: Obj = (
        {"name": name}
        if name
        else {"generateName": f"drain-{nodes[0]}"[:GENERATE_PREFIX_MAX].rstrip(".-") + "-"}
    )
    return {
        "apiVersion": names.API_VERSION,
        "kind": "NodeMaintenance",
        "metadata": meta,
        "spec": spec,
    }


def blocker_text(blocker: Mapping[str, Any]) -> str:
    """`ns/pod: Reason (budget ns/pdb): message`."""
    text = f"{blocker.get('pod')}: {blocker.get('reason')}"
    if blocker.get("budget"):
        text += f" (budget {blocker['budget']})"
    if blocker.get("message"):
        text += f": {blocker['message']}"
    return text


def _nodes(nm: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    status = (nm or {}).get("status") or {}
    entries = status.get("nodes") or []
    return {str(n.get("name")): n for n in entries if isinstance(n, Mapping)}


def _node_line(node: Mapping[str, Any]) -> str:
    line = f"node {node.get('name')}: {node.get('state')}"
    if node.get("state") in ("Cordoned", "Draining"):
        left = node.get("podsLeft", 0)
        line += f", {left} pod{'' if left == 1 else 's'} left"
    if node.get("message"):
        line += f" ({node['message']})"
    return line


def changes(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What changed in the drain between two versions of the object, as lines to print: a
    node's state (or pods left), and each blocker that appeared or changed."""
    lines: list[str] = []
    old_nodes = _nodes(before)
    for name, node in _nodes(after).items():
        old = old_nodes.get(name) or {}
        keys = ("state", "podsLeft", "message")
        if any(old.get(k) != node.get(k) for k in keys):
            lines.append(_node_line(node))
        old_blockers = {blocker_text(b) for b in old.get("blockers") or []}
        for b in node.get("blockers") or []:
            text = blocker_text(b)
            if text not in old_blockers:
                lines.append(f"  blocked: {text}")
    old_status = (before or {}).get("status") or {}
    status = after.get("status") or {}
    if status.get("phase") != old_status.get("phase") and status.get("phase"):
        lines.append(f"phase {status['phase']}, {status.get('progress') or '0/?'} drained")
    blocked = _condition(after, BLOCKED)
    if blocked.get("status") == "True" and blocked != _condition(before, BLOCKED):
        lines.append(f"Blocked: {blocked.get('message', '')}")
    return lines


def _condition(nm: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    for c in ((nm or {}).get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == type_:
            return c
    return {}


def what_blocks(nm: Mapping[str, Any]) -> str:
    """The nodes not drained yet and what holds each of their pods, on one line."""
    parts = []
    for node in _nodes(nm).values():
        if node.get("state") == "Drained":
            continue
        part = _node_line(node)
        blockers = [blocker_text(b) for b in node.get("blockers") or []]
        if blockers:
            part += "; blocked: " + "; ".join(blockers)
        parts.append(part)
    pending = [n for n in (nm.get("spec") or {}).get("nodes") or [] if n not in _nodes(nm)]
    if pending:
        parts.append(f"not started: {', '.join(pending)}")
    return " | ".join(parts) or "the maintenance controller has reported nothing yet"


def outcome(nm: Mapping[str, Any]) -> tuple[State, str]:
    """Whether the wait is over: Done, Failed (naming the failed nodes) or not yet. A
    status of an older generation is not an answer yet."""
    meta = nm.get("metadata") or {}
    status = nm.get("status") or {}
    name = meta.get("name")
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    if generation is not None and observed is not None and observed < generation:
        return "waiting", ""
    phase = status.get("phase")
    if phase == "Done":
        return "done", f"nodemaintenance {name} done: {status.get('progress')} nodes drained"
    if phase == "Failed":
        failed = [
            f"{n.get('name')} ({n.get('message') or 'no message'})"
            for n in _nodes(nm).values()
            if n.get("state") == "Failed"
        ]
        return "failed", f"error: nodemaintenance {name} failed: {'; '.join(failed)}"
    return "waiting", ""


# -- API calls -----------------------------------------------------------------------------


async def unknown_nodes(rest: Rest, nodes: Sequence[str]) -> list[str] | None:
    """The nodes given that the cluster does not have; None if nodes cannot be listed."""
    try:
        items, _ = await rest.list_pages(NODES.path())
    except ApiError:
        return None
    known = {str(n["metadata"]["name"]) for n in items}
    return [n for n in nodes if n not in known]


async def drain_cmd(
    rest: Rest,
    body: Obj,
    *,
    wait: bool,
    limit: float,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    missing = await unknown_nodes(rest, body["spec"]["nodes"])
    if missing:
        print(f"error: no such node: {', '.join(missing)}; nothing was created", file=err)
        return 1
    created = await rest.create(NODEMAINTENANCES.path(), body)
    name = str(created["metadata"]["name"])
    print(f"nodemaintenance.{names.GROUP}/{name} created", file=out, flush=True)
    if not wait:
        return 0
    return await follow(rest, name, limit, out=out, err=err)


async def follow(
    rest: Rest, name: str, limit: float, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """Print the drain's changes until Done (0), Failed, deletion or `limit` seconds (1)."""
    deadline = time.monotonic() + limit if limit > 0 else None
    nm: Obj = await rest.get(NODEMAINTENANCES.path(name=name))
    shown: Obj | None = None

    def show(obj: Obj) -> State:
        nonlocal shown
        for line in changes(shown, obj):
            print(line, file=out, flush=True)
        shown = obj
        state, message = outcome(obj)
        if state != "waiting":
            print(message, file=out if state == "done" else err, flush=True)
        return state

    state = show(nm)
    rv = str(nm["metadata"]["resourceVersion"])
    while state == "waiting":
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            print(
                f"error: timed out after {limit:g}s waiting for nodemaintenance {name} "
                f"({((shown or {}).get('status') or {}).get('progress') or '0/?'} drained): "
                f"{what_blocks(shown or nm)}",
                file=err,
            )
            return 1
        window = 300 if remaining is None else max(1, min(300, int(remaining) + 1))
        try:
            events = rest.watch(
                NODEMAINTENANCES.path(),
                rv,
                {"fieldSelector": f"metadata.name={name}"},
                timeout_seconds=window,
            )
            async with asyncio.timeout(remaining), contextlib.aclosing(events):  # type: ignore[type-var]
                async for event in events:
                    obj = event.get("object") or {}
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event.get("type") == "BOOKMARK":
                        continue
                    if event.get("type") == "DELETED":
                        print(
                            f"error: nodemaintenance {name} was deleted before it was done "
                            "(its nodes are uncordoned)",
                            file=err,
                        )
                        return 1
                    state = show(obj)
                    if state != "waiting":
                        break
        except TimeoutError:
            continue
        except ApiError as e:
            if not e.gone:
                raise
            nm = await rest.get(NODEMAINTENANCES.path(name=name))
            rv = str(nm["metadata"]["resourceVersion"])
            state = show(nm)
    return 0 if state == "done" else 1


# -- argparse -------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--max-concurrent must be a whole number >= 1: {text}")
    return value


def _run(args: argparse.Namespace) -> int:
    if args.timeout and not args.wait:
        print(
            f"error: --timeout {args.timeout:g}s needs --wait: without it the command returns "
            "once the NodeMaintenance is created",
            file=sys.stderr,
        )
        return 2
    try:
        body = maintenance_body(
            args.nodes,
            name=args.name,
            max_concurrent=args.max_concurrent,
            one_per_zone=args.one_per_zone,
            order=args.order,
            reason=args.reason,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return run_with_rest(
        args, lambda rest, _ns: drain_cmd(rest, body, wait=args.wait, limit=args.timeout)
    )


def add_parser(sub: Any, common: Common) -> None:
    """Register `drain` under the plugin's subcommands."""
    d = sub.add_parser(
        "drain",
        help="drain nodes for maintenance at the pace disruption budgets allow (NodeMaintenance)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common(d, top=False)
    d.add_argument("nodes", nargs="+", metavar="NODE", help="the nodes, drained in this order")
    d.add_argument("--name", help="the NodeMaintenance's name (default: drain-<node>-<random>)")
    d.add_argument(
        "--max-concurrent",
        type=_positive,
        default=1,
        help="nodes cordoned or draining at the same time at most (default 1)",
    )
    d.add_argument(
        "--one-per-zone",
        action="store_true",
        help=f"at most one node per zone ({names.LABEL_ZONE}) draining at a time",
    )
    d.add_argument(
        "--order",
        choices=ORDERS,
        default="Given",
        help="Given (default) or FewestProductionFirst (nodes with fewest production pods first)",
    )
    d.add_argument("--reason", help="why the nodes are drained; shown in Events")
    d.add_argument(
        "--wait", action="store_true", help="follow the drain until it is done (exit 1 if not)"
    )
    d.add_argument(
        "--timeout",
        type=parse_duration,
        default=0.0,
        help="with --wait: give up waiting after this long, e.g. 30m (0: never); "
        "the drain itself goes on",
    )
    d.set_defaults(func=_run)
