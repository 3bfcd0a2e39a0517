"""Runners in a sandbox: what a real runner is confined to, and what a model that
took over its runner could still do (each attempt fails)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeplex.agent.catalog import demo
from edgeplex.agent.config import AgentSettings
from edgeplex.agent.runners import framing, ipc, sandbox
from edgeplex.agent.runners.view import runner_view
from edgeplex.agent.runners.zygote_client import runner_environment
from edgeplex.net import free_ports
from tests.conftest import AgentProcess, agent_command, start_agent
from tests.support.agent import infer_http, status

pytestmark = pytest.mark.slow

NAMESPACES = ("user", "mnt", "pid", "ipc", "net")
JOIN_TOKEN = "ejt_never-in-a-runner"


def test_a_runner_is_confined_and_sees_no_secret(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    # Secrets where a runner would see them if they were not masked (inside the
    # repository it reads), and the state directory it must not see at all.
    inside = repo / ".state"
    inside.mkdir()
    (inside / "control-plane.pub").write_text("pinned key\n")
    state = tmp_path / "state"
    agent = start_agent(
        repo,
        tmp_path,
        env={
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "",  # generated in the token file
            "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN_FILE": str(inside / "admin-token"),
            "EDGEPLEX_AGENT_FLEET__TRUST_FILE": str(inside / "control-plane.pub"),
            "EDGEPLEX_AGENT_FLEET__JOIN_TOKEN": JOIN_TOKEN,
            "EDGEPLEX_AGENT_RUNNER__SANDBOX": "required",
            "STATE_DIRECTORY": str(state),
        },
    )
    try:
        assert infer_http(agent, "m")[0] == 200
        pid = status(agent)["m"]["runner_pid"]
        proc = Path(f"/proc/{pid}")
        fields = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines())
        assert fields["NoNewPrivs"].strip() == "1"
        assert fields["Seccomp"].strip() == "2"  # a filter
        assert fields["CapEff"].strip() == "0000000000000000"
        for ns in NAMESPACES:
            theirs = os.readlink(proc / "ns" / ns)
            assert theirs != os.readlink(f"/proc/{agent.process.pid}/ns/{ns}"), ns
        lines = (proc / "net" / "dev").read_text().splitlines()[2:]
        interfaces = [line.split(":")[0].strip() for line in lines]
        assert interfaces == ["lo"]
        root = proc / "root"
        token = (inside / "admin-token").read_text().strip()
        assert token  # the agent's copy is there...
        assert (root / str(inside / "admin-token").lstrip("/")).read_text() == ""  # ...not theirs
        assert (root / str(inside / "control-plane.pub").lstrip("/")).read_text() == ""
        assert not (root / str(state).lstrip("/")).exists()
        assert (root / str(repo / "m" / "1" / "model.onnx").lstrip("/")).is_file()
        environ = (proc / "environ").read_bytes()
        assert JOIN_TOKEN.encode() not in environ and b"EDGEPLEX_AGENT" not in environ
        assert token.encode() not in environ
        memory = json.loads(agent.http_get("/edgeplex/v1/memory")[1])["sandbox"]
        assert memory["mode"] == "required"
        assert set(memory["runners"]["shared-0"].values()) == {"on"}, memory
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'edgeplex_runner_sandbox_layer{layer="seccomp"} 1.0' in metrics
        groups = (proc / "cgroup").read_text()
        assert "/edgeplex-" in groups and "/shared-0" in groups, groups  # its own memory group
    finally:
        assert agent.stop() == 0, agent.log()


def test_a_model_that_takes_over_its_runner_reaches_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    (repo / ".state").mkdir()
    masked = repo / ".state" / "admin-token"  # under a path the runner sees
    masked.write_text("token-in-the-repository\n")
    state = tmp_path / "state"
    state.mkdir()
    outside = state / "admin-token"  # not in the view at all
    outside.write_text("token-in-the-state-directory\n")
    settings = AgentSettings(
        model_repo=repo,
        security={"admin_token_file": masked},
        fleet={"trust_file": outside},
    )
    staging = tmp_path / "staged"
    staging.mkdir()
    view = runner_view(settings, staging)
    sockets = tmp_path / "sock"
    sockets.mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sockets / "runners.sock"))
    listener.listen(1)
    listener.settimeout(30)
    parent, child = socket.socketpair()
    helper = Path(__file__).with_name("attack_zygote.py")
    secrets = [str(masked), str(outside)]
    process = subprocess.Popen(
        [sys.executable, str(helper), "--fd", str(child.fileno()), "--sandbox", "required",
         "--readonly", str(repo / "m")] + [a for s in secrets for a in ("--secret", s)],
        pass_fds=[child.fileno()],
        env=runner_environment(dict(os.environ)) | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    child.close()
    try:
        report, _ = framing.recv_frame(parent)
        assert isinstance(report, ipc.SandboxReport)
        assert set(report.layers) == set(sandbox.LAYERS) and set(report.layers.values()) == {"on"}
        request = ipc.SpawnRunner(
            "attacker",
            str(sockets / "runners.sock"),
            "INFO",
            0,
            sandbox="required",
            read_only=[*view.read_only, str(sockets)],
            writable=view.writable,
            hidden=view.hidden,
            max_open_files=256,
        )
        framing.send_frame(parent, request)
        conn, _ = listener.accept()
        conn.settimeout(30)
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
        outcomes = json.loads(data)
    finally:
        parent.close()
        process.wait(30)
    print(json.dumps(outcomes, indent=1))
    for what in ("inet_socket", "inet6_socket", "netlink_socket", "exec_shell", "fork",
                 "unshare", "write_model", f"read {outside}", f"list {state}"):  # fmt: skip
        assert outcomes[what].startswith("refused"), (what, outcomes[what])
    assert outcomes[f"read {masked}"] == "allowed: 0"  # masked: an empty file
    assert outcomes["pids_visible"] == "allowed: ['1']"  # alone in its PID namespace


def _without_user_namespaces(command: list[str]) -> list[str]:
    """`command` on a host that gives no new user namespaces (as in a container with
    Docker's default seccomp profile): a user namespace whose limit is 0."""
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *command]


def test_a_missing_layer_is_reported_or_refused_as_the_mode_says(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    env = {
        **os.environ,
        "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "t",
        "EDGEPLEX_AGENT_RUNNER__SANDBOX": "required",
    }
    refused = subprocess.run(
        _without_user_namespaces(agent_command(repo, 0, 0)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1, refused.stdout + refused.stderr
    said = refused.stdout + refused.stderr
    assert "runner.sandbox is required, but this host cannot provide: namespaces" in said

    grpc_port, http_port = free_ports(2)
    log = (tmp_path / "agent.log").open("wb")
    env["EDGEPLEX_AGENT_RUNNER__SANDBOX"] = "best_effort"
    process = subprocess.Popen(
        _without_user_namespaces(agent_command(repo, grpc_port, http_port)),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    agent = AgentProcess(process, grpc_port, http_port, tmp_path / "agent.log")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if agent.http_get("/v2/health/ready")[0] == 200:
                    break
            time.sleep(0.1)
        assert infer_http(agent, "m")[0] == 200
        sandbox = json.loads(agent.http_get("/edgeplex/v1/memory")[1])["sandbox"]
        layers = sandbox["runners"]["shared-0"]
        assert "clone into new namespaces" in layers["namespaces"], layers
        assert layers["mount_view"] != "on"
        assert layers["seccomp"] == layers["landlock"] == layers["no_new_privs"] == "on"
        metrics = agent.http_get("/metrics")[1].decode()
        assert 'edgeplex_runner_sandbox_layer{layer="namespaces"} 0.0' in metrics
        assert "runner sandbox without: namespaces" in agent.log()
    finally:
        assert agent.stop() == 0, agent.log()


# CUDA's driver as it behaved on an H200 host: cuInit fails with
# CUDA_ERROR_OPERATING_SYSTEM (304) inside the runner sandbox (there, as PID 1 of its
# namespace) and succeeds outside it.
FAKE_CUDA_DRIVER = r"""
#include <stdlib.h>
#include <unistd.h>
int cuInit(unsigned int flags) {
    (void)flags;
    return getenv("CUDA_FAKE_FAILS_IN_SANDBOX") && getpid() == 1 ? 304 : 0;
}
"""


def _fake_cuda_driver(tmp_path: Path) -> Path:
    source = tmp_path / "fake_cuda.c"
    source.write_text(FAKE_CUDA_DRIVER)
    driver = tmp_path / "driver"
    driver.mkdir()
    compile_ = ["cc", "-shared", "-fPIC", "-o", str(driver / "libcuda.so.1"), str(source)]
    subprocess.run(compile_, check=True)
    return driver


@pytest.mark.parametrize("fails_inside", [True, False])
def test_cuda_runners_are_sandboxed_only_where_the_driver_starts_inside(
    tmp_path: Path, fails_inside: bool
) -> None:
    repo = tmp_path / "repo"
    demo.make_mlp(repo / "m", width=64, layers=2, in_width=64)
    driver = _fake_cuda_driver(tmp_path)
    env = {
        "LD_LIBRARY_PATH": str(driver),
        "EDGEPLEX_AGENT_RUNNER__SANDBOX_PATHS": json.dumps([str(driver)]),
        "EDGEPLEX_AGENT_RUNNER__EXECUTION_PROVIDER": "cuda",
        "EDGEPLEX_AGENT_RUNNER__CPU_FALLBACK": "true",  # this host's ONNX Runtime has no CUDA
    }
    if fails_inside:
        env["CUDA_FAKE_FAILS_IN_SANDBOX"] = "1"
        refused = subprocess.run(
            agent_command(repo, 0, 0),
            env={**os.environ, "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": "t", **env,
                 "EDGEPLEX_AGENT_RUNNER__SANDBOX": "required"},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said = refused.stdout + refused.stderr
        assert refused.returncode == 1, said
        assert "this host cannot provide: cuda (CUDA's driver does not initialise inside the " \
            "sandbox (cuInit: 304))" in said  # fmt: skip
    agent = start_agent(
        repo, tmp_path, env={**env, "EDGEPLEX_AGENT_RUNNER__SANDBOX": "best_effort"}
    )
    try:
        assert infer_http(agent, "m")[0] == 200
        pid = status(agent)["m"]["runner_pid"]
        sandbox = json.loads(agent.http_get("/edgeplex/v1/memory")[1])["sandbox"]
        same_pid_namespace = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
        if fails_inside:  # served, unconfined, and said so
            assert "cuInit: 304" in sandbox["host"]["cuda"], sandbox
            assert sandbox["runners"] == {} and same_pid_namespace
            assert "runners run without their sandbox: CUDA's driver" in agent.log()
            metrics = agent.http_get("/metrics")[1].decode()
            assert 'edgeplex_runner_sandbox_layer{layer="cuda"} 0.0' in metrics
        else:
            assert sandbox["host"]["cuda"] == "on", sandbox
            assert "shared-0" in sandbox["runners"] and not same_pid_namespace
    finally:
        assert agent.stop() == 0, agent.log()
