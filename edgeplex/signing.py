"""Signed control messages: the control plane seals, agents open.

Every desired state, routes table and key rollover travels over MQTT as a
`SignedMessage`: an Ed25519 signature over a `SignedBody` that names its kind,
its audience (`site/<id>` or `region/<name>`), a version and an expiry. An
agent opens a message only if the key is one it trusts, the signature holds,
the kind and audience are its own, the message has not expired, and the
version is above the last one it accepted for that kind (the same version with
the same payload is a refresh of the expiry). Anything else is `Rejected`
with a reason the agent counts.

Keys: the control plane keeps its private key in a file it creates with mode
0600. An agent trusts the key it is configured with, or pins the first one
the control plane presents at registration (trust on first use, as ssh does)
and refuses a different one afterwards, except through a `KeyRollover`
signed by the key it trusts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from google.protobuf.message import DecodeError

from edgeplex import durable as crash_safe
from edgeplex.proto import edgeplex_control_pb2 as pb

DESIRED, ROUTES, ROLLOVER = "desired", "routes", "key-rollover"
# A reply to AgentService.LookupModel: fresh per call, bound to it by a nonce
# (opened with ordered=False: it has no place in the version order).
CATALOG_ENTRY = "catalog-entry"
MAX_MESSAGE_BYTES = 16 << 20  # as sent, and as inflated
ZLIB = "zlib"
COMPRESS_ABOVE = 1024  # smaller payloads are sent as they are
LEVEL = 6  # deflate's; level 3 halves the time for about 23% more bytes a message
ZLIB_HEADER = b"\x78\x9c"  # deflate, 32 KiB window, the default level


class Rejected(Exception):
    """A control message that must not be used; `reason` labels the counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _inflated(body: pb.SignedBody) -> bytes:
    """A verified body's payload as it was before sealing: inflated if deflated, at
    most MAX_MESSAGE_BYTES (a small message may not inflate into a huge one)."""
    if not body.encoding:
        return body.payload
    if body.encoding != ZLIB:
        raise Rejected("malformed", f"unknown encoding {body.encoding[:16]!r}")
    inflate = zlib.decompressobj()
    try:
        payload = inflate.decompress(body.payload, MAX_MESSAGE_BYTES)
    except zlib.error as exc:
        raise Rejected("malformed", f"the payload does not inflate: {exc}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise Rejected("malformed", f"the payload inflates beyond {MAX_MESSAGE_BYTES} bytes")
    return payload


def raw_deflate(data: bytes) -> bytes:
    """`data` deflated alone, without zlib's header and checksum: a tail that
    `deflate_joined` puts after a head."""
    deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return deflate.compress(data) + deflate.flush()


def deflate_joined(head: bytes, tail: bytes, tail_deflated: bytes) -> bytes:
    """The zlib stream of `head + tail`, with the tail's `raw_deflate` made before:
    the head is deflated and flushed to a byte boundary with its history dropped
    (Z_FULL_FLUSH), so the tail's blocks follow as they were deflated alone, and
    the checksum covers both. Any inflater reads it as one stream. A site's models
    recur from round to round while its head (version, tenants) changes: this
    deflates them once, not at every change of the head (2 ms a state of 770
    models; the head alone, some 50 us)."""
    deflate = zlib.compressobj(LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    blocks = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    checksum = zlib.adler32(tail, zlib.adler32(head))
    return b"".join((ZLIB_HEADER, blocks, tail_deflated, checksum.to_bytes(4, "big")))


def _b64_key(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise Rejected("bad_key", "a public key is base64 of its 32 raw bytes") from None


def key_id(public: bytes) -> str:
    return hashlib.sha256(public).hexdigest()[:16]


def public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def site_audience(site_id: str) -> str:
    return f"site/{site_id}"


def region_audience(region: str) -> str:
    return f"region/{region}"


# --- the control plane's side ------------------------------------------------------------


class Signer:
    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        self.public = public_bytes(private.public_key())
        self.key_id = key_id(self.public)

    @classmethod
    def from_file(cls, path: Path) -> Signer:
        """The key in `path` (raw 32-byte seed, base64), created with mode 0600 when
        missing (whole or not at all); refused when others may read it or it is empty."""
        crash_safe.sweep_temporary(path.parent, path.name)
        private = Ed25519PrivateKey.generate()
        seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        if crash_safe.create_atomic(path, base64.b64encode(seed) + b"\n", point="signing-key"):
            return cls(private)
        if path.stat().st_mode & 0o077:
            raise PermissionError(f"{path} is readable by others; chmod 600 it")
        text = path.read_text().strip()
        if not text:
            raise ValueError(f"{path} is empty: restore the control plane's key from backup")
        return cls(Ed25519PrivateKey.from_private_bytes(base64.b64decode(text)))

    def seal(
        self,
        kind: str,
        audience: str,
        version: int,
        payload: bytes,
        ttl_s: float,
        compress: bool = False,
        deflated: bytes | None = None,
    ) -> bytes:
        """`payload` signed for `audience`; deflated first with `compress` when that
        makes it smaller (a desired state of a thousand models: about 2.7x).
        `deflated`: the payload deflated already (`deflate_joined`), used instead."""
        encoding = ""
        if compress and len(payload) > COMPRESS_ABOVE:
            if deflated is None:
                deflated = zlib.compress(payload, LEVEL)
            if len(deflated) < len(payload):
                payload, encoding = deflated, ZLIB
        body = pb.SignedBody(
            kind=kind,
            audience=audience,
            version=version,
            expires_at=time.time() + ttl_s,
            payload=payload,
            encoding=encoding,
        ).SerializeToString()
        return pb.SignedMessage(
            body=body, key_id=self.key_id, signature=self._private.sign(body)
        ).SerializeToString()


# --- the agent's side --------------------------------------------------------------------


@dataclass
class Opened:
    version: int
    payload: bytes


@dataclass
class TrustStore:
    """The keys an agent trusts and the last version it accepted per kind, kept in
    `pin_file` (JSON, written atomically with fsync) so that neither a replay of an
    older message nor a configured key can undo them across a restart."""

    pin_file: Path | None = None
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    # kind -> (version, sha256 of its payload) last accepted
    last: dict[str, tuple[int, str]] = field(default_factory=dict)
    retired: list[str] = field(default_factory=list)  # key ids rolled over from

    @classmethod
    def load(cls, configured: str | None, pin_file: Path | None) -> TrustStore:
        """Trust `configured` (base64 raw public key) if given, unless the pin file
        records a completed rollover away from it (then its successor); else the pinned
        key. ValueError for a pin file that exists but holds no key: it is restored or
        deleted by hand, never silently trusted anew."""
        store = cls(pin_file)
        saved = store._read()
        pinned = saved.get("key", "")
        if configured:
            configured_id = key_id(_b64_key(configured))
            if pinned and key_id(_b64_key(pinned)) != configured_id:
                if configured_id in saved.get("retired", []):
                    store._trust(_b64_key(pinned))  # the rollover stands
                else:
                    store._trust(_b64_key(configured))
            else:
                store._trust(_b64_key(configured))
        elif pinned:
            store._trust(_b64_key(pinned))
        store.retired = [str(k) for k in saved.get("retired", [])]
        for kind, (version, digest) in saved.get("last", {}).items():
            store.last[kind] = (int(version), str(digest))
        return store

    def _read(self) -> dict[str, Any]:
        if self.pin_file is None:
            return {}
        crash_safe.sweep_temporary(self.pin_file.parent, self.pin_file.name)
        try:
            text = self.pin_file.read_text().strip()
        except FileNotFoundError:
            return {}
        damaged = ValueError(
            f"{self.pin_file} holds no key: restore it, or delete it to trust the key "
            "the control plane presents at the next registration"
        )
        if not text:
            raise damaged
        if not text.startswith("{"):  # the one-line form of earlier versions
            return {"key": text}
        try:
            saved = json.loads(text)
        except ValueError:
            raise damaged from None
        if not isinstance(saved, dict) or not saved.get("key"):
            raise damaged
        return saved

    def _trust(self, public: bytes) -> str:
        if len(public) != 32:
            raise Rejected("bad_key", f"an Ed25519 public key has 32 bytes, not {len(public)}")
        self.keys = {key_id(public): Ed25519PublicKey.from_public_bytes(public)}
        return key_id(public)

    def _save(self) -> None:
        if self.pin_file is None or not self.keys:
            return
        (key,) = self.keys.values()
        state = {
            "key": base64.b64encode(public_bytes(key)).decode(),
            "retired": self.retired[-16:],
            "last": {kind: list(v) for kind, v in self.last.items()},
        }
        crash_safe.write_atomic(
            self.pin_file, (json.dumps(state) + "\n").encode(), 0o600, point="pin"
        )

    def pin(self, public: bytes) -> bool:
        """Trust on first use: the key the control plane presented at registration.
        True if it is (now) trusted; False if another key is trusted already."""
        if key_id(public) in self.keys:
            return True
        if self.keys:
            return False
        self._trust(public)
        self._save()
        return True

    def open(self, data: bytes, kind: str, audience: str, ordered: bool = True) -> Opened:
        if len(data) > MAX_MESSAGE_BYTES:
            raise Rejected("malformed", f"{len(data)} bytes")
        try:
            message = pb.SignedMessage.FromString(data)
        except DecodeError:
            raise Rejected("malformed", "not a SignedMessage") from None
        key = self.keys.get(message.key_id)
        if key is None:
            raise Rejected("unknown_key", f"key {message.key_id[:16]!r} is not trusted")
        try:
            key.verify(message.signature, message.body)
        except InvalidSignature:
            raise Rejected(
                "bad_signature", f"signature by {message.key_id} does not hold"
            ) from None
        try:
            body = pb.SignedBody.FromString(message.body)
        except DecodeError:
            raise Rejected("malformed", "the signed body is not a SignedBody") from None
        if body.kind != kind:
            raise Rejected("wrong_kind", f"{body.kind!r} on the {kind!r} topic")
        if body.audience != audience:
            raise Rejected("wrong_audience", f"for {body.audience!r}, not {audience!r}")
        if body.expires_at < time.time():
            raise Rejected("expired", f"expired at {body.expires_at:.0f}")
        payload = _inflated(body)
        if not ordered:
            return Opened(body.version, payload)
        last = self.last.get(kind)
        digest = hashlib.sha256(body.payload).hexdigest()
        if last is not None and (
            body.version < last[0] or (body.version == last[0] and digest != last[1])
        ):
            raise Rejected("stale", f"version {body.version} after {last[0]}")
        if last != (body.version, digest):
            self.last[kind] = (body.version, digest)
            self._save()  # before anything acts on it: a restart still knows it
        return Opened(body.version, payload)

    def rollover(self, opened: Opened) -> str:
        """Apply a verified KeyRollover: trust its key instead. Returns the new key id."""
        rollover = pb.KeyRollover.FromString(opened.payload)
        self.retired = [k for k in self.retired if k not in self.keys] + list(self.keys)
        new_id = self._trust(rollover.public_key)
        self._save()
        return new_id
