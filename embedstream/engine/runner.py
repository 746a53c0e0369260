"""The model runner: loads weights once, picks the execution path, runs packed batches.

Paths, best first: packed BERT-family or packed decoder (no padding FLOPs; flash-attn varlen in
bf16 on CUDA, grouped SDPA in fp32 on CPU), then a padded Hugging Face forward for anything else.
``describe()`` says which path runs, so logs and benchmarks can never hide a fallback.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from embedstream.engine import pooling
from embedstream.engine.attention import attention_kernel_name
from embedstream.engine.backends import bert, decoder
from embedstream.engine.backends.hf_padded import PaddedHFEncoder
from embedstream.engine.errors import ConfigError
from embedstream.engine.model_spec import ModelSpec
from embedstream.engine.packed import PackedBatch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass
class ForwardTimings:
    forward_ms: float = 0.0
    pool_ms: float = 0.0


def pick_device(requested: str) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("device=cuda requested but CUDA is not available")
        return torch.device("cuda")
    return torch.device("cpu")


def set_threads(threads: int | None) -> None:
    """Intra-op threads for torch; None keeps torch's default (all cores)."""
    if threads:
        torch.set_num_threads(int(threads))


class ModelRunner:
    """Owns one loaded model and turns PackedBatches into pooled vectors or scores."""

    def __init__(self, spec: ModelSpec, device: str = "auto", backend: str = "auto", threads: int | None = None):
        from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

        set_threads(threads)
        self.spec = spec
        self.device = pick_device(device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        config = AutoConfig.from_pretrained(str(spec.path))
        loader = AutoModelForSequenceClassification if spec.kind == "rerank" else AutoModel
        model = loader.from_pretrained(str(spec.path), dtype=self.dtype).to(self.device).eval()
        self.model = model
        self.config = config
        base = getattr(model, model.base_model_prefix, model) if spec.kind == "rerank" else model
        self.hidden_size = int(config.hidden_size)
        self.encoder, self.path = self._choose(base, config, backend)

    def _choose(self, base, config, backend: str):
        reasons = []
        if backend in ("auto", "packed"):
            for family, cls in ((bert, bert.PackedBertEncoder), (decoder, decoder.PackedDecoder)):
                reason = family.supports(config)
                if reason is None:
                    try:
                        encoder = cls(base, config, self.device, self.dtype)
                    except (AttributeError, ValueError) as exc:  # unusual layout: fall back, say why
                        reasons.append(f"{cls.__name__}: {exc}")
                        continue
                    name = family.__name__.rsplit(".", 1)[-1]
                    return encoder, f"packed-{name}/{self.device.type}/{attention_kernel_name(self.device, self.dtype)}"
                reasons.append(reason)
            if backend == "packed":
                raise ConfigError(f"no packed path for {self.spec.name}: {'; '.join(reasons)}")
        left = self.spec.pooling == "last_token"
        encoder = PaddedHFEncoder(base, config, config.pad_token_id, left_padding=left)
        self.fallback_reason = "; ".join(reasons)
        return encoder, f"hf-padded/{self.device.type}"

    def describe(self) -> str:
        return self.path

    def flops_per_token(self, length: int) -> float:
        return self.encoder.flops_per_token(length)

    def _hidden(self, batch: PackedBatch) -> torch.Tensor:
        return self.encoder(batch.to(self.device) if self.device.type != "cpu" else batch)

    @torch.inference_mode()
    def embed(self, batch: PackedBatch, timings: ForwardTimings) -> torch.Tensor:
        """Pooled float32 vectors [B, H] in packed order (batch.order maps back to callers)."""
        start = time.perf_counter()
        hidden = self._hidden(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        mid = time.perf_counter()
        pooled = pooling.pool(hidden, batch, self.spec.pooling).float().cpu()
        timings.forward_ms += (mid - start) * 1000
        timings.pool_ms += (time.perf_counter() - mid) * 1000
        return pooled

    @torch.inference_mode()
    def score(self, batch: PackedBatch, timings: ForwardTimings) -> torch.Tensor:
        """Cross-encoder relevance [B] in packed order: the model's head on the first token."""
        start = time.perf_counter()
        hidden = self._hidden(batch)
        cls = pooling.pool(hidden, batch, "cls").unsqueeze(1)  # heads expect [B, L, H] and read [:, 0]
        model = self.model
        if getattr(model, "bert", None) is not None and hasattr(model.bert, "pooler") and model.bert.pooler is not None:
            logits = model.classifier(model.bert.pooler(cls))
        else:
            logits = model.classifier(cls)
        logits = logits.float()
        if logits.shape[-1] != 1:
            raise ConfigError(f"{self.spec.name}: reranker heads must have one label, found {logits.shape[-1]}")
        scores = logits[:, 0]
        if self.spec.activation == "sigmoid":
            scores = torch.sigmoid(scores)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        timings.forward_ms += (time.perf_counter() - start) * 1000
        return scores.cpu()
