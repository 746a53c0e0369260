"""A Qdrant server or cluster fault is transient (back off, keep the offset), a record the server rejects is
permanent (dead letter): classified on the exceptions the real qdrant-client raises, over REST and gRPC, against
loopback endpoints that fail the way a Qdrant node does (refused, hung, hung up, Qdrant's error answers)."""

from __future__ import annotations

import grpc
import pytest
from failing_endpoints import ErrorEndpoint, GrpcErrorEndpoint, SilentEndpoint, closed_port
from qdrant_client import QdrantClient, models
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from embedstream.vectorstore.base import Point
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
from embedstream.workers.transport.lane import PERMANENT, TRANSIENT, failure_kind

POINT = models.PointStruct(id=1, vector={"full": [0.1, 0.2]}, payload={"doc_id": "d"})


def _upsert_error(client: QdrantClient) -> Exception:
    """What the real client raises for the sink's write (an upsert with wait=True)."""
    with pytest.raises(Exception) as caught:
        client.upsert("docs", points=[POINT], wait=True)
    client.close()
    return caught.value


def _rest(port: int, timeout: int = 5) -> QdrantClient:
    return QdrantClient(url=f"http://127.0.0.1:{port}", timeout=timeout, check_compatibility=False)


def _grpc(port: int, timeout: int = 5) -> QdrantClient:
    return QdrantClient(host="127.0.0.1", grpc_port=port, prefer_grpc=True, timeout=timeout, check_compatibility=False)


# Qdrant's answers: status and message as src/actix/helpers.rs and the storage errors write them
CLUSTER_FAULTS = [
    (500, "Service internal error: The replica set for shard 0 on peer 7 has no active replica"),
    (500, "Service internal error: Failed to apply operation to at least one `Active` replica. Consistency of this "
          "update is not guaranteed. Please retry. Failed peer: 2, error: Service internal error: Tonic transport error"),
    (500, "Service internal error: Some replica of shard 1 failed to apply operation and deactivation timed out "
          "after 10s. Consistency of this update is not guaranteed. Please retry."),
    (500, "Pre-condition failure: Shard 0 is not in an active state"),
    (503, "Shard temporarily unavailable: partial snapshot recovery is in progress"),
    (507, "Insufficient storage: the node is over its disk quota"),
    (408, "Timeout: Operation 'update' timed out after 30s"),
    (429, "Rate limiting exceeded: Write rate limit exceeded, request larger than rate limiter capacity"),
    (403, "Storage locked: Write operations are forbidden"),
    (502, "upstream connect error"),  # a proxy in front of a dead node
]
RECORD_REJECTIONS = [
    (400, "Wrong input: Vector dimension error: expected dim: 384, got 2"),
    (400, "Wrong input: Not existing vector name error: full"),
    (400, "Format error in JSON body: invalid type: string \"x\", expected f32 at line 1 column 40"),
    (400, "Bad request: Payload size 70000000 exceeds the limit"),
    (404, "Not found: Collection `docs` doesn't exist!"),
    (409, "Wrong input: Collection `docs` already exists!"),
]


@pytest.mark.parametrize("status, message, kind", [(*case, TRANSIENT) for case in CLUSTER_FAULTS]
                         + [(*case, PERMANENT) for case in RECORD_REJECTIONS])
def test_qdrant_answers_over_rest_are_classified_by_status_and_message(status, message, kind):
    """A cluster fault is transient; a record the server rejects is permanent."""
    with ErrorEndpoint(0, status, message) as endpoint:
        exc = _upsert_error(_rest(endpoint.port))
    assert isinstance(exc, UnexpectedResponse) and exc.status_code == status
    assert failure_kind(exc) == kind, str(exc)


def test_a_rate_limit_with_retry_after_is_transient():
    with ErrorEndpoint(2, 429, "Rate limiting exceeded: Write rate limit exceeded: Operation requires 8 tokens but "
                               "only 2.0 were available. Retry after 1s", {"retry-after": "1"}) as endpoint:
        exc = _upsert_error(_rest(endpoint.port))
    assert isinstance(exc, ResourceExhaustedResponse)  # not an UnexpectedResponse: no status_code on it
    assert failure_kind(exc) == TRANSIENT


@pytest.mark.parametrize("node", ["refused", "hung", "hung up"])
def test_a_node_down_hung_or_dying_mid_answer_is_transient_over_rest(node):
    if node == "refused":
        exc = _upsert_error(_rest(closed_port(3)))
    else:
        with SilentEndpoint(4, hang_up=node == "hung up") as endpoint:
            exc = _upsert_error(_rest(endpoint.port, timeout=1))
    assert isinstance(exc, ResponseHandlingException), repr(exc)
    assert failure_kind(exc) == TRANSIENT, repr(exc.source)


@pytest.mark.parametrize("code, message, kind", [
    (grpc.StatusCode.UNAVAILABLE, "Shard temporarily unavailable: partial snapshot recovery is in progress", TRANSIENT),
    (grpc.StatusCode.INTERNAL, "Service internal error: The replica set for shard 0 on peer 7 has no active replica",
     TRANSIENT),
    (grpc.StatusCode.DEADLINE_EXCEEDED, "Timeout: Operation 'update' timed out after 30s", TRANSIENT),
    (grpc.StatusCode.FAILED_PRECONDITION, "Storage locked: Write operations are forbidden", TRANSIENT),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, "Rate limiting exceeded: Write rate limit exceeded", TRANSIENT),
    (grpc.StatusCode.INVALID_ARGUMENT, "Wrong input: Vector dimension error: expected dim: 384, got 2", PERMANENT),
    (grpc.StatusCode.NOT_FOUND, "Not found: Collection `docs` doesn't exist!", PERMANENT),
    (grpc.StatusCode.ALREADY_EXISTS, "Wrong input: Collection `docs` already exists!", PERMANENT),
])
def test_qdrant_errors_over_grpc_are_classified_by_their_status_code(code, message, kind):
    with GrpcErrorEndpoint(5, code, message) as endpoint:
        exc = _upsert_error(_grpc(endpoint.port))
    assert isinstance(exc, grpc.RpcError) and exc.code() == code
    assert failure_kind(exc) == kind, exc.details()


@pytest.mark.parametrize("node", ["refused", "hung"])
def test_a_node_down_or_hung_is_transient_over_grpc(node):
    if node == "refused":
        exc = _upsert_error(_grpc(closed_port(6)))
    else:
        with SilentEndpoint(7) as endpoint:
            exc = _upsert_error(_grpc(endpoint.port, timeout=1))
    assert isinstance(exc, grpc.RpcError), repr(exc)
    assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert failure_kind(exc) == TRANSIENT


def test_the_sinks_own_writes_through_the_store_keep_the_kind():
    """QdrantClientStore's upsert (spec lookup, then the write) over a failing node, and a bad vector locally."""
    point = Point("00000000-0000-0000-0000-000000000001", {"full": [0.1, 0.2]}, {"doc_id": "d"})
    with ErrorEndpoint(8, 500, "Service internal error: The replica set for shard 0 on peer 7 has no active replica") as ep:
        with pytest.raises(UnexpectedResponse) as caught:
            QdrantClientStore(_rest(ep.port)).upsert("docs", [point])
    assert failure_kind(caught.value) == TRANSIENT
    with pytest.raises(ResponseHandlingException) as refused:
        QdrantClientStore(_rest(closed_port(9))).upsert("docs", [point])
    assert failure_kind(refused.value) == TRANSIENT
    local = QdrantClientStore.in_memory()
    from embedstream.vectorstore.base import VectorSpec

    local.ensure_collection("docs", {"full": VectorSpec(4, "cosine")})
    with pytest.raises(Exception) as wrong_size:
        local.upsert("docs", [point])  # 2 values for a 4-d vector: this record's fault
    assert failure_kind(wrong_size.value) == PERMANENT
