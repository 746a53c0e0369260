"""Broker-free parts of Kafka security: masked passwords, the dev broker's certificates and config, the access check's
refusals that need no broker (tests/kafka/test_security.py runs the rest against the secured broker)."""

from __future__ import annotations

import socket
import stat
import threading

import pytest

from embedstream import devkafka
from embedstream.config import KafkaSettings
from embedstream.devkafka.layout import layout_for
from embedstream.devkafka.security import AclGrant, SecureFiles, check_mode, prepare, provision, server_overrides
from embedstream.kafka_access import KafkaAccessError, check_kafka_access
from embedstream.masked import MaskedSecret

PASSWORD = "s3cret-value-for-unit-test"


def test_client_kwargs_hand_out_the_password_but_never_show_it():
    kwargs = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
                           sasl_password=PASSWORD).client_kwargs()
    secret = kwargs["sasl_plain_password"]
    assert isinstance(secret, MaskedSecret) and secret == PASSWORD and secret.encode() == PASSWORD.encode()
    assert PASSWORD not in repr(kwargs) and PASSWORD not in "%s" % (kwargs,)
    assert "\0".join(["u", "u", secret]) == f"u\0u\0{PASSWORD}"  # what SASL PLAIN sends


def test_certificates_name_the_loopback_host_chain_to_the_ca_and_are_reused(tmp_path):
    x509 = pytest.importorskip("cryptography.x509")
    files = prepare(layout_for(19000, tmp_path), "127.0.0.1")
    ca = x509.load_pem_x509_certificate(files.ca_file.read_bytes())
    broker = x509.load_pem_x509_certificate(files.keystore.read_bytes())
    broker.verify_directly_issued_by(ca)
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert "127.0.0.1" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert b"PRIVATE KEY" in files.keystore.read_bytes()
    for private in (files.keystore, files.directory / "admin.password"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    again = prepare(layout_for(19000, tmp_path), "127.0.0.1")
    assert again.ca_file.read_bytes() == files.ca_file.read_bytes() and again.admin_password == files.admin_password
    assert files.admin_password not in repr(files)


def test_secured_config_requires_authentication_everywhere(tmp_path):
    files = SecureFiles(tmp_path, tmp_path / "ca.pem", tmp_path / "broker.pem", PASSWORD)
    props = server_overrides("127.0.0.1", 19000, files)
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer") and props["super.users"] == "User:admin"
    assert [k for k, v in props.items() if PASSWORD in v] == [
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config", "listener.name.controller.plain.sasl.jaas.config"]


def test_security_options_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(devkafka.DevKafkaError):
        check_mode("kerberos")
    with pytest.raises(devkafka.DevKafkaError) as plain_users:
        devkafka.start(port=19000, data_dir=tmp_path, users={"u": "p"})
    assert plain_users.value.code == "dev_kafka" and "sasl_ssl" in str(plain_users.value)
    files = SecureFiles(tmp_path, tmp_path / "ca.pem", tmp_path / "broker.pem", PASSWORD)
    for users, grant in (({"u": "p"}, AclGrant("u", "topic", "t", ("raed",))),  # checked before connecting
                         ({"u": "p"}, AclGrant("v", "topic", "t")), ({"admin": "p"}, AclGrant("admin", "topic", "t"))):
        with pytest.raises(devkafka.DevKafkaError):
            provision("127.0.0.1:1", files, users, [grant], timeout_s=1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_access_check_names_an_unreachable_broker_and_a_server_that_is_not_kafka():
    port = _free_port()
    with pytest.raises(KafkaAccessError) as down:
        check_kafka_access(KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"), timeout_s=2)
    assert down.value.code == "kafka_unreachable" and str(port) in down.value.message

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def hang_up() -> None:  # accepts and closes, as a TLS listener does with plaintext bytes
        conn, _ = server.accept()
        conn.recv(1024)
        conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{server.getsockname()[1]}")
        with pytest.raises(KafkaAccessError) as mismatch:
            check_kafka_access(settings, timeout_s=5)
        assert mismatch.value.code == "kafka_protocol_mismatch"
    finally:
        thread.join(5)
        server.close()
