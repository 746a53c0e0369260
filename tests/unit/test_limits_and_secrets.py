"""Security limits (text bytes, record bytes, candidates) and secrets that never reach a log line."""

from __future__ import annotations

import io
import json
import logging

import pytest
from conftest import make_engine

from embedstream import logs
from embedstream.config import KafkaSettings, QdrantSettings, Settings
from embedstream.engine.engine import EmbedRequest, ScoreRequest
from embedstream.schemas import ChunkEvent, DecodeError, decode, encode


def test_a_text_over_the_byte_limit_is_refused_before_tokenizing_and_the_rest_is_embedded(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, engine={"max_text_bytes": 1000})
    results, _ = engine.embed([EmbedRequest(0, "short text"), EmbedRequest(1, "é " * 400),  # 1200 bytes
                               EmbedRequest(2, "word " * 199)])  # 995 bytes: within the byte limit
    assert results[1].error.code == "text_too_large" and "1200 bytes" in results[1].error.message
    assert results[0].error is None and results[0].vector is not None
    assert results[2].error is None or results[2].error.code != "text_too_large"


def test_a_passage_over_the_byte_limit_is_refused(tiny_ce_dir):
    engine = make_engine(tiny_ce_dir, kind="rerank", engine={"max_text_bytes": 100})
    results, _ = engine.score([ScoreRequest(0, "q", "fine passage"), ScoreRequest(1, "q", "p " * 51)])
    assert results[0].error is None and results[0].score is not None
    assert results[1].error.code == "text_too_large"


def test_a_record_over_the_size_limit_is_refused_without_parsing():
    raw = encode(ChunkEvent(doc_id="d", chunk_id=0, text="t" * 5000))
    assert decode(raw, ChunkEvent, max_bytes=len(raw)).doc_id == "d"
    with pytest.raises(DecodeError) as err:
        decode(raw, ChunkEvent, max_bytes=len(raw) - 1)
    assert err.value.code == "record_too_large"


def test_secrets_never_reach_logs_or_reprs(capsys):
    settings = Settings(
        kafka=KafkaSettings(sasl_mechanism="PLAIN", sasl_username="svc", sasl_password="kafka-hunter2"),
        qdrant=QdrantSettings(url="https://qdrant.example", api_key="qdrant-hunter2"),
    )
    assert "hunter2" not in repr(settings) and "hunter2" not in settings.model_dump_json()
    assert settings.kafka.client_kwargs()["sasl_plain_password"] == "kafka-hunter2"  # still usable by the client
    logs.configure(json=True)
    log = logs.get("test")
    log.info("connecting", api_key="qdrant-hunter2", sasl_password="kafka-hunter2", settings=repr(settings))
    out = capsys.readouterr().err
    line = json.loads(out.strip().splitlines()[-1])
    assert line["api_key"] == "***" and line["sasl_password"] == "***"
    assert "hunter2" not in out


def test_library_logs_take_the_same_road_and_are_redacted_too(capsys):
    """kafka-python and friends log through the standard library: same JSON renderer, same redaction."""
    logs.configure(json=True)
    logging.getLogger("kafka.conn").warning("broker %s unreachable", "127.0.0.1:1",
                                            extra={"sasl_plain_password": "kafka-hunter2"})
    logging.getLogger("kafka.conn").info("connecting")  # library chatter below WARNING stays out
    out = capsys.readouterr().err
    lines = [json.loads(raw) for raw in out.strip().splitlines()]
    assert len(lines) == 1, out
    line = lines[0]
    assert line["event"] == "broker 127.0.0.1:1 unreachable"
    assert line["level"] == "warning" and line["logger"] == "kafka.conn" and "timestamp" in line
    assert line["sasl_plain_password"] == "***" and "hunter2" not in out


def test_configure_twice_writes_each_library_line_once(capsys):
    logs.configure(json=True)
    logs.configure(json=True)
    logging.getLogger("embedstream.test").error("once")
    assert [json.loads(raw)["event"] for raw in capsys.readouterr().err.strip().splitlines()] == ["once"]


def test_our_loggers_name_themselves_like_library_records(capsys):
    logs.configure(json=True)
    logs.get("embedstream.publisher").warning("flush slow", topic="t")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["logger"] == "embedstream.publisher" and line["topic"] == "t" and line["level"] == "warning"


def test_library_chatter_shows_at_debug_level(capsys):
    logs.configure(json=True, level="DEBUG")
    try:
        logging.getLogger("kafka.conn").debug("connecting to %s", "127.0.0.1:1")
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert line["event"] == "connecting to 127.0.0.1:1" and line["level"] == "debug"
    finally:
        logs.configure(json=True)
