"""The Qdrant sink: embedded chunks -> points, written idempotently, deletes applied in order.

Point ids are UUIDv5 of (doc_id, chunk_id), so a redelivered or re-produced chunk overwrites
itself instead of adding a point. A chunk can also be written without a forward pass, from what the
store holds (:class:`Reuse`, found by :mod:`embedstream.workers.unchanged`): its payload alone, or
another point's vectors under its id. Named vectors: "full" plus one "mrl_<d>" per configured
Matryoshka size, and with a sparse encoder its "sparse_<kind>" vector (the one the engine's row
carries) in the same point and the same upsert. Storage forms: float32, float16, uint8 (int8 shifted by 128, per-point scale kept
in the payload), or float32 with Qdrant's own scalar/binary quantization (rescored at search).
Ids, names and codecs are the layout's (:mod:`embedstream.vectors`), shared with the searcher.

Every point carries the identity of the embedding it was written under (``identity``: the engine's model and
sparse encoder, plus this sink's stored layout; :mod:`embedstream.engine.identity`); only a point of the same
identity is reused. A collection records the vector space it holds (its metadata) when the sink first uses
it: a sink of another space refuses it and names ``embedstream reindex``. A payload-only write applies only
while its point still holds what the lookup read (``Reuse.expect``); :meth:`QdrantSink.write_payloads`
returns the writes that lost that race.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from embedstream.engine.errors import ConfigError
from embedstream.engine.identity import EmbeddingIdentity, differences, model_identity
from embedstream.engine.model_spec import ModelSpec
from embedstream.schemas import ChunkEvent, DocumentDelete
from embedstream.vectors import (
    FULL,
    canonical_json,
    is_layout_key,
    matryoshka_cut,
    mrl_name,
    point_id,
    scale_key,
    sparse_modifier,
    sparse_name,
    sparse_of,
    stored_form,
)
from embedstream.vectorstore.base import AnySpec, AtLeast, CollectionConfigMismatch, Point, SparseSpec, VectorSpec, VectorStore
from embedstream.workers.trust import content_hash

__all__ = ["EmbeddedChunk", "QdrantSink", "Reuse", "ReusedChunk", "SinkConfig", "collection_vectors", "point_id"]

IDENTITY = "identity"  # payload key: the digest of the embedding identity the point was written under
METADATA_KEY = "embedstream"  # collection metadata key: the vector space the collection holds


@dataclass
class SinkConfig:
    datatype: str = "float32"  # float32 | float16 | uint8
    quantization: str = "none"  # none | scalar | binary
    matryoshka_dims: tuple[int, ...] = ()
    versioned: bool = False  # create the default collection as <name>_v1 behind alias <name>
    sparse: str | None = None  # the sparse encoder's kind ("bm25", "splade"): its vector is written too


@dataclass
class EmbeddedChunk:
    """A chunk event with its normalised full-size vector (an engine row: it may carry its sparse
    vector, :func:`embedstream.vectors.sparse_of`) and where it came from."""

    event: ChunkEvent
    vector: np.ndarray
    source: dict = field(default_factory=dict)  # topic, partition, offset


@dataclass(frozen=True)
class Reuse:
    """What the store holds that spares a chunk its forward pass (:meth:`QdrantSink.lookup`).

    ``same``: its point already holds its text, identity and metadata (nothing to write). ``payload``: its
    point holds its text and identity, its metadata changed (the payload alone is rewritten, while the point
    still holds ``expect``: the values read). ``vectors``: another point of its document holds its text and
    identity (those vectors are written under its id). ``layout``: the stored vectors' own payload keys
    (uint8 scales), which go with them."""

    kind: Literal["same", "payload", "vectors"]
    layout: dict = field(default_factory=dict)
    vectors: dict | None = None
    expect: dict = field(default_factory=dict)


@dataclass
class ReusedChunk:
    """A chunk event written without a forward pass, from what the store holds, and where it came from."""

    event: ChunkEvent
    reuse: Reuse
    source: dict = field(default_factory=dict)


SAME = Reuse("same")
PAYLOAD_INDEXES = ("doc_id", "content_hash")  # keyword indexes: a document's points, and its points of one text


def collection_vectors(spec: ModelSpec, hidden: int, config: SinkConfig) -> dict[str, AnySpec]:
    """Named vectors for a model: full size plus the configured Matryoshka sizes, and the sparse vector."""
    quant = None if config.quantization == "none" else config.quantization
    vectors = {FULL: VectorSpec(hidden, "cosine", config.datatype, quant)}
    for d in config.matryoshka_dims:
        if d not in spec.matryoshka_dims:
            raise ValueError(f"Matryoshka size {d} is not trained for model {spec.name!r} ({list(spec.matryoshka_dims)})")
        vectors[mrl_name(d)] = VectorSpec(d, "cosine", config.datatype, quant)
    if config.sparse is not None:
        vectors[sparse_name(config.sparse)] = SparseSpec(sparse_modifier(config.sparse))
    return vectors


# Payload keys the sink writes itself; the rest of a payload is the event's metadata.
_SINK_KEYS = frozenset({"doc_id", "chunk_id", "content_hash", "text", "model", "source", IDENTITY})


def user_metadata(payload: dict) -> dict:
    """A payload's metadata: what is neither the sink's own keys nor the layout's."""
    return {k: v for k, v in payload.items() if k not in _SINK_KEYS and not is_layout_key(k)}


def metadata_key(metadata: dict) -> str:
    """What metadata is compared by: typed canonical JSON (1, 1.0 and true differ; key order does not)."""
    return canonical_json(user_metadata(metadata))


def expectation(payload: dict) -> dict:
    """What a payload-only write expects its point to still hold: the text's hash, the identity, the vectors'
    layout keys and the source of the write that made the point (a later write changes at least that)."""
    source = payload.get("source") if isinstance(payload.get("source"), dict) else {}
    scalars = (str, int, float, bool)
    return {"content_hash": payload.get("content_hash"), IDENTITY: payload.get(IDENTITY), **layout_keys(payload),
            **{f"source.{k}": v for k, v in source.items() if isinstance(v, scalars)}}


def layout_keys(payload: dict) -> dict:
    """A payload's layout keys (uint8 scales): they belong to the point's vectors."""
    return {k: v for k, v in payload.items() if is_layout_key(k)}


def _next_version(collection: str) -> str:
    """The name a re-index of ``collection`` would write: ``docs_v1`` -> ``docs_v2``, ``docs`` -> ``docs_v2``."""
    base, _, number = collection.rpartition("_v")
    return f"{base}_v{int(number) + 1}" if base and number.isdigit() else f"{collection}_v2"


class QdrantSink:
    """Writes chunk points and applies deletes; ``wait=True`` so commits follow durable writes."""

    def __init__(self, store: VectorStore, spec: ModelSpec, hidden: int, default_collection: str, config: SinkConfig,
                 identity: EmbeddingIdentity | None = None):
        """``identity``: the engine's (``Engine.identity``: the model and the sparse encoder): then the sink records
        and checks the vector space of every collection it uses. Without it (a sink that only creates
        collections, a benchmark's), the model's alone is written, and collections are neither checked nor marked."""
        self.store = store
        self.spec = spec
        self.config = config
        self.default_collection = default_collection
        self.vectors = collection_vectors(spec, hidden, config)
        layout = {"datatype": config.datatype, "quantization": config.quantization,
                  "matryoshka": sorted(config.matryoshka_dims), "sparse_kind": config.sparse}
        self.identity = (identity or model_identity(spec)).with_parts({"layout": layout})
        self.checks_space = identity is not None
        self._ready: set[str] = set()

    def _collection(self, name: str | None) -> str:
        target = name or self.default_collection
        if target not in self._ready:
            if self.store.get_alias(target) is None:
                if self.config.versioned and target == self.default_collection and not self.store.collection_exists(target):
                    first = f"{target}_v1"  # readers and writers use the alias; reindex swaps it later
                    self.store.ensure_collection(first, self.vectors, payload_indexes=PAYLOAD_INDEXES)
                    self.store.set_alias(target, first)
                else:
                    self.store.ensure_collection(target, self.vectors, payload_indexes=PAYLOAD_INDEXES)
            if self.checks_space:
                self._check_space(target)
            self._ready.add(target)
        return target

    def _check_space(self, name: str) -> None:
        """The collection holds this sink's vector space, or none yet (then it is recorded as this one's)."""
        recorded = self.store.collection_metadata(name).get(METADATA_KEY) or {}
        if not recorded.get("space"):
            self.store.set_collection_metadata(name, {METADATA_KEY: {"space": dict(self.identity.space),
                                                                     "space_digest": self.identity.space_digest}})
            recorded = self.store.collection_metadata(name).get(METADATA_KEY) or {}  # two first writers: one wins
        if canonical_json(recorded.get("space")) != canonical_json(dict(self.identity.space)):
            changed = differences(recorded.get("space"), dict(self.identity.space))
            new = _next_version(self.store.resolve(name))
            raise CollectionConfigMismatch(
                f"collection {name!r} holds vectors of another embedding ({'; '.join(changed)}): its points and this "
                f"worker's would not be comparable. Re-index: run the workers of this configuration with "
                f"EMBEDSTREAM_QDRANT__COLLECTION={new}, then embedstream reindex --to-collection {new} "
                f"--alias <the alias readers use>; or run the configuration {name!r} was written with")

    def check_existing(self, name: str) -> None:
        """At start: refuse a collection that exists without a vector this sink writes (e.g. created
        before the sparse encoder was switched on), or that holds another embedding's vectors, with what to
        do, instead of failing every write."""
        if not self.store.exists(name):
            return
        have = self.store.get_vector_specs(name)
        missing = sorted(set(self.vectors) - set(have))
        if missing:
            raise ConfigError(
                f"collection {name!r} has no {', '.join(missing)} vector (it has {sorted(have)}): it was created "
                f"without them; re-index into a new collection (embedstream reindex --to-collection ...) or "
                f"run without EMBEDSTREAM_SPARSE__KIND")
        try:
            self._collection(name)
        except CollectionConfigMismatch as exc:
            hint = "" if "embedstream reindex" in str(exc) else (
                "; re-index into a new collection with this configuration (embedstream reindex --to-collection ...)")
            raise ConfigError(f"{exc}{hint}") from exc

    def resolve(self, name: str | None) -> str:
        """The collection an event's name (unset, a collection, an alias) reaches now."""
        return self.store.resolve(self._collection(name))

    def ensure(self, name: str) -> str:
        """Create ``name`` (a collection or an alias's target) with this model's vectors if missing."""
        return self._collection(name)

    def to_points(self, items: list[EmbeddedChunk | ReusedChunk]) -> list[Point]:
        """Points for a batch, in its order: an embedded chunk's storage forms are computed once on the
        stacked [N, D] matrix (the same functions, row-wise, that :func:`embedstream.vectors.named_vectors`
        applies to one vector), each point holding a row view; a reused chunk's are the stored ones. The
        store stacks the rows and makes its lists once per batch, so no per-float Python list is built
        here: 87 -> 20 µs per point at 384 dims + one mrl size."""
        embedded = iter(self._stored_forms([item for item in items if isinstance(item, EmbeddedChunk)]))
        points = []
        for item in items:
            vectors, layout = next(embedded) if isinstance(item, EmbeddedChunk) else (item.reuse.vectors, item.reuse.layout)
            points.append(Point(point_id(item.event.doc_id, item.event.chunk_id), vectors,
                                self.payload(item.event, item.source, layout)))
        return points

    def payload(self, event: ChunkEvent, source: dict, layout: dict) -> dict:
        """A chunk's whole payload: its metadata, its vectors' layout keys and the sink's own keys."""
        return {**event.metadata, **layout, "doc_id": event.doc_id, "chunk_id": event.chunk_id,
                "content_hash": content_hash(event.text), "text": event.text, "model": self.spec.name,
                IDENTITY: self.identity.digest, "source": source}

    def _stored_forms(self, items: list[EmbeddedChunk]) -> list[tuple[dict, dict]]:
        """(named vectors, layout keys) per embedded chunk."""
        if not items:
            return []
        full = np.stack([item.vector for item in items]).astype(np.float32, copy=False)
        columns: dict[str, np.ndarray] = {}
        scales: dict[str, np.ndarray] = {}
        for name, matrix in ((FULL, full), *((mrl_name(d), matryoshka_cut(full, d)) for d in self.config.matryoshka_dims)):
            columns[name], scale = stored_form(matrix, self.config.datatype)
            if scale is not None:
                scales[scale_key(name)] = scale
        sparse = sparse_name(self.config.sparse) if self.config.sparse is not None else None
        out = []
        for row, item in enumerate(items):
            vectors = {k: v[row] for k, v in columns.items()}
            if sparse is not None and sparse_of(item.vector) is not None:
                vectors[sparse] = sparse_of(item.vector)
            out.append((vectors, {key: float(values[row]) for key, values in scales.items()}))
        return out

    def upsert(self, items: list[EmbeddedChunk | ReusedChunk]) -> int:
        """Upsert per target collection, in order; raises on failure so the caller does not commit."""
        for collection, members in self.by_collection(items):
            self.store.upsert(collection, self.to_points(members), wait=True)
        return len(items)

    def write_payloads(self, items: list[ReusedChunk]) -> list[ReusedChunk]:
        """Rewrite the payload of each chunk's point (its vectors and their layout keys kept), per target
        collection, each only while its point still holds what the lookup read (``Reuse.expect``); raises on
        failure so the caller does not commit. Returns the chunks whose point no longer held it (read back
        after the write): a lost race, which the caller embeds and upserts whole, never a torn point."""
        lost: list[ReusedChunk] = []
        for collection, members in self.by_collection(items):
            payloads = {point_id(i.event.doc_id, i.event.chunk_id): self.payload(i.event, i.source, i.reuse.layout)
                        for i in members}
            self.store.overwrite_payloads(collection, payloads, wait=True,
                                          expect={point_id(i.event.doc_id, i.event.chunk_id): i.reuse.expect
                                                  for i in members})
            held = self.store.get_payloads(collection, list(payloads))
            lost += [i for i in members if canonical_json(held.get(point_id(i.event.doc_id, i.event.chunk_id)))
                     != canonical_json(payloads[point_id(i.event.doc_id, i.event.chunk_id)])]
        return lost

    def by_collection(self, items: list) -> list[tuple[str, list]]:
        """Items (each with an ``event``) in runs of one target collection (created if missing), in order: a
        point reached under two names is written in the order of its events."""
        runs: list[tuple[str, list]] = []
        for item in items:
            target = self._collection(item.event.collection)
            if runs and runs[-1][0] == target:
                runs[-1][1].append(item)
            else:
                runs.append((target, [item]))
        return runs

    def delete(self, event: DocumentDelete) -> None:
        collection = self._collection(event.collection)
        if event.chunk_ids is not None:
            self.store.delete_points(collection, [point_id(event.doc_id, c) for c in event.chunk_ids])
        elif event.from_chunk is not None:  # the tail, in one request: no scroll of the document's points
            self.store.delete_where(collection, {"doc_id": event.doc_id, "chunk_id": AtLeast(event.from_chunk)})
        else:
            self.store.delete_where(collection, {"doc_id": event.doc_id})

