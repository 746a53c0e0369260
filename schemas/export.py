"""Write JSON Schemas of the wire models, for producers and consumers written in other languages.

The schemas are plain JSON Schema 2020-12: only keywords of its vocabularies, so strict validators
(ajv's strict mode) compile them. pydantic's OpenAPI ``discriminator`` is not among them, which is
why the chunk-topic union is a ``oneOf`` whose branches exclude each other through ``kind``'s
``const`` (a delete must say ``"kind": "delete"``; a chunk may leave kind out).
Shell use: ``python -m embedstream.schemas.export <directory>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from embedstream.schemas.events import CHUNK_TOPIC_ADAPTER, WIRE_MODELS
from embedstream.schemas.rerank import RERANK_WIRE_MODELS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# JSON Schema 2020-12 keywords by where their values sit (core, applicator, unevaluated, validation,
# meta-data, format-annotation and content vocabularies).
_ONE_SCHEMA = frozenset({"items", "contains", "additionalProperties", "propertyNames", "if", "then", "else", "not",
                         "unevaluatedItems", "unevaluatedProperties", "contentSchema"})
_SCHEMA_LISTS = frozenset({"prefixItems", "allOf", "anyOf", "oneOf"})
_SCHEMA_MAPS = frozenset({"$defs", "properties", "patternProperties", "dependentSchemas"})
_VALUE_KEYWORDS = frozenset({
    "$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment",
    "type", "const", "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
    "maxProperties", "minProperties", "required", "dependentRequired",
    "title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
    "format", "contentEncoding", "contentMediaType",
})
STANDARD_KEYWORDS = _ONE_SCHEMA | _SCHEMA_LISTS | _SCHEMA_MAPS | _VALUE_KEYWORDS


def nonstandard_keywords(schema: Any, where: str = "#") -> list[str]:
    """JSON pointers of keywords outside JSON Schema 2020-12 (what a strict validator refuses)."""
    if isinstance(schema, bool):
        return []
    if not isinstance(schema, dict):
        return [f"{where} (not a schema)"]
    found = []
    for key, value in schema.items():
        path = f"{where}/{key}"
        if key not in STANDARD_KEYWORDS:
            found.append(path)
        elif key in _ONE_SCHEMA:
            found += nonstandard_keywords(value, path)
        elif key in _SCHEMA_LISTS:
            found += [p for i, sub in enumerate(value) for p in nonstandard_keywords(sub, f"{path}/{i}")]
        elif key in _SCHEMA_MAPS:
            found += [p for name, sub in value.items() for p in nonstandard_keywords(sub, f"{path}/{name}")]
    return found


def json_schemas() -> dict[str, dict[str, Any]]:
    """Name -> JSON Schema (validation mode: what a consumer accepts) of every wire model and the chunk-topic union."""
    schemas: dict[str, dict[str, Any]] = {model.__name__: model.model_json_schema() for model in (*WIRE_MODELS, *RERANK_WIRE_MODELS)}
    schemas["ChunkTopicEvent"] = {
        "title": "ChunkTopicEvent",
        "description": "What a chunk topic carries: a ChunkEvent (kind 'chunk' or absent) or a DocumentDelete (kind 'delete')",
        **CHUNK_TOPIC_ADAPTER.json_schema(),
    }
    out = {name: {"$schema": SCHEMA_DIALECT, **schema} for name, schema in schemas.items()}
    for name, schema in out.items():
        bad = nonstandard_keywords(schema)
        if bad:
            raise ValueError(f"{name}: keywords outside JSON Schema 2020-12: {', '.join(bad)}")
    return out


def export_json_schemas(directory: str | Path) -> list[Path]:
    """Write ``<Name>.schema.json`` per model into directory (created if needed); returns the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in json_schemas().items():
        path = out / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m embedstream.schemas.export <directory>", file=sys.stderr)
        return 2
    for path in export_json_schemas(args[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
