"""One identity for "the same embedding": everything a stored vector depends on besides its text.

A point is reused (no forward pass) only when it was written under the identity the worker runs now. Two
parts, because a change of each calls for a different answer:

* ``space``: what decides which vector space the vectors live in, so that a query is comparable with them:
  the weights' content (config, weight files and tokenizer files, hashed; never the folder's name),
  pooling, normalisation, the document prompt, the Dense layers, the output size, the stored layout
  (datatype, Qdrant quantization, Matryoshka sizes: added by the sink) and the sparse vector's kind and
  term space (BM25's tokenizer, the SPLADE model). Points of two spaces in one collection make every
  search quietly wrong, so a worker refuses a collection written under another space and names
  ``embedstream reindex`` (the sink's check).
* ``values``: what changes the numbers but not the space: the token limit (where chunks are cut), BM25's
  ``k``, ``b`` and average length. Old and new points stay comparable, so nothing is refused: an unchanged
  chunk sent again is embedded again (its point's identity differs), the rest keep their vectors until then.

Left out on purpose: the precision and device a pass runs at (float32, bf16, int8; CPU or GPU). They
approximate the same function, and one fleet runs them side by side (online lanes ``fast``, bulk lanes
``tuned``); a point written by either is the same embedding for reuse.

The weights are hashed once per file and load (sha256, cached in the process by the file's size, dates and
inode): all-MiniLM-L6-v2's 87 MB take ~0.1 s.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embedstream.vectors import canonical_json

if TYPE_CHECKING:
    from embedstream.engine.model_spec import ModelSpec
    from embedstream.engine.sparse import SparseEncoder

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")

_file_digests: dict[tuple, str] = {}
_lock = threading.Lock()


def file_digest(path: Path) -> str:
    """sha256 of a file's content, computed once per process while its size, dates and inode stay the same."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)
    with _lock:
        found = _file_digests.get(key)
    if found is None:
        with path.open("rb") as handle:
            found = hashlib.file_digest(handle, "sha256").hexdigest()
        with _lock:
            _file_digests[key] = found
    return found


def folder_digest(folder: Path, tokenizer: bool = True) -> str:
    """Hash of a model folder's content: ``config.json``, its weight files and (``tokenizer``) its tokenizer files,
    by name and content; other files (a README, caches) and the folder's own name are not in it."""
    names = {"config.json", *(TOKENIZER_FILES if tokenizer else ())}
    digest = hashlib.sha256()
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and (path.name in names or path.suffix in WEIGHT_SUFFIXES):
            digest.update(f"{path.name}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def _short(material: Any) -> str:
    return hashlib.sha256(canonical_json(material).encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, eq=False)
class EmbeddingIdentity:
    """``space`` and ``values`` (JSON objects, see the module docstring); ``digest`` names both, ``space_digest``
    the space alone."""

    space: Mapping[str, Any] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def digest(self) -> str:
        return _short({"space": self.space, "values": self.values})

    @cached_property
    def space_digest(self) -> str:
        return _short(self.space)

    def with_parts(self, space: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                   ) -> "EmbeddingIdentity":
        """This identity with more components (a key given again replaces the old one)."""
        return EmbeddingIdentity({**self.space, **(space or {})}, {**self.values, **(values or {})})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EmbeddingIdentity) and self.digest == other.digest

    def __hash__(self) -> int:
        return hash(self.digest)


def differences(old: Any, new: Any, path: str = "") -> list[str]:
    """Where two identity parts differ, as ``path: old -> new`` lines (digests shortened)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for key in sorted(set(old) | set(new)):
            out += differences(old.get(key), new.get(key), f"{path}.{key}" if path else str(key))
        return out
    if canonical_json(old) == canonical_json(new):
        return []
    show = [v[:12] if isinstance(v, str) and len(v) == 64 else v for v in (old, new)]
    return [f"{path}: {json.dumps(show[0])} -> {json.dumps(show[1])}"]


def model_identity(spec: ModelSpec) -> EmbeddingIdentity:
    """A dense model's part: its folder's content, the Dense layers, pooling, normalisation, document prompt."""
    from embedstream.engine.tokenize import st_lowercase

    root = _pipeline_root(spec.path)
    space = {
        "weights": folder_digest(spec.path),
        "dense": [{"weights": folder_digest(d.path, tokenizer=False), "in": d.in_features, "out": d.out_features,
                   "bias": d.bias, "activation": d.activation, "residual": d.residual} for d in spec.dense],
        "pooling": spec.pooling, "include_prompt": spec.include_prompt, "normalize": spec.normalize,
        "prompt": spec.document_prompt or "", "lowercase": st_lowercase(root), "dimensions": spec.dimensions,
    }
    return EmbeddingIdentity({"model": space}, {"max_tokens": spec.max_tokens})


def embedding_identity(spec: ModelSpec, sparse: SparseEncoder | None = None) -> EmbeddingIdentity:
    """The identity of the chunk vectors an engine writes: its model's, and its sparse encoder's when it has one."""
    identity = model_identity(spec)
    if sparse is None:
        return identity
    space, values = sparse.identity()
    return identity.with_parts({"sparse": space}, {"sparse": values})


def _pipeline_root(encoder: Path) -> Path:
    """The sentence-transformers folder around an encoder sub-folder (the folder itself when it has none)."""
    parent = encoder.parent
    return parent if not (encoder / "modules.json").is_file() and (parent / "modules.json").is_file() else encoder
