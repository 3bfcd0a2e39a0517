"""`edgeplex admin agent ADDR VERB`: one agent's own verbs, over its HTTP port.

    edgeplex admin agent 10.0.0.5:8000 status
    edgeplex admin agent 10.0.0.5:8000 pin|unpin|load|unload MODEL
    edgeplex admin agent 10.0.0.5:8000 demote MODEL --tier staged|cached
    edgeplex admin agent 10.0.0.5:8000 budget 64MiB|none

The admin token comes from EDGEPLEX_ADMIN_TOKEN or `--token-file` (the agent's
`security.admin_token_file`). As with the control plane, the token is not sent
in clear text to a non-loopback address unless `--tls-ca` (HTTPS) or
`--insecure` says so.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edgeplex.control_plane.cli_render import table
from edgeplex.net import is_loopback

VERBS = ("status", "pin", "unpin", "load", "unload", "demote", "budget")


def add_agent_noun(nouns: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    agent = nouns.add_parser("agent", parents=[common], help="one agent's own verbs, over HTTP")
    agent.add_argument("address", help="host:port of the agent's HTTP port")
    agent.add_argument("verb", choices=VERBS, help="what to do")
    agent.add_argument(
        "model", nargs="?",
        help="the model (every verb but status); for budget, the new device budget "
        "(e.g. 64MiB, or none for no limit)",
    )  # fmt: skip
    agent.add_argument(
        "--tier", choices=["staged", "cached"], default="staged", help="demote: to which tier"
    )
    agent.add_argument("--token-file", type=Path, help="the agent's admin token file")
    agent.set_defaults(call=None)


def run(args: argparse.Namespace) -> int:
    if args.verb != "status" and not args.model:
        print(f"error: {args.verb} needs a MODEL", file=sys.stderr)
        return 2
    token = os.environ.get("EDGEPLEX_ADMIN_TOKEN", "")
    if args.token_file:
        token = args.token_file.read_text().strip()
    host = args.address.rpartition(":")[0]
    context = ssl.create_default_context(cafile=str(args.tls_ca)) if args.tls_ca else None
    if context is None and token and not is_loopback(host) and not args.insecure:
        print(
            f"error: refusing to send the admin token to {args.address} in clear text; "
            "pass --tls-ca, or --insecure",
            file=sys.stderr,
        )
        return 2
    base = f"{'https' if context else 'http'}://{args.address}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        if args.verb == "status":
            models = _call(f"{base}/edgeplex/v1/status", None, headers, context)
            print(json.dumps(models, indent=2) if args.json else _status_table(models))
            return 0
        if args.verb == "budget":
            budget = None if args.model.lower() == "none" else args.model
            memory = _call(
                f"{base}/edgeplex/v1/memory", {"device_budget": budget}, headers, context
            )
            print(json.dumps(memory["tiers"]["loaded"]))
            return 0
        path = {
            "pin": f"/edgeplex/v1/models/{args.model}/pin",
            "unpin": f"/edgeplex/v1/models/{args.model}/unpin",
            "demote": f"/edgeplex/v1/models/{args.model}/demote",
            "load": f"/v2/repository/models/{args.model}/load",
            "unload": f"/v2/repository/models/{args.model}/unload",
        }[args.verb]
        body = {"tier": args.tier} if args.verb == "demote" else {}
        _call(base + path, body, headers, context)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        print(f"error: {exc.code}: {detail}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {args.address}: {exc}", file=sys.stderr)
        return 1
    print(f"{args.verb} {args.model}: done")
    return 0


def _call(
    url: str, body: dict[str, Any] | None, headers: dict[str, str], context: ssl.SSLContext | None
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers={**headers, "Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60, context=context) as reply:
        text = reply.read()
    return json.loads(text) if text.strip() else None


def _status_table(models: list[dict[str, Any]]) -> str:
    rows: list[tuple[str, ...]] = [
        ("MODEL", "VERSION", "STATE", "TIER", "MEMORY", "INSTANCES", "QUEUE", "NOTES")
    ]
    for m in models:
        notes = m.get("reason") or ""
        if m.get("warnings"):
            notes = (notes + "; " if notes else "") + f"{len(m['warnings'])} config warnings"
        if m.get("pinned"):
            notes = "pinned" + ("; " + notes if notes else "")
        rows.append(
            (
                m["name"],
                str(m["version"]),
                str(m["state"]),
                str(m["tier"]),
                f"{m['memory_bytes'] / 2**20:.1f} MiB" if m["memory_bytes"] else "-",
                str(m["instances"]),
                str(m["queue_depth"]),
                notes,
            )
        )
    return table(rows)
