"""Shared fixtures: models built once per session, engines loaded once, the local Kafka broker."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One torch thread in the test process and the processes it starts (EMBEDSTREAM_TEST_TORCH_THREADS): on a
# busy 2-vCPU host two OpenMP threads wait on each other at every barrier; a MiniLM pass over 59 texts took
# 2.3-3x the wall time and 2.6x the CPU time at 2 threads (load 21-25). Vectors are the same either way
# (the exactness tests compare at cos >= 0.9999); tests that need threads set them (EngineSettings.threads).
TORCH_THREADS = int(os.environ.get("EMBEDSTREAM_TEST_TORCH_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(TORCH_THREADS))
sys.path.insert(0, str(Path(__file__).parent))

import run_rig  # noqa: E402
import tiny_models  # noqa: E402

from embedstream.config import EngineSettings, ModelConfig  # noqa: E402
from embedstream.engine.engine import Engine  # noqa: E402
from embedstream.engine.model_spec import build_spec  # noqa: E402
from embedstream.engine.runner import set_threads  # noqa: E402

set_threads(TORCH_THREADS)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def minilm_engine() -> Engine:
    return Engine.from_name("all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def tiny_bert_dir(model_dir) -> Path:
    return tiny_models.build_tiny_bert(model_dir / "tiny-bert-cls", pooling="cls")


@pytest.fixture(scope="session")
def tiny_qwen3_dir(model_dir) -> Path:
    return tiny_models.build_tiny_qwen3(model_dir / "tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_ce_dir(model_dir) -> Path:
    return tiny_models.build_tiny_cross_encoder(model_dir / "tiny-ce")


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler set-up, which writes to a stderr the capture hides
def pytest_configure(config):
    """The run's leash (whatever the run starts dies with it, even killed -9) and its evidence files."""
    from embedstream.devkafka import leash

    leash.hold()
    run_rig.Evidence.begin()


def pytest_unconfigure(config):
    run_rig.Evidence.end()


def pytest_runtest_logstart(nodeid):
    run_rig.Evidence.current.started(nodeid)


def pytest_runtest_logreport(report):
    if report.failed or report.when == "call":
        run_rig.Evidence.current.outcome(f"{report.when}:{report.outcome}")


def pytest_runtest_logfinish(nodeid):
    run_rig.Evidence.current.finished(nodeid)


def pytest_terminal_summary(terminalreporter):
    stack = sys.modules.get("stack")  # tests/compose/stack.py, once the compose tests ran
    if stack is not None and getattr(stack, "TIMINGS", None):
        terminalreporter.write_sep("-", "compose stack: seconds per step")
        for name, seconds in stack.TIMINGS.items():
            terminalreporter.write_line(f"{name:55s} {seconds:8.1f}")
    dumps = run_rig.Evidence.current.hang_dumps()
    if dumps:
        terminalreporter.write_sep("-", "stack dumps of tests that ran long (py-spy dump --native)")
        for path in dumps:
            terminalreporter.write_line(str(path))


@pytest.fixture(autouse=True)
def _nothing_left_running():
    """Every test ends with no worker thread, child process or service it started still running."""
    with run_rig.nothing_left_running():
        yield


_FOLDER_MARKS = {"kafka": ("kafka",), "slow": ("slow",), "cdc": ("kafka", "cdc"), "fleet": ("kafka", "fleet"),
                 "compose": ("compose", "slow")}
# Tests outside slow/ that take a minute or more each on a busy 2-vCPU host (--durations, load 19-25): every
# command as its own processes on a fresh broker, or an int8 calibration. Marked slow here, by path, so
# ``-m "not slow"`` is the quick loop; scripts/test.sh runs them all.
_SLOW_PATHS = (
    "kafka/test_quick_starts.py",  # 8 tests, 45-150 s each
    "kafka/test_command_cleanup.py",  # 5 tests, 20-75 s each
    "kafka/test_hybrid_cli.py",  # 68-135 s
    "kafka/test_pretokenized_kafka.py::test_bench_host_smoke",  # 70 s
    "unit/test_openvino_backend.py::test_minilm_openvino_int8_keeps_cosine_on_the_bench_corpus",  # 300-360 s
    "unit/test_openvino_backend.py::test_int8_is_calibrated_once_cached_next_to_the_model_and_reused",  # 72 s
    "unit/test_int8_static.py::test_minilm_static_int8_keeps_cosine_on_the_bench_corpus",  # 117 s at 2 threads
)


def pytest_collection_modifyitems(config, items):
    """A test's folder says what it needs: ``unit/`` no service (some load the offline weights that the
    set-up installs, never a hub), ``kafka/`` the local broker, ``slow/`` time
    (and the broker), ``cdc/`` the CDC rig (PostgreSQL and Kafka Connect with Debezium, and the broker), ``fleet/``
    a 3-broker cluster of its own, ``compose/`` the docker compose stack on a container engine. The folder adds the markers, so ``-m "not kafka"``, ``-m "not slow"``,
    ``-m "not cdc"`` and ``-m "not fleet"`` select by it
    (``_SLOW_PATHS``: the long tests of the other folders are marked slow too)."""
    root = Path(__file__).parent
    for item in items:
        try:
            folder = Path(item.fspath).relative_to(root).parts[0]
        except ValueError:
            continue
        for mark in _FOLDER_MARKS.get(folder, ()):
            item.add_marker(getattr(pytest.mark, mark))
        if item.nodeid.removeprefix("tests/").startswith(_SLOW_PATHS):
            item.add_marker(pytest.mark.slow)


def make_engine(path: Path, name: str = "m", **cfg) -> Engine:
    """An engine over a local folder with registry overrides (kind, pooling, matryoshka_dims, ...)."""
    settings = EngineSettings(**cfg.pop("engine", {}))
    return Engine(build_spec(name, ModelConfig(path=str(path), **cfg)), settings)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory) -> str:
    """One real Apache Kafka broker (KRaft) for the whole test run, on a private port and data dir."""
    from embedstream import devkafka

    port = int(os.environ.get("EMBEDSTREAM_TEST_KAFKA_PORT", "19092"))
    data_dir = tmp_path_factory.mktemp("kafka-data")
    info = devkafka.start(port=port, data_dir=str(data_dir))
    yield info.bootstrap
    devkafka.stop(port=port, data_dir=str(data_dir))


def isolated_settings(bootstrap: str, name: str, versioned_collections: bool = False):
    """Settings whose topics and groups belong to one test only (no cross-test interference).

    Collections are created under their own name unless ``versioned_collections`` (the production
    default: ``docs`` becomes an alias of ``docs_v1``).
    """
    import uuid

    from embedstream.config import KafkaSettings, Settings

    p = f"t{name}-{uuid.uuid4().hex[:6]}"
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        topic_chunks_online=f"{p}.chunks.online",
        topic_chunks_bulk=f"{p}.chunks.bulk",
        topic_queries=f"{p}.queries",
        topic_replies=f"{p}.replies",
        topic_rerank=f"{p}.rerank",
        topic_search=f"{p}.search",
        topic_dead_letters=f"{p}.dlq",
        topic_documents=f"{p}.documents",
        topic_claims=f"{p}.claims",
        group_online=f"{p}-online",
        group_bulk=f"{p}-bulk",
        group_rerank=f"{p}-rerank",
        group_search=f"{p}-search",
    )
    from embedstream.config import QdrantSettings

    return Settings(kafka=kafka, qdrant=QdrantSettings(versioned_collections=versioned_collections))


from embedstream.vectorstore.locked import LockedStore  # noqa: E402 - re-exported for the tests
from cdc_rig import cdc_rig, cdc_table  # noqa: E402,F401 - the CDC rig's fixtures (tests/cdc/)
from cluster_rig import cluster, healed  # noqa: E402,F401 - the 3-broker cluster's fixtures (tests/fleet/)


def memory_store() -> LockedStore:
    from embedstream.vectorstore.factory import open_store

    return LockedStore(open_store(":memory:", None, None))


def wait_for(predicate, timeout_s: float, what: str) -> None:
    """Poll until ``predicate()`` is true; fail naming what never happened."""
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def read_dead_letters(settings, expected: int, timeout_s: float = 30) -> list:
    """Every DeadLetter on the settings' dead-letter topic (reads from the beginning)."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    from embedstream.schemas import DeadLetter
    from embedstream.schemas.codec import decode

    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=10)
    topic = settings.kafka.topic_dead_letters
    consumer.assign([TopicPartition(topic, p) for p in (consumer.partitions_for_topic(topic) or [])])
    consumer.seek_to_beginning()
    letters: list[DeadLetter] = []
    end = time.monotonic() + timeout_s
    while len(letters) < expected and time.monotonic() < end:
        for recs in consumer.poll(timeout_ms=200).values():
            letters += [decode(r.value, DeadLetter) for r in recs]
    consumer.close()
    return letters
