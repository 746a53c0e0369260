"""The published JSON Schemas and the decoders agree, example by example.

For every exported schema: each valid instance (the schema's own ``examples`` plus edge cases here)
validates under jsonschema's Draft 2020-12 validator with format checks AND decodes with the
project's decoder to the same content (and the decoded event, encoded again, is still valid);
each invalid instance is refused by both, the decoder's reason naming the field. The only
instances allowed to split them are the limits JSON Schema cannot state (metadata's total key
count and encoded size), listed in DECODER_ONLY. ajv in strict mode compiles every schema and
must reach jsonschema's verdict on every instance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from embedstream.schemas import CHUNK_TOPIC_ADAPTER, DecodeError, decode, encode, export_json_schemas
from embedstream.schemas.bounds import MAX_SAFE_INTEGER
from embedstream.schemas.events import WIRE_MODELS
from parts import require
from embedstream.schemas.rerank import RERANK_WIRE_MODELS

AJV_VERSIONS = ("ajv@8.20.0", "ajv-formats@3.0.1")
NODE_CACHE = Path(os.environ.get("EMBEDSTREAM_NODE_CACHE", Path.home() / ".cache" / "embedstream" / "node"))
AJV_RUNNER = Path(__file__).resolve().parent.parent / "ajv_strict_check.cjs"

DECODERS = {model.__name__: model for model in (*WIRE_MODELS, *RERANK_WIRE_MODELS)} | {"ChunkTopicEvent": CHUNK_TOPIC_ADAPTER}


def _nest(depth: int) -> dict:
    """A metadata object nested ``depth`` containers deep (the object itself counts)."""
    node: object = "leaf"
    for level in range(depth - 1):
        node = {f"l{level}": node} if level % 2 else [node]
    return {"nested": node}


CHUNK = {"doc_id": "go-1", "chunk_id": 0, "text": "…"}
FINGERPRINT = "0123456789abcdef" * 2
QUERY = {"request_id": "r", "text": "q", "reply_to": "embedstream.replies"}
RERANK = {"request_id": "r", "query": "q", "reply_to": "embedstream.replies"}
SEARCH = {"request_id": "s", "query": "q", "reply_to": "embedstream.replies"}
LETTER = {"source_topic": "t", "partition": 0, "offset": 1, "raw_value": "{", "failed_at_ms": 1,
          "error": {"code": "malformed_json", "message": "bad"}}

_CHUNK_VALID = [
    CHUNK,  # the issue's event: valid under the schema, so it must decode as a chunk
    CHUNK | {"kind": "chunk", "chunk_id": MAX_SAFE_INTEGER, "doc_id": "d" * 1024},
    CHUNK | {"chunk_id": 5.0, "created_at_ms": 1.7e12},  # integral numbers are integers in JSON Schema
    CHUNK | {"metadata": _nest(4), "collection": "docs_v2", "model": "all-MiniLM-L6-v2", "lane": "online",
             "doc_id": "文書/ü ✓", "content_hash": "ab" * 32},
    CHUNK | {"metadata": {f"k{i}": i for i in range(64)}},
    CHUNK | {"token_ids": "ZQCoHSgIZgA=", "token_dtype": "uint16", "tokenizer": FINGERPRINT},
    CHUNK | {"text": "", "token_ids": "ZQAAAA==", "tokenizer": FINGERPRINT},  # int32 by default; ids without text
]
_CHUNK_INVALID = [  # (instance, what the decoder's reason must name)
    (CHUNK | {"chunk_id": 2**64}, "chunk_id"),
    (CHUNK | {"chunk_id": MAX_SAFE_INTEGER + 1}, "chunk_id"),
    (CHUNK | {"chunk_id": -1}, "chunk_id"),
    (CHUNK | {"chunk_id": "5"}, "chunk_id"),
    (CHUNK | {"chunk_id": True}, "chunk_id"),
    (CHUNK | {"chunk_id": 1.5}, "chunk_id"),
    (CHUNK | {"doc_id": ""}, "doc_id"),
    (CHUNK | {"doc_id": "a\nb"}, "doc_id"),
    (CHUNK | {"doc_id": "a\x00"}, "doc_id"),
    (CHUNK | {"doc_id": "d" * 1025}, "doc_id"),
    (CHUNK | {"doc_id": 7}, "doc_id"),
    (CHUNK | {"text": None}, "text"),
    (CHUNK | {"metadata": _nest(5)}, "metadata"),
    (CHUNK | {"metadata": {f"k{i}": i for i in range(65)}}, "metadata"),
    (CHUNK | {"metadata": {"k" * 257: 1}}, "metadata"),
    (CHUNK | {"metadata": {"tags": list(range(257))}}, "metadata"),
    (CHUNK | {"metadata": []}, "metadata"),
    (CHUNK | {"collection": "../../etc/x y"}, "collection"),
    (CHUNK | {"collection": "c" * 256}, "collection"),
    (CHUNK | {"model": "m\x1b[31m"}, "model"),
    (CHUNK | {"created_at_ms": -1}, "created_at_ms"),
    (CHUNK | {"content_hash": "nothex"}, "content_hash"),
    (CHUNK | {"lane": "fast"}, "lane"),
    (CHUNK | {"schema_version": 2}, "schema_version"),
    ({"text": "t", "chunk_id": 0}, "doc_id"),
    (CHUNK | {"token_ids": "ZQCoHSgIZgA="}, "tokenizer"),  # ids without the fingerprint they were made with
    (CHUNK | {"token_ids": "ZQC!HSgIZgA=", "tokenizer": FINGERPRINT}, "token_ids"),
    (CHUNK | {"token_ids": "ZQCoHSgIZgA", "tokenizer": FINGERPRINT}, "token_ids"),  # unpadded
    (CHUNK | {"token_ids": "A" * 174_768, "tokenizer": FINGERPRINT}, "token_ids"),
    (CHUNK | {"token_ids": "ZQCoHSgIZgA=", "token_dtype": "uint8", "tokenizer": FINGERPRINT}, "token_dtype"),
    (CHUNK | {"token_ids": "ZQCoHSgIZgA=", "token_dtype": "uint16", "tokenizer": "XYZ"}, "tokenizer"),
]

VALID: dict[str, list[dict]] = {
    "ChunkEvent": _CHUNK_VALID,
    "ChunkTopicEvent": _CHUNK_VALID + [
        {"kind": "delete", "doc_id": "go-1"},
        {"kind": "delete", "doc_id": "go-1", "chunk_ids": list(range(10_000)), "from_chunk": MAX_SAFE_INTEGER},
    ],
    "DocumentDelete": [{"kind": "delete", "doc_id": "d", "collection": "a.b-c_d"}],
    "DocumentRecord": [{"doc_id": "d", "text": ""}, {"kind": "document", "doc_id": "d", "text": "t", "metadata": _nest(4)}],
    "QueryRequest": [QUERY | {"reply_to": "r" * 249, "request_id": "x" * 256, "dimensions": 65_536},
                     QUERY | {"prompt": "document", "dtype": "binary", "deadline_ms": 0}],
    "QueryReply": [{"request_id": "r", "embedding": [1, -2], "dtype": "int8", "scale": 0.5, "dims": 2.0},
                   {"request_id": "r", "error": {"code": "too_long", "message": "m"}, "timings_ms": {"total": 1}}],
    "DeadLetter": [LETTER, LETTER | {"key": None, "raw_encoding": "base64", "raw_value": "/w=="}],
    "RerankRequest": [RERANK | {"top_n": 1000, "candidates": [{"id": "c", "text": "p"}] * 1000}],
    "RerankReply": [{"request_id": "r", "results": [{"id": "c", "score": -1.5, "rank": 1, "truncated": True}]}],
    "SearchRequest": [SEARCH | {"top_k": 1000, "top_n": 1000, "filters": {"n": 1, "f": 0.5, "b": True, "l": ["x", 2]}},
                      SEARCH | {"filters": {f"k{i}": "v" for i in range(32)}, "collection": "docs"}],
    "SearchReply": [{"request_id": "s", "hits": [{"id": "p", "vector_score": 0.5, "rank": 1, "chunk_id": 3}]}],
}

INVALID: dict[str, list[tuple[dict, str]]] = {
    "ChunkEvent": _CHUNK_INVALID + [(CHUNK | {"kind": "delete"}, "kind")],
    "ChunkTopicEvent": _CHUNK_INVALID + [
        (CHUNK | {"kind": "upsert"}, "kind"),
        ({"doc_id": "go-1"}, "chunk_id"),  # no kind: a chunk, which needs chunk_id and text
        ({"kind": "delete"}, "doc_id"),
        ({"kind": "delete", "doc_id": "d", "chunk_ids": list(range(10_001))}, "chunk_ids"),
        ({"kind": "delete", "doc_id": "d", "from_chunk": 2**53}, "from_chunk"),
        ({"kind": "delete", "doc_id": "d", "chunk_ids": [-1]}, "chunk_ids"),
    ],
    "DocumentDelete": [({"doc_id": "d"}, "kind"), ({"kind": "delete", "doc_id": "d", "collection": "x y"}, "collection")],
    "DocumentRecord": [({"doc_id": "", "text": "t"}, "doc_id"), ({"doc_id": "d", "text": "t", "metadata": _nest(5)}, "metadata")],
    "QueryRequest": [
        (QUERY | {"reply_to": "bad topic!"}, "reply_to"),
        (QUERY | {"reply_to": "r" * 250}, "reply_to"),
        (QUERY | {"reply_to": "."}, "reply_to"),
        (QUERY | {"reply_to": ""}, "reply_to"),
        (QUERY | {"request_id": ""}, "request_id"),
        (QUERY | {"request_id": "x" * 257}, "request_id"),
        (QUERY | {"dimensions": 0}, "dimensions"),
        (QUERY | {"dimensions": 65_537}, "dimensions"),
        (QUERY | {"dimensions": "8"}, "dimensions"),
        (QUERY | {"deadline_ms": -5}, "deadline_ms"),
        (QUERY | {"sent_at_ms": 2**63}, "sent_at_ms"),
        (QUERY | {"dtype": "bf16"}, "dtype"),
    ],
    "QueryReply": [({"request_id": "r", "truncated": "yes"}, "truncated"), ({"request_id": "r", "dims": "3"}, "dims")],
    "DeadLetter": [(LETTER | {"partition": "1"}, "partition"), (LETTER | {"raw_encoding": "hex"}, "raw_encoding")],
    "RerankRequest": [
        (RERANK | {"top_n": 0}, "top_n"),
        (RERANK | {"top_n": 1001}, "top_n"),
        (RERANK | {"candidates": [{"id": "c", "text": "p"}] * 1001}, "candidates"),
        (RERANK | {"candidates": [{"id": "", "text": "p"}]}, "candidates"),
        (RERANK | {"cut": "yes"}, "cut"),
        (RERANK | {"reply_to": "__consumer offsets"}, "reply_to"),
    ],
    "RerankReply": [({"request_id": "r", "results": [{"id": "c", "score": 1, "rank": 0}]}, "rank")],
    "SearchRequest": [
        (SEARCH | {"top_k": 1001}, "top_k"),
        (SEARCH | {"top_n": 0}, "top_n"),
        (SEARCH | {"filters": {f"k{i}": "v" for i in range(33)}}, "filters"),
        (SEARCH | {"filters": {"l": list(range(257))}}, "filters"),
        (SEARCH | {"filters": {"": "v"}}, "filters"),
        (SEARCH | {"filters": {"s": "v" * 1025}}, "filters"),
        (SEARCH | {"collection": "attacker made"}, "collection"),
        (SEARCH | {"rerank": 1}, "rerank"),
    ],
    "SearchReply": [({"request_id": "s", "hits": [{"id": "p", "vector_score": 0.5, "rank": "1"}]}, "rank")],
}

DECODER_ONLY: dict[str, list[tuple[dict, str]]] = {  # JSON Schema cannot state these limits (see bounds.py)
    "ChunkTopicEvent": [
        (CHUNK | {"metadata": {f"k{i}": {f"j{j}": j for j in range(8)} for i in range(40)}}, "keys in all"),
        (CHUNK | {"metadata": {f"k{i}": "v" * 2000 for i in range(40)}}, "bytes as JSON"),
    ],
}


def _carries(decoded: object, sent: object) -> bool:
    """Whether the decoded content holds everything sent (defaults may add keys to objects)."""
    if isinstance(sent, dict):
        return isinstance(decoded, dict) and all(k in decoded and _carries(decoded[k], v) for k, v in sent.items())
    if isinstance(sent, list):
        return isinstance(decoded, list) and len(decoded) == len(sent) and all(map(_carries, decoded, sent))
    return isinstance(decoded, bool) == isinstance(sent, bool) and decoded == sent  # 1 and 1.0: the same JSON number


def _instances(name: str, schema: dict) -> list[dict]:
    return [*schema.get("examples", []), *VALID.get(name, [])]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, dict[str, dict]]:
    folder = tmp_path_factory.mktemp("schemas")
    paths = export_json_schemas(folder)
    return folder, {p.name.removesuffix(".schema.json"): json.loads(p.read_text()) for p in paths}


def _validator(schema: dict) -> Draft202012Validator:
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_every_schema_is_covered(exported):
    _, schemas = exported
    assert set(schemas) == set(DECODERS)
    for name, schema in schemas.items():
        assert schema.get("examples") or schema.get("$defs"), f"{name} publishes no examples"
        assert VALID.get(name) and (INVALID.get(name) or name in DECODER_ONLY), f"{name} has no test instances"


def test_valid_instances_validate_and_decode_to_the_same_content(exported):
    _, schemas = exported
    for name, schema in schemas.items():
        validator = _validator(schema)
        for instance in _instances(name, schema):
            errors = [e.message[:200] for e in validator.iter_errors(instance)]
            assert not errors, f"{name}: schema refuses {str(instance)[:200]}: {errors}"
            event = decode(json.dumps(instance).encode(), DECODERS[name])
            content = event.model_dump(mode="json")
            for key, value in instance.items():
                assert _carries(content[key], value), f"{name}.{key}: decoded {content[key]!r}, sent {value!r}"
            if name == "ChunkTopicEvent" and "kind" not in instance:
                assert content["kind"] == "chunk"
            again = json.loads(encode(event))
            assert not list(validator.iter_errors(again)), f"{name}: the encoder wrote what the schema refuses"


def test_invalid_instances_are_refused_by_both(exported):
    _, schemas = exported
    for name, cases in INVALID.items():
        validator = _validator(schemas[name])
        for instance, field in cases:
            assert not validator.is_valid(instance), f"{name}: schema accepts {str(instance)[:200]}"
            with pytest.raises(DecodeError) as err:
                decode(json.dumps(instance).encode(), DECODERS[name])
            assert err.value.code in ("invalid_event", "unknown_schema_version"), err.value
            assert field in err.value.message, f"{name}: reason {err.value.message!r} does not name {field!r}"


def test_limits_json_schema_cannot_state_are_described_and_enforced_by_the_decoder(exported):
    _, schemas = exported
    for name, cases in DECODER_ONLY.items():
        validator = _validator(schemas[name])
        description = json.dumps(schemas[name])
        assert "checked by the decoder" in description
        for instance, reason in cases:
            assert validator.is_valid(instance)
            with pytest.raises(DecodeError) as err:
                decode(json.dumps(instance).encode(), DECODERS[name])
            assert err.value.code == "invalid_event" and "metadata" in err.value.message and reason in err.value.message


# -- ajv, strict mode -----------------------------------------------------------------------------
def _ajv_modules() -> Path:
    """node_modules holding ajv and ajv-formats, installed once into the cache folder; without node or npm, or
    when the install fails, the test fails (or skips when the part is left out by name: tests/parts.py)."""
    modules = NODE_CACHE / "node_modules"
    if all((modules / name / "package.json").is_file() for name in ("ajv", "ajv-formats")):
        return modules
    npm = shutil.which("npm")
    require("node", npm is not None and shutil.which("node") is not None,
            "node/npm not installed: ajv strict-mode check not run")
    NODE_CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([npm, "install", "--prefix", str(NODE_CACHE), "--no-audit", "--no-fund", *AJV_VERSIONS],
                          capture_output=True, text=True, timeout=300)
    require("node", done.returncode == 0, f"npm install {' '.join(AJV_VERSIONS)} failed: {done.stderr.strip()[-500:]}")
    return modules


def _run_ajv(folder: Path, instances: dict[str, list], tmp_path: Path) -> dict:
    modules = _ajv_modules()
    data = tmp_path / f"{folder.name}-instances.json"
    data.write_text(json.dumps(instances))
    done = subprocess.run(["node", str(AJV_RUNNER), str(folder), str(data)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "NODE_PATH": str(modules)})
    assert done.returncode == 0, done.stderr
    assert not done.stderr.strip(), f"ajv warned: {done.stderr}"
    return json.loads(done.stdout)


def test_ajv_strict_compiles_every_schema_and_agrees_on_every_instance(exported, tmp_path):
    folder, schemas = exported
    instances = {name: _instances(name, schema) + [i for i, _ in INVALID.get(name, [])]
                 + [i for i, _ in DECODER_ONLY.get(name, [])] for name, schema in schemas.items()}
    verdicts = _run_ajv(folder, instances, tmp_path)
    assert set(verdicts) == set(schemas)
    for name, result in verdicts.items():
        assert result["error"] is None, f"ajv strict refuses {name}.schema.json: {result['error']}"
        validator = _validator(schemas[name])
        expected = [validator.is_valid(instance) for instance in instances[name]]
        assert result["valid"] == expected, f"{name}: ajv and jsonschema disagree"


def test_ajv_strict_refuses_the_openapi_discriminator(tmp_path):
    """The check can fail: the old chunk-topic schema's keyword is refused in strict mode."""
    folder = tmp_path / "old"
    folder.mkdir()
    old = {"$schema": "https://json-schema.org/draft/2020-12/schema", "oneOf": [{"type": "object"}],
           "discriminator": {"propertyName": "kind"}}
    (folder / "Old.schema.json").write_text(json.dumps(old))
    verdicts = _run_ajv(folder, {}, tmp_path)
    assert "discriminator" in (verdicts["Old"]["error"] or "")


def test_the_cli_writes_the_checked_schemas(exported, tmp_path):
    from typer.testing import CliRunner

    from embedstream.cli import app

    result = CliRunner().invoke(app, ["schemas", "export", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = {p.name.removesuffix(".schema.json"): json.loads(p.read_text()) for p in (tmp_path / "out").glob("*.json")}
    assert written == exported[1]
