"""``dradriver-controller``: the leader-elected control-plane component."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from controller.app import ControllerApp, Options
from controller.claims.staleness import DEFAULT_CATCHUP
from dradriver import DEFAULT_DRIVER_NAME
from dradriver.httpserver import parse_address
from dradriver.k8s import names
from dradriver.k8s.client import KubeClient, load_connection
from dradriver.log import configure, get_logger
from dradriver.runtime import LeaderElectionConfig
from dradriver.webhook import limits as webhook_limits

log = get_logger("controller")


def build_parser() -> argparse.ArgumentParser:
    """The controller's flags (defaults from the environment where the help says so)."""
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="dradriver-controller",
        description="The control-plane component of dradriver: validates DeviceClaimParameters "
        "(status condition Valid), resolves the parameters ResourceClaims refer to, and "
        "allocates the claims that ask for it (annotation dradriver.dev/allocation: Immediate "
        "or parameters with allocationMode: Immediate) without waiting for a pod. "
        "Several replicas may run; one leads, chosen through a Lease.",
    )
    parser.add_argument(
        "--driver-name",
        default=env("DRADRIVER_DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help="DRA driver name, also the API group of the CRDs (default: %(default)s)",
    )
    parser.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig path (default: $KUBECONFIG, else the in-cluster service account)",
    )
    _add_lease_flags(parser)
    _add_serving_flags(parser)
    _add_work_flags(parser)
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    return parser


def _add_lease_flags(parser: argparse.ArgumentParser) -> None:
    """Leader election: the Lease and its timing."""
    env = os.environ.get
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compete for a Lease and act only while holding it (default: on); turn off only "
        "when exactly one replica runs",
    )
    parser.add_argument(
        "--lease-namespace",
        default=env("POD_NAMESPACE", "dradriver"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else %(default)s)",
    )
    parser.add_argument(
        "--lease-name",
        default="dradriver-controller",
        help="name of the Lease (default: %(default)s)",
    )
    parser.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits after the last renewal it saw before taking over "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds the leader keeps acting without a successful renewal (default: %(default)s)",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        help="seconds between renewals and acquisition attempts (default: %(default)s)",
    )
    parser.add_argument(
        "--identity",
        default=None,
        help="this replica's name in the Lease (default: $POD_NAME or hostname, plus a random "
        "suffix)",
    )


def _add_serving_flags(parser: argparse.ArgumentParser) -> None:
    """The HTTP endpoints: probes and metrics, the admission webhook."""
    env = os.environ.get
    parser.add_argument(
        "--http-address",
        default="127.0.0.1:8081",
        help="/healthz, /readyz (leader, or standby with synced caches) and /metrics "
        "(default: %(default)s; ':8081' for all interfaces)",
    )
    parser.add_argument(
        "--webhook-address",
        default=env("DRADRIVER_WEBHOOK_ADDRESS"),
        help="also serve the admission webhook (POST /validate, and /healthz, /readyz, "
        "/metrics as on --http-address) over HTTPS on HOST:PORT, e.g. ':8443'; every replica "
        "serves it, leader or not (default: $DRADRIVER_WEBHOOK_ADDRESS, else off)",
    )
    parser.add_argument(
        "--webhook-cert",
        type=Path,
        default=env("DRADRIVER_WEBHOOK_CERT"),
        help="the webhook's serving certificate, PEM (default: $DRADRIVER_WEBHOOK_CERT)",
    )
    parser.add_argument(
        "--webhook-key",
        type=Path,
        default=env("DRADRIVER_WEBHOOK_KEY"),
        help="its private key, PEM (default: $DRADRIVER_WEBHOOK_KEY)",
    )
    webhook_limits.add_flags(parser.add_argument_group("webhook limits"), "webhook-")


def _add_work_flags(parser: argparse.ArgumentParser) -> None:
    """The reconcilers: workers, shutdown, which claims to allocate and the search budget."""
    parser.add_argument(
        "--workers",
        type=int,
        default=4,
        help="reconcile workers per controller (default: %(default)s)",
    )
    parser.add_argument(
        "--claim-workers",
        type=int,
        default=16,
        help="workers of the claim controller (immediate allocation and deallocation); they "
        "wait on API writes, searches take turns (default: %(default)s)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        help="seconds in-flight reconciles may take to finish on SIGTERM (default: %(default)s)",
    )
    parser.add_argument(
        "--allocation-namespace",
        action="append",
        default=[],
        dest="allocation_namespaces",
        help="allocate (and deallocate) only claims in this namespace; repeat for more "
        "(default: every namespace). The allocated state always covers every namespace.",
    )
    parser.add_argument(
        "--allocation-driver",
        action="append",
        default=[],
        dest="allocation_drivers",
        help="also allocate claims whose classes pin this driver (device.driver == NAME); "
        "'*.example.com' matches every name under it; repeat for more (default: only "
        "--driver-name; test harnesses give each test a driver of its own)",
    )
    parser.add_argument(
        "--allocation-timeout",
        type=float,
        default=10.0,
        help="wall-clock seconds the search for one claim's allocation may take, over all "
        "nodes (it runs in a child process, off the loop that serves the webhook, probes "
        "and the Lease); a claim that runs out gets an AllocationFailed event and the "
        "dradriver.dev/allocation-status annotation naming this budget, and is retried "
        "with backoff (default: %(default)s, the scheduler's timeout per node)",
    )
    parser.add_argument(
        "--allocation-turn",
        type=float,
        default=0.5,
        help="seconds one batch of fresh searches may take in the worker process; a search "
        "not done by then continues alone in the slow lane, with its full budget, so "
        "fresh claims wait at most about this long for the worker (default: %(default)s)",
    )
    parser.add_argument(
        "--allocation-workers",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="allocation worker processes: 1 (slow searches wait while fresh batches "
        "wait), 2 (fresh batches and slow searches side by side), 0: 2 where the machine "
        "has two cores or more (default: %(default)s)",
    )
    parser.add_argument(
        "--scheduler-catchup",
        type=float,
        default=DEFAULT_CATCHUP,
        help="after a gap in the controller's own list/watch or Lease requests (an apiserver "
        "outage), seconds kube-scheduler may still allocate from a stale claim cache (its "
        "reflectors back off up to 60 s): no allocation is written meanwhile, "
        "unless the scheduler shows it has caught up; 0 turns this off (default: %(default)s)",
    )


def options_from(args: argparse.Namespace) -> Options:
    """Validated options; ValueError names the flag."""
    try:
        parse_address(args.http_address)
    except ValueError as e:
        raise ValueError(f"--http-address: {e}") from e
    if args.webhook_address is not None:
        try:
            parse_address(args.webhook_address)
        except ValueError as e:
            raise ValueError(f"--webhook-address: {e}") from e
        for flag, path in (
            ("--webhook-cert", args.webhook_cert),
            ("--webhook-key", args.webhook_key),
        ):
            if path is None:
                raise ValueError(
                    f"--webhook-address needs {flag} (the apiserver calls webhooks over TLS only)"
                )
            if not Path(path).is_file():
                raise ValueError(f"{flag}: {path} does not exist or is not a file")
    elif args.webhook_cert is not None or args.webhook_key is not None:
        raise ValueError("--webhook-cert and --webhook-key need --webhook-address")
    limits = webhook_limits.from_args(args, "webhook-")
    if args.workers < 1 or args.claim_workers < 1:
        raise ValueError("--workers and --claim-workers must be at least 1")
    for pattern in args.allocation_drivers:
        try:
            names.validate_dns_subdomain(pattern.removeprefix("*."), "name")
        except ValueError as e:
            raise ValueError(f"--allocation-driver {pattern!r}: {e}") from e
    if not args.allocation_timeout > 0:
        raise ValueError("--allocation-timeout must be a positive number of seconds")
    if not args.allocation_turn > 0:
        raise ValueError("--allocation-turn must be a positive number of seconds")
    if not args.scheduler_catchup >= 0:
        raise ValueError("--scheduler-catchup must be 0 (off) or a number of seconds")
    try:
        LeaderElectionConfig(
            args.lease_namespace,
            args.lease_name,
            identity="check",
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
    except ValueError as e:
        raise ValueError(f"--lease-duration/--renew-deadline/--retry-period: {e}") from e
    return Options(
        driver_name=args.driver_name,
        leader_elect=args.leader_elect,
        lease_namespace=args.lease_namespace,
        lease_name=args.lease_name,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        identity=args.identity,
        http_address=args.http_address,
        workers=args.workers,
        claim_workers=args.claim_workers,
        shutdown_grace=args.shutdown_grace,
        allocation_namespaces=tuple(args.allocation_namespaces),
        allocation_drivers=tuple(args.allocation_drivers),
        allocation_timeout=args.allocation_timeout,
        allocation_turn=args.allocation_turn,
        allocation_workers=args.allocation_workers,
        scheduler_catchup=args.scheduler_catchup,
        webhook_address=args.webhook_address,
        webhook_cert=None if args.webhook_address is None else Path(args.webhook_cert),
        webhook_key=None if args.webhook_address is None else Path(args.webhook_key),
        webhook_limits=limits,
    )


async def _main(options: Options, kubeconfig: str | None) -> int:
    client = KubeClient(load_connection(kubeconfig), "dradriver-controller")
    try:
        app = ControllerApp(options, client)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await app.run(stop)
        return 0
    finally:
        await client.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args.log_level)
    try:
        options = options_from(args)
    except ValueError as e:
        print(f"dradriver-controller: error: {e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(options, args.kubeconfig))
    except Exception:
        log.exception("controller failed")
        return 1


if __name__ == "__main__":
    sys.exit(main())
