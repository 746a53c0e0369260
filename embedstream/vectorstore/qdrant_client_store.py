"""VectorStore over ``qdrant_client.QdrantClient``.

One implementation serves two uses: a Qdrant server (production: url, api_key,
timeout) and qdrant-client's local mode (``":memory:"`` or a path; tests).
Local mode stores but ignores datatypes, quantization and payload indexes and
searches by brute force, which is fine for tests and tiny setups only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from qdrant_client import QdrantClient, models

from ._util import (
    check_top_k,
    check_vector_name,
    conditions,
    holds,
    prepare_batch,
    sorted_points,
)
from .base import (
    AliasError,
    CollectionConfigMismatch,
    CollectionNotFound,
    FilterValue,
    Hit,
    Point,
    Prefetch,
    SparseSpec,
    SparseVector,
    VectorLike,
    VectorSpec,
    VectorStore,
    as_float_list,
    dense_specs,
    describe_mismatch,
    normalize_id,
    quant_oversampling,
    sparse_specs,
    validate_name,
)

_DISTANCE_TO_QDRANT = {
    "cosine": models.Distance.COSINE,
    "dot": models.Distance.DOT,
    "euclid": models.Distance.EUCLID,
}
_DISTANCE_FROM_QDRANT = {v: k for k, v in _DISTANCE_TO_QDRANT.items()}
_DATATYPE_TO_QDRANT = {
    "float32": models.Datatype.FLOAT32,
    "float16": models.Datatype.FLOAT16,
    "uint8": models.Datatype.UINT8,
}
_DATATYPE_FROM_QDRANT = {v: k for k, v in _DATATYPE_TO_QDRANT.items()}

_MODIFIER_TO_QDRANT = {None: None, "idf": models.Modifier.IDF}
_SCROLL_PAGE = 1024


def _to_qdrant(vector: Any) -> Any:
    """A query or stored vector as qdrant-client takes it: a list, or its SparseVector."""
    if isinstance(vector, SparseVector):
        return models.SparseVector(indices=vector.indices.tolist(), values=vector.values.tolist())
    return as_float_list(vector) if not isinstance(vector, list) else vector


def _search_params(spec: Any, exact: bool = False) -> models.SearchParams | None:
    """Rescoring with the original vectors where a vector is quantized, an exact scan where asked (local mode is
    brute force and warns on every call given search params: callers skip it there)."""
    kind = getattr(spec, "quantization", None)
    if kind is None:
        return models.SearchParams(exact=True) if exact else None
    return models.SearchParams(
        exact=exact, quantization=models.QuantizationSearchParams(rescore=True, oversampling=quant_oversampling(kind)))


def _from_qdrant(vector: Any) -> Any:
    if isinstance(vector, models.SparseVector):
        return SparseVector.of(vector.indices, vector.values)
    return list(vector)
_SPEC_TTL_S = 10.0


def _quantization_config(kind: str | None) -> models.QuantizationConfig | None:
    if kind is None:
        return None
    if kind == "scalar":
        return models.ScalarQuantization(
            scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
        )
    if kind == "binary":
        return models.BinaryQuantization(binary=models.BinaryQuantizationConfig(always_ram=True))
    raise ValueError(f"unsupported quantization {kind!r}")


def _quantization_kind(cfg: Any) -> str | None:
    if cfg is None:
        return None
    if isinstance(cfg, models.ScalarQuantization):
        return "scalar"
    if isinstance(cfg, models.BinaryQuantization):
        return "binary"
    return type(cfg).__name__  # product / turbo: not expressible as VectorSpec -> mismatch


def _build_filter(filter: Mapping[str, FilterValue] | None, ids: Sequence[str] | None = None) -> models.Filter | None:
    """An AND of ``field == value`` conditions (a list: any of; a float: the range [v, v]) and, with ``ids``, of
    being one of these points (an empty ``ids`` matches nothing)."""
    must: list[models.Condition] = [] if ids is None else [
        models.HasIdCondition(has_id=list(dict.fromkeys(normalize_id(i) for i in ids)))]
    for kind, field, val in conditions(filter):
        if kind == "any":
            must.append(models.FieldCondition(key=field, match=models.MatchAny(any=val)))
        elif kind == "value":
            must.append(models.FieldCondition(key=field, match=models.MatchValue(value=val)))
        elif kind == "at_least":
            must.append(models.FieldCondition(key=field, range=models.Range(gte=val)))
        else:
            must.append(models.FieldCondition(key=field, range=models.Range(gte=val, lte=val)))
    return models.Filter(must=must) if must else None


class QdrantClientStore(VectorStore):
    """Qdrant server or qdrant-client local mode behind the VectorStore contract.

    Aliases are Qdrant's own (``update_collection_aliases``: one atomic call with
    delete+create), so a server switch is atomic for every client. Searches always
    send ``rescore=True`` with oversampling: Qdrant applies them to quantized vectors
    only and ignores them otherwise, which saves a config round trip per query.
    """

    def __init__(self, client: QdrantClient) -> None:
        self.client = client
        self.collection_options: dict = {}  # a cluster's shard_number, replication_factor, write_consistency_factor
        self._spec_cache: dict[str, tuple[float, dict[str, VectorSpec]]] = {}
        try:
            from qdrant_client.local.qdrant_local import QdrantLocal

            self.is_local = isinstance(getattr(client, "_client", None), QdrantLocal)
        except ImportError:  # pragma: no cover - layout of qdrant-client changed
            self.is_local = False

    # ---- constructors ----------------------------------------------------------------
    @classmethod
    def connect(cls, url: str, api_key: str | None = None, timeout: float | None = 30.0) -> "QdrantClientStore":
        """Qdrant server at ``url`` (http(s)://host:6333)."""
        return cls(QdrantClient(url=url, api_key=api_key, timeout=int(timeout) if timeout else None))

    @classmethod
    def in_memory(cls) -> "QdrantClientStore":
        """Throw-away local-mode store for tests."""
        return cls(QdrantClient(location=":memory:"))

    @classmethod
    def local_path(cls, path: str) -> "QdrantClientStore":
        """Local mode persisted under ``path`` (slow writes: it rewrites storage per batch)."""
        return cls(QdrantClient(path=path))

    # ---- helpers ---------------------------------------------------------------------
    def _collection_names(self) -> set[str]:
        return {c.name for c in self.client.get_collections().collections}

    def _not_found(self, name: str, exc: Exception) -> Exception:
        """Map backend 'not found' errors (ValueError local, 404 server) to CollectionNotFound."""
        try:
            missing = name not in self._collection_names() and self.get_alias(name) is None
        except Exception:  # keep the original error if even the check fails
            return exc
        if missing:
            return CollectionNotFound(f"no collection or alias named {name!r}")
        return exc

    def _specs_of(self, info: models.CollectionInfo, name: str) -> dict[str, VectorSpec]:
        params = info.config.params
        vectors = params.vectors
        if vectors is None:
            return {}
        if isinstance(vectors, models.VectorParams):
            vectors = {"": vectors}
        default_q = _quantization_kind(info.config.quantization_config)
        specs: dict[str, VectorSpec] = {}
        for vname, vp in vectors.items():
            distance = _DISTANCE_FROM_QDRANT.get(vp.distance)
            datatype = _DATATYPE_FROM_QDRANT.get(vp.datatype or models.Datatype.FLOAT32)
            quant = _quantization_kind(vp.quantization_config) if vp.quantization_config else default_q
            try:
                specs[vname] = VectorSpec(size=vp.size, distance=distance, datatype=datatype, quantization=quant)  # type: ignore[arg-type]
            except ValueError as exc:
                raise CollectionConfigMismatch(
                    f"collection {name!r} vector {vname!r} uses a config embedstream cannot express "
                    f"(distance={vp.distance}, datatype={vp.datatype}, quantization={quant}): {exc}"
                ) from exc
        for vname, sp in (params.sparse_vectors or {}).items():
            modifier = "idf" if sp.modifier == models.Modifier.IDF else None
            specs[vname] = SparseSpec(modifier)  # type: ignore[assignment]
        return specs

    # ---- collections -----------------------------------------------------------------
    def collection_exists(self, name: str) -> bool:
        return name in self._collection_names()

    def list_collections(self) -> list[str]:
        return sorted(self._collection_names())

    def get_vector_specs(self, name: str) -> dict[str, VectorSpec]:
        try:
            info = self.client.get_collection(name)
        except Exception as exc:
            raise self._not_found(name, exc) from exc
        return self._specs_of(info, name)

    def _cached_specs(self, name: str) -> dict[str, VectorSpec]:
        """Specs for validating upserts without a config round trip per batch.

        Short TTL because another process may switch an alias; the server still
        rejects wrong dimensions, so staleness only weakens the early check.
        """
        now = time.monotonic()
        hit = self._spec_cache.get(name)
        if hit is not None and now - hit[0] < _SPEC_TTL_S:
            return hit[1]
        specs = self.get_vector_specs(name)
        self._spec_cache[name] = (now, specs)
        return specs

    def ensure_collection(
        self,
        name: str,
        vectors: Mapping[str, VectorSpec],
        payload_indexes: Iterable[str] = ("doc_id",),
    ) -> bool:
        validate_name(name)
        wanted = dict(vectors)
        if not wanted:
            raise ValueError("a collection needs at least one named vector")
        indexes = list(payload_indexes)
        if self.get_alias(name) is not None:
            raise AliasError(f"{name!r} is an alias; ensure_collection needs a collection name")
        self._spec_cache.clear()
        created = False
        if not self.collection_exists(name):
            try:
                self.client.create_collection(
                    collection_name=name,
                    vectors_config={
                        vname: models.VectorParams(
                            size=spec.size,
                            distance=_DISTANCE_TO_QDRANT[spec.distance],
                            datatype=_DATATYPE_TO_QDRANT[spec.datatype],
                            quantization_config=_quantization_config(spec.quantization),
                        )
                        for vname, spec in dense_specs(wanted).items()
                    },
                    sparse_vectors_config={
                        vname: models.SparseVectorParams(modifier=_MODIFIER_TO_QDRANT[spec.modifier])
                        for vname, spec in sparse_specs(wanted).items()
                    } or None,
                    **self.collection_options,
                )
                created = True
            except Exception:
                # Another worker may have created it between the check and the call;
                # fall through to the config comparison, re-raise if it still is missing.
                if not self.collection_exists(name):
                    raise
        if not created:
            existing = self.get_vector_specs(name)
            if existing != wanted:
                raise CollectionConfigMismatch(describe_mismatch(name, existing, wanted))
        self._ensure_payload_indexes(name, indexes)
        return created

    def _ensure_payload_indexes(self, name: str, fields: Sequence[str]) -> None:
        if self.is_local or not fields:
            return  # local mode ignores payload indexes (and warns on each call)
        schema = self.client.get_collection(name).payload_schema or {}
        for field in fields:
            if field not in schema:
                self.client.create_payload_index(
                    collection_name=name,
                    field_name=field,
                    field_schema=models.PayloadSchemaType.KEYWORD,
                    wait=True,
                )

    def delete_collection(self, name: str) -> bool:
        self._spec_cache.clear()
        if not self.collection_exists(name):
            return False
        # Drop its aliases explicitly so no alias is left dangling (server and local behave alike).
        ops = [
            models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=a))
            for a, target in self.list_aliases().items()
            if target == name
        ]
        if ops:
            self.client.update_collection_aliases(change_aliases_operations=ops)
        return bool(self.client.delete_collection(name))

    # ---- points ----------------------------------------------------------------------
    def upsert(self, name: str, points: Sequence[Point], wait: bool = True) -> None:
        if not points:
            return
        specs = self._cached_specs(name)
        structs = [
            models.PointStruct(id=pid, vector={k: _to_qdrant(v) for k, v in vecs.items()}, payload=payload)
            for pid, vecs, payload in prepare_batch(points, specs)
        ]
        self.client.upsert(collection_name=name, points=structs, wait=wait)

    def overwrite_payloads(self, name: str, payloads: Mapping[str, Mapping[str, Any]], wait: bool = True,
                           expect: Mapping[str, Mapping[str, FilterValue]] | None = None) -> None:
        """Server: one batch of updates, each by a filter on its point's id and ``expect`` values (Qdrant applies
        an update operation whole, in order with the shard's other updates). Local mode: the points that exist
        and hold the expected values, by id (local mode runs one call at a time)."""
        if not payloads:
            return
        wanted = {normalize_id(pid): dict(payload) for pid, payload in payloads.items()}
        expect = {normalize_id(pid): values for pid, values in (expect or {}).items()}
        if self.is_local:  # a filter is a scan of every point there: select the points that exist by id
            existing = self.get_payloads(name, list(wanted))
            ops = [models.OverwritePayloadOperation(overwrite_payload=models.SetPayload(payload=payload, points=[pid]))
                   for pid, payload in wanted.items() if pid in existing and holds(existing[pid], expect.get(pid, {}))]
        else:  # a has_id filter (indexed) matches nothing for an id with no point, where a points list fails
            ops = [models.OverwritePayloadOperation(overwrite_payload=models.SetPayload(
                payload=payload, filter=_build_filter(expect.get(pid), ids=[pid])))
                for pid, payload in wanted.items()]
        if not ops:
            return
        try:
            self.client.batch_update_points(collection_name=name, update_operations=ops, wait=wait)
        except Exception as exc:
            raise self._not_found(name, exc) from exc

    def delete_points(self, name: str, ids: Sequence[str]) -> None:
        if not ids:
            return
        pids = [normalize_id(i) for i in ids]
        try:
            self.client.delete(collection_name=name, points_selector=models.PointIdsList(points=pids), wait=True)
        except Exception as exc:
            raise self._not_found(name, exc) from exc

    def delete_where(self, name: str, filter: Mapping[str, FilterValue]) -> None:
        flt = _build_filter(filter)
        try:
            self.client.delete(collection_name=name, points_selector=models.FilterSelector(filter=flt), wait=True)
        except Exception as exc:
            raise self._not_found(name, exc) from exc

    def count(self, name: str, exact: bool = True) -> int:
        try:
            return int(self.client.count(collection_name=name, exact=exact).count)
        except Exception as exc:
            raise self._not_found(name, exc) from exc

    def scroll(
        self,
        name: str,
        field: str | None = None,
        value: FilterValue | None = None,
        with_vectors: bool = False,
        filter: Mapping[str, FilterValue] | None = None,
    ) -> list[Point]:
        flt = _build_filter({**(filter or {}), **({field: value} if field is not None else {})})
        out: list[Point] = []
        offset: Any = None
        while True:
            try:
                records, offset = self.client.scroll(
                    collection_name=name,
                    scroll_filter=flt,
                    limit=_SCROLL_PAGE,
                    offset=offset,
                    with_payload=True,
                    with_vectors=with_vectors,
                )
            except Exception as exc:
                raise self._not_found(name, exc) from exc
            for r in records:
                vecs: dict[str, Any] = {}
                if with_vectors and isinstance(r.vector, dict):
                    vecs = {k: _from_qdrant(v) for k, v in r.vector.items()}
                out.append(Point(id=normalize_id(r.id), vectors=vecs, payload=dict(r.payload or {})))
            if offset is None:
                break
        return sorted_points(out)

    def get_payloads(self, name: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        pids = list(dict.fromkeys(normalize_id(i) for i in ids))
        try:
            records = self.client.retrieve(collection_name=name, ids=pids, with_payload=True, with_vectors=False)
        except Exception as exc:
            raise self._not_found(name, exc) from exc
        return {normalize_id(r.id): dict(r.payload or {}) for r in records}

    def get_vectors(self, name: str, ids: Sequence[str], vector_name: str) -> dict[str, Any]:
        if not ids:
            return {}
        check_vector_name(self._cached_specs(name), vector_name, name)
        pids = list(dict.fromkeys(normalize_id(i) for i in ids))
        try:
            records = self.client.retrieve(collection_name=name, ids=pids, with_payload=False, with_vectors=[vector_name])
        except Exception as exc:
            raise self._not_found(name, exc) from exc
        return {normalize_id(r.id): _from_qdrant(r.vector[vector_name]) for r in records
                if isinstance(r.vector, dict) and vector_name in r.vector}

    def search(
        self,
        name: str,
        vector_name: str,
        vector: VectorLike,
        top_k: int,
        filter: Mapping[str, FilterValue] | None = None,
        prefetch: Sequence[Prefetch] | None = None,
        ids: Sequence[str] | None = None,
        exact: bool = False,
    ) -> list[Hit]:
        check_top_k(top_k)
        flt = _build_filter(filter, ids)
        # Local mode is brute force (exact) and warns on every call if given search params.
        specs = None if self.is_local else self._cached_specs(name)
        params = None if specs is None else _search_params(specs.get(vector_name), exact)
        pf = None
        if prefetch:
            pf = [
                models.Prefetch(
                    query=_to_qdrant(p.vector), using=p.vector_name, limit=int(p.limit), filter=flt,
                    params=None if specs is None else _search_params(specs.get(p.vector_name), exact),
                )
                for p in prefetch
            ]
        try:
            res = self.client.query_points(
                collection_name=name,
                query=_to_qdrant(vector),
                using=vector_name,
                prefetch=pf,
                query_filter=flt,
                search_params=params,
                limit=top_k,
                with_payload=True,
                with_vectors=False,
            )
        except Exception as exc:
            err = self._not_found(name, exc)
            if err is exc:
                # Give the same error as the edge backend for a wrong vector name.
                specs = self.get_vector_specs(name)
                check_vector_name(specs, vector_name, name)
                for p in prefetch or ():
                    check_vector_name(specs, p.vector_name, name)
            raise err from exc
        return [
            Hit(id=normalize_id(p.id), score=float(p.score), payload=dict(p.payload or {}), vector_name=vector_name)
            for p in res.points
        ]

    # ---- collection metadata -----------------------------------------------------------
    def collection_metadata(self, name: str) -> dict[str, Any]:
        try:
            info = self.client.get_collection(self.resolve(name))
        except Exception as exc:
            raise self._not_found(name, exc) from exc
        return dict(info.config.metadata or {})

    def set_collection_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        """Qdrant's collection metadata (an update merges the keys given)."""
        try:
            self.client.update_collection(collection_name=self.resolve(name), metadata=dict(metadata))
        except Exception as exc:
            raise self._not_found(name, exc) from exc

    def search_batch(self, name: str, vector_name: str, vectors: Sequence[VectorLike], top_k: int,
                     exact: bool = False, with_vector: bool = False) -> list[list[Hit]]:
        """One ``query_batch_points`` request of plain nearest searches."""
        check_top_k(top_k)
        if not vectors:
            return []
        params = None if self.is_local else _search_params(self._cached_specs(name).get(vector_name), exact)
        requests = [models.QueryRequest(query=_to_qdrant(v), using=vector_name, limit=top_k, params=params,
                                        with_payload=True, with_vector=[vector_name] if with_vector else False)
                    for v in vectors]
        try:
            responses = self.client.query_batch_points(collection_name=name, requests=requests)
        except Exception as exc:
            err = self._not_found(name, exc)
            if err is exc:
                check_vector_name(self.get_vector_specs(name), vector_name, name)
            raise err from exc
        return [[Hit(id=normalize_id(p.id), score=float(p.score), payload=dict(p.payload or {}), vector_name=vector_name,
                     vector=_from_qdrant(p.vector[vector_name]) if with_vector and isinstance(p.vector, dict)
                     and vector_name in p.vector else None)
                 for p in response.points] for response in responses]

    # ---- aliases ---------------------------------------------------------------------
    def list_aliases(self) -> dict[str, str]:
        return {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}

    def get_alias(self, alias: str) -> str | None:
        return self.list_aliases().get(alias)

    def set_alias(self, alias: str, collection: str) -> None:
        validate_name(alias, "alias")
        names = self._collection_names()
        if alias in names:
            raise AliasError(f"alias {alias!r} clashes with an existing collection")
        if collection not in names:
            raise CollectionNotFound(f"cannot point alias {alias!r} at missing collection {collection!r}")
        self._spec_cache.clear()
        for attempt in range(2):
            ops: list[Any] = []
            if self.get_alias(alias) is not None:
                ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias)))
            ops.append(
                models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=collection, alias_name=alias))
            )
            try:
                # One call: Qdrant applies the delete and the create atomically.
                self.client.update_collection_aliases(change_aliases_operations=ops)
                return
            except Exception:
                if attempt:  # a concurrent writer changed the alias between our read and write
                    raise

    def delete_alias(self, alias: str) -> bool:
        self._spec_cache.clear()
        if self.get_alias(alias) is None:
            return False
        self.client.update_collection_aliases(
            change_aliases_operations=[models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))]
        )
        return True

    def close(self) -> None:
        self.client.close()
