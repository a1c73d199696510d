"""`kubectl pilotfish`: the kubectl plugin for people operating and using Pilotfish.

Uses the caller's kubeconfig and identity (what they may see is what RBAC lets them see), and
kubectl's global flags before or after the subcommand: --kubeconfig, --context, --cluster,
--user, -n, -s/--server, --token, --certificate-authority, --client-certificate, --client-key,
--insecure-skip-tls-verify, --request-timeout, --as, --as-group (repeatable), --as-uid.

  kubectl pilotfish gates [-n NS | -A] [-o table|wide|json]
  kubectl pilotfish gates release POD GATE --reason TEXT [--dry-run[=server]]
  kubectl pilotfish gates cancel POD --reason TEXT [--dry-run[=server]]
  kubectl pilotfish why POD | bw/NAME | nm/NAME
  kubectl pilotfish drain NODE... [--max-concurrent K] [--one-per-zone] [--wait]
  kubectl pilotfish status | version
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio.config import ConfigException

import pilotfish
from pilotfish import names
from pilotfish.cli import drain_cmd, gates_cmd, rollout_cmd, why
from pilotfish.cli.connect import Target, add_flags, default_namespace, rest_client, whoami
from pilotfish.kube.rest import ApiError, Rest

KINDS = (
    ("serviceworkloads", True),
    ("batchworkloads", True),
    ("gatepolicies", True),
    ("teamquotas", False),
    ("nodemaintenances", False),
)


async def _status_cmd(rest: Rest, namespace: str | None) -> int:
    print(f"{'KIND':<20} COUNT")
    for plural, namespaced in KINDS:
        path = (
            f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{namespace}/{plural}"
            if namespaced and namespace
            else f"/apis/{names.GROUP}/{names.VERSION}/{plural}"
        )
        try:
            count: Any = len((await rest.get(path)).get("items") or [])
        except ApiError as e:
            count = f"error {e.status}: {e.reason}"
        print(f"{plural:<20} {count}")
    try:
        deps = await rest.get(f"/apis/apps/v1/namespaces/{names.SYSTEM_NAMESPACE}/deployments")
    except ApiError:
        deps = {}
    for d in deps.get("items") or []:
        ready = (d.get("status") or {}).get("readyReplicas") or 0
        wanted = (d.get("spec") or {}).get("replicas")
        print(f"deployment/{d['metadata']['name']:<28} {ready}/{wanted} ready")
    return 0


def _status(args: argparse.Namespace) -> int:
    namespace = vars(args).get("namespace")
    return asyncio.run(_with_rest(args, lambda rest: _status_cmd(rest, namespace)))


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    add_flags(parser, top=top)


def _target(args: argparse.Namespace) -> Target:
    return Target.from_args(args)


def _namespace(args: argparse.Namespace) -> str:
    return default_namespace(_target(args))


async def _with_rest(args: argparse.Namespace, body: Callable[[Rest], Awaitable[int]]) -> int:
    try:
        rest = await rest_client(_target(args))
    except (OSError, ConfigException) as e:
        print(f"error: cannot load the kubeconfig: {e}", file=sys.stderr)
        return 1
    try:
        return await body(rest)
    except (OSError, aiohttp.ClientError, TimeoutError) as e:
        print(f"error: cannot reach the API server: {e}", file=sys.stderr)
        return 1
    finally:
        await rest.api.close()


def _gates(args: argparse.Namespace) -> int:
    action = getattr(args, "gates_cmd", None) or "list"
    if action == "list":
        namespace = None if args.all_namespaces else _namespace(args)
        return asyncio.run(
            _with_rest(args, lambda rest: gates_cmd.list_gates(rest, namespace, args.output))
        )
    namespace = _namespace(args)
    dry_run: gates_cmd.DryRun = args.dry_run
    if action == "release":
        return asyncio.run(
            _with_rest(
                args,
                lambda rest: gates_cmd.release_gate(
                    rest,
                    namespace,
                    args.pod,
                    args.gate,
                    args.reason,
                    whoami=whoami,
                    dry_run=dry_run,
                ),
            )
        )
    return asyncio.run(
        _with_rest(
            args,
            lambda rest: gates_cmd.cancel_pod(
                rest, namespace, args.pod, args.reason, whoami=whoami, dry_run=dry_run
            ),
        )
    )


def _why(args: argparse.Namespace) -> int:
    namespace = _namespace(args)
    return asyncio.run(_with_rest(args, lambda rest: why.run_target(rest, namespace, args.pod)))


def _dry_run_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        nargs="?",
        const="client",
        default="none",
        choices=("none", "client", "server"),
        help="print what would be done without doing it; 'server' also asks the API server "
        "whether it would accept the write (RBAC and admission policies), changing nothing",
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl pilotfish", description=__doc__)
    _common(p, top=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    version = sub.add_parser("version", help="print the plugin version")
    version.set_defaults(func=lambda _: print(f"pilotfish {pilotfish.__version__}") or 0)
    status = sub.add_parser("status", help="counts of Pilotfish objects, health of its parts")
    _common(status, top=False)
    status.set_defaults(func=_status)

    g = sub.add_parser(
        "gates",
        help="pods waiting on Pilotfish gates; release or cancel by hand",
        description="List pods holding gates.pilotfish.io/ scheduling gates (the default), or "
        "release one gate / cancel one pod by hand, with an Event and an audit record. Use "
        "the manual path when the gate controller cannot: it is limited to members of group "
        f"{gates_cmd.RELEASERS_GROUP} by the API server.",
    )
    _common(g, top=False)
    g.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    g.add_argument(
        "-o", "--output", choices=("table", "wide", "json"), default="table", help="format"
    )
    g.set_defaults(func=_gates)
    gsub = g.add_subparsers(dest="gates_cmd", required=False)
    gl = gsub.add_parser("list", help="list gated pods (the default)")
    _common(gl, top=False)
    gl.add_argument("-A", "--all-namespaces", action="store_true", default=argparse.SUPPRESS)
    gl.add_argument("-o", "--output", choices=("table", "wide", "json"), default=argparse.SUPPRESS)
    rel = gsub.add_parser(
        "release",
        help="remove one Pilotfish gate from one pod (audited)",
        description="Remove GATE from POD with a conditional strategic-merge patch; record "
        f"who and why in the annotation {gates_cmd.ANNOTATION_MANUAL_RELEASE} and an Event "
        f"{gates_cmd.REASON_MANUALLY_RELEASED}. Other gates stay.",
    )
    _common(rel, top=False)
    rel.add_argument("pod")
    rel.add_argument("gate", help="the gate name (gates.pilotfish.io/ may be left out)")
    rel.add_argument("--reason", required=True, help="why; recorded with your name")
    _dry_run_flag(rel)
    can = gsub.add_parser(
        "cancel",
        help="delete one gated pod (audited)",
        description=f"Record an Event {gates_cmd.REASON_CANCELLED}, then delete POD, "
        "conditional on the version read. Only for pods still holding Pilotfish gates.",
    )
    _common(can, top=False)
    can.add_argument("pod")
    can.add_argument("--reason", required=True, help="why; recorded with your name")
    _dry_run_flag(can)

    w = sub.add_parser(
        "why",
        help="why a pod is not running: gated, unschedulable, or the node's problem; "
        "bw/NAME: a BatchWorkload's progress and what its tasks wait on; "
        "nm/NAME: a NodeMaintenance's progress and what blocks each node",
    )
    _common(w, top=False)
    w.add_argument("pod", metavar="POD | bw/NAME | nm/NAME")
    w.set_defaults(func=_why)

    rollout_cmd.add_parser(sub, _common)
    drain_cmd.add_parser(sub, _common)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    try:
        _target(args).impersonation_headers()
    except ValueError as e:
        p.error(str(e))
    sys.exit(args.func(args))


if __name__ == "__main__":  # `python -m pilotfish.cli.kubectl_plugin`: krew's launcher
    main()
