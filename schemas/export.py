"""Write JSON Schemas of the wire models, for producers and consumers written in other languages.

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


def json_schemas() -> dict[str, dict[str, Any]]:
    """Name -> JSON Schema (validation mode: what a consumer accepts) of every wire model and the chunk-topic union."""
    schemas: dict[str, dict[str, Any]] = {model.__name__: model.model_json_schema() for model in (*WIRE_MODELS, *RERANK_WIRE_MODELS)}
    schemas["ChunkTopicEvent"] = {"title": "ChunkTopicEvent", **CHUNK_TOPIC_ADAPTER.json_schema()}
    return {name: {"$schema": SCHEMA_DIALECT, **schema} for name, schema in schemas.items()}


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
