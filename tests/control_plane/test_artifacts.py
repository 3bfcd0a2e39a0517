"""Artifacts: fetched by URI, verified by sha256, cached by content, never escaping."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeplex.agent import demo
from edgeplex.artifacts import ArtifactCache, ArtifactError, model_file, probe_onnx


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache(tmp_path: Path) -> ArtifactCache:
    return ArtifactCache(tmp_path / "cache", max_bytes=1 << 20)


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
    with pytest.raises(ArtifactError, match="sha256 mismatch"):
        cache.fetch(src.as_uri(), sha(b"truncated and more"))
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
