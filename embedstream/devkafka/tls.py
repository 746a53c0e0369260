"""Certificates for the secured dev broker: a private CA and a broker certificate for 127.0.0.1/localhost.

Made with ``cryptography`` (no JVM start per ``keytool`` step: the set takes ~10 ms instead of ~5 s on
2 cores), written as PEM because Kafka reads PEM key and trust stores directly
(``ssl.keystore.type=PEM``) and clients (kafka-python, librdkafka) take the CA as a PEM file.
Generated once per data dir and reused while valid, so a client's ``ssl_cafile`` stays good across
restarts.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import write_text

VALID_DAYS = 825  # the longest leaf lifetime TLS clients accept
RENEW_BEFORE = dt.timedelta(days=7)


def _crypto():
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:  # a dev extra: only the secured broker needs it
        raise DevKafkaError(
            "the secured dev broker makes its certificates with 'cryptography' (pip install cryptography)"
        ) from exc
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _still_valid(cert_path: Path) -> bool:
    x509 = _crypto()[0]
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc - RENEW_BEFORE > dt.datetime.now(dt.timezone.utc)


def ensure_certificates(directory: Path, host: str) -> tuple[Path, Path]:
    """(CA certificate PEM, broker key + certificate chain PEM) in directory, made when missing or expiring.

    The broker certificate names ``host``, 127.0.0.1, ::1 and localhost, so clients verify the hostname.
    """
    ca_path, broker_path = directory / "ca.pem", directory / "broker.pem"
    if ca_path.is_file() and broker_path.is_file() and _still_valid(broker_path) and _still_valid(ca_path):
        return ca_path, broker_path
    x509, hashes, serialization, ec, eku, name_oid = _crypto()
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def builder(subject: str, issuer: str, public_key):
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        )

    ca_name = "embedstream dev Kafka CA"
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names: list = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                   x509.IPAddress(ipaddress.ip_address("::1"))]
    try:
        if ipaddress.ip_address(host) not in (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")):
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        if host != "localhost":
            names.append(x509.DNSName(host))
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker_cert = (
        builder("embedstream dev Kafka broker", ca_name, broker_key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([eku.SERVER_AUTH, eku.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    # Kafka's PEM key store reads an unencrypted PKCS#8 key; the file is the owner's alone.
    key_pem = broker_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_text(broker_path, key_pem + broker_cert.public_bytes(pem) + ca_cert.public_bytes(pem), private=True)
    write_text(ca_path, ca_cert.public_bytes(pem))
    return ca_path, broker_path
