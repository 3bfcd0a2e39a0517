"""Real Redis, mosquitto and control-plane processes for the integration tests.

Redis and mosquitto are Debian's binaries, each started on a free port in a
temp directory and restartable on the same port with the same data. Two
backends run them:
- containers (testcontainers), when a Docker engine answers and the compose
  rig's image (`edgeplex:dev`, built by scripts/compose_rig.py) is there: the
  same binaries in that image, on the host's network, with the temp directory
  mounted at its own path;
- local processes otherwise (`make setup` installs the binaries when missing).
EDGEPLEX_TEST_SERVICES=local or =containers chooses one. Nothing here fakes a
protocol.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.conftest import free_port

if TYPE_CHECKING:
    import grpc


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


SERVICE_IMAGE = "edgeplex:dev"


@functools.cache
def in_containers() -> bool:
    """Whether Redis and mosquitto run in containers (the module docstring)."""
    choice = os.environ.get("EDGEPLEX_TEST_SERVICES", "")
    if choice in ("local", "containers"):
        return choice == "containers"
    if shutil.which("docker") is None:
        return False
    try:
        probe = subprocess.run(
            ["docker", "image", "inspect", SERVICE_IMAGE], capture_output=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return False
    return probe.returncode == 0  # the engine answered, and the image is there


class Service:
    """A child process on a fixed port, restartable with its data kept."""

    name = "service"
    containable = False  # may run in SERVICE_IMAGE (in_containers)

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.container: Any = None  # a testcontainers DockerContainer, when running in one
        self.log_path = workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        if self.containable and in_containers():
            self._start_container()
        else:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                stdout=self.log_path.open("ab"),
                stderr=subprocess.STDOUT,
            )
        wait_port(self.port)

    def _start_container(self) -> None:
        # The reaper's image would come from a registry; containers are removed in stop().
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        from testcontainers.core.container import DockerContainer

        binary, *args = self.command()
        self.container = (
            DockerContainer(SERVICE_IMAGE)
            .with_command(args)
            .with_volume_mapping(str(self.workdir), str(self.workdir), "rw")
            .with_kwargs(
                entrypoint=[Path(binary).name],  # on the image's PATH
                network_mode="host",
                healthcheck={"test": ["NONE"]},  # the image's checks an agent; wait_port suffices
                user=f"{os.getuid()}:{os.getgid()}",
                working_dir=str(self.workdir),
            )
            .start()
        )

    def _stop_container(self, sig: int) -> None:
        wrapped = self.container.get_wrapped_container()
        with contextlib.suppress(Exception):  # already exited
            wrapped.kill(signal=int(sig))
            wrapped.wait(timeout=10)
        with self.log_path.open("ab") as out:
            out.write(wrapped.logs())
        wrapped.remove(force=True)
        self.container = None

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.container is not None:
            self._stop_container(sig)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class RedisServer(Service):
    name = "redis"
    containable = True

    def command(self) -> list[str]:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.workdir),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            # A replica that (re)connects is synced at once, not after 5 s waiting for
            # others to share the transfer (docs/deployment.md).
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


MASTER = "edgeplex"  # the Sentinels' name for the primary


class RedisReplica(RedisServer):
    name = "redis-replica"
    containable = False

    def __init__(self, workdir: Path, primary: RedisServer) -> None:
        super().__init__(workdir)
        self.primary = primary

    def command(self) -> list[str]:
        return [*super().command(), "--replicaof", "127.0.0.1", str(self.primary.port)]


class Sentinel(Service):
    name = "sentinel"

    def __init__(self, workdir: Path, primary: RedisServer, down_after_ms: int = 1000) -> None:
        super().__init__(workdir)
        self.primary = primary
        self.down_after_ms = down_after_ms  # a primary silent this long is down
        self.log_path = workdir / f"sentinel-{self.port}.log"

    def command(self) -> list[str]:
        conf = self.workdir / f"sentinel-{self.port}.conf"  # each rewrites its own
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {MASTER} 127.0.0.1 {self.primary.port} 2\n"
            f"sentinel down-after-milliseconds {MASTER} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
        )
        return [shutil.which("redis-server") or "/usr/bin/redis-server", str(conf), "--sentinel"]


def online_replicas(port: int) -> int:
    """Replicas streaming from the primary on `port` (INFO replication)."""
    import redis

    info = redis.Redis(port=port).info("replication")
    return sum(
        1 for k, v in info.items() if k[5:].isdigit() and k.startswith("slave")
        and isinstance(v, dict) and v.get("state") == "online"
    )  # fmt: skip


def usage_minutes_on(port: int) -> set[str]:
    """The usage minutes ("<site>/<minute>") summed into the hours of the Redis on
    `port` (the control plane's layout: store.py)."""
    import redis

    from edgeplex.proto import edgeplex_control_pb2 as pb

    minutes = set()
    with redis.Redis(port=port) as found:
        for key in found.scan_iter("edgeplex:usage:h:*"):
            hour = pb.UsageHour.FromString(found.get(key) or b"")
            start = hour.sum.minute * 3600
            minutes |= {f"{hour.sum.site_id}/{(start + at) // 60}" for at in hour.minutes}
    return minutes


def sentinel_url(sentinels: list[Sentinel]) -> str:
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in sentinels)
    return f"redis+sentinel://{hosts}/{MASTER}/0"


class Mosquitto(Service):
    name = "mosquitto"
    containable = True

    def __init__(self, workdir: Path, password_file: Path | None = None) -> None:
        super().__init__(workdir)
        self.password_file = password_file

    def command(self) -> list[str]:
        conf = self.workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} 127.0.0.1",
            "persistence true",
            f"persistence_location {self.workdir}/",
            "autosave_interval 1",
        ]
        if os.geteuid() == 0:
            # Otherwise mosquitto drops to its own user, which cannot read our temp dir.
            lines.append("user root")
        if self.password_file is None:
            lines.append("allow_anonymous true")
        else:
            lines += [
                "allow_anonymous false",
                f"password_file {self.password_file}",
                "use_username_as_clientid true",  # as the fleet's brokers run
            ]
        conf.write_text("\n".join(lines) + "\n")
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        return [binary, "-c", str(conf)]

    def url(self, user: str = "", password: str = "") -> str:
        auth = f"{user}:{password}@" if user else ""
        return f"mqtt://{auth}127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Bridge:
    """A bridge from one broker to another: the remote broker's port, the bridge's
    user there, and the CA that signed the remote's certificate (when it speaks TLS)."""

    port: int
    user: str
    password: str
    ca: Path | None = None


class FleetBroker(Mosquitto):
    """mosquitto as a fleet runs it: reading the password and ACL files the control
    plane rewrites (in `files`; every broker of a fleet reads the same ones, as
    brokers kept in step by configuration management do) and writing a pid file, for
    the SIGHUP that reloads them. With `tls` (a folder of ca.pem, cert.pem and
    key.pem), its one listener speaks TLS only (mqtts); with `bridge`, it brings
    the fleet's topics in from another broker, as a regional broker does."""

    password_file: Path

    def __init__(
        self,
        workdir: Path,
        files: Path | None = None,  # else workdir
        tls: Path | None = None,
        bridge: Bridge | None = None,
    ) -> None:
        workdir.mkdir(exist_ok=True)
        files = files or workdir
        super().__init__(workdir, files / "passwd")
        self.acl_file, self.pid_file = files / "acl", workdir / "mosquitto.pid"
        self.tls, self.bridge = tls, bridge

    def command(self) -> list[str]:
        command = super().command()
        conf = Path(command[-1])
        # A thousand sites' desired states and routes can wait for one subscriber.
        text = f"acl_file {self.acl_file}\npid_file {self.pid_file}\nmax_queued_messages 10000\n"
        if self.tls is not None:  # applies to the listener above
            text += (
                f"cafile {self.tls / 'ca.pem'}\ncertfile {self.tls / 'cert.pem'}\n"
                f"keyfile {self.tls / 'key.pem'}\n"
            )
        if self.bridge is not None:
            b = self.bridge
            text += (
                f"connection to-the-control-planes\naddress 127.0.0.1:{b.port}\n"
                f"remote_username {b.user}\nremote_password {b.password}\n"
                f"remote_clientid {b.user}\nkeepalive_interval 10\nrestart_timeout 1 5\n"
                "topic edgeplex/v1/# in 1\n"
            )
            if b.ca is not None:
                text += f"bridge_cafile {b.ca}\n"
        conf.write_text(conf.read_text() + text)
        return command

    def url(self, user: str = "", password: str = "") -> str:
        plain = super().url(user, password)
        return plain.replace("mqtt://", "mqtts://", 1) if self.tls is not None else plain

    def reload(self) -> None:
        """Read the password and ACL files again (what the control plane does to the
        broker whose pid file it has; a regional broker's own management does it)."""
        os.kill(int(self.pid_file.read_text()), signal.SIGHUP)


TOKEN = "test-admin-token"


class ControlPlane(Service):
    name = "control-plane"

    def __init__(
        self,
        workdir: Path,
        redis: RedisServer,
        mqtt_url: str,
        redis_url: str | None = None,  # else `redis`'s
        tls_ca: Path | None = None,  # the CA of its certificate, when it serves TLS
        **env: str,
    ) -> None:
        super().__init__(workdir)
        self.tls_ca = tls_ca
        self.redis = redis
        self.redis_url = redis_url or redis.url
        self.mqtt_url = mqtt_url
        self.env = env
        self.replica = f"cp-{self.port}"
        self.log_path = workdir / f"control-plane-{self.port}.log"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "edgeplex", "control-plane",
            "--redis", self.redis_url,
            "--mqtt", self.mqtt_url,
            "--grpc-port", str(self.port),
        ]  # fmt: skip

    def start(self) -> None:
        env = {
            **os.environ,
            "EDGEPLEX_ADMIN_TOKEN": TOKEN,
            "EDGEPLEX_CP_REPLICA_ID": self.replica,
            "EDGEPLEX_CP_PLACEMENT_INTERVAL_S": "1",
            "EDGEPLEX_CP_SITE_LEASE_S": "3",
            "EDGEPLEX_CP_REPORT_INTERVAL_S": "0.5",
            "EDGEPLEX_CP_LEADER_LEASE_S": "2",
            "EDGEPLEX_CP_DEMAND_HALF_LIFE_S": "2",
            "EDGEPLEX_CP_ARTIFACT_DIR": str(self.workdir / f"artifacts-{self.port}"),
            # Replicas sharing a workdir share the key, as every replica of one fleet must.
            "EDGEPLEX_CP_SIGNING_KEY_FILE": str(self.workdir / "signing-key"),
            # Test artifacts live in the workdir, and some are served over plain HTTP.
            "EDGEPLEX_CP_ARTIFACT_FILE_ROOTS": json.dumps([str(self.workdir)]),
            "EDGEPLEX_CP_ARTIFACT_SCHEMES": '["https", "http"]',
            **self.env,
        }
        self.process = subprocess.Popen(
            self.command(),
            cwd=self.workdir,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            wait_port(self.port, timeout=30)
        except TimeoutError:
            raise RuntimeError(f"control plane did not start:\n{self.log()}") from None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def channel(self) -> grpc.Channel:
        """A channel to its gRPC port: over TLS, checked against its CA, when it
        serves TLS."""
        import grpc

        if self.tls_ca is None:
            return grpc.insecure_channel(self.address)
        creds = grpc.ssl_channel_credentials(self.tls_ca.read_bytes())
        return grpc.secure_channel(self.address, creds)


def add_site(cp: ControlPlane, site_id: str, region: str) -> tuple[str, str]:
    """`edgeplex admin site add` through the admin API: the site's join token and,
    where the control plane manages the broker's users, its broker password."""
    from edgeplex.proto import edgeplex_control_pb2 as pb
    from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

    with cp.channel() as channel:
        reply = pb_grpc.AdminServiceStub(channel).AddSite(
            pb.AddSiteRequest(site_id=site_id, region=region),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=10,
        )
    return reply.join_token, reply.mqtt_password


def join_token(cp: ControlPlane, site_id: str, region: str) -> str:
    return add_site(cp, site_id, region)[0]


def fleet_env(cp: ControlPlane, mqtt_url: str, site_id: str, region: str) -> dict[str, str]:
    """The environment of an agent joining `cp` as `site_id`, with its own join token
    (and its own broker user, where the control plane made one)."""
    token, password = add_site(cp, site_id, region)
    if password:
        mqtt_url = mqtt_url.replace("://", f"://{site_id}:{password}@", 1)
    return {
        "EDGEPLEX_AGENT_FLEET__CONTROL_PLANE": cp.address,
        "EDGEPLEX_AGENT_FLEET__SITE_ID": site_id,
        "EDGEPLEX_AGENT_FLEET__REGION": region,
        "EDGEPLEX_AGENT_FLEET__MQTT_URL": mqtt_url,
        "EDGEPLEX_AGENT_FLEET__JOIN_TOKEN": token,
        **({"EDGEPLEX_AGENT_FLEET__TLS_CA": str(cp.tls_ca)} if cp.tls_ca else {}),
        "EDGEPLEX_AGENT_FLEET__ARTIFACT_FILE_ROOTS": json.dumps([str(cp.workdir)]),
        "EDGEPLEX_AGENT_FLEET__ARTIFACT_SCHEMES": '["https", "http"]',
        # Usage records of this fleet only (not the user's state directory), kept by
        # 2-second periods so a test sees them sent.
        "EDGEPLEX_AGENT_USAGE_DIR": str(cp.workdir / f"usage-{site_id}"),
        "EDGEPLEX_AGENT_USAGE_INTERVAL_S": "2",
        # Every request's access line (tests count them against the usage records).
        "EDGEPLEX_AGENT_ACCESS_LOG_RATE": "100000",
    }
