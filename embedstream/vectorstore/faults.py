"""What a failed store call means for the records in it: the store's side of ``workers.transport.lane.failure_kind``.

transient: the server or the cluster cannot take the write now (a node down, a shard without an active
replica, a consistency factor not reached, a timeout, a rate limit, storage locked): back off, keep the
offset, write it when the cluster recovers. permanent: the server rejected the record itself (a vector of the
wrong size, a payload it cannot take, a collection that does not exist): dead-letter it with the reason.
None: not a store error this module knows (the caller decides).

Read from qdrant-client 1.20 and Qdrant's own sources (``src/actix/helpers.rs`` ``HttpError``,
``lib/storage/src/content_manager/conversions.rs`` ``From<StorageError> for Status``,
``lib/collection/src/shards/replica_set/update.rs``):

* REST: qdrant-client raises ``UnexpectedResponse`` (``status_code``, Qdrant's body
  ``{"status": {"error": "..."}}``) for a non-2xx answer, ``ResourceExhaustedResponse`` for a 429 with
  Retry-After, and ``ResponseHandlingException(source)`` around an httpx error (connection refused or
  reset, a timeout, a connection closed mid-answer). Qdrant answers a cluster fault with 500
  (``ServiceError``: "The replica set for shard N on peer P has no active replica", "Failed to apply
  operation to at least one `Active` replica. Consistency of this update is not guaranteed. Please retry.",
  a peer's transport error; ``PreconditionFailed``), 503 (``ShardUnavailable``, an operation already in
  progress), 507 (a node over its storage quota), 408 (``Timeout``), 429 (rate limit) and 403 with
  "Storage locked" (writes locked on the node); a record it rejects with 400 (``BadInput``: "Wrong input:
  Vector dimension error: expected dim: 384, got 3"; ``BadRequest``), 404 (``NotFound``) or 409.
* gRPC: ``grpc.RpcError`` with ``code()``: UNAVAILABLE (a node down, ``ShardUnavailable``),
  DEADLINE_EXCEEDED (``Timeout``, no answer in time), INTERNAL (``ServiceError``: the cluster faults
  above), FAILED_PRECONDITION (``Locked``, ``PreconditionFailed``), RESOURCE_EXHAUSTED, ABORTED and
  CANCELLED are transient; INVALID_ARGUMENT (``BadInput``, ``BadRequest``), NOT_FOUND, ALREADY_EXISTS,
  OUT_OF_RANGE, UNIMPLEMENTED, DATA_LOSS (a checksum mismatch), PERMISSION_DENIED and UNAUTHENTICATED
  are the record's or the deployment's, permanent.
"""

from __future__ import annotations

import json

TRANSIENT, PERMANENT = "transient", "permanent"

_TRANSIENT_GRPC = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "FAILED_PRECONDITION",
                             "RESOURCE_EXHAUSTED", "ABORTED", "CANCELLED"})
_PERMANENT_GRPC = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "OUT_OF_RANGE", "UNIMPLEMENTED",
                             "DATA_LOSS", "PERMISSION_DENIED", "UNAUTHENTICATED"})
_LOCKED = "Storage locked"  # Qdrant's StorageError::Locked, answered 403 over REST


def qdrant_message(exc: BaseException) -> str:
    """Qdrant's own error text of a REST answer (``status.error``), or '' when the body has none."""
    content = getattr(exc, "content", None)
    if not isinstance(content, (bytes, str)):
        return ""
    try:
        status = json.loads(content).get("status")
    except (ValueError, AttributeError):
        return ""
    return str(status.get("error") or "") if isinstance(status, dict) else ""


def http_status_kind(status: int, message: str = "") -> str:
    """A REST answer's status (and Qdrant's message): the server's state, or the record's fault."""
    if status >= 500 or status in (408, 429):
        return TRANSIENT
    if status == 403 and message.startswith(_LOCKED):  # writes locked on the node: it answers again once unlocked
        return TRANSIENT
    return PERMANENT


def store_fault(exc: BaseException) -> str | None:
    """TRANSIENT, PERMANENT, or None for an error that is not a store client's."""
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)  # qdrant-client's UnexpectedResponse
    if isinstance(status, int):
        return http_status_kind(status, qdrant_message(exc))
    if name == "ResourceExhaustedResponse":  # a 429 with Retry-After
        return TRANSIENT
    if name == "ResponseHandlingException":  # qdrant-client's wrapper of the HTTP client's error
        source = getattr(exc, "source", None)
        return TRANSIENT if source is None or isinstance(source, OSError) or _transport_error(source) else None
    if _transport_error(exc):
        return TRANSIENT
    code = _grpc_code(exc)
    if code in _TRANSIENT_GRPC:
        return TRANSIENT
    if code in _PERMANENT_GRPC:
        return PERMANENT
    if name == "StoreLockedError":  # the embedded store held by another process
        return TRANSIENT
    return None


def _transport_error(exc: BaseException) -> bool:
    """Connection refused or reset, a timeout, a connection closed mid-answer: httpx's transport errors."""
    try:
        import httpx
    except ImportError:  # pragma: no cover - qdrant-client depends on httpx
        return isinstance(exc, (ConnectionError, TimeoutError))
    return isinstance(exc, (httpx.TransportError, ConnectionError, TimeoutError))


def _grpc_code(exc: BaseException) -> str | None:
    """The status code name of a gRPC error (``grpc.RpcError.code()``), else None."""
    code = getattr(exc, "code", None)
    if not callable(code) or not type(exc).__module__.startswith("grpc"):
        return None
    try:
        value = code()
    except Exception:  # noqa: BLE001 - not an RPC error after all
        return None
    return getattr(value, "name", None)
