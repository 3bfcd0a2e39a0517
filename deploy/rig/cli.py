"""`edgeplex rig up|down|status` (run as root)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def default_state_dir() -> Path:
    env = os.environ.get("EDGEPLEX_RIG_DIR")
    if env:
        return Path(env)
    return Path("/run/edgeplex-rig") if os.geteuid() == 0 else Path.home() / ".cache/edgeplex-rig"


def add_commands(sub: argparse._SubParsersAction) -> None:
    rig = sub.add_parser("rig", help="a multi-site fleet on this box (root; network namespaces)")
    rig.add_argument("--state-dir", type=Path, default=None, help="env EDGEPLEX_RIG_DIR")
    verbs = rig.add_subparsers(dest="verb", required=True)
    up = verbs.add_parser("up", help="build the network and start every process")
    up.add_argument("--regions", type=int, default=3, help="regions (3)")
    up.add_argument("--sites-per-region", type=int, default=2, help="sites in each region (2)")
    up.add_argument("--delays", help="one-way ms per region pair (0,1),(0,2),...,(1,2),...")
    up.add_argument("--clock-offsets", help="hours per region (local time for batch jobs)")
    up.add_argument("--prefix", default="epx", help="names of namespaces and links")
    up.add_argument("--octet", type=int, default=77, help="addresses are 10.<octet>.0.0/16")
    up.set_defaults(run=_up)
    verbs.add_parser("down", help="stop and remove everything the rig made").set_defaults(run=_down)
    verbs.add_parser("status", help="sites, regions, addresses, what each holds").set_defaults(
        run=_status
    )


def _rig(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from edgeplex.rig.rig import Rig

    if os.geteuid() != 0:
        raise SystemExit("edgeplex rig needs root (network namespaces)")
    return Rig(args.state_dir or default_state_dir())


def _up(args: argparse.Namespace) -> int:
    from edgeplex.rig.rig import build_topology

    rig = _rig(args)
    try:
        state = rig.up(build_topology(args))
    except (RuntimeError, ValueError) as exc:
        print(f"rig up failed: {exc}; cleaning up")
        rig.down()
        return 1
    if not state["netem"]:
        print("note: no netem qdisc in this kernel: delays come from a userspace TCP proxy")
    print(rig.status())
    return 0


def _down(args: argparse.Namespace) -> int:
    left = _rig(args).down()
    for item in left:
        print(f"left behind: {item}")
    return 1 if left else 0


def _status(args: argparse.Namespace) -> int:
    print(_rig(args).status())
    return 0
