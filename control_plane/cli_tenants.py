"""`edgeplex admin tenant ...`: tenants, their limits and keys, through the control
plane's admin API, or with `--file PATH` in a standalone agent's tenants file
(security.tenants_file; the agent rereads it when it changes). Both ways run the
same operations (edgeplex/tenants.py) and print the same replies."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeplex import tenants

Call = Callable[[str, Any], Any]


def add_tenant_noun(
    nouns: argparse._SubParsersAction, leaf: Callable[..., argparse.ArgumentParser]
) -> None:
    tenant = nouns.add_parser("tenant", help="customers: keys, limits, fair shares")
    verbs = tenant.add_subparsers(dest="verb", required=True)

    def with_file(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument(
            "--file", type=Path,
            help="a standalone agent's tenants file (YAML) instead of the control plane",
        )  # fmt: skip
        return parser

    for verb, adding in (("add", True), ("update", False)):
        p = with_file(leaf(verbs, verb, help=f"{verb} a tenant"))
        p.add_argument("name", help="the tenant's name (lower case, digits, . _ -)")
        p.add_argument("--rate", type=float, help="requests a second at each site (0: no limit)")
        p.add_argument(
            "--fleet-rate", type=float,
            help="requests a second across the fleet, split among sites by demand (0: none)",
        )  # fmt: skip
        p.add_argument("--burst", type=int, help="requests above the rate at once")
        p.add_argument("--concurrency", type=int, help="requests in flight at each site")
        p.add_argument("--weight", type=float, help="share of a contended model (1)")
        p.add_argument(
            "--models", nargs="*",
            help="shell patterns of the models it may call (none given: every model)",
        )  # fmt: skip
        p.set_defaults(call=_spec_call("AddTenant" if adding else "UpdateTenant", adding))
    with_file(leaf(verbs, "list", help="every tenant")).set_defaults(call=_list)
    for verb, method in (("show", "GetTenant"), ("remove", "RemoveTenant")):
        p = with_file(leaf(verbs, verb, help=f"{verb} a tenant"))
        p.add_argument("name", help="the tenant")
        p.set_defaults(call=_name_call(method))
    keys = verbs.add_parser("key", help="a tenant's API keys").add_subparsers(
        dest="key_verb", required=True
    )
    p = with_file(leaf(keys, "issue", help="a new key: printed once, stored as its SHA-256"))
    p.add_argument("name", help="the tenant")
    p.set_defaults(call=_issue)
    p = with_file(leaf(keys, "revoke", help="stop a key working"))
    p.add_argument("name", help="the tenant")
    p.add_argument("key", help="the key's id (as `tenant show` lists it), or the key")
    p.set_defaults(call=_revoke)


def _spec_call(method: str, adding: bool) -> Callable[[argparse.Namespace, Call], Any]:
    def run(args: argparse.Namespace, call: Call) -> Any:
        from edgeplex.proto import edgeplex_control_pb2 as pb

        spec = pb.TenantSpec(name=args.name)
        for field in ("rate", "fleet_rate", "burst", "concurrency", "weight"):
            value = getattr(args, field)
            if value is not None:
                setattr(spec, field, value)
        if args.models is not None:
            spec.models.extend(args.models)
            spec.models_given = True
        return call(method, spec)

    return run


def _list(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("ListTenants", pb.Empty())


def _name_call(method: str) -> Callable[[argparse.Namespace, Call], Any]:
    def run(args: argparse.Namespace, call: Call) -> Any:
        from edgeplex.proto import edgeplex_control_pb2 as pb

        reply = call(method, pb.TenantName(name=args.name))
        if method == "RemoveTenant":
            print(f"removed tenant {args.name}")
            return None
        return reply

    return run


def _issue(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    issued = call("IssueTenantKey", pb.TenantName(name=args.name))
    if args.json:
        return issued
    print(f"key {issued.key_id} of tenant {issued.tenant} (shown once; clients send it as")
    print("'Authorization: Bearer <key>'):")
    print(issued.key)
    return None


def _revoke(args: argparse.Namespace, call: Call) -> Any:
    from edgeplex.proto import edgeplex_control_pb2 as pb

    return call("RevokeTenantKey", pb.KeyRef(tenant=args.name, key_id=args.key))


class FileError(Exception):
    """What a call on a tenants file could not do, as the admin API would say it."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


def file_call(path: Path) -> Call:
    """`call` for a tenants file: the admin API's tenant methods, run on the file
    (created on the first add, written whole, mode 0600)."""
    from edgeplex.control_plane.api_tenants import limits_of, tenant_info
    from edgeplex.proto import edgeplex_control_pb2 as pb

    def load() -> tenants.TenantTable:
        return tenants.read_file(path) if path.exists() else tenants.TenantTable()

    def call(method: str, request: Any) -> Any:
        table = load()
        try:
            if method == "ListTenants":
                return pb.ListTenantsResponse(
                    tenants=[tenant_info(t) for t in table.tenants.values()]
                )
            if method == "GetTenant":
                return tenant_info(tenants.get(table, request.name))
            shown = getattr(request, "name", "") or getattr(request, "tenant", "")
            issued = None
            if method in ("AddTenant", "UpdateTenant"):
                change = tenants.add if method == "AddTenant" else tenants.update
                table = change(table, request.name, limits_of(request, method == "AddTenant"))
            elif method == "RemoveTenant":
                table = tenants.remove(table, request.name)
            elif method == "IssueTenantKey":
                table, key, record = tenants.issue_key(table, request.name)
                issued = pb.IssuedKey(tenant=request.name, key_id=record.id, key=key)
            elif method == "RevokeTenantKey":
                table = tenants.revoke_key(table, request.tenant, request.key_id)
            else:
                raise FileError("UNIMPLEMENTED", f"{method} does not apply to a tenants file")
        except tenants.UnknownTenant as exc:
            raise FileError("NOT_FOUND", str(exc)) from None
        except tenants.TenantExists as exc:
            raise FileError("ALREADY_EXISTS", str(exc)) from None
        except ValueError as exc:
            raise FileError("INVALID_ARGUMENT", str(exc)) from None
        tenants.write_file(path, table)
        if issued is not None:
            return issued
        if method == "RemoveTenant":
            return pb.Empty()
        return tenant_info(table.tenants[shown])

    return call
