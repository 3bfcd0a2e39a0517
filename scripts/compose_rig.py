#!/usr/bin/env python3
"""The 3-region compose rig, from nothing to a smoke test and back to nothing.

    python scripts/compose_rig.py            # make compose-rig: all of it
    python scripts/compose_rig.py --keep     # leave the rig up (down: --down)
    python scripts/compose_rig.py --build-only

Steps, each skipped when already done:
1. A Docker engine: Debian's docker.io, docker-compose and debootstrap are
   installed when missing (root, apt), and dockerd is started when nothing
   answers (overlay2, or vfs where overlay is refused). An engine this script
   started is stopped at the end.
2. The base image `edgeplex-base:bookworm`: Debian from debootstrap (Python,
   redis-server, mosquitto, iproute2), `docker import`ed. No registry is used.
3. The image `edgeplex:dev` (deploy/compose/Dockerfile), built with no network
   from wheels made and downloaded here for the image's Python.
4. The rig (deploy/compose/docker-compose.yml, project `edgeplex-rig`), then the
   smoke test: every site joins; a model is added for region r0 only, placed
   there and served in region; a call at an r2 site is forwarded to r0.
5. Down, volumes and network included.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "compose"
CONTEXT = ROOT / "build" / "compose"
PKI = CONTEXT / "pki"  # the compose file mounts its folders
COMPOSE_FILE = ROOT / "deploy" / "compose" / "docker-compose.yml"
PROJECT = "edgeplex-rig"
BASE_IMAGE = "edgeplex-base:bookworm"
IMAGE = "edgeplex:dev"
BASE_PACKAGES = "python3,python3-venv,redis-server,mosquitto,iproute2,ca-certificates"
MIRROR = "http://deb.debian.org/debian"
GATEWAY = "172.28.0.1"  # the host on the rig's network (docker-compose.yml)
SITES = {f"r{r}s{s}": (f"r{r}", f"172.28.{r + 1}.1{s}") for r in range(3) for s in range(2)}


def log(message: str) -> None:
    print(f"compose-rig: {message}", flush=True)


def run(*command: str, **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("check", True)
    return subprocess.run(command, text=True, **kw)  # type: ignore[call-overload,no-any-return]


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20)
    return probe.returncode == 0


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class EngineUnavailable(RuntimeError):
    """No Docker engine answers and none can be started on this machine."""


def can_start_engine() -> bool:
    return os.geteuid() == 0 and bool(shutil.which("dockerd") or shutil.which("apt-get"))


class Engine:
    """A Docker engine that answers; one started here is stopped by `stop`."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def ensure(self) -> None:
        if engine_answers():
            return
        if not can_start_engine():
            raise EngineUnavailable("no Docker engine answers; starting one needs root and apt")
        missing = [
            package
            for package, binary in (
                ("docker.io", "dockerd"),
                ("docker-compose", "docker-compose"),
                ("debootstrap", "debootstrap"),
            )
            if shutil.which(binary) is None
        ]
        if missing:
            log(f"installing {' '.join(missing)}")
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            try:
                run("apt-get", "update", "-qq", env=env)
                run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing,
                    env=env)  # fmt: skip
            except subprocess.CalledProcessError as exc:
                raise EngineUnavailable(f"could not install {' '.join(missing)}: {exc}") from exc
        CACHE.mkdir(parents=True, exist_ok=True)
        for driver in ("overlay2", "vfs"):
            log(f"starting dockerd ({driver})")
            self.process = subprocess.Popen(
                # --iptables=false: the host's firewall stays as it was (a FORWARD
                # DROP policy would cut off bridged namespaces such as the netns rig).
                ["dockerd", "--storage-driver", driver, "--iptables=false"],
                stdout=(CACHE / "dockerd.log").open("ab"),
                stderr=subprocess.STDOUT,
            )
            with contextlib.suppress(TimeoutError):
                wait_for(engine_answers, 60, "dockerd")
                return
            self.stop()
        raise EngineUnavailable(f"dockerd did not start; see {CACHE / 'dockerd.log'}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def build_base() -> None:
    if image_exists(BASE_IMAGE):
        return
    rootfs = CACHE / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    log(f"debootstrap bookworm ({BASE_PACKAGES}); a few minutes")
    started = time.monotonic()
    run("debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm",
        str(rootfs), MIRROR)  # fmt: skip
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (rootfs / cache).glob("*"):
            if item.is_file():
                item.unlink()
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run("docker", "import", "--change", 'CMD ["/bin/bash"]', "-", BASE_IMAGE, stdin=tar.stdout)
    tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)
    log(f"{BASE_IMAGE} built in {time.monotonic() - started:.0f} s")


def missing_in_image(wheels: Path) -> str | None:
    """The first requirement the base image's pip cannot satisfy from `wheels`."""
    script = (
        'cd "$(mktemp -d)" && python3 -m venv v && v/bin/pip install --dry-run --no-index --quiet '
        "--disable-pip-version-check --find-links /wheels edgeplex"
    )
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-v", f"{wheels}:/wheels:ro", BASE_IMAGE,
         "sh", "-c", script],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode == 0:
        return None
    for line in probe.stderr.splitlines():
        if "No matching distribution found for " in line:
            return line.split("found for ", 1)[1].split(";")[0].strip()
    raise RuntimeError(f"pip in the image failed: {probe.stderr[-2000:]}")


def build_image() -> None:
    """edgeplex:dev from wheels of this checkout and its dependencies."""
    wheels = CONTEXT / "wheels"
    shutil.rmtree(CONTEXT, ignore_errors=True)
    wheels.mkdir(parents=True)
    env = {**os.environ, "PIP_CACHE_DIR": str(ROOT / ".cache" / "pip")}
    # Dependencies resolved for the image's Python, not this one: markers such as
    # python_full_version differ between point releases.
    version = run("docker", "run", "--rm", "--network", "none", BASE_IMAGE, "python3", "-c",
                  "import platform; print(platform.python_version())",
                  capture_output=True).stdout.strip()  # fmt: skip
    log(f"wheels for the image's Python {version}")
    pip = (sys.executable, "-m", "pip")
    run(*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(ROOT), env=env)
    (edgeplex,) = wheels.glob("edgeplex-*.whl")
    run(*pip, "download", "--quiet", "--only-binary=:all:", "--python-version", version,
        "--dest", str(wheels), str(edgeplex), env=env)  # fmt: skip
    # pip evaluates markers for this interpreter; ask the image's own pip (no
    # network) what is still missing, and fetch that here.
    for _ in range(10):
        missing = missing_in_image(wheels)
        if missing is None:
            break
        log(f"the image's Python also needs {missing}")
        run(*pip, "download", "--quiet", "--only-binary=:all:", "--no-deps", "--python-version",
            version, "--dest", str(wheels), missing, env=env)  # fmt: skip
    # This checkout's wheel apart from its dependencies': the image installs them in
    # a layer of their own, which the next build takes from the cache unless they
    # changed (the docker build 17 s with them in one layer, 4 s from the cache).
    own = CONTEXT / "edgeplex"
    own.mkdir()
    edgeplex.rename(own / edgeplex.name)
    dockerfile = ROOT / "deploy" / "compose" / "Dockerfile"
    for line in dockerfile.read_text().splitlines():  # the rest it copies, from its folder
        words = line.split()
        if words[:1] == ["COPY"] and words[1] not in ("wheels", "edgeplex", "--from=dependencies"):
            shutil.copy2(dockerfile.parent / words[1], CONTEXT / words[1])
    log(f"docker build {IMAGE} (no network)")
    started = time.monotonic()
    run("docker", "build", "--network", "none", "--force-rm", "--quiet", "-f", str(dockerfile),
        "-t", IMAGE,
        str(CONTEXT))  # fmt: skip
    log(f"{IMAGE} built in {time.monotonic() - started:.0f} s")


def compose(
    *args: str, token: str = "unused", redis_password: str = "unused", **kw: object
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEPLEX_ADMIN_TOKEN": token, "EDGEPLEX_REDIS_PASSWORD": redis_password}
    command = ["docker-compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), *args]
    return run(*command, env=env, **kw)


def make_pki() -> None:
    """The rig's CA and the control plane's and broker's certificates (kept across
    runs), readable by the image's user: its containers run as `edgeplex`."""
    from edgeplex.rig.certs import issue

    issue(PKI, "cp", ["172.28.0.20", "127.0.0.1"])  # also as the host reaches it
    issue(PKI, "broker", ["172.28.0.11"])
    ask = ("docker", "run", "--rm", "--network", "none", "--entrypoint", "id", IMAGE)
    ids = run(*ask, "-u", capture_output=True).stdout.strip()
    gid = run(*ask, "-g", capture_output=True).stdout.strip()
    for name in ("cp", "broker", "trust"):
        for path in (PKI / name, *(PKI / name).iterdir()):
            os.chown(path, int(ids), int(gid))


def down() -> None:
    compose("down", "--volumes", "--remove-orphans", "--timeout", "20")


def stop_cleanly(token: str) -> float:
    """Stop the rig as an operator would, and the seconds that took. RuntimeError
    naming each container the stop's timeout had to kill: its main process never
    handled SIGTERM (a shell in front of it, say), so it had no chance to finish
    its writes."""
    started = time.monotonic()
    compose("stop", "--timeout", "20", token=token)
    seconds = time.monotonic() - started
    listed = run(
        "docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}",
        "--format", "{{.Names}} {{.Status}}", capture_output=True,
    ).stdout.splitlines()  # fmt: skip
    killed = [line for line in listed if "Exited (0)" not in line]
    if killed:
        raise RuntimeError(f"not stopped by SIGTERM: {killed}")
    return seconds


# --- the smoke test ---------------------------------------------------------------


def http_json(url: str, body: bytes | None = None) -> tuple[int, dict, dict[str, str]]:  # type: ignore[type-arg]
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read() or b"{}"), dict(reply.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode(errors="replace")}, dict(exc.headers)
    except OSError as exc:
        return 0, {"error": str(exc)}, {}


@contextlib.contextmanager
def serve_artifacts(directory: Path) -> Iterator[str]:
    """An HTTP server for the agents, on the host's address in the rig's network."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer((GATEWAY, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{GATEWAY}:{server.server_address[1]}"
    finally:
        server.shutdown()


def smoke(token: str) -> dict[str, object]:
    """Drive the running rig as a user would; returns what it measured. Raises
    AssertionError or TimeoutError naming what did not happen."""
    import grpc

    from edgeplex.agent.catalog import demo
    from edgeplex.artifacts import sha256_of
    from edgeplex.proto import edgeplex_control_pb2 as pb
    from edgeplex.proto import edgeplex_control_pb2_grpc as pb_grpc

    started = time.monotonic()
    auth = (("authorization", f"Bearer {token}"),)
    creds = grpc.ssl_channel_credentials((PKI / "trust" / "ca.pem").read_bytes())
    channel = grpc.secure_channel("127.0.0.1:7070", creds)  # TLS, as every agent
    admin = pb_grpc.AdminServiceStub(channel)

    def sites_up() -> bool:
        try:
            sites = admin.ListSites(pb.ListSitesRequest(), metadata=auth, timeout=5).sites
        except grpc.RpcError:
            return False
        return sorted(s.site_id for s in sites if s.up) == sorted(SITES)

    wait_for(sites_up, 180, "all six sites up at the control plane")
    joined_s = time.monotonic() - started
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 32], "datatype": "FP32", "data": [1.0] * 32}]}
    ).encode()
    with tempfile.TemporaryDirectory() as work, serve_artifacts(Path(work)) as base_url:
        demo.make_mlp(Path(work) / "smoke", width=64, layers=2, in_width=32, seed=7)
        artifact = Path(work) / "smoke" / "1" / "model.onnx"
        admin.AddModel(
            pb.CatalogModel(
                name="smoke",
                artifact_uri=f"{base_url}/smoke/1/model.onnx",
                sha256=sha256_of(artifact),
                regions=["r0"],
                min_replicas=1,
            ),
            metadata=auth,
            timeout=10,
        )

        def served_at(site: str) -> str:
            status, reply, headers = http_json(
                f"http://{SITES[site][1]}:8000/v2/models/smoke/infer", body
            )
            if status != 200:
                return ""
            assert len(reply["outputs"][0]["data"]) == 64, reply
            return headers.get("edgeplex-served-by", "")

        def placed_in_r0() -> bool:
            return any(served_at(s) == s for s in ("r0s0", "r0s1"))

        wait_for(placed_in_r0, 120, "the model placed and served in region r0")
        in_region_s = time.monotonic() - started
        holder = next(s for s in ("r0s0", "r0s1") if served_at(s) == s)
        wait_for(lambda: served_at("r2s0") == holder, 60, "a call at r2s0 forwarded to r0")
    # Redis is on the control plane's loopback only: an agent's container cannot reach it.
    probe = "import socket; socket.create_connection(('172.28.0.20', 6379), 3)"
    reached = compose(
        "exec", "-T", "agent-r0s0", "python3", "-c", probe, check=False, capture_output=True
    )
    assert reached.returncode != 0, "an agent's container reached Redis"
    return {
        "sites_joined_s": round(joined_s, 1),
        "served_in_region_s": round(in_region_s, 1),
        "forwarded_from_r2_to": holder,
        "total_s": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the rig (and dockerd) up")
    parser.add_argument("--down", action="store_true", help="take a kept rig down and exit")
    parser.add_argument("--build-only", action="store_true", help="build the images and exit")
    args = parser.parse_args(argv)
    engine = Engine()
    started = time.monotonic()
    engine.ensure()
    try:
        if args.down:
            down()
            return 0
        build_base()
        build_image()
        make_pki()
        if args.build_only:
            return 0
        token, redis_password = secrets.token_hex(16), secrets.token_hex(16)
        log("docker-compose up")
        compose("up", "-d", "--no-build", token=token, redis_password=redis_password)
        try:
            figures = smoke(token)
            figures["stopped_s"] = round(stop_cleanly(token), 1)
        except BaseException:
            compose("ps", token=token)
            compose("logs", "--tail", "40", token=token)
            raise
        finally:
            if not args.keep:
                down()
        figures["whole_run_s"] = round(time.monotonic() - started, 1)
        log("smoke test passed: " + json.dumps(figures))
        return 0
    finally:
        if not args.keep:
            engine.stop()


if __name__ == "__main__":
    sys.exit(main())
