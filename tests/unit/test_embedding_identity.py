"""One identity for "the same embedding" (issue #42): every component that changes a stored vector besides its
text decides whether a stored point is reused, and what a worker does with a collection written under another.

* A change of the vector space (the weights' content at the same path, tokenizer files, pooling,
  normalisation, the document prompt, a Dense layer, the stored layout, the sparse kind, BM25's tokenizer,
  the SPLADE model): the worker refuses the collection at start and names ``embedstream reindex``; a write
  to it is refused for good (dead-lettered with the reason), never mixed in.
* A change of values in the same space (the token limit, BM25's k, b and average length): the worker
  starts; an unchanged chunk sent again is embedded again (its point was written under another identity).

Real stores (qdrant-client ``:memory:`` and the embedded qdrant-edge), real model folders and real encoders.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiny_models

from embedstream.config import ModelConfig, Settings
from embedstream.engine.errors import ConfigError
from embedstream.engine.identity import embedding_identity, folder_digest, model_identity
from embedstream.engine.model_spec import build_spec
from embedstream.engine.sparse import BM25Encoder
from embedstream.engine.splade import SpladeEncoder
from embedstream.engine.tokenize import TextTokenizer, load_tokenizer
from embedstream.schemas import ChunkEvent
from embedstream.vectors import SparseVector, encoded_rows
from embedstream.vectorstore.base import CollectionConfigMismatch
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.vectorstore.factory import open_store
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig
from embedstream.workers.unchanged import StoredChunks


def _perturbed_copy(folder: Path, to: Path, file: str) -> Path:
    """The model folder copied elsewhere, with one file's content changed (new weights at an old path)."""
    shutil.copytree(folder, to, ignore=shutil.ignore_patterns(".embedstream-calibration"))
    path = to / file
    path.write_bytes(path.read_bytes() + b" ")
    return to


def _spec(folder: Path, **cfg):
    return build_spec("tiny", ModelConfig(path=str(folder), **cfg))


def _bm25(**kwargs) -> BM25Encoder:
    return BM25Encoder(**kwargs)


class _Writer:
    """A worker's sink for one identity over a shared store: what it refuses, looks up and writes."""

    def __init__(self, store, spec, sparse=None, config: SinkConfig | None = None):
        config = config or SinkConfig(sparse=None if sparse is None else sparse.kind)
        self.sink = QdrantSink(store, spec, spec.dimensions, "docs", config, identity=embedding_identity(spec, sparse))

    def write(self, texts: list[str]) -> None:
        """Random unit vectors (and a sparse vector each when the sink writes one) under this identity."""
        dense = np.random.default_rng(0).standard_normal((len(texts), self.sink.spec.dimensions)).astype(np.float32)
        sparse = [SparseVector.of([i + 1], [1.0]) for i in range(len(texts))] if self.sink.config.sparse else None
        rows = encoded_rows(dense / np.linalg.norm(dense, axis=1, keepdims=True), sparse)
        self.sink.upsert([EmbeddedChunk(ChunkEvent(doc_id="d", chunk_id=i, text=text), row, {})
                          for i, (text, row) in enumerate(zip(texts, rows))])

    def kinds(self, texts: list[str]) -> list[str | None]:
        found = StoredChunks(self.sink).lookup([ChunkEvent(doc_id="d", chunk_id=i, text=t) for i, t in enumerate(texts)])
        return [None if r is None else r.kind for r in found]


@pytest.fixture(params=["memory", "edge"])
def store(request, tmp_path):
    s = EdgeStore(tmp_path / "edge") if request.param == "edge" else open_store(":memory:", None, None)
    yield s
    s.close()


TEXTS = ["the first chunk of the guide", "the second chunk of the guide"]


def _space_changes(tiny: Path, tmp: Path) -> dict:
    """name -> (the writer's spec, sparse, config) of the collection, and the one of the worker that meets it."""
    base = _spec(tiny)
    tokenizer = TextTokenizer(load_tokenizer(tiny), base.max_tokens)
    return {
        "weights (same path, new content)": ((base, None, None),
                                             (_spec(_perturbed_copy(tiny, tmp / "w", "model.safetensors")), None, None)),
        "tokenizer files": ((base, None, None), (_spec(_perturbed_copy(tiny, tmp / "t", "tokenizer.json")), None, None)),
        "pooling": ((base, None, None), (dataclasses.replace(base, pooling="mean"), None, None)),
        "normalisation": ((base, None, None), (dataclasses.replace(base, normalize=False), None, None)),
        "prompt": ((base, None, None), (dataclasses.replace(base, document_prompt="passage: "), None, None)),
        "prompt in the pooling": ((base, None, None), (dataclasses.replace(base, include_prompt=False), None, None)),
        "datatype": ((base, None, None), (base, None, SinkConfig(datatype="uint8"))),
        "quantization": ((base, None, None), (base, None, SinkConfig(quantization="scalar"))),
        "matryoshka": ((dataclasses.replace(base, matryoshka_dims=(16,)), None, None),
                       (dataclasses.replace(base, matryoshka_dims=(16,)), None, SinkConfig(matryoshka_dims=(16,)))),
        "bm25 tokenizer": ((base, _bm25(tokenizer="words"), None),
                           (base, _bm25(tokenizer="model", text_tokenizer=tokenizer), None)),
    }


@pytest.mark.parametrize("change", ["weights (same path, new content)", "tokenizer files", "pooling", "normalisation",
                                    "prompt", "prompt in the pooling", "datatype", "quantization", "matryoshka",
                                    "bm25 tokenizer"])
def test_a_worker_refuses_a_collection_written_in_another_vector_space(change, store, tiny_bert_dir, tmp_path):
    (old, old_sparse, old_config), (new, new_sparse, new_config) = _space_changes(tiny_bert_dir, tmp_path)[change]
    writer = _Writer(store, old, old_sparse, old_config)
    writer.sink.check_existing("docs")
    writer.write(TEXTS)
    assert writer.kinds(TEXTS) == ["same", "same"]
    worker = _Writer(store, new, new_sparse, new_config)
    with pytest.raises(ConfigError, match="embedstream reindex"):
        worker.sink.check_existing("docs")  # at start: the worker exits non-zero with the reason
    with pytest.raises(CollectionConfigMismatch):
        worker.write(TEXTS)  # a write reaching it: refused for good (its record is dead-lettered), never mixed in
    assert writer.kinds(TEXTS) == ["same", "same"]  # what it holds is left as it was


@pytest.mark.parametrize("change", ["token limit", "bm25 k", "bm25 b", "bm25 average length"])
def test_another_value_in_the_same_space_reembeds_unchanged_chunks(change, store, tiny_bert_dir):
    base = _spec(tiny_bert_dir)
    old, new = {
        "token limit": ((base, None), (dataclasses.replace(base, max_tokens=64), None)),
        "bm25 k": ((base, _bm25(k=1.2)), (base, _bm25(k=2.0))),
        "bm25 b": ((base, _bm25(b=0.75)), (base, _bm25(b=0.5))),
        "bm25 average length": ((base, _bm25(avg_len=256.0)), (base, _bm25(avg_len=100.0))),
    }[change]
    writer, worker = _Writer(store, *old), _Writer(store, *new)
    writer.sink.check_existing("docs")
    writer.write(TEXTS)
    worker.sink.check_existing("docs")  # the same space: the worker starts
    assert worker.kinds(TEXTS) == [None, None]  # unchanged chunks are embedded again, never reused
    worker.write(TEXTS)
    assert worker.kinds(TEXTS) == ["same", "same"]
    assert writer.kinds(TEXTS) == [None, None]


def test_the_sparse_kind_and_the_splade_model_are_part_of_the_space(store, tiny_bert_dir, tmp_path):
    """BM25 -> SPLADE: another named vector (refused as before); SPLADE -> new SPLADE weights: refused."""
    base = _spec(tiny_bert_dir)
    settings = Settings()
    splade = SpladeEncoder.from_name("splade-tiny", settings)
    retrained = SpladeEncoder.from_name(str(_perturbed_copy(splade.spec.path, tmp_path / "splade", "heads.pt")), settings)
    _Writer(store, base, splade).write(TEXTS)
    with pytest.raises(ConfigError, match="embedstream reindex"):
        _Writer(store, base, retrained).sink.check_existing("docs")
    with pytest.raises(ConfigError, match="embedstream reindex"):
        _Writer(store, base, _bm25()).sink.check_existing("docs")
    assert embedding_identity(base, splade).space["sparse"]["kind"] == "splade"


def test_the_weights_are_hashed_by_content_never_by_the_folders_name(tiny_bert_dir, tmp_path):
    moved = tmp_path / "another-name"
    shutil.copytree(tiny_bert_dir, moved, ignore=shutil.ignore_patterns(".embedstream-calibration"))
    (moved / "README.md").write_text("notes do not change an embedding")
    assert folder_digest(moved) == folder_digest(tiny_bert_dir)
    assert model_identity(_spec(moved)) == model_identity(_spec(tiny_bert_dir))
    weights = moved / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))  # same size, new content
    assert folder_digest(moved) != folder_digest(tiny_bert_dir)


def test_a_dense_layers_weights_are_in_the_identity(model_dir, tmp_path):
    folder = tiny_models.build_tiny_st_pipeline(model_dir / "st-identity", [(16, True, "Tanh")])
    spec = build_spec("st", ModelConfig(path=str(folder)))
    dense = next(p for p in (folder / "2_Dense").iterdir() if p.name in ("model.safetensors", "pytorch_model.bin"))
    copy = _perturbed_copy(folder, tmp_path / "st", str(dense.relative_to(folder)))
    changed = model_identity(build_spec("st", ModelConfig(path=str(copy))))
    assert changed.space["model"]["dense"] != model_identity(spec).space["model"]["dense"]
    assert changed.space["model"]["weights"] == model_identity(spec).space["model"]["weights"]


def test_the_engines_identity_covers_its_sparse_encoder(minilm_engine):
    settings = Settings()
    settings.sparse.kind, settings.sparse.bm25_k = "bm25", 1.6
    from embedstream.engine.sparse_choice import build_sparse_encoder

    sparse = build_sparse_encoder(settings, minilm_engine.tokenizer, minilm_engine.spec.max_tokens)
    identity = embedding_identity(minilm_engine.spec, sparse)
    assert identity.space["sparse"] == {"kind": "bm25", "tokenizer": "words"}
    assert identity.values["sparse"] == {"k": 1.6, "b": 0.75, "avg_len": 256.0}
    assert minilm_engine.identity == model_identity(minilm_engine.spec)  # no sparse encoder: the model's alone
    assert identity.digest != minilm_engine.identity.digest and identity.space_digest != minilm_engine.identity.space_digest
