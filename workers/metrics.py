"""Prometheus metrics of a worker: every stage timed apart, lanes and models labelled.

Names follow text-embeddings-inference's spirit (queue, tokenization, inference, batch size and
tokens) under the ``embedstream_`` prefix; docs/operations/metrics.md lists them all. Each worker owns a registry
so several workers can live in one process (tests, all-in-one deployments).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_MS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
STAGES = ("queue_wait", "tokenize", "forward", "pool", "upsert", "search", "rerank", "reply")


class WorkerMetrics:
    """All metrics of one worker process."""

    def __init__(self, registry: CollectorRegistry | None = None, model: str = ""):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.model = model
        self.stage = Histogram("embedstream_stage_duration_seconds", "Time spent per pipeline stage",
                               ["stage", "lane"], buckets=_MS_BUCKETS, registry=r)
        self.texts = Counter("embedstream_texts_total", "Texts embedded or scored", ["lane", "kind"], registry=r)
        self.tokens = Counter("embedstream_tokens_total", "Real tokens run through the model", ["lane"], registry=r)
        self.batch_size = Histogram("embedstream_batch_size", "Sequences per forward pass", ["lane"],
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512), registry=r)
        self.batch_tokens = Histogram("embedstream_batch_tokens", "Real tokens per forward pass", ["lane"],
                                      buckets=(16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768), registry=r)
        self.padding = Gauge("embedstream_padding_fraction", "Share of computed tokens that were padding (packed path: 0)",
                             ["lane"], registry=r)
        self.queue_items = Gauge("embedstream_queue_items", "Records decoded and waiting for a batch", ["lane"], registry=r)
        self.queue_tokens = Gauge("embedstream_queue_tokens", "Tokens waiting for a batch", ["lane"], registry=r)
        self.consumer_lag = Gauge("embedstream_consumer_lag", "Records behind the log end, per lane", ["lane"], registry=r)
        self.dead_letters = Counter("embedstream_dead_letters_total", "Records sent to the dead-letter topic",
                                    ["lane", "code"], registry=r)
        self.errors = Counter("embedstream_request_errors_total", "Requests answered with an error", ["lane", "code"],
                              registry=r)
        self.sink_failures = Counter("embedstream_sink_failures_total", "Failed sink writes (retried)", registry=r)
        # Staged embed worker (workers/stages.py): where each stage's thread spends its time, so a
        # run shows which stage sets the pace (busy ~1) and whether the model waits for work (idle).
        self.stage_busy = Counter("embedstream_stage_busy_seconds_total",
                                  "Seconds a worker stage spent working (intake, model, output)", ["stage"], registry=r)
        self.stage_idle = Counter("embedstream_stage_idle_seconds_total",
                                  "Seconds a worker stage waited for work (the model stage: the device idle)", ["stage"],
                                  registry=r)
        self.stage_blocked = Counter("embedstream_stage_blocked_seconds_total",
                                     "Seconds a worker stage waited for room in the next stage's bounded queue",
                                     ["stage"], registry=r)
        # Incremental re-embedding (workers/unchanged.py): what the store already held spared these.
        self.forward_passes_avoided = Counter(
            "embedstream_forward_passes_avoided_total", "Chunks finished or written without a forward pass, by reason: "
            "unchanged (their point holds the same text, model and metadata), metadata (their payload alone was "
            "rewritten), moved (another point of the document lent its vectors)", ["lane", "reason"], registry=r)
        self.payload_updates = Counter("embedstream_payload_updates_total",
                                       "Points whose payload alone was rewritten (metadata-only changes)", ["lane"],
                                       registry=r)
        self.payload_races = Counter(
            "embedstream_payload_races_total", "Metadata-only writes whose point changed between the lookup and the "
            "write (a write of the other lane, under another collection name, or an old owner's late one): left "
            "unwritten, then embedded and upserted whole unless their partition moved on", ["lane"], registry=r)
        self.change_chunks_embedded = Histogram(
            "embedstream_change_chunks_embedded", "Chunks of one document sent through the model per change "
            "(the document's chunk events in one batch)", ["lane"],
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128), registry=r)

        # Admission control (workers/admission.py): the window, predicted vs observed pass, queue age, shed requests.
        self.window_ms = Gauge("embedstream_batching_window_ms", "Batching window the lane's controller allows now",
                               ["lane"], registry=r)
        self.pass_ms = Histogram("embedstream_pass_compute_seconds", "A pass's compute time, predicted before and "
                                 "observed after", ["lane", "kind"], buckets=_MS_BUCKETS, registry=r)
        self.queue_age = Gauge("embedstream_queue_oldest_age_seconds", "Age of the oldest request when its batch formed",
                               ["lane"], registry=r)
        self.shed = Counter("embedstream_shed_total", "Requests answered deadline_exceeded without compute",
                            ["lane", "reason"], registry=r)

    def observe_pass(self, lane: str, window_ms: float, predicted_ms: float, observed_ms: float) -> None:
        self.window_ms.labels(lane=lane).set(window_ms)
        self.pass_ms.labels(lane=lane, kind="predicted").observe(predicted_ms / 1000)
        self.pass_ms.labels(lane=lane, kind="observed").observe(observed_ms / 1000)

    def observe_stage(self, stage: str, lane: str, ms: float) -> None:
        self.stage.labels(stage=stage, lane=lane).observe(ms / 1000)

    def observe_batch(self, lane: str, timings, size: int) -> None:
        self.observe_stage("forward", lane, timings.forward_ms)
        self.observe_stage("pool", lane, timings.pool_ms)
        self.tokens.labels(lane=lane).inc(timings.tokens)
        self.batch_size.labels(lane=lane).observe(size)
        self.batch_tokens.labels(lane=lane).observe(timings.tokens)
        self.padding.labels(lane=lane).set(0.0)

    def queue_depth(self, lane: str, items: int, tokens: int) -> None:
        self.queue_items.labels(lane=lane).set(items)
        self.queue_tokens.labels(lane=lane).set(tokens)

    def lag(self, lane: str, consumer) -> int:
        """Consumer lag from the client's own fetch metadata (no extra broker round trip); returns it."""
        if hasattr(consumer, "lag"):  # RdConsumer (librdkafka) keeps its own
            total = consumer.lag()
            self.consumer_lag.labels(lane=lane).set(total)
            return total
        total = 0
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            if highwater is None:
                continue
            try:  # the client's cached position; the public position() may block on the network
                position = consumer._subscription.assignment[tp].position
                offset = position.offset if position is not None else None
            except (AttributeError, KeyError):
                offset = None
            if offset is not None:
                total += max(0, highwater - offset)
        self.consumer_lag.labels(lane=lane).set(total)
        return total


class CdcMetrics:
    """Metrics of the CDC bridge (Debezium topic -> chunk topic)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter("embedstream_cdc_events_total", "Change events applied, by Debezium op (tombstone included)",
                              ["op"], registry=r)
        self.chunks = Counter("embedstream_cdc_chunks_published_total", "ChunkEvents published by the CDC bridge",
                              registry=r)
        self.deletes = Counter("embedstream_cdc_deletes_published_total", "DocumentDeletes published by the CDC bridge",
                               registry=r)
        self.dead_letters = Counter("embedstream_dead_letters_total", "Records sent to the dead-letter topic",
                                    ["lane", "code"], registry=r)
        self.publish_failures = Counter("embedstream_cdc_publish_failures_total",
                                        "Failed publishes to the chunk topic (retried)", registry=r)
        self.filled = Counter("embedstream_cdc_unavailable_filled_total",
                              "Values the source left out (unchanged TOAST) filled in from the documents log", registry=r)
        self.skipped = Counter("embedstream_cdc_skipped_total", "Records that change no document (heartbeats, "
                               "transaction metadata, schema changes, ignored truncates), by kind", ["kind"], registry=r)
        self.consumer_lag = Gauge("embedstream_consumer_lag", "Records behind the log end, per lane", ["lane"], registry=r)

    def lag(self, lane: str, consumer) -> int:
        return WorkerMetrics.lag(self, lane, consumer)  # type: ignore[arg-type] - same gauge name and logic
