"""Wire models and codec: round trips, every DecodeError code, the chunk-topic union, JSON Schema export."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from embedstream.schemas import (
    CHUNK_TOPIC_ADAPTER,
    ChunkEvent,
    ChunkTopicEvent,
    DeadLetter,
    DecodeError,
    DocumentDelete,
    ErrorInfo,
    QueryReply,
    QueryRequest,
    content_hash,
    decode,
    encode,
    export_json_schemas,
)
from embedstream.schemas.events import WIRE_MODELS


def _chunk(**overrides: object) -> ChunkEvent:
    fields: dict = {"doc_id": "doc-1", "chunk_id": 3, "text": "Grüße, world ✓", "metadata": {"lang": "de", "n": [1, 2]}}
    fields.update(overrides)
    return ChunkEvent(**fields)


EXAMPLES = [
    _chunk(collection="docs", model="all-MiniLM-L6-v2", lane="bulk", created_at_ms=1_700_000_000_000),
    DocumentDelete(doc_id="doc-1", chunk_ids=[0, 2]),
    DocumentDelete(doc_id="doc-1"),
    QueryRequest(request_id="r1", text="what is kafka?", reply_to="replies", dimensions=128, dtype="int8",
                 deadline_ms=2, sent_at_ms=1),
    QueryReply(request_id="r1", embedding=[0.25, -1.5], dims=2, tokens=7, timings_ms={"queue": 0.4}),
    QueryReply(request_id="r2", embedding=[-3, 0, 127], dims=3, dtype="int8", scale=0.01),
    QueryReply(request_id="r3", error=ErrorInfo(code="too_long", message="600 tokens, limit 256")),
    DeadLetter(source_topic="t", partition=1, offset=42, key="k", raw_value="{", error=ErrorInfo(code="x", message="y"),
               failed_at_ms=5),
]


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip(event):
    raw = encode(event)
    assert isinstance(raw, bytes)
    compact = json.dumps(json.loads(raw), separators=(",", ":"), ensure_ascii=False).encode()
    assert len(raw) == len(compact)  # no whitespace between tokens, UTF-8 not escaped
    again = decode(raw, type(event))
    assert again == event
    assert json.loads(raw)["schema_version"] == 1


def test_reply_embedding_keeps_number_kind():
    floats = decode(encode(QueryReply(request_id="a", embedding=[1.0, 2.5])), QueryReply).embedding
    ints = decode(encode(QueryReply(request_id="a", embedding=[1, -2], dtype="int8")), QueryReply).embedding
    assert floats == [1.0, 2.5] and all(isinstance(v, float) for v in floats)
    assert ints == [1, -2] and all(isinstance(v, int) for v in ints)


def test_content_hash_computed_when_absent_and_kept_when_given():
    event = decode(b'{"doc_id":"d","chunk_id":0,"text":"hello"}', ChunkEvent)
    assert event.content_hash == hashlib.sha256(b"hello").hexdigest() == content_hash("hello")
    given = "AB" * 32
    assert decode(json.dumps({"doc_id": "d", "chunk_id": 0, "text": "x", "content_hash": given}).encode(),
                  ChunkEvent).content_hash == given.lower()
    with pytest.raises(DecodeError) as err:
        decode(b'{"doc_id":"d","chunk_id":0,"text":"x","content_hash":"nothex"}', ChunkEvent)
    assert err.value.code == "invalid_event" and "content_hash" in err.value.message


def test_union_discriminates_on_kind():
    chunk = decode(encode(_chunk()), CHUNK_TOPIC_ADAPTER)
    delete = decode(encode(DocumentDelete(doc_id="x", chunk_ids=None)), CHUNK_TOPIC_ADAPTER)
    assert isinstance(chunk, ChunkEvent) and isinstance(delete, DocumentDelete)
    assert delete.chunk_ids is None
    # The bare annotated type works too (adapter built once and cached).
    assert isinstance(decode(encode(delete), ChunkTopicEvent), DocumentDelete)
    # A delete never validates as a chunk and vice versa.
    with pytest.raises(DecodeError) as err:
        decode(encode(delete), ChunkEvent)
    assert err.value.code == "invalid_event"


def test_empty_value():
    for raw in (None, b""):
        with pytest.raises(DecodeError) as err:
            decode(raw, ChunkEvent)
        assert err.value.code == "empty_value"


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe{}", b'{"doc_id":"\xff"}', b"[1, 2]", b'"text"', b"null", b"42"])
def test_malformed_json(raw):
    for target in (ChunkEvent, CHUNK_TOPIC_ADAPTER):
        with pytest.raises(DecodeError) as err:
            decode(raw, target)
        assert err.value.code == "malformed_json", err.value


def test_unknown_schema_version_names_supported_versions():
    raw = encode(_chunk()).replace(b'"schema_version":1', b'"schema_version":2')
    for target in (ChunkEvent, CHUNK_TOPIC_ADAPTER):
        with pytest.raises(DecodeError) as err:
            decode(raw, target)
        assert err.value.code == "unknown_schema_version"
        assert "schema_version 2" in err.value.message and "supported: 1" in err.value.message
    # Even when a future version also changed the kinds, the version is what gets reported.
    with pytest.raises(DecodeError) as err:
        decode(b'{"schema_version":3,"kind":"upsert"}', CHUNK_TOPIC_ADAPTER)
    assert err.value.code == "unknown_schema_version"


def test_invalid_event_summarises_field_errors():
    with pytest.raises(DecodeError) as err:
        decode(b'{"chunk_id":-1,"text":3}', ChunkEvent)
    error = err.value
    assert error.code == "invalid_event"
    assert "doc_id: field required" in error.message
    assert "chunk_id: input should be greater than or equal to 0" in error.message
    assert "text: input should be a valid string" in error.message
    assert "default_factory" not in error.message  # consequential noise is dropped
    assert error.to_error_info() == ErrorInfo(code="invalid_event", message=error.message)
    with pytest.raises(DecodeError) as err:
        decode(b'{"kind":"delete","doc_id":""}', CHUNK_TOPIC_ADAPTER)
    assert err.value.code == "invalid_event" and "doc_id" in err.value.message
    with pytest.raises(DecodeError) as err:
        decode(b'{"request_id":"r","text":"t","reply_to":"x","dtype":"bf16"}', QueryRequest)
    assert err.value.code == "invalid_event" and "dtype" in err.value.message


def test_invalid_event_message_is_bounded():
    raw = json.dumps({f"k{i}": i for i in range(100)} | {"text": "x" * 10_000}).encode()
    with pytest.raises(DecodeError) as err:
        decode(raw, QueryRequest)
    assert len(err.value.message) < 800 and "x" * 100 not in err.value.message


def test_unknown_fields_are_ignored():
    raw = b'{"doc_id":"d","chunk_id":0,"text":"t","added_in_v1_1":true}'
    assert decode(raw, ChunkEvent).text == "t"


def test_dead_letter_keeps_raw_bytes():
    info = ErrorInfo(code="malformed_json", message="bad")
    binary = DeadLetter.from_record("t", 0, 7, b"key", b"\xff\x00binary", info, worker="w1")
    assert binary.raw_encoding == "base64" and base64.b64decode(binary.raw_value) == b"\xff\x00binary"
    text = DeadLetter.from_record("t", 0, 8, None, b'{"a": 1}', info)
    assert text.raw_encoding == "utf-8" and text.raw_value == '{"a": 1}' and text.key is None
    for letter in (binary, text):
        again = decode(encode(letter), DeadLetter)
        assert again.raw_bytes() == letter.raw_bytes() and again.failed_at_ms > 0


def test_export_json_schemas(tmp_path):
    paths = export_json_schemas(tmp_path / "schemas")
    names = {p.name for p in paths}
    assert {f"{m.__name__}.schema.json" for m in WIRE_MODELS} <= names
    assert "ChunkTopicEvent.schema.json" in names
    for path in paths:
        schema = json.loads(path.read_text())
        assert schema["$schema"].startswith("https://json-schema.org/")
    chunk = json.loads((tmp_path / "schemas" / "ChunkEvent.schema.json").read_text())
    assert set(chunk["required"]) == {"doc_id", "chunk_id", "text"}
    assert chunk["properties"]["schema_version"]["const"] == 1
    union = json.loads((tmp_path / "schemas" / "ChunkTopicEvent.schema.json").read_text())
    # Told apart by kind's const (no OpenAPI "discriminator"): a delete must name its kind, a chunk may omit it.
    assert "discriminator" not in json.dumps(union)
    assert [branch["$ref"] for branch in union["oneOf"]] == ["#/$defs/ChunkEvent", "#/$defs/DocumentDelete"]
    assert union["$defs"]["DocumentDelete"]["properties"]["kind"]["const"] == "delete"
    assert "kind" in union["$defs"]["DocumentDelete"]["required"]
    assert union["$defs"]["ChunkEvent"]["properties"]["kind"]["const"] == "chunk"
    assert "kind" not in union["$defs"]["ChunkEvent"]["required"]


def test_the_issues_events_decode_as_the_schema_says():
    """#13: a chunk without kind is a chunk; 2**64 is refused (not stored imprecisely); types are strict."""
    event = decode('{"doc_id":"go-1","chunk_id":0,"text":"…"}'.encode(), CHUNK_TOPIC_ADAPTER)
    assert isinstance(event, ChunkEvent) and event.kind == "chunk" and event.text == "…"
    for raw, field in ((b'{"doc_id":"go-1","chunk_id":18446744073709551616,"text":"t"}', "chunk_id"),
                       (b'{"doc_id":"go-1","chunk_id":"5","text":"t"}', "chunk_id"),
                       (b'{"doc_id":"go-1","chunk_id":0,"text":"t","collection":"../../etc/x y"}', "collection"),
                       (b'{"kind":"delete","doc_id":"go-1","from_chunk":9007199254740992}', "from_chunk")):
        with pytest.raises(DecodeError) as err:
            decode(raw, CHUNK_TOPIC_ADAPTER)
        assert err.value.code == "invalid_event" and field in err.value.message, err.value.message
    with pytest.raises(DecodeError) as err:
        decode(b'{"kind":"upsert","doc_id":"go-1"}', CHUNK_TOPIC_ADAPTER)
    assert err.value.message.endswith("kind: must be 'chunk' (the default when absent) or 'delete'")
    with pytest.raises(DecodeError) as err:  # a delete must say so: without kind it would read as a chunk
        decode(b'{"doc_id":"go-1"}', DocumentDelete)
    assert "kind" in err.value.message
    assert DocumentDelete(doc_id="go-1").kind == "delete"  # Python callers may still omit it


def test_decode_error_is_a_coded_error():
    from embedstream.errors import CodedError

    error = DecodeError("invalid_event", "doc_id: field required")
    assert isinstance(error, CodedError) and isinstance(error, ValueError)
    assert (error.code, error.message, str(error)) == ("invalid_event", "doc_id: field required", "doc_id: field required")
