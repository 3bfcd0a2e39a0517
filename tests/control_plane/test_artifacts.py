"""Artifacts: fetched by URI, verified by sha256, cached by content, never escaping."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import os
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeplex.agent.catalog import demo
from edgeplex.artifacts import (
    ArtifactCache,
    ArtifactError,
    FetchPolicy,
    model_file,
    probe_onnx,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache(tmp_path: Path) -> ArtifactCache:
    policy = FetchPolicy(("https", "http"), (tmp_path,), deadline_s=5.0)
    return ArtifactCache(tmp_path / "cache", max_bytes=1 << 20, policy=policy)


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # The size-cap test hangs up mid-body: the server's broken pipe is expected.
    server.handle_error = lambda *a: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_file_uri_is_verified_and_cached_by_content(tmp_path: Path, cache: ArtifactCache) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(b"x" * 1000)
    path = cache.fetch(src.as_uri(), sha(b"x" * 1000))
    assert path == cache.root / "sha256" / sha(b"x" * 1000)
    assert path.read_bytes() == b"x" * 1000
    src.unlink()  # served from the cache now
    assert cache.fetch(src.as_uri(), sha(b"x" * 1000)) == path


def test_mismatch_leaves_nothing_behind(tmp_path: Path, cache: ArtifactCache) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(b"truncated")
    with pytest.raises(ArtifactError, match="sha256 mismatch") as err:
        cache.fetch(src.as_uri(), sha(b"truncated and more"))
    assert sha(b"truncated") not in str(err.value)  # never echoes what it read
    assert list((cache.root / "sha256").iterdir()) == []
    assert list((cache.root / "tmp").iterdir()) == []


def test_a_corrupted_cache_entry_is_fetched_again(tmp_path: Path, cache: ArtifactCache) -> None:
    src = tmp_path / "m.onnx"
    src.write_bytes(b"good bytes")
    path = cache.fetch(src.as_uri(), sha(b"good bytes"))
    path.write_bytes(b"bit rot")
    assert cache.fetch(src.as_uri(), sha(b"good bytes")).read_bytes() == b"good bytes"


def test_http_download_and_size_cap(http_root: tuple[Path, str], cache: ArtifactCache) -> None:
    root, base = http_root
    (root / "small.onnx").write_bytes(b"s" * 100)
    (root / "big.onnx").write_bytes(b"b" * (2 << 20))
    assert cache.fetch(f"{base}/small.onnx", sha(b"s" * 100)).read_bytes() == b"s" * 100
    with pytest.raises(ArtifactError, match="larger than the cap"):
        cache.fetch(f"{base}/big.onnx", sha(b"b" * (2 << 20)))
    with pytest.raises(ArtifactError, match="cannot download"):
        cache.fetch(f"{base}/missing.onnx", "0" * 64)


def test_bad_uris_and_hashes(cache: ArtifactCache) -> None:
    with pytest.raises(ArtifactError, match="scheme"):
        cache.fetch("ftp://host/m.onnx", "0" * 64)
    with pytest.raises(ArtifactError, match="64 hex"):
        cache.fetch("file:///m.onnx", "abc")
    with pytest.raises(ArtifactError, match="artifact_file_roots"):
        cache.fetch("file:///etc/passwd", "0" * 64)  # outside the configured roots


def _tar(members: list[tarfile.TarInfo], payloads: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info in members:
            data = payloads.get(info.name)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


@pytest.mark.parametrize(
    "member",
    ["../escape.onnx", "/etc/passwd_copy", "dir/../../escape"],
)
def test_archive_members_cannot_escape(tmp_path: Path, cache: ArtifactCache, member: str) -> None:
    info, data = _file(member, b"evil")
    archive = tmp_path / "m.tar"
    archive.write_bytes(_tar([info], {member: data}))
    with pytest.raises(ArtifactError, match="escapes"):
        cache.fetch(archive.as_uri(), sha(archive.read_bytes()))
    assert not (tmp_path / "escape.onnx").exists()


def test_archive_links_are_refused(tmp_path: Path, cache: ArtifactCache) -> None:
    link = tarfile.TarInfo("model.onnx")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    archive = tmp_path / "m.tar"
    archive.write_bytes(_tar([link], {}))
    with pytest.raises(ArtifactError, match="not a plain file"):
        cache.fetch(archive.as_uri(), sha(archive.read_bytes()))


def test_archive_with_a_model_unpacks(tmp_path: Path, cache: ArtifactCache) -> None:
    demo.make_mlp(tmp_path / "mlp", width=8, layers=1, in_width=4)
    onnx = (tmp_path / "mlp" / "1" / "model.onnx").read_bytes()
    info, data = _file("model.onnx", onnx)
    archive = tmp_path / "m.tar"
    archive.write_bytes(_tar([info], {"model.onnx": data}))
    unpacked = cache.fetch(archive.as_uri(), sha(archive.read_bytes()))
    assert model_file(unpacked).read_bytes() == onnx
    assert probe_onnx(model_file(unpacked)) == {"inputs": 1, "outputs": 1}


def test_probe_rejects_what_is_not_onnx(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage" * 50)
    with pytest.raises(ArtifactError, match="not a loadable ONNX model") as info:
        probe_onnx(junk)
    assert str(tmp_path) not in str(info.value)


def test_only_allowed_schemes_and_roots(tmp_path: Path) -> None:
    strict = ArtifactCache(tmp_path / "c", 1 << 20, FetchPolicy())  # the default: https only
    for uri in ("http://127.0.0.1:1/m.onnx", (tmp_path / "m.onnx").as_uri(), "ftp://h/m"):
        with pytest.raises(ArtifactError, match=r"not allowed|artifact_file_roots"):
            strict.fetch(uri, "0" * 64)
    roots = FetchPolicy(file_roots=(tmp_path / "models",))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.onnx").write_bytes(b"m")
    cache = ArtifactCache(tmp_path / "c2", 1 << 20, roots)
    assert cache.fetch((tmp_path / "models" / "m.onnx").as_uri(), sha(b"m")).read_bytes() == b"m"
    escape = (tmp_path / "models" / ".." / "m.onnx").as_uri()
    with pytest.raises(ArtifactError, match="artifact_file_roots"):
        cache.fetch(escape, sha(b"m"))


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """/redirect: to another scheme; /midway: promises 1000 bytes, sends 10 and hangs
    up; /drip: one byte every 0.2 s, forever."""

    def do_GET(self) -> None:
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "https://127.0.0.1:9/m.onnx")
            self.end_headers()
        elif self.path == "/midway":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
        elif self.path == "/drip":
            self.send_response(200)
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(200):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                    time.sleep(0.2)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def bad_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Misbehaving)
    server.daemon_threads = True
    server.handle_error = lambda *a: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_downloads_that_misbehave_fail_with_a_reason(bad_server: str, tmp_path: Path) -> None:
    cache = ArtifactCache(
        tmp_path / "c", 1 << 20, FetchPolicy(("http",), (), deadline_s=1.5), timeout_s=5
    )
    with pytest.raises(ArtifactError, match="another scheme"):
        cache.fetch(f"{bad_server}/redirect", "0" * 64)
    with pytest.raises(ArtifactError, match="broke off"):
        cache.fetch(f"{bad_server}/midway", "0" * 64)
    started = time.monotonic()
    with pytest.raises(ArtifactError, match=r"longer than 1\.5 s"):
        cache.fetch(f"{bad_server}/drip", "0" * 64)
    assert time.monotonic() - started < 4
    assert list((cache.root / "tmp").iterdir()) == []


def test_prune_keeps_the_budget_and_what_is_desired(tmp_path: Path, cache: ArtifactCache) -> None:
    hashes = []
    for i in range(4):
        data = bytes([i]) * 1000
        src = tmp_path / f"m{i}.onnx"
        src.write_bytes(data)
        hashes.append(sha(data))
        blob = cache.fetch(src.as_uri(), hashes[-1])
        os.utime(blob, (i, i))  # m0 is the least recently used
    dropped = cache.prune(2500, keep={hashes[0]})
    assert dropped == [hashes[1], hashes[2]]
    assert {p.name for p in (cache.root / "sha256").iterdir()} == {hashes[0], hashes[3]}
    assert cache.prune(None, keep=set()) == []


class _Flaky(http.server.BaseHTTPRequestHandler):
    """/flaky: the first answer breaks off halfway, then a Range request gets the
    rest (206); /busy: 503 twice, then the file; /gone: 404."""

    payload = bytes(range(256)) * 4096  # 1 MiB
    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(f"{self.path} {self.headers.get('Range', '')}".strip())
        data = self.payload
        if self.path == "/flaky":
            offset = int((self.headers.get("Range") or "bytes=0-")[6:].rstrip("-") or 0)
            if offset == 0:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                return  # the connection closes: a short read
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {offset}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(data) - offset))
            self.end_headers()
            self.wfile.write(data[offset:])
        elif self.path == "/busy" and sum(s.startswith("/busy") for s in self.seen) <= 2:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/busy":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[::-1])
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_downloads_resume_and_retry_and_report_progress(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    cache = ArtifactCache(tmp_path / "c", 4 << 20, FetchPolicy(("http",), (), deadline_s=30))
    data = _Flaky.payload
    try:
        seen: list[tuple[int, int | None]] = []
        got = cache.fetch(f"{base}/flaky", sha(data), progress=lambda n, t: seen.append((n, t)))
        assert got.read_bytes() == data
        assert _Flaky.seen == ["/flaky", f"/flaky bytes={len(data) // 2}-"]  # resumed
        assert seen[-1] == (len(data), len(data))
        _Flaky.seen.clear()
        assert cache.fetch(f"{base}/busy", sha(data[::-1])).read_bytes() == data[::-1]
        assert _Flaky.seen == ["/busy"] * 3  # 503, 503, then served
        _Flaky.seen.clear()
        with pytest.raises(ArtifactError, match="404"):
            cache.fetch(f"{base}/gone", "1" * 64)
        assert _Flaky.seen == ["/gone"]  # not retried
    finally:
        server.shutdown()
    assert list((cache.root / "tmp").iterdir()) == []
