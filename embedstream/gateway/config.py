"""What a gateway deployment tunes: models it answers for, limits, overload bounds, deadlines, truncation."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from embedstream.schemas.bounds import MAX_CANDIDATES


class GatewayOptions(BaseModel):
    """The gateway's settings (``embedstream gateway --help`` shows each as an option)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: str | None = Field(default=None, description="The embed workers' model (registry name or folder); None = "
                              "EMBEDSTREAM_DEFAULT_MODEL")
    rerank_model: str | None = Field(default=None, description="The rerank workers' cross-encoder; None = the rerank "
                                     "routes answer 424")
    max_inputs: int = Field(default=2048, ge=1, description="Texts per embed request (OpenAI's own limit); more is 413")
    max_documents: int = Field(default=MAX_CANDIDATES, ge=1, description="Documents per rerank request (the wire's "
                               "bound); the rerank worker's own (50) may be lower")
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1, description="Request body size; more is 413 (read and "
                                "discarded, never buffered)")
    max_inflight: int = Field(default=4096, ge=1, description="Kafka requests awaiting a reply, per gateway; past it 429")
    max_lag: int = Field(default=2000, ge=0, description="Records the online lane's consumer group is behind; past it 429")
    lag_interval_s: float = Field(default=1.0, gt=0, description="How often the lag is measured (one long-lived probe "
                                  "per lane)")
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After of a 429")
    default_timeout_s: float = Field(default=10.0, gt=0, description="Deadline (s) when the client sends none")
    max_timeout_s: float = Field(default=60.0, gt=0, description="Cap (s) on a client's timeout (the openai SDK says "
                                 "600 s)")
    reply_topic: str | None = Field(default=None, description="Reply topic of this gateway; None = "
                                    "EMBEDSTREAM_KAFKA__TOPIC_REPLIES")
    own_reply_topic: bool = Field(default=True, description="Read the replies on a topic of this gateway's own, "
                                  "<reply topic>.<host>-<pid> (made at start, deleted at stop), so N gateways do not "
                                  "each read all N gateways' replies; off: on the reply topic itself")
    # The reply reader's fetch long-poll: a reply ends it at once, so a longer wait costs no latency, but
    # it cuts the reader's empty fetches from 100/s to 10/s (idle CPU 11% -> 2.6%), GIL time the event
    # loop otherwise waited for (handler over the Kafka client alone: 0.3-0.5 instead of 0.65-0.8 ms p50).
    reply_fetch_wait_ms: int = Field(default=100, ge=1, description="The reply reader's fetch long-poll (ms)")
    auto_truncate: bool = Field(default=True, description="TEI's --auto-truncate: an over-long input is cut to the "
                                "model's limit when the request does not say (TEI's truncate, OpenAI's routes, which "
                                "have no such field); off: it is refused (422 on TEI's routes, 400 on OpenAI's). "
                                "Cohere's truncate defaults to END whatever this says")
