"""`kubectl pilotfish`: the kubectl plugin for people operating and using Pilotfish.

Uses the caller's kubeconfig and identity (what they may see is what RBAC lets them see).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

import pilotfish
from pilotfish import names

KINDS = (
    ("serviceworkloads", True),
    ("batchworkloads", True),
    ("gatepolicies", True),
    ("teamquotas", False),
    ("nodemaintenances", False),
)


def _status(args: argparse.Namespace) -> int:
    api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
    apps = client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    print(f"{'KIND':<20} COUNT")
    for plural, namespaced in KINDS:
        try:
            if namespaced and args.namespace:
                items = custom.list_namespaced_custom_object(
                    names.GROUP, names.VERSION, args.namespace, plural
                )["items"]
            else:
                items = custom.list_cluster_custom_object(names.GROUP, names.VERSION, plural)[
                    "items"
                ]
            count: Any = len(items)
        except ApiException as e:
            count = f"error {e.status}: {e.reason}"
        print(f"{plural:<20} {count}")
    try:
        deps = apps.list_namespaced_deployment(names.SYSTEM_NAMESPACE).items
    except ApiException:
        deps = []
    for d in deps:
        ready = d.status.ready_replicas or 0
        print(f"deployment/{d.metadata.name:<28} {ready}/{d.spec.replicas} ready")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl pilotfish", description=__doc__)
    p.add_argument("--kubeconfig")
    p.add_argument("--context")
    p.add_argument("-n", "--namespace")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the plugin version").set_defaults(
        func=lambda _: print(f"pilotfish {pilotfish.__version__}") or 0
    )
    sub.add_parser("status", help="counts of Pilotfish objects, health of its parts").set_defaults(
        func=_status
    )
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    sys.exit(args.func(args))
