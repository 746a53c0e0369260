"""Debezium change events as the connectors write them, shared by the CDC unit and broker tests."""

from __future__ import annotations

import json

from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("lang",))
MONGO = CdcConfig("_id", ("title", "content.body"), ("views", "tags"))
SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "db": "shop", "schema": "public",
          "table": "articles", "snapshot": "false", "lsn": 123}
MONGO_SOURCE = {"version": "2.7.0.Final", "connector": "mongodb", "name": "kb", "db": "kb", "collection": "guides"}
OID = "65a1f0c2e4b0a1b2c3d4e5f6"


def envelope(op: str, before=None, after=None, source=None, wrap: bool = False, **extra) -> dict:
    payload = {"before": before, "after": after, "source": source or SOURCE, "op": op, "ts_ms": 1_700_000_000_000,
               "transaction": None, **extra}
    if not wrap:
        return payload
    return {"schema": {"type": "struct", "name": "shop.public.articles.Envelope", "optional": False, "fields": []},
            "payload": payload}


def key(value, field: str = "id", wrap: bool = False) -> dict:
    body = {field: value}
    if not wrap:
        return body
    return {"schema": {"type": "struct", "name": "shop.public.articles.Key", "optional": False,
                       "fields": [{"type": "int32", "optional": False, "field": field}]}, "payload": body}


def raw(obj) -> bytes | None:
    return None if obj is None else json.dumps(obj).encode()


def row(id_, title, body, lang="en") -> dict:
    return {"id": id_, "title": title, "body": body, "lang": lang, "updated_at": 1_700_000_000_000}
