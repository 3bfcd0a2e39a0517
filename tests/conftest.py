"""Shared fixtures: a model repository and a running agent on free ports.

The agent runs as a real `edgeplex agent` subprocess and is driven through
tritonclient, exactly as users would; nothing in it is mocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgeplex.agent.catalog import demo
from edgeplex.net import free_ports

ROOT = Path(__file__).resolve().parent.parent
# Every agent the tests start takes this admin token; requests for its verbs carry AUTH.
ADMIN_TOKEN = "test-admin-token"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}  # lower case: gRPC metadata needs it
CACHE = Path(os.environ.get("EDGEPLEX_TEST_CACHE", ROOT / ".cache" / "test-models"))


# Tests that measure time against a bound (a light tenant's latency beside a flood, a
# victim client under attack, closed loops under deadlines, benchmarks, a Redis
# restart within a lease, the simulator against the rig's latencies) or hold fixed
# ports (the README's fleet); a killed agent's leftovers, which any agent starting
# meanwhile sweeps; and schemathesis's, whose operations are sub-items of one test
# that pytest-xdist's file scheduling does not run. `make test` runs the rest four at
# a time, file by file (most of them wait on processes more than they compute), and
# these alone after it. The rig's own tests run with the rest: their one bound on
# time, a failover within 9 s, held at 2.3 s beside three busy loops.
SERIAL = (
    "tests/agent/test_crash_safety.py",
    "tests/agent/frontdoor/test_openapi.py",
    "tests/rig/test_sim_vs_rig.py",
    "tests/test_readme.py",
    "tests/test_bench_density.py",
    "tests/test_bench_profile.py",
    "tests/agent/frontdoor/test_tenants.py",
    "tests/agent/frontdoor/test_attacks.py",
    "tests/agent/residency/test_no_lost_requests.py",
    "tests/agent/residency/test_overcommit.py::test_loaded_models_never_wait_behind_a_slow_load",
    # A Redis restart within a 3 s lease: the restart's own time must stay under it.
    "tests/control_plane/test_redis_failover.py::test_a_leader_back_within_a_lease",
)


# The files that take longest (seconds of wall time each in a parallel phase, most of
# it waiting on timers and processes), handed out first, longest first: `make test`
# gives pytest-xdist the files in collection order (--no-loadscope-reorder; by default
# it orders them by their number of tests, which sent a 38-second file of one test to
# a worker last, 40 s after the other two were done).
LONGEST_FIRST = (
    "tests/control_plane/test_fleet.py",  # 88
    "tests/control_plane/test_redis_failover.py",  # 38
    "tests/control_plane/test_simulator.py",  # 38
    "tests/agent/frontdoor/test_fuzz_doors.py",  # 31
    "tests/control_plane/test_batch.py",  # 30
    "tests/rig/test_rig.py",  # 29
    "tests/agent/batching/test_priority.py",  # 28
    "tests/control_plane/test_mqtt_cut.py",  # 24, most of it waiting
    "tests/control_plane/test_dashboard.py",  # 22
    "tests/control_plane/test_replica_cut.py",  # 20, most of it waiting
    "tests/agent/frontdoor/test_fuzz.py",  # 20
    "tests/agent/test_variants.py",  # 18
    "tests/control_plane/test_fleet_trust.py",  # 17
    "tests/test_gpu_check.py",  # 15
    "tests/agent/test_shutdown.py",  # 14
)


def pytest_configure(config: pytest.Config) -> None:
    # Redis and mosquitto's backend (tests/services.py) is chosen once, before any
    # test runs, and pytest-xdist's workers inherit the choice: the compose rig's
    # test starts a Docker engine and stops it, and a worker that looked while it ran
    # would put its services in containers the engine's stop takes away.
    if not os.environ.get("EDGEPLEX_TEST_SERVICES"):
        from tests.services import in_containers

        os.environ["EDGEPLEX_TEST_SERVICES"] = "containers" if in_containers() else "local"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)

    rank = {file: i for i, file in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


def free_port() -> int:
    return free_ports(1)[0]


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every model the integration tests use (built once per session)."""
    repo = tmp_path_factory.mktemp("repo")
    demo.fetch_silero(repo / "silero_vad", cache=CACHE)
    demo.make_add_sub(repo / "add_sub", config="max_batch_size: 16\nmax_queue_delay_us: 20000\n")
    demo.make_add_sub(repo / "add_sub_nobatch", config="max_batch_size: 0\n")
    demo.make_mlp(repo / "mlp_small", width=64, layers=2, in_width=32)
    demo.make_mlp(
        repo / "mlp_dedicated",
        width=64,
        layers=2,
        in_width=32,
        seed=3,
        config="isolation: dedicated\n",
    )
    demo.make_slow(
        repo / "slow",
        size=512,
        depth=32,
        config="max_batch_size: 8\nmax_queue_size: 2\nisolation: dedicated\n",
    )
    for datatype in ("FP32", "FP16", "INT64", "INT32", "INT8", "UINT8", "BOOL"):
        demo.make_identity(repo / f"identity_{datatype.lower()}", datatype)
    demo.make_broken(repo / "broken")
    return repo


@dataclass
class AgentProcess:
    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    log_path: Path
    tls_ca: Path | None = None  # set when the agent serves TLS (security.tls_cert)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def http_get(self, path: str) -> tuple[int, bytes]:
        scheme, context = "http", None
        if self.tls_ca is not None:
            scheme, context = "https", ssl.create_default_context(cafile=str(self.tls_ca))
        url = f"{scheme}://{self.http_url}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5, context=context) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)


def agent_command(repo: Path, grpc_port: int, http_port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "edgeplex",
        "agent",
        "--model-repo",
        str(repo),
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
    ]


def start_agent(
    repo: Path,
    log_dir: Path,
    env: dict[str, str] | None = None,
    wait_ready: bool = True,
    tls_ca: Path | None = None,
) -> AgentProcess:
    """An agent on free ports, once it answers ready (or at all: `wait_ready` off).
    Ports another test worker took between their choice and the agent's bind are
    chosen again, up to three times."""
    for attempt in range(3):
        grpc_port, http_port = free_ports(2)
        log_path = log_dir / f"agent-{grpc_port}.log"
        with log_path.open("wb") as log:  # the agent writes to its own copy
            process = subprocess.Popen(
                agent_command(repo, grpc_port, http_port),
                stdout=log,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "EDGEPLEX_AGENT_SECURITY__ADMIN_TOKEN": ADMIN_TOKEN,
                    # Shedding for loop lag is its own test's (test_limits.py): on two
                    # cores busy with three test workers, a loop 0.25 s late (the
                    # default) is the machine's doing, and an agent refusing with 429
                    # there would hide the answer a test asks for.
                    "EDGEPLEX_AGENT_DOORS__SHED_LOOP_LAG_S": "2",
                    # Each agent pins its own control-plane key (never the user's state).
                    "EDGEPLEX_AGENT_FLEET__TRUST_FILE": str(
                        log_dir / f"control-plane-{grpc_port}.pub"
                    ),
                    **(env or {}),
                },
            )
        agent = AgentProcess(process, grpc_port, http_port, log_path, tls_ca)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                if "address already in use" in agent.log() and attempt < 2:
                    break  # taken meanwhile: choose again
                raise RuntimeError(f"agent exited early:\n{agent.log()}")
            try:
                status, _ = agent.http_get("/v2/health/ready")
                if status == 200 or (status == 503 and not wait_ready):
                    return agent
            except OSError:
                pass
            time.sleep(0.1)
        else:
            agent.stop()
            raise RuntimeError(f"agent not ready in time:\n{agent.log()}")
    raise AssertionError("unreachable: the last attempt returns or raises")


@contextlib.contextmanager
def running_agent(
    repo: Path, tmp_path_factory: pytest.TempPathFactory, **env: str
) -> Iterator[AgentProcess]:
    """An agent on `repo` for a module's tests (16 MiB payloads; `env` on top); it
    must stop cleanly."""
    process = start_agent(
        repo,
        tmp_path_factory.mktemp("agent"),
        env={"EDGEPLEX_AGENT_MAX_PAYLOAD_BYTES": "16MiB", **env},
    )
    yield process
    assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def agent(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    with running_agent(model_repo, tmp_path_factory) as process:
        yield process
