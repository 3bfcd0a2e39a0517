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
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from google.protobuf.message import DecodeError

from edgeplex.proto import edgeplex_control_pb2 as pb

DESIRED, ROUTES, ROLLOVER = "desired", "routes", "key-rollover"
# A reply to AgentService.LookupModel: fresh per call, bound to it by a nonce
# (opened with ordered=False: it has no place in the version order).
CATALOG_ENTRY = "catalog-entry"
MAX_MESSAGE_BYTES = 16 << 20


class Rejected(Exception):
    """A control message that must not be used; `reason` labels the counter."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


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
        missing; refused when others may read it."""
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if path.stat().st_mode & 0o077:
                raise PermissionError(f"{path} is readable by others; chmod 600 it") from None
            seed = base64.b64decode(path.read_text().strip())
            return cls(Ed25519PrivateKey.from_private_bytes(seed))
        private = Ed25519PrivateKey.generate()
        seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        with os.fdopen(fd, "w") as f:
            f.write(base64.b64encode(seed).decode() + "\n")
        return cls(private)

    def seal(self, kind: str, audience: str, version: int, payload: bytes, ttl_s: float) -> bytes:
        body = pb.SignedBody(
            kind=kind,
            audience=audience,
            version=version,
            expires_at=time.time() + ttl_s,
            payload=payload,
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
    """The keys an agent trusts and the last version it accepted per kind."""

    pin_file: Path | None = None
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)
    last: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    @classmethod
    def load(cls, configured: str | None, pin_file: Path | None) -> TrustStore:
        """Trust `configured` (base64 raw public key) if given, else the pinned key."""
        store = cls(pin_file)
        text = configured or (
            pin_file.read_text().strip() if pin_file and pin_file.exists() else ""
        )
        if text:
            store._trust(base64.b64decode(text))
        return store

    def _trust(self, public: bytes) -> str:
        if len(public) != 32:
            raise Rejected("bad_key", f"an Ed25519 public key has 32 bytes, not {len(public)}")
        self.keys = {key_id(public): Ed25519PublicKey.from_public_bytes(public)}
        return key_id(public)

    def _save(self, public: bytes) -> None:
        if self.pin_file is not None:
            self.pin_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.pin_file.with_suffix(".tmp")
            tmp.write_text(base64.b64encode(public).decode() + "\n")
            tmp.replace(self.pin_file)

    def pin(self, public: bytes) -> bool:
        """Trust on first use: the key the control plane presented at registration.
        True if it is (now) trusted; False if another key is trusted already."""
        if key_id(public) in self.keys:
            return True
        if self.keys:
            return False
        self._trust(public)
        self._save(public)
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
        if not ordered:
            return Opened(body.version, body.payload)
        last = self.last.get(kind)
        if last is not None and (
            body.version < last[0] or (body.version == last[0] and body.payload != last[1])
        ):
            raise Rejected("stale", f"version {body.version} after {last[0]}")
        self.last[kind] = (body.version, body.payload)
        return Opened(body.version, body.payload)

    def rollover(self, opened: Opened) -> str:
        """Apply a verified KeyRollover: trust its key instead. Returns the new key id."""
        rollover = pb.KeyRollover.FromString(opened.payload)
        new_id = self._trust(rollover.public_key)
        self._save(rollover.public_key)
        return new_id
