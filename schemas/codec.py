"""Bytes <-> wire models, with one error type whose ``code`` tells a worker what went wrong.

The happy path is a single pydantic-core JSON parse (``model_validate_json``); the slower
classification work runs only once validation has already failed. Decoding is strict, as the
published JSON Schemas are: ``"5"`` is not an integer and ``1`` is not a boolean on the wire
(Python constructors stay lax).
"""

from __future__ import annotations

import json
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, overload

from pydantic import BaseModel, TypeAdapter, ValidationError

from embedstream.errors import CodedError
from embedstream.schemas.bounds import explain
from embedstream.schemas.events import SUPPORTED_SCHEMA_VERSIONS

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

DecodeErrorCode = Literal["malformed_json", "unknown_schema_version", "invalid_event", "empty_value", "record_too_large"]

_MAX_REPORTED_ERRORS = 5
_MAX_MESSAGE_CHARS = 600
# Errors pydantic adds as a consequence of another error: noise in a summary.
_CONSEQUENTIAL_ERRORS = {"default_factory_not_called"}
_UNPARSED = object()
_ADAPTERS: dict[int, tuple[Any, TypeAdapter[Any]]] = {}


class DecodeError(CodedError, ValueError):
    """A record value that cannot become the expected model; ``code`` is stable, ``message`` is for people."""

    code: DecodeErrorCode

    def __init__(self, code: DecodeErrorCode, message: str):
        super().__init__(code, message)


def encode(model: BaseModel) -> bytes:
    """Compact UTF-8 JSON of a wire model (all fields written, so other languages need no defaults)."""
    return model.__pydantic_serializer__.to_json(model)


@overload
def decode(raw: bytes | bytearray | memoryview | str | None, model_type: type[M], max_bytes: int | None = None) -> M: ...
@overload
def decode(raw: bytes | bytearray | memoryview | str | None, model_type: TypeAdapter[T], max_bytes: int | None = None) -> T: ...
@overload
def decode(raw: bytes | bytearray | memoryview | str | None, model_type: Any, max_bytes: int | None = None) -> Any: ...
def decode(raw: bytes | bytearray | memoryview | str | None, model_type: Any, max_bytes: int | None = None) -> Any:
    """Parse and validate one record value into a model class, a TypeAdapter, or a type such as a union.

    Raises DecodeError with code ``empty_value`` (None / empty: a tombstone), ``record_too_large``
    (over ``max_bytes``, refused before parsing), ``malformed_json`` (not JSON, bad UTF-8, or not an
    object), ``unknown_schema_version`` or ``invalid_event``.
    """
    if raw is None or len(raw) == 0:
        raise DecodeError("empty_value", "record has no value (tombstone or empty message)")
    if max_bytes is not None and len(raw) > max_bytes:
        raise DecodeError("record_too_large", f"record value is {len(raw)} bytes, over the limit of {max_bytes} bytes")
    if isinstance(raw, memoryview):
        raw = raw.tobytes()
    try:
        if isinstance(model_type, type) and issubclass(model_type, BaseModel):
            return model_type.model_validate_json(raw, strict=True)
        return _adapter(model_type).validate_json(raw, strict=True)
    except ValidationError as exc:
        raise _classify(exc, raw, _type_name(model_type)) from None


def _adapter(model_type: Any) -> TypeAdapter[Any]:
    """Cached TypeAdapter for non-model types (building one per record would dominate decode time)."""
    if isinstance(model_type, TypeAdapter):
        return model_type
    cached = _ADAPTERS.get(id(model_type))
    if cached is None or cached[0] is not model_type:
        cached = (model_type, TypeAdapter(model_type))
        _ADAPTERS[id(model_type)] = cached
    return cached[1]


def _type_name(model_type: Any) -> str:
    """'ChunkEvent', or 'ChunkEvent | DocumentDelete' for a union: names what the decoder expected."""
    if isinstance(model_type, TypeAdapter):
        model_type = getattr(model_type, "_type", None)  # private, only used for the message
    if isinstance(model_type, type):
        return model_type.__name__
    origin, args = get_origin(model_type), get_args(model_type)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    return "event"


def _classify(exc: ValidationError, raw: bytes | bytearray | str, name: str) -> DecodeError:
    errors = exc.errors(include_url=False, include_context=True, include_input=False)
    if any(err["type"] == "json_invalid" for err in errors):
        return DecodeError("malformed_json", f"value is not valid UTF-8 JSON: {errors[0]['msg']}")
    try:
        payload: Any = json.loads(raw)
    except (ValueError, UnicodeDecodeError):  # pydantic accepted what json rejects: classify by errors alone
        payload = _UNPARSED
    if payload is not _UNPARSED and not isinstance(payload, dict):
        return DecodeError("malformed_json", f"expected a JSON object, got {_json_kind(payload)}")
    if isinstance(payload, dict) and "schema_version" in payload:
        version = payload["schema_version"]
        if type(version) is not int or version not in SUPPORTED_SCHEMA_VERSIONS:
            supported = ", ".join(map(str, SUPPORTED_SCHEMA_VERSIONS))
            return DecodeError(
                "unknown_schema_version",
                f"schema_version {json.dumps(version)} is not supported by this {name} decoder "
                f"(supported: {supported}); upgrade the consumer or produce version {SUPPORTED_SCHEMA_VERSIONS[-1]}",
            )
    return DecodeError("invalid_event", f"{name}: {summarize(errors)}")


def summarize(errors: list[Any]) -> str:
    """'doc_id: field required; chunk_id: input should be greater than or equal to 0' (bounded length)."""
    parts = []
    relevant = [err for err in errors if err["type"] not in _CONSEQUENTIAL_ERRORS] or errors
    for err in relevant[:_MAX_REPORTED_ERRORS]:
        where = ".".join(str(part) for part in err["loc"]) or ("kind" if err["type"] == "invalid_kind" else "value")
        parts.append(f"{where}: {explain(err)}")
    if len(relevant) > _MAX_REPORTED_ERRORS:
        parts.append(f"(and {len(relevant) - _MAX_REPORTED_ERRORS} more)")
    text = "; ".join(parts)
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 3] + "..."


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return "null"
