"""Request-reply over Kafka: send a request carrying its request_id, wait for the reply that carries it.

Requests and replies are unkeyed: the request_id in the value correlates them, and each record goes to
a partition whose leader acknowledges (``producers.live_partitions``), so a dead broker's partitions are
left alone from half a second after its death. An idempotent request (an embedding, a rerank, a search:
``RETRIED``) whose send is not acknowledged within half a second, or with no reply in a while, is sent again,
same request_id, within its deadline and a retry budget (``retry_policy``); a send the broker refused is sent
again at once. The first reply wins, later ones are dropped.

Replies are read without a consumer group: the client assigns itself every partition of its reply
topic and starts at the end, so it sees every reply produced after it started (no rebalance
pauses, no committed offsets) and keeps the ones whose request_id it is waiting for. Clients that share
a reply topic read each other's replies too; a client serving many requests (a gateway) takes a reply
topic of its own (``own_reply_topic``: ``<replies topic>.<name>``, allowed by the workers' ``reply_to``
rule, made at start and deleted at ``close``), so N gateways do not each read all N gateways' replies.

The Kafka clients are librdkafka's (confluent-kafka): its I/O runs in native threads, off the GIL.
A loopback request-reply through an echo served by kafka-python took 4.2 ms p50 / 5.3 ms p95 with
this client against 8.3 / 11.0 ms with kafka-python's (``embedstream bench transport``), and an
online query's whole budget is 30 ms.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from pydantic import BaseModel, ConfigDict, ValidationError

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.kafka_access import check_kafka_access
from embedstream.producers.live_partitions import LiveSender, live_producer
from embedstream.producers.retry_policy import RetryPolicy
from embedstream.producers.topics import DEFAULT_PARTITIONS, delete_topics, ensure_topics
from embedstream.schemas.codec import DecodeError, decode, encode
from embedstream.schemas.events import Dtype, PromptKind, QueryReply, QueryRequest, now_ms
from embedstream.schemas.rerank import RerankRequest, SearchRequest

log = logs.get("embedstream.query_client")

R = TypeVar("R", bound=BaseModel)

_POLL_TIMEOUT_S = 0.1
_DRAIN_BATCH = 500
_EXPIRY_GRACE_S = 1.0
RETRY_AFTER_S = 1.0  # no reply this long (or twice the recent p95) after a send: send an idempotent request again
_LAST_SEND_S = 0.05  # no retry this close to the deadline: its reply could not come in time
# a new topic's partitions until their leaders are known (librdkafka does not flag these retriable here)
_NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
RETRIED = (QueryRequest, RerankRequest, SearchRequest)  # idempotent: answering one twice changes nothing


class _Envelope(BaseModel):
    """Just the correlation id: replies to other clients are skipped without a full decode."""

    model_config = ConfigDict(extra="ignore")
    request_id: str


@dataclass(slots=True)
class _Pending:
    reply_model: type[BaseModel]
    future: Future[Any]
    expires_at: float  # monotonic; lets abandoned async requests be reaped
    topic: str = ""
    value: bytes = b""
    deadline: float = 0.0  # monotonic: no reply can help after it
    retry_at: float | None = None  # monotonic: when to send again for want of a reply (None: not retried)
    gap_s: float = RETRY_AFTER_S  # the wait before the next retry (doubles)
    sent_at: float = 0.0  # monotonic: the first send (latency) ...
    last_sent: float = 0.0  # ... and the latest
    acked: bool = False  # the latest send acknowledged by its partition's leader


def _settle(future: Future[Any], exc: BaseException | None = None, result: Any = None) -> None:
    """Complete a future unless the caller already cancelled it."""
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class ClientClosedError(RuntimeError):
    """The client was closed (or its reply reader died) before the reply arrived."""


class QueryClient:
    """Sends QueryRequests (and other request types) to the workers and returns their replies.

    Thread-safe: any number of threads may call :meth:`embed` / :meth:`request` at once.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        reply_topic: str | None = None,
        *,
        create_reply_topic: bool = True,
        partitions: int = DEFAULT_PARTITIONS,
        start_timeout_s: float = 30.0,
        send_block_s: float = 10.0,
        retry_after_s: float | None = RETRY_AFTER_S,
        own_reply_topic: str | None = None,
    ):
        """``retry_after_s``: when an idempotent request with no reply is sent again (None: never).
        ``own_reply_topic``: read replies on ``<reply topic>.<own_reply_topic>``, this client's alone (made
        here, deleted at ``close``) instead of a topic other clients read too."""
        self.settings = settings
        self.reply_topic = reply_topic or settings.topic_replies
        self.owns_reply_topic = bool(own_reply_topic)
        if own_reply_topic:
            self.reply_topic = f"{self.reply_topic}.{own_reply_topic}"
        self.retry_after_s = retry_after_s
        self.policy = RetryPolicy(retry_after_s or RETRY_AFTER_S)
        self.retries = 0  # requests sent again (no reply in time, or a send the broker never took)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._failure: BaseException | None = None
        check_kafka_access(settings, timeout_s=start_timeout_s)  # no broker: KafkaAccessError now, not a 30 s bootstrap
        self._consumer = self._start_consumer(create_reply_topic, partitions, start_timeout_s)
        try:  # acks=1: a request lost with its leader is sent again (``live_partitions``); a request the broker
            # has not taken within send_block_s (missing topic, broker away) fails, or is sent again
            self._producer = live_producer(settings, "embedstream-query-client", send_block_s)
            self._sender = LiveSender(self._producer, metadata_timeout_s=2.0, refresh_inline=False)  # reader refreshes
        except BaseException:
            self._consumer.close()
            raise
        self._reader = threading.Thread(target=self._read_replies, name=f"reply-reader:{self.reply_topic}", daemon=True)
        self._reader.start()

    def _start_consumer(self, create: bool, partitions: int, timeout_s: float) -> Consumer:
        """Assign all reply partitions at their end offsets, resolved now, before any request can be sent.

        librdkafka needs a ``group.id`` even for assigned partitions; it is never joined nor committed to."""
        consumer = Consumer(self.settings.librdkafka_config(
            **{"client.id": "embedstream-query-client", "group.id": f"embedstream-query-client-{uuid.uuid4().hex}",
               "enable.auto.commit": False, "enable.auto.offset.store": False,
               "fetch.wait.max.ms": self.settings.fetch_max_wait_ms}))
        try:
            ids = self._partition_ids(consumer, timeout_s)
            if not ids and create:
                ensure_topics(self.settings, partitions, topics=[self.reply_topic])
                deadline = time.monotonic() + timeout_s
                while not ids and time.monotonic() < deadline:
                    time.sleep(0.05)
                    ids = self._partition_ids(consumer, timeout_s)
            if not ids:
                raise RuntimeError(
                    f"reply topic {self.reply_topic!r} does not exist on {self.settings.bootstrap_servers} "
                    f"(create it, e.g. with embedstream.producers.topics.ensure_topics)"
                )
            assigned = []
            deadline = time.monotonic() + timeout_s
            for partition in ids:
                while True:  # a topic created a moment ago answers "not leader" until its leaders are known
                    left = max(0.1, deadline - time.monotonic())
                    try:
                        _low, high = consumer.get_watermark_offsets(TopicPartition(self.reply_topic, partition),
                                                                    timeout=min(5.0, left))
                        break
                    except KafkaException as exc:
                        error = exc.args[0] if exc.args else None
                        ready_later = error is not None and (error.retriable() or error.code() in _NOT_READY)
                        if not ready_later or time.monotonic() >= deadline:
                            raise RuntimeError(f"could not resolve the end offset of {self.reply_topic}[{partition}] "
                                               f"within {timeout_s:g} s: {exc}") from None
                        # ask the broker for the topic's leaders again: the client's cached metadata may still be
                        # the one from before the topic had leaders (seen: "not leader" for 30 s on a loaded host)
                        self._partition_ids(consumer, min(5.0, left))
                        time.sleep(0.1)
                assigned.append(TopicPartition(self.reply_topic, partition, high))
            consumer.assign(assigned)
        except BaseException:
            consumer.close()
            raise
        return consumer

    def _partition_ids(self, consumer: Consumer, timeout_s: float) -> list[int]:
        """The reply topic's partitions, or [] while the broker does not know the topic."""
        topic = consumer.list_topics(self.reply_topic, timeout=timeout_s).topics.get(self.reply_topic)
        if topic is None or topic.error is not None:
            return []
        return sorted(topic.partitions)

    # ------------------------------------------------------------------ requests

    def embed(
        self,
        text: str,
        model: str | None = None,
        dimensions: int | None = None,
        dtype: Dtype = "float32",
        timeout_s: float = 5.0,
        prompt: PromptKind | None = "query",
        sparse: bool = False,
        topic: str | None = None,
    ) -> QueryReply:
        """Embed one text on the online path (``sparse``: its sparse vector too, in ``reply.sparse``; ``topic``:
        another queries topic than the shared one, e.g. a collection's). A worker error comes back in
        ``reply.error``, not raised."""
        sent = now_ms()
        request = QueryRequest(
            request_id=uuid.uuid4().hex,
            text=text,
            model=model,
            dimensions=dimensions,
            dtype=dtype,
            prompt=prompt,
            sparse=sparse,
            reply_to=self.reply_topic,
            deadline_ms=sent + int(timeout_s * 1000),
            sent_at_ms=sent,
        )
        return self.request(topic or self.settings.topic_queries, request, QueryReply, timeout_s=timeout_s)

    def request(
        self,
        topic: str,
        payload: BaseModel,
        reply_model: type[R],
        request_id: str | None = None,
        timeout_s: float = 5.0,
    ) -> R:
        """Send payload to topic and wait for the reply_model record whose request_id matches.

        request_id defaults to ``payload.request_id``. Raises TimeoutError after timeout_s.
        """
        request_id = request_id or getattr(payload, "request_id", None)
        future = self.submit(topic, payload, reply_model, request_id=request_id, timeout_s=timeout_s)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:  # the wait ran out, or the reader expired the entry
            self._forget(request_id)  # type: ignore[arg-type]
            raise TimeoutError(
                f"no reply to request {request_id} within {timeout_s:g} s (sent to {topic!r}, waiting on "
                f"{self.reply_topic!r}); is a worker consuming {topic!r}?"
            ) from None

    def submit(
        self,
        topic: str,
        payload: BaseModel,
        reply_model: type[R],
        request_id: str | None = None,
        timeout_s: float = 5.0,
        retry: bool | None = None,
    ) -> Future[R]:
        """Asynchronous :meth:`request`: a Future of the reply (fails with TimeoutError if none comes).

        ``retry``: send again when no reply came (module docstring); None: for the idempotent ``RETRIED`` types."""
        request_id = request_id or getattr(payload, "request_id", None)
        if not request_id:
            raise ValueError("request_id is required (pass it, or use a payload with a request_id field)")
        reply_to = getattr(payload, "reply_to", self.reply_topic)
        if reply_to != self.reply_topic:
            raise ValueError(
                f"payload.reply_to is {reply_to!r} but this client reads {self.reply_topic!r}: the reply would be missed"
            )
        if getattr(payload, "deadline_ms", 0) is None:  # every request carries a deadline: the wait it gets
            payload = payload.model_copy(update={"deadline_ms": now_ms() + int(timeout_s * 1000)})
        future: Future[R] = Future()
        now = time.monotonic()
        retried = (isinstance(payload, RETRIED) if retry is None else retry) and self.retry_after_s is not None
        gap = self.policy.gap_s
        carried = getattr(payload, "deadline_ms", None)  # the workers shed a copy past it: none is sent after it
        answerable_s = timeout_s if carried is None else min(timeout_s, (carried - now_ms()) / 1000)
        pending = _Pending(reply_model, future, now + timeout_s + _EXPIRY_GRACE_S, topic, encode(payload),
                           now + answerable_s, now + gap if retried else None, gap, now, now)
        self.policy.sent()
        with self._lock:
            if self._closed.is_set() or self._failure is not None:
                raise ClientClosedError(self._closed_reason())
            if request_id in self._pending:
                raise ValueError(f"request {request_id} is already in flight")
            self._pending[request_id] = pending
        try:
            self._send(request_id, pending)
        except BaseException as exc:
            self._forget(request_id)
            if isinstance(exc, KafkaException):
                raise RuntimeError(f"sending request {request_id} to {topic!r} failed: {exc.args[0].str()}") from None
            raise
        return future

    def _send(self, request_id: str, pending: _Pending) -> None:
        def delivered(error, _message) -> None:  # runs on the reply reader (it polls the producer)
            if error is not None:
                self._on_send_failure(request_id, pending, error.str())
            elif sent == pending.last_sent:
                pending.acked = True

        pending.acked, pending.last_sent = False, time.monotonic()
        sent = pending.last_sent
        self._sender.send(pending.topic, pending.value, delivered)

    def _on_send_failure(self, request_id: str, pending: _Pending, reason: str) -> None:
        """A send the broker never took: sent again at once while a retry could still be answered, else failed."""
        with self._lock:
            if self._pending.get(request_id) is not pending:
                return  # answered (by another send), or given up
            if pending.retry_at is not None and time.monotonic() < pending.deadline - _LAST_SEND_S:
                pending.retry_at = time.monotonic()  # the reader sends it again now
                return
            self._pending.pop(request_id, None)
        _settle(pending.future, RuntimeError(f"sending request {request_id} to {pending.topic!r} failed: {reason}"))

    def _retry_due(self) -> None:
        """Send again, within their deadline and the budget, the requests whose send is stuck (unacknowledged after
        ``stuck_s``) or whose reply is overdue (on the reply reader)."""
        now, stuck_s = time.monotonic(), self.policy.stuck_s
        with self._lock:
            due = [(rid, p) for rid, p in self._pending.items() if p.retry_at is not None and
                   (p.retry_at <= now or (not p.acked and now - p.last_sent >= stuck_s))]
            for _rid, p in due:
                if now >= p.deadline - _LAST_SEND_S:
                    p.retry_at = None
                elif p.retry_at <= now:
                    p.retry_at, p.gap_s = now + p.gap_s * 2, p.gap_s * 2
        for rid, p in due:
            if p.retry_at is None or not self.policy.take():
                continue
            try:
                self._send(rid, p)
                self.retries += 1
            except (BufferError, KafkaException) as exc:  # tried again at the next turn
                log.debug("sending request %s again failed: %s", rid, exc)

    def _forget(self, request_id: str) -> _Pending | None:
        with self._lock:
            return self._pending.pop(request_id, None)

    def cancel(self, request_id: str) -> bool:
        """Stop waiting for a request's reply (its caller gave up); a late reply is then skipped.

        Returns whether it was still pending. Without it an abandoned request is reaped only after
        its timeout, which an HTTP gateway answering 504 early would otherwise hold open."""
        pending = self._forget(request_id)
        if pending is not None:
            pending.future.cancel()
        return pending is not None

    def prepare(self, topics: list[str]) -> None:
        """Load the producer's metadata for ``topics`` now: the first send to a topic otherwise blocks on it
        (up to ``send_block_s``), which an asyncio caller sending on its event loop must never do."""
        for topic in topics:
            self._producer.list_topics(topic, timeout=10.0)
            self._sender.pick(topic)  # its partition count, learned now

    def healthy(self) -> bool:
        """Open, and its reply reader still running (a dead reader fails every request)."""
        return not self._closed.is_set() and self._failure is None and self._reader.is_alive()

    # ------------------------------------------------------------------ reply reader

    def _read_replies(self) -> None:
        next_sweep, next_retry_check = time.monotonic() + _EXPIRY_GRACE_S, 0.0
        try:
            while not self._closed.is_set():
                first = self._consumer.poll(_POLL_TIMEOUT_S)
                if first is not None:  # then what else is already fetched, without waiting
                    for message in [first, *self._consumer.consume(_DRAIN_BATCH, 0)]:
                        if message.error() is None:
                            self._deliver(message.value())
                        elif message.error().fatal():
                            raise KafkaException(message.error())
                self._producer.poll(0)  # delivery reports: a failed send fails its request now
                if time.monotonic() >= next_retry_check:  # a scan of every pending request: 20 a second at most
                    self._retry_due()
                    next_retry_check = time.monotonic() + 0.05
                if time.monotonic() >= next_sweep:
                    self._expire()
                    self._sender.refresh()
                    self.policy.refresh()
                    next_sweep = time.monotonic() + _EXPIRY_GRACE_S
        except BaseException as exc:  # noqa: BLE001 - a dead reader must fail waiters, not hang them
            if not self._closed.is_set():
                log.exception("reply reader on %s stopped", self.reply_topic)
                with self._lock:
                    self._failure = exc
                self._fail_pending()

    def _deliver(self, value: bytes | None) -> None:
        if not value:
            return
        try:
            request_id = _Envelope.model_validate_json(value).request_id
        except ValidationError:
            log.debug("skipping a reply without request_id on %s", self.reply_topic)
            return
        pending = self._forget(request_id)
        if pending is None:
            return  # another client's reply, a second reply (a request sent again), or one after its timeout
        self.policy.answered(time.monotonic() - pending.sent_at)
        try:
            reply = decode(value, pending.reply_model)
        except DecodeError as exc:
            _settle(pending.future, exc)
        else:
            _settle(pending.future, result=reply)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            expired = [rid for rid, p in self._pending.items() if p.expires_at <= now]
            entries = [self._pending.pop(rid) for rid in expired]
        for rid, pending in zip(expired, entries):
            _settle(pending.future, TimeoutError(f"no reply to request {rid} on {self.reply_topic!r}"))

    def _fail_pending(self) -> None:
        with self._lock:
            entries = list(self._pending.values())
            self._pending.clear()
        for pending in entries:
            _settle(pending.future, ClientClosedError(self._closed_reason()))

    def _closed_reason(self) -> str:
        if self._failure is not None:
            return f"query client stopped: reply reader failed ({self._failure!r})"
        return "query client is closed"

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the reply reader, fail requests still waiting, close the Kafka clients. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._reader.join(timeout=timeout_s)
        self._fail_pending()
        try:
            self._producer.flush(timeout_s)
        finally:
            self._consumer.close()
            if self.owns_reply_topic:
                delete_topics(self.settings, [self.reply_topic], timeout_s)

    def __enter__(self) -> QueryClient:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.close()
