"""Signed control messages (edgeplex/signing.py): what an agent accepts, what it
drops and why, key pinning and rollover. Pure: no broker, no processes."""

from __future__ import annotations

import hashlib
import stat
import time
import zlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeplex.proto import edgeplex_control_pb2 as pb
from edgeplex.signing import (
    DESIRED,
    MAX_MESSAGE_BYTES,
    ROLLOVER,
    ROUTES,
    Rejected,
    Signer,
    TrustStore,
    deflate_joined,
    raw_deflate,
    site_audience,
)

SITE = site_audience("s1")


def desired(version: int, site: str = "s1") -> bytes:
    return pb.DesiredState(version=version, site_id=site).SerializeToString()


@pytest.fixture
def signer() -> Signer:
    return Signer(Ed25519PrivateKey.generate())


@pytest.fixture
def store(signer: Signer, tmp_path) -> TrustStore:
    trust = TrustStore(tmp_path / "cp.pub")
    assert trust.pin(signer.public)
    return trust


def reason(store: TrustStore, data: bytes, kind: str = DESIRED, audience: str = SITE) -> str:
    with pytest.raises(Rejected) as err:
        store.open(data, kind, audience)
    return err.value.reason


def test_a_sealed_message_opens(signer, store):
    opened = store.open(signer.seal(DESIRED, SITE, 7, desired(7), 60), DESIRED, SITE)
    assert opened.version == 7
    assert pb.DesiredState.FromString(opened.payload).version == 7


def test_forgeries_are_rejected_with_their_reason(signer, store):
    attacker = Signer(Ed25519PrivateKey.generate())
    assert reason(store, desired(2**64 - 1)) in ("malformed", "unknown_key")  # unsigned
    assert reason(store, b"\xff" * 40) == "malformed"
    assert reason(store, attacker.seal(DESIRED, SITE, 2**64 - 1, desired(9), 60)) == "unknown_key"
    sealed = pb.SignedMessage.FromString(signer.seal(DESIRED, SITE, 3, desired(3), 60))
    sealed.signature = attacker._private.sign(sealed.body)  # right key id, wrong signer
    assert reason(store, sealed.SerializeToString()) == "bad_signature"
    tampered = pb.SignedMessage.FromString(signer.seal(DESIRED, SITE, 3, desired(3), 60))
    tampered.body = tampered.body.replace(b"s1", b"s2")
    assert reason(store, tampered.SerializeToString()) == "bad_signature"
    other_site = signer.seal(DESIRED, site_audience("s2"), 4, desired(4, "s2"), 60)
    assert reason(store, other_site) == "wrong_audience"
    assert reason(store, signer.seal(ROUTES, SITE, 4, b"", 60)) == "wrong_kind"
    expired = signer.seal(DESIRED, SITE, 5, desired(5), -1)
    assert reason(store, expired) == "expired"


def test_replays_and_rollbacks_are_stale_but_a_refresh_is_not(signer, store):
    store.open(signer.seal(DESIRED, SITE, 10, desired(10), 60), DESIRED, SITE)
    assert reason(store, signer.seal(DESIRED, SITE, 9, desired(9), 60)) == "stale"
    assert reason(store, signer.seal(DESIRED, SITE, 10, desired(11), 60)) == "stale"
    refreshed = store.open(signer.seal(DESIRED, SITE, 10, desired(10), 120), DESIRED, SITE)
    assert refreshed.version == 10


def test_trust_on_first_use_then_only_a_signed_rollover(signer, tmp_path):
    pin = tmp_path / "cp.pub"
    store = TrustStore.load(None, pin)
    assert reason(store, signer.seal(DESIRED, SITE, 1, desired(1), 60)) == "unknown_key"
    assert store.pin(signer.public)
    other = Signer(Ed25519PrivateKey.generate())
    assert not store.pin(other.public)  # a different key later is refused
    assert TrustStore.load(None, pin).keys.keys() == store.keys.keys()  # survives a restart
    rollover = pb.KeyRollover(key_id=other.key_id, public_key=other.public).SerializeToString()
    forged = other.seal(ROLLOVER, "fleet", 1, rollover, 60)  # signed by the new key itself
    assert reason(store, forged, ROLLOVER, "fleet") == "unknown_key"
    store.rollover(store.open(signer.seal(ROLLOVER, "fleet", 2, rollover, 60), ROLLOVER, "fleet"))
    assert list(store.keys) == [other.key_id]
    assert store.open(other.seal(DESIRED, SITE, 2, desired(2), 60), DESIRED, SITE).version == 2
    assert reason(store, signer.seal(DESIRED, SITE, 3, desired(3), 60)) == "unknown_key"
    assert TrustStore.load(None, pin).keys.keys() == store.keys.keys()


def test_the_key_file_is_private_and_stable(tmp_path):
    path = tmp_path / "state" / "signing-key"
    first = Signer.from_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Signer.from_file(path).key_id == first.key_id
    path.chmod(0o644)
    with pytest.raises(PermissionError):
        Signer.from_file(path)


def test_a_configured_key_is_trusted_without_pinning(signer, tmp_path):
    import base64

    store = TrustStore.load(base64.b64encode(signer.public).decode(), tmp_path / "x.pub")
    assert store.open(signer.seal(DESIRED, SITE, 1, desired(1), 60), DESIRED, SITE).version == 1
    assert not store.pin(Signer(Ed25519PrivateKey.generate()).public)


def test_lookup_replies_open_out_of_order_but_only_when_asked(signer, store):
    """Catalog entries answer one lookup each (bound by a nonce): they have no place
    in the version order, so they open unordered, and do not move that order."""
    from edgeplex.signing import CATALOG_ENTRY

    first = signer.seal(CATALOG_ENTRY, SITE, 0, b"one", 60)
    second = signer.seal(CATALOG_ENTRY, SITE, 0, b"two", 60)
    assert store.open(second, CATALOG_ENTRY, SITE, ordered=False).payload == b"two"
    assert store.open(first, CATALOG_ENTRY, SITE, ordered=False).payload == b"one"
    assert CATALOG_ENTRY not in store.last
    store.open(first, CATALOG_ENTRY, SITE)
    assert reason(store, second, CATALOG_ENTRY) == "stale"


def test_a_restart_remembers_what_was_accepted_so_replays_stay_rejected(signer, tmp_path):
    pin = tmp_path / "cp.pub"
    store = TrustStore.load(None, pin)
    assert store.pin(signer.public)
    old = signer.seal(DESIRED, SITE, 4, desired(4), 3600)  # captured, still unexpired
    assert store.open(old, DESIRED, SITE).version == 4
    assert store.open(signer.seal(DESIRED, SITE, 5, desired(5), 3600), DESIRED, SITE).version == 5
    restarted = TrustStore.load(None, pin)
    assert reason(restarted, old) == "stale"
    changed = signer.seal(DESIRED, SITE, 5, desired(6), 3600)  # same version, other payload
    assert reason(restarted, changed) == "stale"
    again = signer.seal(DESIRED, SITE, 5, desired(5), 3600)  # a refresh of what it has
    assert restarted.open(again, DESIRED, SITE).version == 5
    assert stat.S_IMODE(pin.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".cp.pub.*"))  # no temporary file left


def test_a_configured_key_does_not_undo_a_completed_rollover(signer, tmp_path):
    import base64

    pin = tmp_path / "cp.pub"
    configured = base64.b64encode(signer.public).decode()
    store = TrustStore.load(configured, pin)
    store.open(signer.seal(DESIRED, SITE, 1, desired(1), 60), DESIRED, SITE)
    other = Signer(Ed25519PrivateKey.generate())
    rollover = pb.KeyRollover(key_id=other.key_id, public_key=other.public).SerializeToString()
    store.rollover(store.open(signer.seal(ROLLOVER, "fleet", 2, rollover, 60), ROLLOVER, "fleet"))
    restarted = TrustStore.load(configured, pin)  # the old key still in the settings
    assert list(restarted.keys) == [other.key_id]
    assert reason(restarted, signer.seal(DESIRED, SITE, 9, desired(9), 60)) == "unknown_key"
    third = Signer(Ed25519PrivateKey.generate())  # a key the operator configures anew wins
    fresh = TrustStore.load(base64.b64encode(third.public).decode(), pin)
    assert list(fresh.keys) == [third.key_id]


def test_an_empty_or_damaged_pin_file_is_refused_not_trusted_anew(tmp_path):
    pin = tmp_path / "cp.pub"
    for damaged in ("", "{}", "{not json"):
        pin.write_text(damaged)
        with pytest.raises(ValueError, match="holds no key"):
            TrustStore.load(None, pin)


def big_desired(version: int, models: int = 500) -> bytes:
    state = pb.DesiredState(version=version, site_id="s1")
    for j in range(models):
        uri = f"https://artifacts.example.com/m{j}/1/model.onnx"
        digest = hashlib.sha256(uri.encode()).hexdigest()
        state.models.add(name=f"m{j}", version="1", tier="staged", sha256=digest, artifact_uri=uri)
    return state.SerializeToString()


def test_a_deflated_message_opens_to_what_was_sealed(signer, store):
    payload = big_desired(4)
    sealed = signer.seal(DESIRED, SITE, 4, payload, 60, compress=True)
    body = pb.SignedBody.FromString(pb.SignedMessage.FromString(sealed).body)
    assert body.encoding == "zlib" and len(sealed) * 2 < len(payload)
    assert store.open(sealed, DESIRED, SITE).payload == payload
    # A small payload is sent as it is: deflating it would not pay.
    small = pb.SignedBody.FromString(
        pb.SignedMessage.FromString(signer.seal(DESIRED, SITE, 5, desired(5), 60, True)).body
    )
    assert small.encoding == "" and small.payload == desired(5)


def test_a_head_deflated_before_a_kept_tail_opens_to_both(signer, store):
    """A site's desired state as the publisher seals it: the head (version, tenants)
    deflated anew, the models' deflate kept from before. It opens to head + tail,
    as small as deflating the whole within a few bytes."""
    models = big_desired(0)
    tail = raw_deflate(models)
    for version in (5, 6):
        head = pb.DesiredState(version=version, site_id="s1", tenants_json='[{"name": "t"}]')
        payload = head.SerializeToString() + models
        joined = deflate_joined(head.SerializeToString(), models, tail)
        assert zlib.decompress(joined) == payload
        assert len(joined) <= len(zlib.compress(payload, 6)) + 16
        sealed = signer.seal(DESIRED, SITE, version, payload, 60, True, joined)
        assert store.open(sealed, DESIRED, SITE).payload == payload


def test_the_publisher_deflates_a_tail_once_while_it_stays(signer, store, monkeypatch):
    """A change of a site's head alone (a tenant added) does not deflate its models
    again, nor does a lapse of the leader's lease; a change of its models does."""
    from edgeplex.control_plane import publisher as module

    deflated: list[int] = []

    def counted(data: bytes) -> bytes:
        deflated.append(len(data))
        return raw_deflate(data)

    monkeypatch.setattr(module, "raw_deflate", counted)
    publisher = module.Publisher("mqtt://127.0.0.1:1", "cp", signer, 60)
    topic = "edgeplex/v1/sites/s1/desired"

    def seal(version: int, tenants: str, models: bytes) -> bytes:
        head = pb.DesiredState(version=version, site_id="s1", tenants_json=tenants)
        message = module.Outgoing(DESIRED, SITE, version, head.SerializeToString(), models)
        opened = store.open(publisher._seal(topic, message), DESIRED, SITE).payload
        assert opened == message.payload + models
        return opened

    seal(1, "[]", big_desired(0))
    seal(2, '[{"name": "new"}]', big_desired(0))  # equal bytes, another object
    assert len(deflated) == 1
    seal(3, '[{"name": "new"}]', big_desired(0, models=400))
    assert len(deflated) == 2
    publisher.forget()  # the lease lapsed: its states are sent again once it leads again
    seal(4, '[{"name": "new"}]', big_desired(0, models=400))
    assert len(deflated) == 2


def sealed_with(signer: Signer, payload: bytes, encoding: str) -> bytes:
    """A message signed by the trusted key whose body says `encoding` (as a control
    plane with a bug, or a stolen key, could send)."""
    body = pb.SignedBody(
        kind=DESIRED, audience=SITE, version=9, payload=payload, encoding=encoding,
        expires_at=time.time() + 60,
    ).SerializeToString()  # fmt: skip
    return pb.SignedMessage(
        body=body, key_id=signer.key_id, signature=signer._private.sign(body)
    ).SerializeToString()


def test_a_payload_that_inflates_too_far_or_not_at_all_is_rejected(signer, store):
    bomb = zlib.compress(b"\0" * (MAX_MESSAGE_BYTES + 1), 9)  # 16 KiB that inflate to 16 MiB
    assert len(bomb) < 64 << 10
    assert reason(store, sealed_with(signer, bomb, "zlib")) == "malformed"
    assert reason(store, sealed_with(signer, b"not deflated", "zlib")) == "malformed"
    assert reason(store, sealed_with(signer, zlib.compress(desired(9)), "lz4")) == "malformed"
    assert store.last.get(DESIRED) is None  # nothing rejected counts as accepted
