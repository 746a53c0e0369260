"""Debezium change events -> what happened to which document: a pure parser, no Kafka.

Accepts what Kafka Connect's JsonConverter writes, with or without the ``{"schema", "payload"}``
wrapper (``schemas.enable``), for the key and for the value:

* relational connectors (PostgreSQL, MySQL, ...): ``before`` / ``after`` are row objects;
* the MongoDB connector: ``before`` / ``after`` are JSON *strings* in MongoDB extended JSON
  (``{"_id": {"$oid": "..."}}``, ``{"$numberLong": "7"}``), and the key's ``id`` is the document's
  ``_id`` serialised the same way.

Ops: ``c`` (create), ``r`` (snapshot read) and ``u`` (update) carry the new row; ``d`` (delete) and a
tombstone (null value) remove the document; ``t`` (truncate) concerns a whole table. The document id
is ``after[id_field]`` (``before[id_field]`` for a delete), falling back to the key. Text is the
configured text fields joined by a blank line; metadata the configured metadata fields plus
``cdc_source`` (``db.schema.table`` or ``db.collection``). Anything that does not fit raises
:class:`CdcError`, whose ``code`` goes into the dead letter.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import decimal
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from embedstream.errors import CodedError
from embedstream.schemas.bounds import doc_id_refusal, metadata_refusal

UPSERT_OPS = frozenset({"c", "r", "u"})
KNOWN_OPS = frozenset({"c", "r", "u", "d", "t"})
SKIPPED_KINDS = frozenset({"heartbeat", "transaction", "schema_change"})  # records that change no document
OLD_KEY_HEADER = "__debezium.oldkey"  # on the create of a primary-key change: the row's previous key
FLAT_OP, FLAT_DELETED = "__op", "__deleted"  # ExtractNewRecordState's add.fields=op and rewrite delete marker
DECIMAL_TYPES = frozenset({"org.apache.kafka.connect.data.Decimal"})
#: epoch-based logical types: unit in microseconds, and whether a time of day goes with the date
EPOCH_TYPES = {"io.debezium.time.Date": (86_400_000_000, False), "org.apache.kafka.connect.data.Date": (86_400_000_000, False),
               "io.debezium.time.Timestamp": (1000, True), "org.apache.kafka.connect.data.Timestamp": (1000, True),
               "io.debezium.time.MicroTimestamp": (1, True)}
EPOCH = datetime.datetime(1970, 1, 1)
TEXT_SEPARATOR = "\n\n"
SOURCE_KEY = "cdc_source"

CdcErrorCode = Literal[
    "malformed_json",  # key or value is not JSON (or a document string inside it is not a JSON object)
    "invalid_envelope",  # not a Debezium envelope: no op, no before/after, wrong types
    "unknown_op",  # op other than c, r, u, d, t
    "missing_after",  # c / r / u whose after is null (e.g. a MongoDB update without the full document)
    "missing_id",  # no id in the row and none in the key
    "invalid_id",  # an id that is not a string, number or ObjectId-like value, or breaks the doc_id bounds
    "invalid_metadata",  # the metadata fields break the wire's metadata bounds (depth, keys, size)
    "non_text_field",  # a configured text field holds something other than a string
    "truncate_refused",  # a table truncate, refused by configuration (set by the bridge)
    "unavailable_value",  # the source left a field out (an unchanged TOASTed value) and no earlier record has it
]


class CdcError(CodedError, ValueError):
    """A change event that cannot be applied; ``code`` is stable, ``message`` is for people."""

    code: CdcErrorCode

    def __init__(self, code: CdcErrorCode, message: str):
        super().__init__(code, message)


@dataclass(frozen=True)
class CdcConfig:
    """Which fields of a row make a document."""

    id_field: str
    text_fields: tuple[str, ...]
    metadata_fields: tuple[str, ...] = ()
    #: what the connector sends for a value it could not read (Debezium's unavailable.value.placeholder)
    unavailable_placeholder: str = "__debezium_unavailable_value"

    def __post_init__(self) -> None:
        if not self.id_field:
            raise ValueError("id_field must not be empty")
        if not self.text_fields or not all(self.text_fields):
            raise ValueError("at least one (non-empty) text field is needed")


@dataclass(frozen=True)
class Change:
    """One change event, reduced to what the index needs.

    ``op`` is the Debezium op, or ``"tombstone"`` for a null value. For c / r / u ``text`` is the
    document's new text; ``previous_doc_id`` is set when an update moved the row to another id
    (the old id's chunks must go). ``doc_id`` is None only for a truncate. A change with
    ``unavailable`` fields has no text yet and lacks those metadata fields: :func:`complete` fills
    them in from the document's previous record, and only then may it be applied.
    """

    op: str
    doc_id: str | None
    text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    previous_doc_id: str | None = None
    fields: dict[str, str | None] = field(default_factory=dict)  # the text fields by name (None: null/missing)
    unavailable: tuple[str, ...] = ()  # text or metadata fields the source did not send (see complete())

    @property
    def is_upsert(self) -> bool:
        return self.op in UPSERT_OPS

    @property
    def is_delete(self) -> bool:
        return self.op in ("d", "tombstone")

    @property
    def is_skipped(self) -> bool:
        return self.op in SKIPPED_KINDS


def parse_change(key: bytes | str | None, value: bytes | str | None, config: CdcConfig) -> Change:
    """Parse one Kafka record of a Debezium topic; raises CdcError when it cannot be applied.

    Besides change events it recognises the records that change no document and returns them as a
    Change whose op is in SKIPPED_KINDS: heartbeats, transaction metadata (BEGIN / END) and
    schema-change records."""
    wrapped = _load(value, "value", unwrap_payload=False)
    envelope, schema = unwrap(wrapped), _schema(wrapped)
    if envelope is None:  # tombstone: only the key says which document
        return Change("tombstone", _id_from_key(key, config))
    if not isinstance(envelope, dict):
        raise CdcError("malformed_json", f"the value must be a JSON object, got {_kind(envelope)}")
    op = envelope.get("op")
    if op is None:
        skipped = _skipped_kind(envelope)
        if skipped is not None:
            return Change(skipped, None)
        if FLAT_OP in envelope or FLAT_DELETED in envelope:
            return _flattened(key, envelope, schema, config)
        raise CdcError("invalid_envelope", "no 'op' field: not a Debezium change event envelope (a record flattened "
                                           f"by ExtractNewRecordState needs {FLAT_OP} or {FLAT_DELETED}: set its "
                                           "add.fields=op or delete.tombstone.handling.mode=rewrite[-with-tombstone])")
    if not isinstance(op, str) or op not in KNOWN_OPS:
        raise CdcError("unknown_op", f"op {json.dumps(op)} is not one of c, r, u, d, t")
    source = _source_name(envelope.get("source"))
    if op == "t":
        return Change("t", None, source=source)
    if "before" not in envelope and "after" not in envelope and op != "d":
        raise CdcError("invalid_envelope", f"op {op!r} event has neither 'before' nor 'after'")
    before = _document(envelope.get("before"), "before")
    after = _document(envelope.get("after"), "after")
    if op == "d":
        doc_id = _id_from_row(before, config) if before is not None else None
        return Change("d", doc_id if doc_id is not None else _id_from_key(key, config), source=source)
    if after is None:
        hint = " (MongoDB: set capture.mode to a *_update_full mode so updates carry the whole document)" \
            if "patch" in envelope or "updateDescription" in envelope else ""
        raise CdcError("missing_after", f"op {op!r} event has no 'after' row{hint}")
    return _upsert(op, key, before, after, source, _row_types(schema, "after"), config)


def _flattened(key, row: dict[str, Any], schema: Any, config: CdcConfig) -> Change:
    """A record of the ExtractNewRecordState transform: the row itself, plus ``__op`` (add.fields=op) and/or
    ``__deleted`` (delete.tombstone.handling.mode=rewrite*); ``__db`` / ``__schema`` / ``__table`` when
    add.fields names them."""
    op = row.get(FLAT_OP)
    deleted = str(row.get(FLAT_DELETED, "false")).lower() == "true"
    if op is not None and op not in KNOWN_OPS:
        raise CdcError("unknown_op", f"{FLAT_OP} {json.dumps(op)} is not one of c, r, u, d, t")
    source = ".".join(str(row[k]) for k in ("__db", "__schema", "__table") if row.get(k)) or None
    if op == "t":
        return Change("t", None, source=source)
    if deleted or op == "d":
        doc_id = _id_from_row(row, config)
        return Change("d", doc_id if doc_id is not None else _id_from_key(key, config), source=source)
    return _upsert(op or "u", key, None, row, source, _row_types(schema, None), config)


def _upsert(op: str, key, before: dict | None, after: dict[str, Any], source: str | None,
            types: Mapping[str, dict], config: CdcConfig) -> Change:
    doc_id = _id_from_row(after, config)
    if doc_id is None:
        doc_id = _id_from_key(key, config)
    previous = _id_from_row(before, config) if before is not None else None
    unavailable = tuple(name for name in (*config.text_fields, *config.metadata_fields)
                        if _is_placeholder(_lookup(after, name, None), config.unavailable_placeholder))
    metadata = {name: logical_value(value, types.get(name)) for name in config.metadata_fields
                if name not in unavailable and (value := _lookup(after, name, _MISSING)) is not _MISSING}
    if source:
        metadata[SOURCE_KEY] = source
    refused = metadata_refusal(metadata)
    if refused:
        raise CdcError("invalid_metadata", f"metadata fields {list(config.metadata_fields)}: {refused}")
    binary = [name for name in config.text_fields
              if (types.get(name) or {}).get("type") == "bytes" and _lookup(after, name, None) is not None]
    if binary:  # base64 of the bytes: text only in appearance (without schemas it cannot be told apart)
        raise CdcError("non_text_field", f"text field(s) {binary} are binary columns (the schema says bytes); "
                                         "name text columns only")
    fields = {name: _text_field(after, name) for name in config.text_fields if name not in unavailable}
    text = None if any(name in unavailable for name in config.text_fields) else join_fields(fields, config.text_fields)
    return Change(op, doc_id, text, metadata, source, previous if previous is not None and previous != doc_id else None,
                  fields, unavailable)


def logical_value(value: Any, field_schema: Mapping[str, Any] | None) -> Any:
    """A value as the converter's schema says to read it (schemas.enable=true): a Decimal's base64 bytes ->
    the number (a float when that is exact, else its decimal string); epoch dates and timestamps -> ISO-8601.
    Without a schema a value stays as sent (set decimal.handling.mode=string or double for readable numbers)."""
    name = (field_schema or {}).get("name")
    if value is None or name is None:
        return value
    try:
        if name in DECIMAL_TYPES and isinstance(value, str):
            scale = int(((field_schema or {}).get("parameters") or {}).get("scale", 0))
            exact = decimal.Decimal(f"{int.from_bytes(base64.b64decode(value), 'big', signed=True)}E{-scale}")  # exact
            return float(exact) if decimal.Decimal(repr(float(exact))) == exact else str(exact)
        if name in EPOCH_TYPES and isinstance(value, int) and not isinstance(value, bool):
            unit, with_date = EPOCH_TYPES[name]
            moment = EPOCH + datetime.timedelta(microseconds=value * unit)
            return moment.date().isoformat() if not with_date else moment.isoformat()
    except (ValueError, TypeError, OverflowError, ArithmeticError, binascii.Error):  # decimal.InvalidOperation too
        return value
    return value


def moved_from(headers, config: CdcConfig) -> str | None:
    """The document id a create came from when Debezium split a primary-key change into delete + create
    (the create's ``__debezium.oldkey`` header); None otherwise."""
    for name, value in headers or ():
        if name == OLD_KEY_HEADER and value:
            try:
                return _id_from_key(value, config)
            except CdcError:
                return None
    return None


def complete(change: Change, previous: Mapping[str, Any] | None, config: CdcConfig) -> Change:
    """``change`` with its unavailable fields taken from the document's previous documents-log record
    (``{"text", "metadata", "fields"}``, None when there is none); raises ``unavailable_value`` when the
    record does not have them, so nothing the source did not send is ever indexed."""
    if not change.unavailable:
        return change
    known = dict((previous or {}).get("fields") or {})
    if previous is not None and not known and len(config.text_fields) == 1:  # one text field: the text is it
        known = {config.text_fields[0]: previous.get("text") or None}
    old_metadata = (previous or {}).get("metadata") or {}
    fields, metadata, missing = dict(change.fields), dict(change.metadata), []
    for name in change.unavailable:
        if name in config.text_fields and name in known:
            fields[name] = known[name]
        elif name not in config.text_fields and name in old_metadata:
            metadata[name] = old_metadata[name]
        else:
            missing.append(name)
    if missing:
        where = "no earlier record of the document" if previous is None else "its earlier record lacks them"
        raise CdcError("unavailable_value", f"the source did not send {missing} (unchanged values PostgreSQL keeps "
                                            f"out of line: TOAST) and {where}; the index keeps the document as it "
                                            "was (REPLICA IDENTITY FULL makes PostgreSQL log every value)")
    ordered = {name: fields.get(name) for name in config.text_fields}
    metadata = {name: metadata[name] for name in (*config.metadata_fields, SOURCE_KEY) if name in metadata}
    return dataclasses.replace(change, text=join_fields(ordered, config.text_fields), metadata=metadata,
                               fields=ordered, unavailable=())


def document_text(row: Mapping[str, Any], text_fields: Sequence[str]) -> str:
    """The text fields joined by a blank line; missing, null and blank fields are skipped."""
    return join_fields({name: _text_field(row, name) for name in text_fields}, text_fields)


def join_fields(fields: Mapping[str, str | None], text_fields: Sequence[str]) -> str:
    """The text: the fields in configured order, joined by a blank line; null and blank ones skipped."""
    return TEXT_SEPARATOR.join(v for name in text_fields if (v := fields.get(name)) is not None and v.strip())


def _text_field(row: Mapping[str, Any], name: str) -> str | None:
    value = _lookup(row, name, None)
    if value is not None and not isinstance(value, str):
        raise CdcError("non_text_field", f"text field {name!r} holds {_kind(value)}, not a string")
    return value


def _is_placeholder(value: Any, placeholder: str) -> bool:
    """Debezium's stand-in for a value it could not read: the text itself, in a one-item array (array
    columns), or base64 of its bytes (binary columns)."""
    if isinstance(value, list):
        return len(value) == 1 and _is_placeholder(value[0], placeholder)
    return isinstance(value, str) and (value == placeholder or value == _base64(placeholder))


@functools.lru_cache(maxsize=8)
def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def unwrap(obj: Any) -> Any:
    """The payload of JsonConverter's ``{"schema": ..., "payload": ...}`` wrapper; anything else as is."""
    if isinstance(obj, dict) and "payload" in obj and "schema" in obj and len(obj) == 2:
        return obj["payload"]
    return obj


def from_extended_json(value: Any) -> Any:
    """MongoDB extended JSON (canonical or relaxed) -> plain JSON values, recursively.

    ``{"$oid": h}`` -> h, ``{"$numberLong"|"$numberInt": s}`` -> int, ``{"$numberDouble": s}`` ->
    float, ``{"$numberDecimal": s}`` -> s (precision kept), ``{"$date": x}`` -> x (epoch ms or ISO
    string), ``{"$uuid": s}`` / ``{"$symbol": s}`` -> s. Other wrappers ($binary, $timestamp, ...)
    stay objects.
    """
    if isinstance(value, list):
        return [from_extended_json(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, inner), = value.items()
        if tag in ("$oid", "$uuid", "$symbol", "$numberDecimal") and isinstance(inner, str):
            return inner
        if tag in ("$numberLong", "$numberInt") and isinstance(inner, (str, int)) and not isinstance(inner, bool):
            try:
                return int(inner)
            except ValueError:
                return inner
        if tag == "$numberDouble" and isinstance(inner, (str, int, float)) and not isinstance(inner, bool):
            try:
                return float(inner)
            except ValueError:
                return inner
        if tag == "$date":
            return from_extended_json(inner)
    return {k: from_extended_json(v) for k, v in value.items()}


# -- internals -----------------------------------------------------------------------------------
_MISSING = object()


def _load(raw: bytes | str | None, what: str, unwrap_payload: bool = True) -> Any:
    """JSON of a key or value, unwrapped; None for a null/empty record or a null payload."""
    if raw is None or len(raw) == 0:
        return None
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CdcError("malformed_json", f"the record {what} is not valid UTF-8 JSON: {exc}") from None
    return unwrap(obj) if unwrap_payload else obj


def _schema(obj: Any) -> Any:
    """The converter's schema of a ``{"schema", "payload"}`` record; None without one."""
    return obj.get("schema") if isinstance(obj, dict) and "payload" in obj and len(obj) == 2 else None


def _row_types(schema: Any, part: str | None) -> dict[str, dict]:
    """Field name -> field schema of the row (the envelope's ``part`` struct, or the schema itself)."""
    if not isinstance(schema, dict):
        return {}
    if part is not None:
        schema = next((f for f in schema.get("fields") or () if isinstance(f, dict) and f.get("field") == part), {})
    return {f["field"]: f for f in schema.get("fields") or () if isinstance(f, dict) and "field" in f}


def _skipped_kind(value: dict[str, Any]) -> str | None:
    """What a record that is not a change event is: a heartbeat ({"ts_ms"} only), transaction metadata
    (status BEGIN / END), a schema change (ddl / tableChanges); None for anything else."""
    if set(value) == {"ts_ms"}:
        return "heartbeat"
    if value.get("status") in ("BEGIN", "END") and "id" in value:
        return "transaction"
    if "ddl" in value or "tableChanges" in value:
        return "schema_change"
    return None


def _document(raw: Any, where: str) -> dict[str, Any] | None:
    """A row object, or a MongoDB document string decoded from extended JSON; None when null."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise CdcError("malformed_json", f"'{where}' is a string but not a JSON document: {exc}") from None
        if not isinstance(doc, dict):
            raise CdcError("malformed_json", f"'{where}' must decode to a JSON object, got {_kind(doc)}")
        return from_extended_json(doc)
    if isinstance(raw, dict):
        return raw
    raise CdcError("invalid_envelope", f"'{where}' must be an object, a JSON document string or null, got {_kind(raw)}")


def _lookup(row: Mapping[str, Any], name: str, default: Any) -> Any:
    """row[name], or a dotted path into nested objects ("meta.title") when no such key exists."""
    if name in row:
        return row[name]
    node: Any = row
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def _id_from_row(row: Mapping[str, Any], config: CdcConfig) -> str | None:
    value = _lookup(row, config.id_field, None)
    return None if value is None else _id_string(value, f"field {config.id_field!r}")


def _id_from_key(raw: bytes | str | None, config: CdcConfig) -> str:
    """The document id from the record key: key[id_field], or the key's only field, or a scalar key."""
    try:
        key = _load(raw, "key")
    except CdcError:  # a key that is not JSON (StringConverter): the text is the id
        key = bytes(raw).decode("utf-8", "replace") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
    if key is None:
        raise CdcError("missing_id", f"no {config.id_field!r} in the event and the record has no key")
    if not isinstance(key, dict):
        return _id_string(key, "key")
    if config.id_field in key:
        value = key[config.id_field]
    elif len(key) == 1:
        (name, value), = key.items()
        if name == "id" and isinstance(value, str) and config.id_field == "_id":
            value = _mongo_key_id(value)  # MongoDB: the key's id is _id as extended JSON text
    else:
        raise CdcError("missing_id", f"no {config.id_field!r} in the event, and the key has no such field "
                                     f"(key fields: {sorted(key)})")
    if value is None:
        raise CdcError("missing_id", f"no {config.id_field!r} in the event and the key's id is null")
    return _id_string(value, "key")


def _mongo_key_id(text: str) -> Any:
    """'{"$oid": "5f..."}' -> '5f...', '"abc"' -> 'abc', '42' -> 42; other text as is."""
    try:
        return from_extended_json(json.loads(text))
    except ValueError:
        return text


def _id_string(value: Any, where: str) -> str:
    value = from_extended_json(value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise CdcError("invalid_id", f"the document id ({where}) must be a string, a number or an ObjectId, "
                                     f"got {_kind(value)}")
    text = value if isinstance(value, str) else str(value)
    if not text:
        raise CdcError("missing_id", f"the document id ({where}) is empty")
    refused = doc_id_refusal(text)
    if refused:
        raise CdcError("invalid_id", f"the document id ({where}) {refused}")
    return text


def _source_name(source: Any) -> str | None:
    """'db.schema.table' (relational) or 'db.collection' (MongoDB) from the envelope's source block."""
    if not isinstance(source, dict):
        return None
    parts = [source.get(k) for k in ("db", "schema", "table")]
    if not source.get("table") and source.get("collection"):
        parts = [source.get("db"), source.get("collection")]
    names = [str(p) for p in parts if p]
    return ".".join(names) or None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
