"""`edgeplex agent` and `edgeplex demo-repo`."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_commands(sub: argparse._SubParsersAction) -> None:
    agent = sub.add_parser("agent", help="serve a model repository over OIP gRPC and HTTP")
    agent.add_argument("--model-repo", type=Path, help="Triton-layout model repository")
    agent.add_argument("--grpc-port", type=int, help="OIP gRPC port (8001)")
    agent.add_argument("--http-port", type=int, help="OIP HTTP port and /metrics (8000)")
    agent.add_argument("--grpc-host", help="address the gRPC port binds (127.0.0.1)")
    agent.add_argument("--http-host", help="address the HTTP port binds (127.0.0.1)")
    agent.add_argument("--metrics-port", type=int, help="a port serving /metrics alone (unset)")
    agent.add_argument("--config", type=Path, help="YAML file of agent settings")
    agent.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(INFO)")
    agent.add_argument(
        "--log-format", choices=["text", "json"], help="text lines, or one JSON object a line"
    )
    agent.add_argument(
        "--execution-provider", choices=["cpu", "cuda"], help="where models run (runner setting)"
    )
    agent.add_argument("--device-memory-budget", help="bytes the loaded tier may hold (2GiB)")
    agent.add_argument("--host-memory-budget", help="bytes the staged tier may hold")
    agent.add_argument("--disk-cache-budget", help="bytes of cached artifacts on disk")
    agent.add_argument(
        "--eviction-policy",
        choices=["gdsf", "lru", "ttl", "none"],
        help="what leaves device memory first (gdsf: cost-aware, the default)",
    )
    agent.add_argument("--site-id", help="this site's name in the fleet")
    agent.add_argument("--region", help="the region this site serves")
    agent.add_argument(
        "--control-plane",
        help="host:port of the control plane (or its replicas, comma-separated): joins the fleet",
    )
    agent.add_argument("--mqtt", help="mqtt://[user:password@]host:port of the fleet's broker")
    agent.add_argument("--advertise-address", help="host:port peers reach the gRPC port at")
    agent.add_argument(
        "--advertise-http-address", help="host:port peers and clients reach the HTTP port at"
    )
    agent.add_argument(
        "--admin-token-file", type=Path, help="where the admin token is read (or generated)"
    )
    agent.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow a non-loopback bind without TLS (a private network or a test rig)",
    )
    agent.set_defaults(run=_run_agent)

    demo = sub.add_parser("demo-repo", help="build the demo model repository")
    demo.add_argument("directory", type=Path, help="where to build it")
    demo.add_argument("--force", action="store_true", help="rebuild even if it exists")
    demo.set_defaults(run=_run_demo_repo)


def _run_agent(args: argparse.Namespace) -> int:
    from edgeplex.agent.config import load_settings
    from edgeplex.agent.server import run_agent

    settings = load_settings(
        args.config,
        model_repo=args.model_repo,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        grpc_host=args.grpc_host,
        http_host=args.http_host,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        log_format=args.log_format,
        device_memory_budget=args.device_memory_budget,
        host_memory_budget=args.host_memory_budget,
        disk_cache_budget=args.disk_cache_budget,
        eviction_policy=args.eviction_policy,
    )
    fleet_flags = {
        "site_id": args.site_id,
        "region": args.region,
        "control_plane": args.control_plane,
        "mqtt_url": args.mqtt,
        "advertise_address": args.advertise_address,
        "advertise_http_address": args.advertise_http_address,
    }
    fleet_flags = {k: v for k, v in fleet_flags.items() if v is not None}
    if fleet_flags:
        fleet = settings.fleet.model_copy(update=fleet_flags)
        settings = settings.model_copy(update={"fleet": type(settings.fleet)(**fleet.model_dump())})
    if args.execution_provider is not None:
        runner = settings.runner.model_copy(update={"execution_provider": args.execution_provider})
        settings = settings.model_copy(update={"runner": runner})
    security_flags = {"admin_token_file": args.admin_token_file, "insecure": args.insecure}
    security_flags = {k: v for k, v in security_flags.items() if v is not None}
    if security_flags:
        security = settings.security.model_copy(update=security_flags)
        settings = settings.model_copy(update={"security": security})
    return run_agent(settings)


def _run_demo_repo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from edgeplex.agent.catalog.demo import build_demo_repo

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn())
    made = [0]
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task("demo repository", total=None)

        def step(model: str, steps: int) -> None:
            progress.update(bar, total=steps, completed=made[0], description=f"making {model}")
            made[0] += 1

        build_demo_repo(args.directory, force=args.force, on_step=step)
    print(f"demo repository ready in {args.directory} ({made[0]} models made)")
    return 0
