"""Model artifacts: fetch by URI, verify by sha256, keep in a content-addressed cache.

Used by the control plane (to verify a catalog entry before placing it) and by
agents (to install what their desired state names). The guarantees:

- Only the schemes the `FetchPolicy` allows (by default `https://`), and
  `file://` only under the policy's roots; a redirect never changes scheme.
- A download has an overall deadline as well as a per-read timeout, so a
  server that drips bytes cannot hold a fetch forever.
- Errors say what is wrong without echoing hashes, sizes or local paths.
- Bytes go to a temporary file inside the cache and are renamed to
  `sha256/<hex>` only when the whole file hashes to it. A partial, truncated
  or corrupt download is never visible under its hash.
- A download that breaks off (a reset, a timeout, a 5xx or 429) is retried
  with backoff within its deadline, resuming where it stopped with a Range
  request when the server honours one.
- Downloads stop at `max_bytes`.
- A cached file is hashed again before each use, so a bit flip on disk is a
  mismatch, not a bad model.
- Archives (`.tar`, `.tar.gz`, `.tgz`) unpack to `unpacked/<hex>/`; a member
  that is a link, a device, an absolute path or climbs out with `..` fails
  the whole artifact, so no path inside an artifact escapes the cache.

Blocking I/O: call from a thread (`asyncio.to_thread`), never on an event loop.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

HEX = re.compile(r"^[0-9a-f]{64}$")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
CHUNK = 1 << 20


class ArtifactError(Exception):
    """A bad artifact: the message says what is wrong and never names a local path."""


class _Transient(ArtifactError):
    """A failure worth another try: a reset, a timeout, a 5xx or 429."""


Progress = Callable[[int, "int | None"], None]
RETRIES = 4
RETRY_BASE_S, RETRY_MAX_S = 0.5, 8.0


def check_sha256(value: str) -> str:
    value = value.strip().lower()
    if not HEX.match(value):
        raise ArtifactError("sha256 must be 64 hex digits")
    return value


@dataclass(frozen=True)
class FetchPolicy:
    """Where artifacts may come from, and how long a download may take."""

    schemes: tuple[str, ...] = ("https",)  # network schemes: https, http
    file_roots: tuple[Path, ...] = ()  # file:// only below one of these
    deadline_s: float = 600.0

    @classmethod
    def of(cls, settings: Any) -> FetchPolicy:
        """From the artifact_schemes, artifact_file_roots and artifact_deadline_s of an
        agent's fleet settings or the control plane's settings."""
        roots = tuple(Path(p).resolve() for p in settings.artifact_file_roots)
        return cls(tuple(settings.artifact_schemes), roots, settings.artifact_deadline_s)


ANYWHERE = FetchPolicy(("https", "http"), (Path("/"),))  # tests and local tools only


def check_uri(uri: str, policy: FetchPolicy) -> str:
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        path = Path(urllib.parse.unquote(parsed.path)).resolve()
        if not any(path.is_relative_to(root) for root in policy.file_roots):
            raise ArtifactError(
                "file:// artifacts are allowed only under the configured artifact_file_roots"
            )
        return uri
    if parsed.scheme not in ("http", "https") or parsed.scheme not in policy.schemes:
        allowed = ", ".join(policy.schemes) + (", file" if policy.file_roots else "")
        raise ArtifactError(f"artifact URI scheme {parsed.scheme!r} is not allowed ({allowed})")
    return uri


class _SameScheme(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        if urllib.parse.urlparse(newurl).scheme != urllib.parse.urlparse(req.full_url).scheme:
            raise ArtifactError("the artifact URL redirects to another scheme")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameScheme)


def is_archive(uri: str) -> bool:
    return urllib.parse.urlparse(uri).path.endswith(ARCHIVE_SUFFIXES)


class ArtifactCache:
    def __init__(
        self, root: Path, max_bytes: int, policy: FetchPolicy, timeout_s: float = 60.0
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.policy = policy
        self.timeout_s = timeout_s
        for sub in ("sha256", "unpacked", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)

    def fetch(self, uri: str, sha256: str, progress: Progress | None = None) -> Path:
        """The verified artifact: a file (a single model) or a directory (an unpacked
        archive). Raises ArtifactError naming what is wrong. `progress(bytes, total)`
        is called as a download advances (total None when the server does not say)."""
        sha256 = check_sha256(sha256)
        check_uri(uri, self.policy)
        blob = self.root / "sha256" / sha256
        if blob.is_file() and sha256_of(blob) == sha256:
            os.utime(blob)  # recently used: pruned last
        else:
            blob.unlink(missing_ok=True)
            self._download(uri, sha256, blob, progress)
        if not is_archive(uri):
            return blob
        unpacked = self.root / "unpacked" / sha256
        if not unpacked.is_dir():
            staging = Path(tempfile.mkdtemp(dir=self.root / "tmp"))
            try:
                safe_extract(blob, staging, self.max_bytes)
                os.replace(staging, unpacked)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return unpacked

    def _download(self, uri: str, sha256: str, dest: Path, progress: Progress | None) -> None:
        """Into a partial file, resumed with a Range request after a transient failure
        (a reset, a timeout, a 5xx or 429), up to `RETRIES` times with backoff within
        the deadline; renamed to `dest` only when the whole file hashes to `sha256`."""
        deadline = time.monotonic() + self.policy.deadline_s
        fd, tmp_name = tempfile.mkstemp(dir=self.root / "tmp", suffix=".part")
        os.close(fd)
        part = Path(tmp_name)
        try:
            for attempt in range(1, RETRIES + 1):
                try:
                    self._attempt(uri, part, deadline, progress)
                    break
                except _Transient as exc:
                    wait = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (attempt - 1))
                    if attempt == RETRIES or time.monotonic() + wait > deadline:
                        raise ArtifactError(str(exc)) from None
                    time.sleep(wait)
            if sha256_of(part) != sha256:
                raise ArtifactError(
                    "sha256 mismatch: the artifact is not the one the catalog names"
                )
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)

    def _attempt(self, uri: str, part: Path, deadline: float, progress: Progress | None) -> None:
        have = part.stat().st_size
        with self._open(uri, have) as src:
            status = getattr(src, "status", 200)
            if have and status != 206:  # the server ignored the Range: start again
                have = 0
            headers = getattr(src, "headers", None)
            declared = headers.get("Content-Length", "") if headers is not None else ""
            total = have + int(declared) if declared.isdigit() else None
            if total is not None and total > self.max_bytes:
                raise ArtifactError(f"artifact is larger than the cap of {self.max_bytes} bytes")
            read = getattr(src, "read1", src.read)  # returns after one receive
            size = have
            with part.open("ab" if have else "wb") as out:
                while chunk := self._read(read):
                    if time.monotonic() > deadline:
                        raise ArtifactError(
                            f"the download took longer than {self.policy.deadline_s:g} s"
                        )
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ArtifactError(
                            f"artifact is larger than the cap of {self.max_bytes} bytes"
                        )
                    out.write(chunk)
                    if progress is not None:
                        progress(size, total)
            if total is not None and size != total:
                raise _Transient("the download broke off before its end")

    @staticmethod
    def _read(read) -> bytes:  # type: ignore[no-untyped-def]
        try:
            return bytes(read(CHUNK))
        except (OSError, ValueError, http.client.HTTPException) as exc:  # reset, timeout, short
            kind = "timed out" if isinstance(exc, TimeoutError) else type(exc).__name__
            raise _Transient(f"the download broke off ({kind})") from None

    def prune(self, budget: int | None, keep: set[str]) -> list[str]:
        """Drop cached artifacts, least recently used first, until the cache holds at
        most `budget` bytes; never one in `keep` (what the desired state names).
        Returns the sha256 of what was dropped."""
        if budget is None:
            return []
        blobs = [(p.stat().st_mtime, p) for p in (self.root / "sha256").iterdir() if p.is_file()]
        total = sum(p.stat().st_size for _, p in blobs)
        dropped = []
        for _, blob in sorted(blobs):
            if total <= budget:
                break
            if blob.name in keep:
                continue
            total -= blob.stat().st_size
            blob.unlink(missing_ok=True)
            shutil.rmtree(self.root / "unpacked" / blob.name, ignore_errors=True)
            dropped.append(blob.name)
        return dropped

    def _open(self, uri: str, offset: int = 0):  # type: ignore[no-untyped-def]
        parsed = urllib.parse.urlparse(uri)
        if parsed.scheme == "file":
            path = Path(urllib.parse.unquote(parsed.path))
            try:
                src = path.open("rb")
            except OSError as exc:
                raise ArtifactError(f"cannot read artifact: {exc.strerror}") from None
            src.seek(offset)
            src.status = 206 if offset else 200  # type: ignore[attr-defined]
            return src
        timeout = min(self.timeout_s, self.policy.deadline_s)
        request = urllib.request.Request(
            uri, headers={"Range": f"bytes={offset}-"} if offset else {}
        )
        try:
            return _OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as exc:
            if exc.code in (429, 500, 502, 503, 504, 416):
                raise _Transient(f"cannot download artifact: HTTP {exc.code}") from None
            raise ArtifactError(f"cannot download artifact: {exc.code}") from None
        except OSError as exc:  # refused, reset, DNS, timed out
            reason = getattr(exc, "reason", None) or exc
            raise _Transient(f"cannot download artifact: {reason}") from None


def log_progress(logger: Any, what: str, step: float = 0.25, min_bytes: int = 64 << 20) -> Progress:
    """A `progress` for a daemon: one log line each `step` of a download of at least
    `min_bytes` (a quarter, by default), so a long fetch shows it is moving."""
    shown = [0.0]

    def report(done: int, total: int | None) -> None:
        if total is None or total < min_bytes:
            return
        share = done / total
        if share >= shown[0] + step or done == total:
            shown[0] = share
            logger.info("%s: downloaded %d of %d MiB (%.0f%%)", what, done >> 20, total >> 20,
                        100 * share)  # fmt: skip

    return report


def safe_extract(archive: Path, dest: Path, max_bytes: int) -> None:
    """Unpack a tar archive into `dest`, refusing anything that could leave it."""
    total = 0
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
            for member in members:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts:
                    raise ArtifactError(f"archive member {member.name!r} escapes the artifact")
                if not (member.isfile() or member.isdir()):
                    raise ArtifactError(f"archive member {member.name!r} is not a plain file")
                total += member.size
                if total > max_bytes:
                    raise ArtifactError(f"archive unpacks to more than {max_bytes} bytes")
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as exc:
        raise ArtifactError(f"not a valid tar archive: {exc}") from None


def model_file(artifact: Path) -> Path:
    """The ONNX file of a fetched artifact (a file, or model.onnx in an archive)."""
    if artifact.is_file():
        return artifact
    candidate = artifact / "model.onnx"
    if not candidate.is_file():
        raise ArtifactError("archive has no model.onnx at its top level")
    return candidate


def probe_onnx(path: Path, timeout_s: float = 120.0) -> dict[str, int]:
    """Open the model with ONNX Runtime in a child process (a malformed file cannot
    crash the caller) and return {"inputs": n, "outputs": n}. Raises ArtifactError."""
    code = "from edgeplex.artifacts import _probe_main; _probe_main()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(path)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise ArtifactError("ONNX Runtime did not open the model in time") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        reason = lines[-1] if lines else f"exit status {done.returncode}"
        raise ArtifactError(f"not a loadable ONNX model: {_scrub(reason, path)}")
    result: dict[str, int] = json.loads(done.stdout)
    return result


def _probe_main() -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        print(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"inputs": len(session.get_inputs()), "outputs": len(session.get_outputs())}))


def _scrub(text: str, path: Path) -> str:
    return text.replace(str(path), "<artifact>").replace(str(path.parent), "<cache>")


def sha256_of(path: Path) -> str:
    """sha256 of a local file, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_bytes(artifact: Path) -> int:
    """Bytes of a fetched artifact: the file, or every file of an unpacked archive."""
    if artifact.is_file():
        return artifact.stat().st_size
    return sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
