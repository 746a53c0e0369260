"""The secured dev broker: SASL_SSL with SCRAM-SHA-512 on the client listener, TLS from a private CA, ACLs.

What a production cluster asks of clients, on one local node, so the clients' security settings are
tested against a broker that refuses them when they are wrong:

* client listener ``SASL_SSL``, mechanism ``SCRAM-SHA-512``; the broker certificate is signed by a CA
  made for this data dir (``security/ca.pem`` is what clients pass as ``ssl_cafile``);
* the controller listener (loopback, port+1) is ``SASL_PLAINTEXT`` with ``PLAIN`` for the admin only
  (KRaft cannot use SCRAM there: the credentials live in the metadata the controller serves), so the
  super user is not granted to anonymous connections;
* ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a user may do only what an
  :class:`AclGrant` allows; the admin (``ADMIN_USER``) is the super user.

The admin's password is generated once per data dir (``security/admin.password``, 0600) and added at
storage-format time; other users are created (or their passwords changed) and ACLs granted through the
admin API on every start, so they can change between starts.
"""

from __future__ import annotations

import dataclasses
import secrets
import ssl
import time
from pathlib import Path
from typing import Literal, Mapping, Sequence

from embedstream.config import KafkaSettings
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import Layout, write_text
from embedstream.devkafka.tls import ensure_certificates
from embedstream.kafka_access import KafkaAccessError, check_kafka_access

PLAINTEXT = "plaintext"
SASL_SSL = "sasl_ssl"
SECURITY_MODES = (PLAINTEXT, SASL_SSL)
SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
PROVISION_TIMEOUT_S = 60.0

Resource = Literal["topic", "group", "cluster", "transactional_id"]


@dataclasses.dataclass(frozen=True)
class AclGrant:
    """Allow ``user`` the ``operations`` on one resource: a topic or consumer group by exact name, or
    every name starting with ``name`` when ``prefixed``.

    E.g. a bulk producer: ``AclGrant("producer", "topic", "embedstream.chunks.", ("write", "describe"),
    prefixed=True)``; a worker's group: ``AclGrant("worker", "group", "embedstream-embed-", ("read",),
    prefixed=True)``.
    """

    user: str
    resource: Resource
    name: str
    operations: tuple[str, ...] = ("read", "write", "describe")
    prefixed: bool = False


@dataclasses.dataclass(frozen=True)
class SecureFiles:
    """A secured data dir's CA, broker key store and admin credential."""

    directory: Path
    ca_file: Path
    keystore: Path
    admin_password: str = dataclasses.field(repr=False)

    @property
    def admin_env(self) -> Path:
        """``EMBEDSTREAM_KAFKA__*`` lines for the admin (``set -a; . admin.env``), 0600."""
        return self.directory / "admin.env"


def check_mode(security: str) -> str:
    mode = security.lower()
    if mode not in SECURITY_MODES:
        raise DevKafkaError(f"unknown security mode {security!r}; use one of {', '.join(SECURITY_MODES)}")
    return mode


def security_dir(layout: Layout) -> Path:
    return layout.root / "security"


def prepare(layout: Layout, host: str) -> SecureFiles:
    """Certificates and the admin password for a secured broker, made once per data dir."""
    directory = security_dir(layout)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_file, keystore = ensure_certificates(directory, host)
    password_file = directory / "admin.password"
    if not password_file.is_file():
        write_text(password_file, secrets.token_urlsafe(24) + "\n", private=True)
    return SecureFiles(directory, ca_file, keystore, password_file.read_text().strip())


def _jaas(module: str, user: str, password: str, **extra: str) -> str:
    fields = " ".join([f'username="{user}"', f'password="{password}"', *(f'{k}="{v}"' for k, v in extra.items())])
    return f"{module} required {fields};"


def server_overrides(host: str, port: int, files: SecureFiles) -> dict[str, str]:
    """server.properties entries that turn the plain single node into the secured one."""
    controller_port = port + 1
    password = files.admin_password
    return {
        "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"SASL_SSL://{host}:{port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": _jaas(
            "org.apache.kafka.common.security.scram.ScramLoginModule", ADMIN_USER, password
        ),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            "org.apache.kafka.common.security.plain.PlainLoginModule", ADMIN_USER, password,
            **{f"user_{ADMIN_USER}": password},
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_file),
        "ssl.client.auth": "none",
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN_USER}",
        "allow.everyone.if.no.acl.found": "false",
    }


def format_args(files: SecureFiles) -> list[str]:
    """The storage tool's ``--add-scram`` for the admin: the broker authenticates as it from the first start."""
    return ["--add-scram", f"{SCRAM_MECHANISM}=[name={ADMIN_USER},password={files.admin_password}]"]


def tls_context(ca_file: Path) -> ssl.SSLContext:
    """A client TLS context trusting only the data dir's CA (the wire probe uses it)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    context.check_hostname = True
    return context


def client_settings(bootstrap: str, files: SecureFiles, user: str, password: str) -> dict:
    """``KafkaSettings`` fields for one user of this broker (``KafkaSettings(**client_settings(...))``)."""
    return {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": SCRAM_MECHANISM,
        "sasl_username": user,
        "sasl_password": password,
        "ssl_cafile": str(files.ca_file),
    }


def write_admin_env(bootstrap: str, files: SecureFiles) -> None:
    """The admin's settings as ``EMBEDSTREAM_KAFKA__*`` lines, for ``set -a; . security/admin.env``."""
    settings = client_settings(bootstrap, files, ADMIN_USER, files.admin_password)
    text = "".join(f"EMBEDSTREAM_KAFKA__{key.upper()}={value}\n" for key, value in settings.items())
    write_text(files.admin_env, text, private=True)


def provision(
    bootstrap: str,
    files: SecureFiles,
    users: Mapping[str, str],
    grants: Sequence[AclGrant],
    timeout_s: float = PROVISION_TIMEOUT_S,
) -> None:
    """Create or update the SCRAM users and add the ACL grants (both idempotent), as the admin.

    Returns once every user can authenticate, so a test that starts the broker can connect at once.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient, ResourcePatternType,
                                       ResourceType, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

    resource_types = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER,
                      "transactional_id": ResourceType.TRANSACTIONAL_ID}
    if ADMIN_USER in users:
        raise DevKafkaError(f"{ADMIN_USER!r} is the broker's own super user; pick another user name")
    for grant in grants:
        if grant.user not in users:
            raise DevKafkaError(f"ACL grant for unknown user {grant.user!r}; add it to users")
        unknown = [op for op in grant.operations if op.upper() not in AclOperation.__members__]
        if unknown or grant.resource not in resource_types:
            raise DevKafkaError(f"ACL grant {grant}: unknown resource type or operation(s) {unknown}")
    admin_settings = KafkaSettings(**client_settings(bootstrap, files, ADMIN_USER, files.admin_password))
    _wait_authenticates(admin_settings, timeout_s)
    admin = AdminClient(admin_settings.librdkafka_config(**{"client.id": "embedstream-devkafka"}))
    mechanism = ScramMechanism[SCRAM_MECHANISM.replace("-", "_")]
    upserts = [UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, 4096), password.encode())
               for user, password in users.items()]
    acls = [AclBinding(resource_types[grant.resource], "kafka-cluster" if grant.resource == "cluster" else grant.name,
                       ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
                       f"User:{grant.user}", "*", AclOperation[op.upper()], AclPermissionType.ALLOW)
            for grant in grants for op in grant.operations]
    for what, futures in (("creating SCRAM users", admin.alter_user_scram_credentials(upserts, request_timeout=timeout_s)
                           if upserts else {}),
                          ("granting ACLs", admin.create_acls(acls, request_timeout=timeout_s) if acls else {})):
        failed = {}
        for key, future in futures.items():
            try:
                future.result(timeout_s)
            except KafkaException as exc:
                failed[str(key)] = str(exc.args[0])
        if failed:
            raise DevKafkaError(f"{what} failed: {failed}")
    for user, password in users.items():
        settings = KafkaSettings(**client_settings(bootstrap, files, user, password))
        _wait_authenticates(settings, timeout_s)


def _wait_authenticates(settings: KafkaSettings, timeout_s: float) -> None:
    """A new SCRAM credential reaches the broker's cache a moment after the controller accepted it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_kafka_access(settings, timeout_s=min(10.0, timeout_s))
            return
        except KafkaAccessError as exc:
            if time.monotonic() >= deadline:
                raise DevKafkaError(
                    f"user {settings.sasl_username!r} cannot use the secured broker: {exc}"
                ) from exc
            time.sleep(0.2)
