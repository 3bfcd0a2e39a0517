"""The `edgeplex` command itself."""

from __future__ import annotations

import subprocess
import sys

from edgeplex import __version__


def test_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edgeplex", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"edgeplex {__version__}"


def test_admin_agent_verbs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os

    from edgeplex.agent.catalog import demo
    from tests.conftest import ADMIN_TOKEN, start_agent

    demo.make_add_sub(tmp_path / "repo" / "add_sub")
    agent = start_agent(tmp_path / "repo", tmp_path)
    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": ADMIN_TOKEN}
    cli = [sys.executable, "-m", "edgeplex", "admin", "agent", agent.http_url]

    def run(*verb: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *verb], env=env, capture_output=True, text=True, timeout=60)

    def state() -> dict:  # type: ignore[type-arg]
        out = run("status", "--json")
        assert out.returncode == 0, out.stderr
        return {m["name"]: m for m in json.loads(out.stdout)}["add_sub"]

    try:
        table = run("status")
        assert table.returncode == 0 and "add_sub" in table.stdout and "TIER" in table.stdout
        assert run("pin", "add_sub").returncode == 0 and state()["pinned"]
        assert run("unpin", "add_sub").returncode == 0 and not state()["pinned"]
        assert run("demote", "add_sub", "--tier", "cached").returncode == 0
        assert state()["tier"] == "cached"
        assert run("load", "add_sub").returncode == 0 and state()["tier"] == "loaded"
        assert run("unload", "add_sub").returncode == 0 and state()["tier"] != "loaded"
        missing = run("pin")
        assert missing.returncode == 2 and "needs a MODEL" in missing.stderr
        denied = subprocess.run(
            [*cli, "pin", "add_sub"], env={**env, "EDGEPLEX_ADMIN_TOKEN": "wrong"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert denied.returncode == 1 and "401" in denied.stderr
    finally:
        assert agent.stop() == 0, agent.log()


def test_every_flag_and_argument_has_help() -> None:
    """`--help` explains every option and positional argument of every command."""
    import argparse

    from edgeplex.agent import cli as agent_cli
    from edgeplex.control_plane import cli as control_plane_cli
    from edgeplex.control_plane.sim import cli as sim_cli
    from edgeplex.rig import cli as rig_cli

    parser = argparse.ArgumentParser(prog="edgeplex")
    sub = parser.add_subparsers()
    for module in (agent_cli, control_plane_cli, sim_cli, rig_cli):
        module.add_commands(sub)
    missing = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.help is None and action.dest != "help":
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(parser, "edgeplex")
    assert missing == [], missing
