"""The clients' security settings against a broker that requires them: SASL_SSL (SCRAM-SHA-512), TLS, ACLs.

One secured dev broker for the module (``devkafka.start(security="sasl_ssl")``) on the port pair
above this run's plain broker. Users: ``worker`` may do anything on topics and groups starting with
``tsec``; ``chunks`` is granted per test, on one test's chunk topics only.
"""

from __future__ import annotations

import logging
import shutil
import stat
import uuid

import pytest
from prometheus_client import generate_latest
import ports
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from embedstream import devkafka, logs
from embedstream.config import KafkaSettings
from embedstream.devkafka.security import AclGrant
from embedstream.kafka_access import KafkaAccessError, check_kafka_access
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode

from worker_rig import RunningWorker

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(shutil.which("java") is None, reason="java not installed"),
]

WORKER_PASSWORD = f"worker-{uuid.uuid4().hex}"  # unique, so finding it in any output means a leak
CHUNKS_PASSWORD = f"chunks-{uuid.uuid4().hex}"
USERS = {"worker": WORKER_PASSWORD, "chunks": CHUNKS_PASSWORD}
WORKER_GRANTS = (
    AclGrant("worker", "topic", "tsec", ("all",), prefixed=True),
    AclGrant("worker", "group", "tsec", ("all",), prefixed=True),
)


def _bindable(port: int) -> bool:
    return devkafka.port_free("127.0.0.1", port)


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory):
    """The secured broker: 4 ports above EMBEDSTREAM_TEST_KAFKA_PORT (the plain one and test_devkafka's below)."""
    base = ports.port(ports.SECURED_BROKER)
    port = next((p for p in range(base, base + 40, 2) if _bindable(p) and _bindable(p + 1)), None)
    if port is None:
        pytest.skip(f"no free port pair from {base}")
    data_dir = tmp_path_factory.mktemp("kafka-secure")
    info = devkafka.start(port=port, data_dir=data_dir, security="sasl_ssl", users=USERS, grants=WORKER_GRANTS)
    yield info
    devkafka.stop(port=port, data_dir=data_dir)


def _secured(info, user: str, password: str, **extra) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=info.bootstrap, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_username=user, sasl_password=password, ssl_cafile=str(info.ca_file), **extra,
    )


def _worker_settings(info, name: str):
    """isolated_settings (topics and groups of this test only, all starting with 'tsec') as user worker."""
    settings = isolated_settings(info.bootstrap, f"sec{name}")
    secure = _secured(info, "worker", WORKER_PASSWORD).model_dump(
        include={"security_protocol", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile"}
    )
    settings.kafka = settings.kafka.model_copy(update=secure)
    return settings


def test_secured_broker_files_are_private_and_status_reports_it(secure_broker):
    info = secure_broker
    assert info.security == "sasl_ssl" and info.ca_file.is_file()
    for secret_file in (info.data_dir / "server.properties", info.admin_env,
                        info.data_dir / "security" / "broker.pem", info.data_dir / "security" / "admin.password"):
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600, secret_file
    state = devkafka.status(port=info.port, data_dir=info.data_dir)
    assert state["answering"] and state["security"] == "sasl_ssl" and state["ca_file"] == str(info.ca_file)
    admin = dict(line.split("=", 1) for line in info.admin_env.read_text().splitlines())
    assert admin["EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL"] == "SASL_SSL"
    check_kafka_access(KafkaSettings(**{k.removeprefix("EMBEDSTREAM_KAFKA__").lower(): v for k, v in admin.items()}))


def test_worker_with_credentials_embeds_and_replies_and_no_secret_is_written(
    secure_broker, minilm_engine, capfd, caplog
):
    """The embed worker end to end as user ``worker``, with every log line (kafka-python's DEBUG ones too)
    captured: the password appears in no log line, repr, metric or dead letter."""
    settings = _worker_settings(secure_broker, "e2e")
    caplog.set_level(logging.DEBUG)
    logs.configure(json=True, level="DEBUG")
    kafka_loggers = {logging.getLogger(n): logging.getLogger(n).level
                     for n in list(logging.root.manager.loggerDict) if n.startswith("kafka")}
    for logger in kafka_loggers:  # the SASL exchange and connection lines too (logs.configure holds them at WARNING)
        logger.setLevel(logging.DEBUG)
    try:
        check_kafka_access(settings.kafka, timeout_s=10)
        ensure_topics(settings.kafka, partitions=2)
        store = memory_store()
        with ChunkPublisher(settings.kafka, lane="bulk") as pub:
            for i in range(6):
                pub.publish_chunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"secured chunk number {i} about files"))
        producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
        producer.send(settings.kafka.topic_chunks_bulk, key=b"bad", value=b"{not json")
        producer.flush()
        producer.close()
        collection = settings.qdrant.collection
        with RunningWorker(settings, minilm_engine, store) as worker:
            wait_for(lambda: store.collection_exists(collection) and store.count(collection) == 6, 120, "6 points")
            with QueryClient(settings.kafka) as client:
                reply = client.embed("how do I open a file?", timeout_s=30)
            assert reply.error is None and reply.dims == 384
            letters = read_dead_letters(settings, 1)
            metrics = generate_latest(worker.metrics.registry).decode()
    finally:
        for logger, level in kafka_loggers.items():
            logger.setLevel(level)
        logs.configure(json=True, level="INFO")
    assert [letter.error.code for letter in letters] == ["malformed_json"]
    captured = capfd.readouterr()
    written = "\n".join([
        captured.out, captured.err, caplog.text,
        *(repr(r.args) for r in caplog.records),
        repr(settings), settings.model_dump_json(), str(settings.kafka.model_dump()),
        *(letter.model_dump_json() for letter in letters),
        metrics,
    ])
    assert "Authenticated as worker" in written  # the captured stream did see the SASL logins
    assert WORKER_PASSWORD not in written
    broker_logs = "\n".join(
        p.read_text(errors="replace") for p in secure_broker.data_dir.glob("*") if p.suffix in (".log", ".out")
    )
    assert WORKER_PASSWORD not in broker_logs and CHUNKS_PASSWORD not in broker_logs
    admin_password = (secure_broker.data_dir / "security" / "admin.password").read_text().strip()
    assert admin_password not in written and admin_password not in broker_logs


def test_wrong_password_fails_fast_with_the_brokers_reason(secure_broker):
    """kafka-python alone retries a refused login until its bootstrap timeout (30 s) and then reports
    'Unable to bootstrap'; the access check answers at once with what the broker said."""
    wrong = f"wrong-{uuid.uuid4().hex}"
    with pytest.raises(KafkaAccessError) as refused:
        check_kafka_access(_secured(secure_broker, "worker", wrong), timeout_s=20)
    assert refused.value.code == "kafka_auth_failed"
    assert "'worker'" in refused.value.message and "invalid credentials" in refused.value.message
    assert wrong not in refused.value.message and wrong not in repr(refused.value)
    with pytest.raises(KafkaAccessError) as unknown:
        check_kafka_access(_secured(secure_broker, "nobody", WORKER_PASSWORD), timeout_s=20)
    assert unknown.value.code == "kafka_auth_failed"


def test_unauthenticated_and_untrusting_clients_are_refused(secure_broker):
    info = secure_broker
    plain = KafkaSettings(bootstrap_servers=info.bootstrap)
    with pytest.raises(KafkaAccessError) as mismatch:
        check_kafka_access(plain, timeout_s=10)
    assert mismatch.value.code == "kafka_protocol_mismatch"
    with pytest.raises(KafkaError):  # kafka-python's own client never gets a connection either
        KafkaProducer(**plain.client_kwargs(), bootstrap_timeout_ms=2000).close()
    no_ca = _secured(info, "worker", WORKER_PASSWORD).model_copy(update={"ssl_cafile": None})
    with pytest.raises(KafkaAccessError) as untrusted:
        check_kafka_access(no_ca, timeout_s=10)
    assert untrusted.value.code == "kafka_tls_failed"


def test_a_principal_allowed_only_the_chunk_topics_cannot_read_replies(secure_broker):
    info = secure_broker
    settings = _worker_settings(info, "acl")
    ensure_topics(settings.kafka, partitions=1)
    k = settings.kafka
    chunk_prefix = k.topic_chunks_online.rsplit(".", 1)[0] + "."  # this test's <p>.chunks.
    group = f"{k.group_online}-chunks-reader"
    # start() on the running broker only adds users and grants: the ACLs of this test's chunk topics
    devkafka.start(port=info.port, data_dir=info.data_dir, security="sasl_ssl", users=USERS, grants=[
        AclGrant("chunks", "topic", chunk_prefix, ("read", "describe"), prefixed=True),
        AclGrant("chunks", "group", group, ("read",)),
    ])
    producer = KafkaProducer(**k.client_kwargs(), acks="all")
    producer.send(k.topic_chunks_online, key=b"d", value=encode(ChunkEvent(doc_id="d", chunk_id=0, text="t")))
    producer.send(k.topic_replies, key=b"r", value=b"a reply")
    producer.flush()
    producer.close()
    reader = _secured(info, "chunks", CHUNKS_PASSWORD)

    chunks = KafkaConsumer(k.topic_chunks_online, **reader.client_kwargs(), group_id=group,
                           auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        seen = []
        wait_for(lambda: seen.extend(r for rs in chunks.poll(timeout_ms=500).values() for r in rs) or seen,
                 30, "the chunk record, read as user chunks")
        assert seen[0].key == b"d"
    finally:
        chunks.close()

    # The refusal, named at start-up: kafka-python's consumer itself would poll nothing, silently.
    check_kafka_access(reader, topics=[k.topic_chunks_online])
    with pytest.raises(KafkaAccessError) as denied:
        check_kafka_access(reader, topics=[k.topic_chunks_online, k.topic_replies])
    assert denied.value.code == "kafka_topic_denied" and k.topic_replies in denied.value.message
    assert k.topic_chunks_online not in denied.value.message
    admin = KafkaAdminClient(**reader.client_kwargs())
    try:
        (described,) = admin.describe_topics([k.topic_replies])
    finally:
        admin.close()
    assert described["error_code"] == TopicAuthorizationFailedError.errno
    with pytest.raises(TopicAuthorizationFailedError):  # nor may it write there
        writer = KafkaProducer(**reader.client_kwargs(), max_block_ms=10_000)
        try:
            writer.send(k.topic_replies, value=b"forged").get(timeout=10)
        finally:
            writer.close()


def test_librdkafka_authenticates_with_the_same_settings(secure_broker):
    """confluent-kafka (librdkafka) as a third-party client: the same user, password and CA file."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    settings = _worker_settings(secure_broker, "rdk")
    k = settings.kafka
    config = {
        "bootstrap.servers": k.bootstrap_servers, "security.protocol": k.security_protocol,
        "sasl.mechanism": k.sasl_mechanism, "sasl.username": k.sasl_username,
        "sasl.password": k.sasl_password.get_secret_value(), "ssl.ca.location": k.ssl_cafile,
    }
    ensure_topics(k, partitions=1)
    delivered = []
    producer = confluent_kafka.Producer(config)
    producer.produce(k.topic_chunks_bulk, key=b"k", value=b"from librdkafka",
                     on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = confluent_kafka.Consumer({**config, "group.id": f"{k.group_bulk}-rdk", "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([k.topic_chunks_bulk])
        got = []

        def received() -> bool:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(message.value())
            return bool(got)

        wait_for(received, 30, "the record back through librdkafka")
        assert got == [b"from librdkafka"]
    finally:
        consumer.close()
    errors = []
    wrong = confluent_kafka.Producer({**config, "sasl.password": "wrong", "error_cb": errors.append})

    def refused() -> bool:
        wrong.poll(0.2)
        return any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors)

    wait_for(refused, 30, "librdkafka's authentication error")


def test_a_worker_the_broker_refuses_fails_at_start_naming_why(secure_broker, minilm_engine):
    """Issue #13: a wrong password, or no right to read one of its topics, stops a worker as it is built, with
    the access check's reason (run_until_signalled is never reached; the command exits non-zero with it)."""
    from pydantic import SecretStr

    from embedstream.workers.runtime import build_embed_worker

    info = secure_broker
    settings = _worker_settings(info, "start")
    ensure_topics(settings.kafka, partitions=1)
    wrong = settings.model_copy(update={"kafka": settings.kafka.model_copy(
        update={"sasl_password": SecretStr(f"wrong-{uuid.uuid4().hex}")})})
    with pytest.raises(KafkaAccessError) as refused:
        build_embed_worker(wrong, ("bulk",), store=memory_store(), engine=minilm_engine)
    assert refused.value.code == "kafka_auth_failed"
    k = settings.kafka
    prefix = k.topic_chunks_online.rsplit(".", 2)[0]  # this test's <p>: chunks, dead letters; not queries
    devkafka.start(port=info.port, data_dir=info.data_dir, security="sasl_ssl", users=USERS, grants=[
        AclGrant("chunks", "topic", f"{prefix}.chunks.", ("read", "describe"), prefixed=True),
        AclGrant("chunks", "topic", k.topic_dead_letters, ("write", "describe")),
    ])
    reader = settings.model_copy(update={"kafka": settings.kafka.model_copy(update={
        "sasl_username": "chunks", "sasl_password": SecretStr(CHUNKS_PASSWORD)})})
    with pytest.raises(KafkaAccessError) as denied:  # the online lane reads the queries topic too
        build_embed_worker(reader, ("online",), store=memory_store(), engine=minilm_engine)
    assert denied.value.code == "kafka_topic_denied" and k.topic_queries in denied.value.message
