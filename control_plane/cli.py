"""`edgeplex control-plane` and `edgeplex admin ...` (the admin API's CLI).

The CLI finds the control plane with --control-plane ADDR or
EDGEPLEX_CONTROL_PLANE, and its token in EDGEPLEX_ADMIN_TOKEN. Errors print
the gRPC status and message on one line and exit 1 (2 for usage errors).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToJson

from edgeplex.control_plane.cli_render import render

# The admin CLI reads what the control plane it was pointed at answers: a usage
# table of a large fleet is many megabytes (gRPC's default cap is 4 MiB).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20)]
CALL_TIMEOUT_S = {"GetUsage": 300.0}  # a month of a fleet's hours; other calls: 30 s


def add_commands(sub: argparse._SubParsersAction) -> None:
    cp = sub.add_parser("control-plane", help="run the control plane (state in Redis)")
    cp.add_argument("--redis", dest="redis_url", help="redis://host:port/db")
    cp.add_argument("--mqtt", dest="mqtt_url", help="mqtt://[user:password@]host:port")
    cp.add_argument("--grpc-port", type=int, help="admin and agent API port (7070)")
    cp.add_argument("--grpc-host", help="address the gRPC port binds (127.0.0.1)")
    cp.add_argument("--http-port", type=int, help="serve /metrics and /healthz here")
    cp.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="serve beyond loopback without TLS (a network you trust)",
    )
    cp.add_argument("--config", type=Path, help="YAML file of control-plane settings")
    cp.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(INFO)")
    cp.add_argument(
        "--log-format", choices=["text", "json"], help="text lines, or one JSON object a line"
    )
    cp.add_argument(
        "--rotate-signing-key",
        type=Path,
        metavar="NEW_KEY_FILE",
        help="publish a rollover to the key in NEW_KEY_FILE (created if missing), signed "
        "by the current key, and exit",
    )
    cp.set_defaults(run=_run_control_plane)

    admin = sub.add_parser("admin", help="operate the fleet through the admin API")
    _admin_options(admin, suppress=False)
    # The same options after the noun and verb too (`admin model list --json`):
    # given there, they override; not given, the admin level's value stands.
    common = argparse.ArgumentParser(add_help=False)
    _admin_options(common, suppress=True)

    def leaf(group: argparse._SubParsersAction, name: str, **kw: Any) -> argparse.ArgumentParser:
        return group.add_parser(name, parents=[common], **kw)  # type: ignore[no-any-return]

    nouns = admin.add_subparsers(dest="noun", required=True)

    model = nouns.add_parser("model", help="the catalog").add_subparsers(dest="verb", required=True)
    add = leaf(model, "add", help="add or update a model")
    add.add_argument("name", help="the model's name in the catalog")
    add.add_argument("--artifact", required=True, help="file://, http:// or https:// URI")
    add.add_argument(
        "--sha256", required=True, help="the artifact's sha256; sites check it before use"
    )
    add.add_argument("--version", default="1", help="the model's version (default 1)")
    add.add_argument(
        "--slo-ms", type=float, default=100.0,
        help="latency objective: placement serves a region from another only within it",
    )  # fmt: skip
    add.add_argument(
        "--min-replicas", type=int, default=0, help="sites that hold it whatever the demand"
    )
    add.add_argument("--regions", default="", help="comma-separated allowed regions")
    add.add_argument(
        "--priority", type=int, default=0, help="higher is placed first and evicted last"
    )
    add.add_argument("--pin", action="store_true", help="keep loaded at every eligible site")
    add.add_argument(
        "--variants", default="",
        help="comma-separated smaller forms sites build and check (int8, fp16)",
    )  # fmt: skip
    add.add_argument(
        "--quality", choices=["exact", "any"], default="exact",
        help="any: sites may serve a usable variant when memory is short",
    )  # fmt: skip
    add.set_defaults(call=_model_add)
    leaf(model, "list", help="every model of the catalog").set_defaults(call=_model_list)
    for verb, fn, what in (
        ("show", _model_show, "one model's catalog entry and state"),
        ("remove", _model_remove, "take a model out of the catalog (sites unload it)"),
    ):
        p = leaf(model, verb, help=what)
        p.add_argument("name", help="the model's name in the catalog")
        p.set_defaults(call=fn)

    site = nouns.add_parser("site", help="edge sites").add_subparsers(dest="verb", required=True)
    leaf(site, "list", help="every site: its region, state and budgets").set_defaults(
        call=_site_list
    )
    p = leaf(site, "add", help="let a site join: prints its join token, once")
    p.add_argument("site_id", help="the site's id")
    p.add_argument("--region", required=True, help="the region the site serves")
    p.add_argument(
        "--env-file",
        type=Path,
        help="write the site's credentials here instead of printing them, as the agent's "
        "environment variables (mode 0600; for systemd's EnvironmentFile or compose)",
    )
    p.add_argument(
        "--mqtt-url",
        help="with --env-file: the broker's mqtt://host:port, written with the site's user "
        "and broker password as EDGEPLEX_AGENT_FLEET__MQTT_URL",
    )
    p.set_defaults(call=_site_add)
    for verb, what in (
        ("cordon", "place nothing new at a site (it keeps what it holds)"),
        ("drain", "move a site's models elsewhere"),
    ):
        p = leaf(site, verb, help=what)
        p.add_argument("site_id", help="the site's id")
        p.add_argument("--undo", action="store_true", help=f"un{verb} the site")
        p.set_defaults(call=_site_action(verb))

    placement = nouns.add_parser(
        "placement", help="which models stay resident where, and why"
    ).add_subparsers(dest="verb", required=True)
    leaf(placement, "show", help="the current placement, site by site").set_defaults(
        call=_placement_show
    )
    p = leaf(placement, "explain", help="why a model is placed where it is")
    p.add_argument("model", help="the model to explain")
    p.set_defaults(call=_placement_explain)
    batch = nouns.add_parser("batch", help="asynchronous batch jobs").add_subparsers(
        dest="verb", required=True
    )
    submit = leaf(batch, "submit", help="submit a JSONL file of OIP request bodies")
    submit.add_argument("--model", required=True, help="the catalog model that serves the items")
    submit.add_argument("--inputs", type=Path, required=True, help="one request body per line")
    submit.add_argument("--shard-size", type=int, default=0, help="items per shard (32)")
    submit.add_argument(
        "--wait", action="store_true", help="show progress until the job ends, then its state"
    )
    submit.set_defaults(call=_batch_submit)
    leaf(batch, "list", help="every job, oldest first").set_defaults(call=_batch_list)
    cancel = leaf(batch, "cancel", help="stop a running job (its results are not kept)")
    cancel.add_argument("job_id", help="the job, as submit printed it")
    cancel.set_defaults(call=_batch_cancel)
    status = leaf(batch, "status", help="progress of a job")
    status.add_argument("job_id", help="the job, as submit printed it")
    status.set_defaults(call=_batch_status)
    results = leaf(batch, "results", help="outputs in input order, as JSONL")
    results.add_argument("job_id", help="the job, as submit printed it")
    results.add_argument("--out", type=Path, help="write here instead of stdout")
    results.set_defaults(call=_batch_results)
    from edgeplex.control_plane.cli_agent import add_agent_noun
    from edgeplex.control_plane.cli_tenants import add_tenant_noun
    from edgeplex.control_plane.cli_usage import add_usage_noun

    add_tenant_noun(nouns, leaf)
    add_usage_noun(nouns, common)
    add_agent_noun(nouns, common)
    admin.set_defaults(run=_run_admin)


def _admin_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The admin command's connection and output options (suppress: no defaults,
    for the copies accepted after the noun and verb)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--control-plane",
        default=default(os.environ.get("EDGEPLEX_CONTROL_PLANE", "127.0.0.1:7070")),
        help="host:port of the control plane (env EDGEPLEX_CONTROL_PLANE)",
    )
    parser.add_argument(
        "--tls-ca", type=Path, default=default(None),
        help="PEM CA of the server's certificate (the control plane's, or an agent's)",
    )  # fmt: skip
    parser.add_argument(
        "--tls-cert", type=Path, default=default(None), help="PEM client certificate (mTLS)"
    )
    parser.add_argument("--tls-key", type=Path, default=default(None), help="PEM key of --tls-cert")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=default(False),
        help="send the admin token to a non-loopback address without TLS",
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print replies as JSON"
    )
    parser.add_argument(
        "--wait-s",
        type=float,
        default=default(10.0),
        help="how long to wait for a control plane that is not listening yet (10)",
    )


def _run_control_plane(args: argparse.Namespace) -> int:
    from edgeplex.control_plane.config import load_settings
    from edgeplex.control_plane.server import run_control_plane

    settings = load_settings(
        args.config,
        redis_url=args.redis_url,
        mqtt_url=args.mqtt_url,
        grpc_port=args.grpc_port,
        grpc_host=args.grpc_host,
        http_port=args.http_port,
        log_level=args.log_level,
        log_format=args.log_format,
        insecure=args.insecure,
    )
    if args.rotate_signing_key is not None:
        from edgeplex.control_plane.keys import rotate

        new = rotate(settings, args.rotate_signing_key)
        print(f"published a rollover to key {new.key_id}; now set signing_key_file to")
        print(f"{args.rotate_signing_key} on every replica and restart them")
        return 0
    return run_control_plane(settings)


def _run_admin(args: argparse.Namespace) -> int:
    if args.noun == "agent":  # an agent's own verbs, over its HTTP port
        from edgeplex.control_plane import cli_agent

        return cli_agent.run(args)
    if args.noun == "tenant" and args.file is not None:  # a standalone agent's file
        from edgeplex.control_plane.cli_tenants import FileError, file_call

        try:
            return _show(args, args.call(args, file_call(args.file)))
        except FileError as exc:
            print(f"error: {exc.code}: {exc.details}", file=sys.stderr)
            return 1
    if args.noun == "usage" and args.journal is not None:  # a standalone agent's journal
        from edgeplex.control_plane.cli_usage import journal_call

        try:
            return _show(args, args.call(args, journal_call(args.journal, args.interval_s)))
        except OSError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    import grpc

    from edgeplex.net import is_loopback
    from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

    token = os.environ.get("EDGEPLEX_ADMIN_TOKEN", "")
    if args.tls_ca:
        creds = grpc.ssl_channel_credentials(
            args.tls_ca.read_bytes(),
            private_key=args.tls_key.read_bytes() if args.tls_key else None,
            certificate_chain=args.tls_cert.read_bytes() if args.tls_cert else None,
        )
        channel = grpc.secure_channel(args.control_plane, creds, options=CHANNEL_OPTIONS)
    else:
        host = args.control_plane.rpartition(":")[0]
        if token and not is_loopback(host) and not args.insecure:
            print(
                f"error: refusing to send the admin token to {args.control_plane} in clear "
                "text; pass --tls-ca (and --tls-cert/--tls-key for mTLS), or --insecure",
                file=sys.stderr,
            )
            return 2
        channel = grpc.insecure_channel(args.control_plane, options=CHANNEL_OPTIONS)
    stub = pb_grpc.AdminServiceStub(channel)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    # A control plane started a moment ago (`control-plane &` in a script) gets a
    # few seconds to listen before the call fails as unreachable.
    with contextlib.suppress(grpc.FutureTimeoutError):
        grpc.channel_ready_future(channel).result(timeout=args.wait_s)

    def call(method: str, request: Any) -> Any:
        timeout = CALL_TIMEOUT_S.get(method, 30.0)
        return getattr(stub, method)(request, metadata=metadata, timeout=timeout)

    try:
        reply = args.call(args, call)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()
    return _show(args, reply)


def _show(args: argparse.Namespace, reply: Any) -> int:
    if args.json and reply is not None:
        print(MessageToJson(reply, preserving_proto_field_name=True))
    elif reply is not None:
        print(render(reply))
    return 0


Call = Callable[[str, Any], Any]


def _model_add(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    regions = [r.strip() for r in args.regions.split(",") if r.strip()]
    return call(
        "AddModel",
        pb.CatalogModel(
            name=args.name,
            version=args.version,
            artifact_uri=args.artifact,
            sha256=args.sha256,
            slo_ms=args.slo_ms,
            min_replicas=args.min_replicas,
            regions=regions,
            priority=args.priority,
            pin=args.pin,
            variants=[v.strip() for v in args.variants.split(",") if v.strip()],
            quality=args.quality,
        ),
    )


def _model_list(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("ListModels", pb.ListModelsRequest())


def _model_show(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("GetModel", pb.ModelName(name=args.name))


def _model_remove(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    call("RemoveModel", pb.ModelName(name=args.name))
    print(f"removed {args.name}")
    return None


def _site_list(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("ListSites", pb.ListSitesRequest())


def _site_add(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    reply = call("AddSite", pb.AddSiteRequest(site_id=args.site_id, region=args.region))
    if args.env_file is not None:
        _write_site_env(args.env_file, reply, args.mqtt_url)
        print(f"credentials of {reply.site_id} written to {args.env_file}")
        return None
    if args.json:
        return reply
    if reply.mqtt_password:
        print(f"broker password of user {reply.site_id} (shown once; put it in fleet.mqtt_url):")
        print(reply.mqtt_password)
    print(f"join token of {reply.site_id} (shown once; set it as the agent's fleet.join_token):")
    print(reply.join_token)
    return None


def _write_site_env(path: Path, reply: Any, mqtt_url: str | None) -> None:
    """The agent's fleet credentials as KEY=value lines, readable by its owner only."""
    lines = [f"EDGEPLEX_AGENT_FLEET__JOIN_TOKEN={reply.join_token}"]
    if mqtt_url:
        scheme, _, hostport = mqtt_url.partition("://")
        if not hostport or "@" in hostport:
            raise SystemExit(f"--mqtt-url {mqtt_url!r}: expected mqtt://host:port, no user")
        user = f"{reply.site_id}:{reply.mqtt_password}@" if reply.mqtt_password else ""
        lines.append(f"EDGEPLEX_AGENT_FLEET__MQTT_URL={scheme}://{user}{hostport}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write("\n".join(lines) + "\n")


def _site_action(verb: str) -> Callable[[argparse.Namespace, Call], Any]:
    def run(args: argparse.Namespace, call: Call) -> Any:
        from edgeplex.proto import edgeplex_control_pb2 as pb

        method = "CordonSite" if verb == "cordon" else "DrainSite"
        return call(method, pb.SiteAction(site_id=args.site_id, undo=args.undo))

    return run


def _placement_show(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("GetPlacement", pb.PlacementRequest())


def _placement_explain(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("ExplainPlacement", pb.ModelName(name=args.model))


def _batch_submit(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    lines = [ln for ln in args.inputs.read_text().splitlines() if ln.strip()]
    job = call(
        "SubmitBatch", pb.BatchSubmit(model=args.model, inputs=lines, shard_size=args.shard_size)
    )
    if args.wait:
        from edgeplex.control_plane.cli_render import wait_for_batch

        return wait_for_batch(job, lambda: call("GetBatch", pb.BatchRef(job_id=job.job_id)))
    if args.json:
        return job
    print(job.job_id)
    return None


def _batch_list(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("ListBatches", pb.ListBatchesRequest())


def _batch_cancel(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("CancelBatch", pb.BatchRef(job_id=args.job_id))


def _batch_status(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("GetBatch", pb.BatchRef(job_id=args.job_id))


def _batch_results(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    results = call("GetBatchResults", pb.BatchRef(job_id=args.job_id))
    text = "".join(line + "\n" for line in results.outputs)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {len(results.outputs)} outputs to {args.out}")
    else:
        print(text, end="")
    return None
