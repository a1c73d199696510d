"""`pilotfish`: run a Pilotfish part, or the local development cluster.

The CLI is the composition root: the only layer that imports the operators, the extender and
the webhooks, each lazily inside its command so `pilotfish dev status` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from pilotfish import draining, log, names, ports
from pilotfish.devcluster import cluster
from pilotfish.devcluster.binaries import MissingBinaries
from pilotfish.devcluster.components import NODE_LIFECYCLE_MODES, Layout
from pilotfish.devcluster.supervisor import ComponentError, Supervisor


def _dev(args: argparse.Namespace) -> int:
    state = Path(args.state) if args.state else cluster.default_state_dir()
    try:
        if args.dev_cmd == "up":
            spec = cluster.resolve_spec(
                Layout(state),
                nodes=args.nodes,
                port_offset=args.port_offset,
                pilotfish=False if args.bare else None,
                node_lifecycle=args.node_lifecycle,
                real_node=True if args.real_node else None,
            )
            cluster.up(state, spec)
            print(f"pilotfish dev cluster is up ({state})")
            for line in cluster.env_lines(state):
                print(line)
        elif args.dev_cmd == "down":
            stopped = cluster.down(state, purge=args.purge)
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.dev_cmd == "status":
            st = cluster.status(state)
            print(json.dumps(st, indent=2))
            return 0 if st["up"] else 1
        elif args.dev_cmd == "env":
            for line in cluster.env_lines(state):
                print(line)
        elif args.dev_cmd == "image":
            from pilotfish.devcluster import image

            return image.cli(as_json=args.json, scheduler=args.scheduler)
        elif args.dev_cmd == "supervise":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            return Supervisor(Layout(state), args.name, command).run()
    except (ComponentError, MissingBinaries, TimeoutError, RuntimeError, ValueError) as e:
        print(f"pilotfish dev {args.dev_cmd}: {e}", file=sys.stderr)
        return 1
    return 0


def _extender(args: argparse.Namespace) -> int:
    from pilotfish.extender import server

    if (args.cert is None) != (args.key is None):
        print("pilotfish extender: --cert and --key go together", file=sys.stderr)
        return 2
    if args.client_ca and args.cert is None:
        print("pilotfish extender: --client-ca needs --cert and --key (TLS)", file=sys.stderr)
        return 2
    try:
        drain = draining.drain_seconds_from_env()
    except ValueError as e:
        print(f"pilotfish extender: {e}", file=sys.stderr)
        return 2
    tls = server.Tls(args.cert, args.key, args.client_ca) if args.cert else None
    server.run(
        args.host,
        args.port,
        args.kubeconfig,
        tls=tls,
        health_port=args.health_port,
        drain_seconds=drain,
    )
    return 0


def _webhooks(args: argparse.Namespace) -> int:
    from pilotfish.webhooks import reclaim, server, tolerations

    try:
        eviction_wait = tolerations.eviction_wait_from_env()
        reclaim_default = reclaim.default_from_env()
        drain = draining.drain_seconds_from_env()
    except ValueError as e:
        print(f"pilotfish webhooks: {e}", file=sys.stderr)
        return 2
    served = server.serve(
        args.host,
        args.port,
        args.cert,
        args.key,
        args.kubeconfig,
        scheduler_name=args.scheduler_name or None,
        foreign_schedulers=args.foreign_schedulers,
        client_ca=args.client_ca,
        health_port=args.health_port,
        eviction_wait=eviction_wait,
        reclaim_default=reclaim_default,
    )
    asyncio.run(draining.serve_until_terminated(served, name="webhooks", drain_seconds=drain))
    return 0


def _operator(args: argparse.Namespace) -> int:
    from pilotfish.operators import runner

    controllers = (
        [c for c in args.controllers.split(",") if c] if args.controllers is not None else None
    )
    return asyncio.run(
        runner.run(
            args.kubeconfig,
            args.metrics_host,
            args.metrics_port,
            # The chart's release namespace: the operator's lease and its batch account.
            namespace=os.environ.get("PILOTFISH_NAMESPACE") or None,
            controllers=controllers if controllers is not None else tuple(runner.CONTROLLERS),
            audit_log=args.audit_log,
            identity=args.identity,
            batch_account=args.batch_account,
        )
    )


def _demo(args: argparse.Namespace) -> int:
    from pilotfish.cli import demo

    state = Path(args.state) if args.state else cluster.default_state_dir()
    return demo.run(state, nodes=args.nodes)


# Listeners bind to loopback unless told otherwise: the chart passes the pod IP.
LOOPBACK = "127.0.0.1"
HOST_HELP = "address to listen on (default 127.0.0.1; in a cluster, the pod IP)"


STATE_HELP = "state directory (default $PILOTFISH_STATE, else ~/.local/state/pilotfish/dev)"


def _state_flag(p: argparse.ArgumentParser) -> None:
    """`--state` after the verb too (`pilotfish dev down --state DIR`); SUPPRESS keeps a
    `--state` given before the verb when none is given after it."""
    p.add_argument("--state", default=argparse.SUPPRESS, help=STATE_HELP)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pilotfish", description=__doc__)
    p.add_argument("--log-level", default="INFO")
    sub = p.add_subparsers(dest="cmd", required=True)

    dev = sub.add_parser("dev", help="the local control plane (etcd, apiserver, scheduler, kwok)")
    dev.add_argument("--state", help=STATE_HELP)
    dsub = dev.add_subparsers(dest="dev_cmd", required=True)
    upp = dsub.add_parser("up", help="start (or repair) the cluster; a no-op when it is up")
    _state_flag(upp)
    upp.add_argument("--nodes", type=int, help=f"fake nodes (default {cluster.DEFAULT_NODES})")
    upp.add_argument("--port-offset", type=int, help="shift every local port (default 0)")
    upp.add_argument("--bare", action="store_true", help="do not install Pilotfish")
    upp.add_argument(
        "--node-lifecycle",
        choices=NODE_LIFECYCLE_MODES,
        help="who notices a silent machine: pilotfish (default; upstream's node lifecycle and "
        "taint eviction controllers off) or upstream (both on at their defaults, as on a "
        "managed cluster); kept for later `up`s, and switched on a running cluster",
    )
    upp.add_argument(
        "--real-node",
        action="store_true",
        help=f"also run one real node ({names.REAL_NODE_NAME}: kubelet, containerd, runc; "
        "needs root; kept for later `up`s)",
    )
    downp = dsub.add_parser("down", help="stop what `up` started")
    _state_flag(downp)
    downp.add_argument("--purge", action="store_true", help="also delete the state directory")
    _state_flag(
        dsub.add_parser("status", help="components, pids, health (exit 1 unless all healthy)")
    )
    _state_flag(
        dsub.add_parser(
            "env",
            help="print the export line: KUBECONFIG, and the pinned kubectl and "
            "kubectl-pilotfish first on PATH (eval it in your shell)",
        )
    )
    imgp = dsub.add_parser(
        "image", help="build the Pilotfish OCI image offline (cached); print archive and ref"
    )
    imgp.add_argument("--json", action="store_true", help="print archive, ref and versions")
    imgp.add_argument(
        "--scheduler",
        action="store_true",
        help="also the pinned kube-scheduler's image, for the chart's second scheduler",
    )
    supp = dsub.add_parser(
        "supervise",
        help="run a command, restarting it with backoff whenever it exits (as a kubelet would)",
    )
    _state_flag(supp)
    supp.add_argument("--name", required=True, help="component name (its pid file in the state)")
    supp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    dev.set_defaults(func=_dev)

    ext = sub.add_parser("extender", help="the kube-scheduler extender (HTTPS)")
    ext.add_argument("--host", default=LOOPBACK, help=HOST_HELP)
    ext.add_argument("--port", type=int, default=ports.EXTENDER)
    ext.add_argument("--kubeconfig")
    ext.add_argument("--cert", help="serving certificate (PEM); without it, plain HTTP")
    ext.add_argument("--key", help="its private key (PEM)")
    ext.add_argument(
        "--client-ca",
        help="CA bundle (PEM) that signs kube-scheduler's client certificate; callers "
        "without one are refused in the TLS handshake (unset: any caller is served)",
    )
    ext.add_argument(
        "--health-port",
        type=int,
        help="also serve /healthz, /readyz and /metrics over plain HTTP on this port",
    )
    ext.set_defaults(func=_extender)

    wh = sub.add_parser("webhooks", help="the admission webhooks (HTTPS)")
    wh.add_argument("--host", default=LOOPBACK, help=HOST_HELP)
    wh.add_argument("--port", type=int, default=ports.WEBHOOKS)
    wh.add_argument("--cert", required=True)
    wh.add_argument("--key", required=True)
    wh.add_argument("--kubeconfig")
    wh.add_argument(
        "--client-ca",
        help="CA bundle (PEM) that signs the API server's webhook client certificate; "
        "callers without one are refused in the TLS handshake (unset: any caller is served)",
    )
    wh.add_argument(
        "--health-port",
        type=int,
        help="also serve /healthz, /readyz and /metrics over plain HTTP on this port",
    )
    wh.add_argument(
        "--scheduler-name",
        help="schedulerName given to band pods that use the default scheduler (unset: keep it)",
    )
    wh.add_argument(
        "--foreign-schedulers",
        choices=("refuse", "rewrite"),
        default="refuse",
        help="tenant pods naming a scheduler other than default-scheduler or "
        "pilotfish-scheduler: refuse them (default) or rewrite them to pilotfish-scheduler",
    )
    wh.set_defaults(func=_webhooks)

    op = sub.add_parser("operator", help="the controllers, leader-elected")
    op.add_argument("--kubeconfig")
    op.add_argument("--metrics-host", default=LOOPBACK, help=HOST_HELP)
    op.add_argument(
        "--identity",
        help="leader-election identity (default: $POD_NAME, else host and pid); a restart "
        "under the same identity resumes its own lease without waiting it out",
    )
    op.add_argument("--metrics-port", type=int, default=ports.OPERATOR_METRICS)
    op.add_argument(
        "--controllers",
        help="comma-separated hot-path controllers to run (default: all); '' runs none",
    )
    op.add_argument(
        "--audit-log",
        help="append the gate controller's audit records (JSON lines) to this file; "
        "they always go to the log on stderr too",
    )
    batch = op.add_mutually_exclusive_group()
    batch.add_argument(
        "--batch-account",
        default=names.SA_BATCH,
        metavar="NAME",
        help="ServiceAccount of the operator's namespace the batch controller writes as, "
        "by impersonation, so its writes queue in their own API priority level "
        f"(default: {names.SA_BATCH})",
    )
    batch.add_argument(
        "--no-batch-account",
        dest="batch_account",
        action="store_const",
        const=None,
        help="the batch controller writes as the operator itself (a cluster installed "
        "with batchAccount.enabled=false)",
    )
    op.set_defaults(func=_operator)

    demo = sub.add_parser("demo", help="local cluster + Pilotfish + an example of each kind")
    demo.add_argument("--state", help=STATE_HELP)
    demo.add_argument("--nodes", type=int, default=cluster.DEFAULT_NODES)
    demo.set_defaults(func=_demo)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    log.setup(args.log_level)
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
