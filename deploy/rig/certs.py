"""A private CA and server certificates for a rig (the compose rig runs with TLS
everywhere): one CA, and per server a key and a certificate naming its addresses.

    python -m edgeplex.rig.certs DIR --server cp=172.28.0.20,127.0.0.1 --server broker=172.28.0.11

writes the CA to DIR/ca (its key stays there and goes in no container), its
certificate alone to DIR/trust/ca.pem (what clients mount), and per server
DIR/<name>/{ca.pem,cert.pem,key.pem} (keys 0600). What exists is kept, so the
rig's certificates survive a rerun.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key_file, cert_file = directory / "ca-key.pem", directory / "ca.pem"
    if key_file.exists() and cert_file.exists():
        key = serialization.load_pem_private_key(key_file.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key, x509.load_pem_x509_certificate(cert_file.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgeplex rig CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write(key_file, _key_pem(key), 0o600)
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    trust = directory.parent / "trust"
    trust.mkdir(exist_ok=True)
    _write(trust / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return key, cert


def issue(root: Path, name: str, addresses: list[str]) -> Path:
    """DIR/<name>/ with the CA's certificate and a server key and certificate for
    `addresses` (IP addresses or DNS names); kept if it exists already."""
    ca_key, ca_cert = _load_ca(root / "ca")
    directory = root / name
    if (directory / "cert.pem").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for address in addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError:
            names.append(x509.DNSName(address))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(directory / "key.pem", _key_pem(key), 0o600)
    _write(directory / "cert.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(directory / "ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m edgeplex.rig.certs")
    parser.add_argument("dir", type=Path)
    parser.add_argument("--server", action="append", default=[], help="NAME=ADDRESS[,ADDRESS...]")
    args = parser.parse_args()
    for spec in args.server:
        name, _, addresses = spec.partition("=")
        issue(args.dir, name, addresses.split(","))


if __name__ == "__main__":
    main()
