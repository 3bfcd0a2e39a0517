"""Killed at any write point, an agent starts again and leaves nothing behind: its
admin token, its pinned key, its staged tier and its installs (edgeplex/durable.py,
agent/runners/leftovers.py, Reconciler.recover)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeplex.agent.catalog import demo
from edgeplex.agent.fleet.reconcile import Reconciler
from edgeplex.agent.runners.leftovers import sweep
from edgeplex.agent.runners.shm import shm_dir
from edgeplex.artifacts import ArtifactCache, FetchPolicy
from edgeplex.names import path_under
from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.signing import Signer, TrustStore
from tests.conftest import agent_command, start_agent
from tests.support.agent import infer_http
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def test_a_kill_while_the_admin_token_is_written_leaves_no_empty_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    token_file = tmp_path / "state" / "admin-token"
    env = {
        **os.environ,
        "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN_FILE": str(token_file),
        "EDGEPLEX_CRASH_AT": "admin-token:written",
    }
    env.pop("EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN", None)
    crashed = subprocess.run(agent_command(repo, 0, 0), env=env, capture_output=True, timeout=60)
    assert crashed.returncode == -signal.SIGKILL
    assert not token_file.exists()
    assert list(token_file.parent.glob(".admin-token.*.tmp"))  # what the kill left
    agent = start_agent(
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "",
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN_FILE": str(token_file),
        },
    )
    try:
        assert len(token_file.read_text().strip()) >= 32
        assert list(token_file.parent.iterdir()) == [token_file]  # swept
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_kill_while_the_key_is_pinned_leaves_the_pin_absent_not_empty(tmp_path: Path) -> None:
    pin = tmp_path / "control-plane.pub"
    signer = Signer(Ed25519PrivateKey.generate())
    script = (
        "import sys; from pathlib import Path; from edgeplex.signing import TrustStore; "
        "TrustStore.load(None, Path(sys.argv[1])).pin(bytes.fromhex(sys.argv[2]))"
    )
    crashed = subprocess.run(
        [sys.executable, "-c", script, str(pin), signer.public.hex()],
        env={**os.environ, "EDGEPLEX_CRASH_AT": "pin:written"},
        timeout=60,
    )
    assert crashed.returncode == -signal.SIGKILL
    assert not pin.exists()
    store = TrustStore.load(None, pin)  # starts: nothing pinned yet, the leftover swept
    assert not store.keys and list(tmp_path.iterdir()) == []
    assert store.pin(signer.public)
    assert list(TrustStore.load(None, pin).keys) == [signer.key_id]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            found += [child, *descendants(child)]
    return found


def test_a_killed_agent_leaves_its_staged_tier_to_the_next_start(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    first = start_agent(repo, tmp_path)
    assert infer_http(first, "m")[0] == 200
    pid = first.process.pid
    mine = [
        *shm_dir().glob(f"edgeplex-*-{pid}-*"),
        *Path(tempfile.gettempdir()).glob(f"edgeplex-agent-{pid}-*"),
    ]
    assert len(mine) == 3, mine  # staged tier, rings, runner socket
    family = descendants(pid)  # its zygote and runners
    assert family
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(30)
    wait_until(
        lambda: not any(Path(f"/proc/{p}").exists() for p in family),
        what="its zygote and runners to die with it",
    )
    assert all(p.exists() for p in mine)
    second = start_agent(repo, tmp_path)
    try:
        assert not any(p.exists() for p in mine), mine
        assert infer_http(second, "m")[0] == 200
        live = list(shm_dir().glob(f"edgeplex-*-{second.process.pid}-*"))
        assert len(live) == 2 and not sweep([shm_dir()])  # a live agent's are never swept
        assert all(p.exists() for p in live)
    finally:
        assert second.stop() == 0, second.log()


def _reconciler(repo: Path, tmp_path: Path) -> Reconciler:
    cache = ArtifactCache(tmp_path / "cache", 1 << 30, FetchPolicy(file_roots=(tmp_path,)))
    return Reconciler(None, repo, cache)  # type: ignore[arg-type]


def test_an_install_a_kill_interrupted_is_recovered_at_start(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    # Killed between the two renames of a replacement: the old version aside, the
    # new one not yet in place.
    os.replace(repo / "m" / "1", repo / "m" / ".1.old")
    (repo / "m" / ".2.tmp").mkdir()  # an install that never got its marker
    assert _reconciler(repo, tmp_path).recover() == 1
    assert (repo / "m" / "1" / "model.onnx").is_file()
    assert sorted(p.name for p in (repo / "m").iterdir()) == ["1"]


def test_names_and_versions_that_would_leave_the_repository_are_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    reconciler = _reconciler(repo, tmp_path)
    for version in ("../../x", "/etc", "1/2", "..", "0", "01", "-1", "1.5", "x"):
        model = pb.DesiredModel(
            name="m", version=version, sha256="0" * 64, artifact_uri="file:///x"
        )
        with pytest.raises(ValueError, match="invalid version"):
            reconciler.install(model)
    for name in ("..", "../m", "/abs", "a/b", ""):
        model = pb.DesiredModel(name=name, version="1", sha256="0" * 64, artifact_uri="file:///x")
        with pytest.raises(ValueError, match="invalid model name"):
            reconciler.install(model)
    assert list(repo.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "cache",
        "repo",
    ]
    with pytest.raises(ValueError, match="leaves"):
        (repo / "link").symlink_to(tmp_path)
        path_under(repo, "link", "1")


def test_a_repository_scan_takes_only_versions_that_are_numbers(tmp_path: Path) -> None:
    from edgeplex.agent.catalog.repository import scan_versions
    from edgeplex.agent.config import ModelConfig

    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    for odd in ("01", "0", "1x", "-2", ".3.old"):
        (repo / "m" / odd).mkdir()
        (repo / "m" / odd / "model.onnx").write_bytes(
            (repo / "m" / "1" / "model.onnx").read_bytes()
        )
    assert [v.version for v in scan_versions(repo, "m", ModelConfig())] == ["1"]
    assert scan_versions(repo, "..", ModelConfig()) == []
