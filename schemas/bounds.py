"""Bounds on every field a producer sends, stated once for the pydantic decoders and the JSON Schemas.

Anything a producer controls is bounded before a worker acts on it: ids (length, no control
characters), integers (``chunk_id`` up to 2**53 - 1, the largest integer a JSON number carries
exactly in JavaScript and other double-based clients: 2**64 arrived as 18446744073709551616 and was
stored as 1.8446744073709552e19), counts (``top_k``, ``top_n``, list lengths), topic and collection
names, and metadata (nesting depth, keys, encoded size). Each bound is a pydantic constraint, so the
published schema carries it too; the two limits JSON Schema cannot express (metadata's total key
count and encoded size) are written into the schema's ``description`` and enforced by the decoder.

Decoding is strict (:func:`embedstream.schemas.codec.decode`): ``"5"`` or ``true`` is not an integer
on the wire, as under the schema. :data:`WireInt` accepts ``5.0`` as 5, as JSON Schema does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError, to_json

MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer every JSON client reads exactly (JavaScript's Number.MAX_SAFE_INTEGER)."""

MAX_ID_CHARS = 1024  # doc_id: room for a deep relative file path
MAX_NAME_CHARS = 256  # request_id, model, candidate id, metadata and filter keys
MAX_COLLECTION_CHARS = 255  # Qdrant's limit on collection names
MAX_TOPIC_CHARS = 249  # Kafka's limit on topic names
MAX_DIMENSIONS = 65_536
MAX_TOP_K = 1_000
MAX_TOP_N = 1_000
MAX_CANDIDATES = 1_000  # on the wire; the rerank worker's own max_candidates (50) is lower
MAX_CHUNK_IDS = 10_000  # an explicit delete list; larger deletes use from_chunk or the whole document
MAX_METADATA_DEPTH = 4  # containers nested, the metadata object itself included
MAX_METADATA_OBJECT_KEYS = 64  # per object (JSON Schema: maxProperties)
MAX_METADATA_KEYS = 256  # across every nested object (decoder only)
MAX_METADATA_ARRAY_ITEMS = 256
MAX_METADATA_BYTES = 65_536  # compact UTF-8 JSON (decoder only)
MAX_FILTERS = 32
MAX_FILTER_VALUES = 256
MAX_FILTER_STRING_CHARS = 1024

PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
"""No control characters (C0, DEL, C1): ids end up in log lines, Kafka keys and terminals."""

SAFE_NAME_PATTERN = r"^[a-zA-Z0-9_-][a-zA-Z0-9._-]*$"
"""Kafka topic and collection names: Kafka's topic characters, the first not '.' (no '.', '..',
path separators or spaces)."""

TOPIC_PATTERN = COLLECTION_PATTERN = SAFE_NAME_PATTERN

BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
"""Canonical, padded standard base64 (RFC 4648): pre-tokenized chunks' ``token_ids``."""

PATTERN_HINTS = {
    PRINTABLE_PATTERN: "must not contain control characters",
    BASE64_PATTERN: "must be padded standard base64 (RFC 4648)",
    SAFE_NAME_PATTERN: "must use only [a-zA-Z0-9._-] and not start with '.'",
}
"""What a pattern means, for refusal messages (pydantic would quote the regular expression)."""


def integral(value: Any) -> Any:
    """5.0 -> 5: JSON Schema counts a number with a zero fraction as an integer; strict pydantic would not."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


WireInt = Annotated[int, BeforeValidator(integral)]


def bounded_int(ge: int, le: int, description: str | None = None) -> Any:
    """An integer field type in [ge, le], integral floats accepted."""
    # Constraints before the validator: after it, pydantic writes them as non-standard "ge"/"le" keywords.
    return Annotated[int, Field(ge=ge, le=le, description=description), BeforeValidator(integral)]


ChunkId = bounded_int(0, MAX_SAFE_INTEGER, "Index of the chunk within its document; at most 2**53 - 1")
EpochMs = bounded_int(0, MAX_SAFE_INTEGER, "Epoch milliseconds")
DocId = Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS, pattern=PRINTABLE_PATTERN,
                             description=f"1-{MAX_ID_CHARS} characters, no control characters")]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=PRINTABLE_PATTERN)]
TopicName = Annotated[str, Field(min_length=1, max_length=MAX_TOPIC_CHARS, pattern=TOPIC_PATTERN)]
CollectionName = Annotated[str, Field(min_length=1, max_length=MAX_COLLECTION_CHARS, pattern=COLLECTION_PATTERN)]


# -- metadata -------------------------------------------------------------------------------------
def _metadata_value_schema(levels_left: int) -> dict[str, Any]:
    scalars: list[dict[str, Any]] = [{"type": t} for t in ("string", "number", "boolean", "null")]
    if levels_left == 0:
        return {"anyOf": scalars}
    child = _metadata_value_schema(levels_left - 1)
    array = {"type": "array", "maxItems": MAX_METADATA_ARRAY_ITEMS, "items": child}
    return {"anyOf": [*scalars, _metadata_object_schema(child), array]}


def _metadata_object_schema(values: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "maxProperties": MAX_METADATA_OBJECT_KEYS,
            "propertyNames": {"type": "string", "maxLength": MAX_NAME_CHARS}, "additionalProperties": values}


METADATA_SCHEMA: dict[str, Any] = {
    **_metadata_object_schema(_metadata_value_schema(MAX_METADATA_DEPTH - 1)),
    "description": (
        f"Stored as point payload. At most {MAX_METADATA_DEPTH} levels of objects/arrays (this one included), "
        f"{MAX_METADATA_OBJECT_KEYS} keys per object and {MAX_METADATA_KEYS} in all, keys up to {MAX_NAME_CHARS} "
        f"characters, arrays up to {MAX_METADATA_ARRAY_ITEMS} items, {MAX_METADATA_BYTES} bytes as compact JSON "
        "(the total key count and size are checked by the decoder)"
    ),
}


def _check_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """Depth, keys and size of a metadata object, walked once (small metadata: a few microseconds)."""
    if not value:
        return value
    keys = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children = list(node.values())
            keys += len(node)
            if len(node) > MAX_METADATA_OBJECT_KEYS:
                raise PydanticCustomError("metadata_too_many_keys", "an object has {n} keys, over the limit of {limit}",
                                          {"n": len(node), "limit": MAX_METADATA_OBJECT_KEYS})
            long_key = next((k for k in node if len(k) > MAX_NAME_CHARS), None)
            if long_key is not None:
                raise PydanticCustomError("metadata_key_too_long", "a key has {n} characters, over the limit of {limit}",
                                          {"n": len(long_key), "limit": MAX_NAME_CHARS})
        elif isinstance(node, list):
            children = node
            if len(node) > MAX_METADATA_ARRAY_ITEMS:
                raise PydanticCustomError("metadata_array_too_long", "an array has {n} items, over the limit of {limit}",
                                          {"n": len(node), "limit": MAX_METADATA_ARRAY_ITEMS})
        else:
            continue
        if depth > MAX_METADATA_DEPTH:
            raise PydanticCustomError("metadata_too_deep", "nested {depth} levels deep, over the limit of {limit}",
                                      {"depth": depth, "limit": MAX_METADATA_DEPTH})
        stack.extend((child, depth + 1) for child in children)
    if keys > MAX_METADATA_KEYS:
        raise PydanticCustomError("metadata_too_many_keys", "{n} keys in all, over the limit of {limit}",
                                  {"n": keys, "limit": MAX_METADATA_KEYS})
    size = len(to_json(value))
    if size > MAX_METADATA_BYTES:
        raise PydanticCustomError("metadata_too_large", "{size} bytes as JSON, over the limit of {limit}",
                                  {"size": size, "limit": MAX_METADATA_BYTES})
    return value


Metadata = Annotated[dict[str, Any], AfterValidator(_check_metadata), WithJsonSchema(METADATA_SCHEMA)]

FilterValue = Annotated[str, Field(max_length=MAX_FILTER_STRING_CHARS)]


# -- checks for producers (before they build an event) --------------------------------------------
_DOC_ID = TypeAdapter(DocId)
_METADATA = TypeAdapter(Metadata)


def doc_id_refusal(value: str) -> str | None:
    """Why ``value`` cannot be a doc_id, or None: producers check ids before building events."""
    return _refusal(_DOC_ID, value)


def metadata_refusal(value: dict[str, Any]) -> str | None:
    """Why ``value`` cannot be an event's metadata, or None."""
    return _refusal(_METADATA, value)


def _refusal(adapter: TypeAdapter[Any], value: Any) -> str | None:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        return "; ".join(explain(err) for err in exc.errors(include_url=False)[:3])
    return None


def explain(error: Mapping[str, Any]) -> str:
    """A pydantic error's message, with a pattern mismatch said in words instead of the expression."""
    if error["type"] == "string_pattern_mismatch":
        pattern = (error.get("ctx") or {}).get("pattern")
        if pattern in PATTERN_HINTS:
            return PATTERN_HINTS[pattern]
    msg = error["msg"]
    return msg[:1].lower() + msg[1:]
