"""What a gateway deployment tunes: models it answers for, limits, overload bounds, deadlines."""

from __future__ import annotations

from dataclasses import dataclass

from embedstream.schemas.bounds import MAX_CANDIDATES


@dataclass
class GatewayOptions:
    model: str | None = None  # the embed workers' model (registry name or folder); None = settings.default_model
    rerank_model: str | None = None  # the rerank workers' cross-encoder; None = rerank routes answer 424
    max_inputs: int = 2048  # texts per embed request (OpenAI's own limit); more is 413
    max_documents: int = MAX_CANDIDATES  # per rerank request (the wire's bound); the worker's own (50) may be lower
    max_body_bytes: int = 8 * 1024 * 1024  # request body; more is 413 (read and discarded, never buffered)
    max_inflight: int = 4096  # Kafka requests awaiting a reply, per gateway; past it 429
    max_lag: int = 2000  # records the online lane's consumer group is behind; past it 429
    lag_interval_s: float = 1.0  # how often the lag is measured (one long-lived probe per lane)
    retry_after_s: int = 1
    default_timeout_s: float = 10.0  # deadline when the client sends none
    max_timeout_s: float = 60.0  # a client timeout above it (the openai SDK says 600 s) is capped here
    reply_topic: str | None = None  # None = settings.kafka.topic_replies
    # The reply reader's fetch long-poll: a reply ends it at once, so a longer wait costs no latency, but
    # it cuts the reader's empty fetches from 100/s to 10/s (idle CPU 11% -> 2.6%), GIL time the event
    # loop otherwise waited for (handler over the Kafka client alone: 0.3-0.5 instead of 0.65-0.8 ms p50).
    reply_fetch_wait_ms: int = 100
