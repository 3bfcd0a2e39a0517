"""The `edgeplex` command: one console script, one subcommand per process role."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    from edgeplex import __version__

    parser = argparse.ArgumentParser(prog="edgeplex", description=__doc__)
    parser.add_argument("--version", action="version", version=f"edgeplex {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    from edgeplex.agent import cli as agent_cli

    agent_cli.add_commands(sub)

    from edgeplex.control_plane import cli as control_plane_cli

    control_plane_cli.add_commands(sub)

    from edgeplex.control_plane.sim import cli as sim_cli

    sim_cli.add_commands(sub)

    from edgeplex.rig import cli as rig_cli

    rig_cli.add_commands(sub)
    args = parser.parse_args(argv)
    sys.exit(args.run(args) or 0)
