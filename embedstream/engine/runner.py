"""The model runner: loads weights once, picks the execution path, runs packed batches.

Paths, best first: packed BERT-family or packed decoder (no padding FLOPs; on CUDA in bf16 the
flash-attn varlen kernel, else torch's varlen_attn; grouped SDPA on CPU and in float32: see
attention.py), then a padded Hugging Face forward for anything else. ``backend=openvino`` (CPU,
BERT family, the ``openvino`` extra) runs OpenVINO on length groups instead (openvino_encoder.py).
``describe()`` says which path and attention kernel run, so logs and benchmarks can never hide a
fallback. On CUDA batches reach the device through pinned memory and a side stream (transfer.py):
``stage`` the next batch before ``embed``-ing the current one and its copy runs under this forward. The hidden
states go through the model's head: :class:`~embedstream.engine.head.EmbeddingHead` (pooling,
Dense, ...) for embedders, :class:`~embedstream.engine.score_head.ScoreHead` for cross-encoders.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import torch

from embedstream.engine.attention import attention_kernel_name
from embedstream import logs
from embedstream.engine import calibrate, tuner, tuning
from embedstream.engine.backends import bert, decoder, openvino_encoder
from embedstream.engine.backends.hf_padded import PaddedHFEncoder
from embedstream.engine.backends.openvino_encoder import OpenVINOEncoder
from embedstream.engine.backends.linear import PRECISIONS, cpu_has_native_bf16, onednn_int8_available
from embedstream.engine.errors import ConfigError
from embedstream.engine.head import EmbeddingHead
from embedstream.engine.model_spec import ModelSpec
from embedstream.engine.packed import PackedBatch, pack_sequences
from embedstream.engine.score_head import ScoreHead
from embedstream.engine.splade_head import SpladeHead
from embedstream.engine.tokenize import Tokenized
from embedstream.engine.transfer import DeviceFeeder, StagedBatch

log = logs.get("embedstream.engine.runner")
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


def pick_precision(requested: str, device: torch.device) -> tuple[str, torch.dtype]:
    """(precision, activation dtype). auto: bf16 on CUDA, exact float32 on CPU. fast: bf16 wherever
    the hardware computes it natively, float32 elsewhere (never the lossier int8). tuned: on CPU the path
    measured fastest here at the quality floor (tuner.py; the runner resolves it), bf16 on CUDA.

    bfloat16 on CPU is fast only where the CPU has bf16 dot products (AVX512-BF16, AMX) and is
    otherwise emulated (about 6x slower than fp32 on AVX2); int8 on CPU is static (calibrated,
    calibrate.py) on the BERT path and dynamic quantization on the decoder path.
    """
    if requested not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if requested == "tuned" and device.type == "cpu":
        return "tuned", torch.float32  # the runner measures (or reads the cached measurements) and resolves it
    if requested in ("auto", "tuned"):
        requested = "bfloat16" if device.type == "cuda" else "float32"
    elif requested == "fast":
        requested = "bfloat16" if device.type == "cuda" or cpu_has_native_bf16() else "float32"
    if requested == "int8" and device.type != "cpu":
        raise ConfigError("precision=int8 runs on CPU (fbgemm dynamic quantization); use bfloat16 on CUDA")
    if requested == "bfloat16" and device.type == "cuda":
        return requested, torch.bfloat16  # all-bf16 model: flash-attn varlen wants bf16 q/k/v
    return requested, torch.float32  # CPU bf16 is mixed: float32 residuals, bf16 GEMMs (linear.py)


def set_threads(threads: int | None) -> None:
    """Intra-op threads for torch; None keeps torch's default (all cores)."""
    if threads:
        torch.set_num_threads(int(threads))


class ModelRunner:
    """Owns one loaded model and turns PackedBatches into pooled vectors or scores."""

    def __init__(
        self, spec: ModelSpec, device: str = "auto", backend: str = "auto", threads: int | None = None,
        precision: str = "auto", quality_floor: str = tuning.DEFAULT_FLOOR, shape: str = "bulk",
    ):
        """``precision`` tuned: the fastest path measured on this host that meets ``quality_floor`` for
        ``shape`` (tuning.py); the measurements are cached per host and model, so only a first start measures."""
        from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

        set_threads(threads)
        self.spec = spec
        self.threads = threads
        self.device = pick_device("cpu" if backend == "openvino" and device == "auto" else device)
        self.precision, self.dtype = pick_precision(precision, self.device)
        self.feeder = DeviceFeeder(self.device)
        config = AutoConfig.from_pretrained(str(spec.path))
        loader = {"rerank": AutoModelForSequenceClassification, "splade": AutoModelForMaskedLM}.get(spec.kind, AutoModel)
        model = loader.from_pretrained(str(spec.path), dtype=self.dtype).to(self.device).eval()
        self.model = model
        self.config = config
        base = getattr(model, model.base_model_prefix, model) if spec.kind in ("rerank", "splade") else model
        self.hidden_size = int(config.hidden_size)
        self.choice: tuning.Choice | None = None  # precision tuned: what won, the runner-up, the float32 best
        self.tuning: tuner.Tuning | None = None
        if self.precision == "tuned":
            self.encoder, self.path = self._tuned(base, config, backend, tuning.parse_floor(quality_floor), shape)
        else:
            self.encoder, self.path = self._choose(base, config, backend)
        if spec.kind == "rerank":
            self.head = ScoreHead(model, self.head_reads, spec.activation, spec.name)
        elif spec.kind == "splade":
            self.head = SpladeHead(model, spec)
        else:
            self.head = EmbeddingHead(spec, self.hidden_size, self.device)

    def _choose(self, base, config, backend: str):
        if backend == "openvino":
            if self.device.type != "cpu":
                raise ConfigError("backend=openvino runs on CPU; use device=cpu (or backend=auto on CUDA)")
            self.head_reads = "all"  # every real token comes back, as from the padded path
            encoder = OpenVINOEncoder(self.spec, config, self.precision, self.threads)
            return encoder, f"openvino/cpu/{self.precision}"
        reasons = []
        if backend in ("auto", "packed"):
            for family, cls in ((bert, bert.PackedBertEncoder), (decoder, decoder.PackedDecoder)):
                reason = family.supports(config)
                if reason is None:
                    try:
                        encoder = self._build_packed(cls, base, config)
                    except (AttributeError, ValueError) as exc:  # unusual layout: fall back, say why
                        reasons.append(f"{cls.__name__}: {exc}")
                        continue
                    name = family.__name__.rsplit(".", 1)[-1]
                    self.head_reads = family.HEAD_READS
                    kernel = attention_kernel_name(self.device, self.dtype, encoder.head_dim)
                    return encoder, f"packed-{name}/{self.device.type}/{kernel}/{self._precision_label()}"
                reasons.append(reason)
            if backend == "packed":
                raise ConfigError(f"no packed path for {self.spec.name}: {'; '.join(reasons)}")
        if self.precision == "int8":
            why = "; ".join(reasons) or "backend=hf was requested"
            raise ConfigError(f"precision=int8 needs the packed path, which {self.spec.name} cannot use: {why}")
        left = self.spec.pooling == "last_token"
        encoder = PaddedHFEncoder(base, config, config.pad_token_id, left_padding=left)
        self.head_reads = "all"  # an unknown architecture's head may read any token
        return encoder, f"hf-padded/{self.device.type}/{self._precision_label()}"

    def _tuned(self, base, config, backend: str, floor: tuning.QualityFloor, shape: str):
        """The measured choice: cached measurements when this host, thread count, library versions and model
        were measured before, else measure now (and cache)."""
        why = bert.supports(config) or (None if self.spec.kind == "embed" else "tuning covers embedding models")
        self.precision = "float32"
        if why:
            log.warning("tuning_not_available", model=self.spec.name, why=why, precision="float32")
            return self._choose(base, config, backend)
        threads = int(self.threads or torch.get_num_threads())
        reference, _ = self._choose(base, config, "packed")
        self.head = EmbeddingHead(self.spec, self.hidden_size, self.device)  # the tuner pools through it
        backends = ("packed",) if backend == "packed" else ("openvino", "packed")
        measured = tuner.load(self.spec, threads, backends)
        if measured is None:
            log.info("engine_tuning", model=self.spec.name, threads=threads,
                     cache=str(tuner.cache_path(self.spec, threads, backends)))
            from embedstream.engine.tokenize import TextTokenizer, load_tokenizer, st_lowercase

            tokenizer = TextTokenizer(load_tokenizer(self.spec.path), self.spec.max_tokens, st_lowercase(self.spec.path))
            measured = tuner.tune(
                reference, self.head, tokenizer, lambda p: self.build_path(base, config, p)[0], threads,
                (lambda precision: openvino_encoder.supports(config, precision)) if "openvino" in backends else None,
                lambda: bert.PackedBertEncoder(base, config, self.device, self.dtype, "int8",
                                               calibration=self._calibration(base, config),
                                               plan=bert.Int8Plan(frozenset())))
            tuner.save(self.spec, threads, measured)
            log.info("engine_tuned", model=self.spec.name, seconds=measured.seconds, paths=len(measured.measurements))
        self.tuning = measured
        pool = [m for m in measured.measurements if backend not in ("packed", "openvino") or m.path.backend == backend]
        self.choice = tuning.choose(pool, floor, shape)
        won = self.choice.winner.path
        encoder, path = (reference, None) if won == tuning.PathSpec("packed", "float32") else \
            self.build_path(base, config, won)
        self.precision = won.precision
        self.head_reads = "all" if won.backend == "openvino" else bert.HEAD_READS
        path = path or f"packed-bert/{self.device.type}/{attention_kernel_name(self.device, self.dtype, encoder.head_dim)}/float32"
        log.info("engine_path_chosen", model=self.spec.name, path=path, **self.choice.summary())
        return encoder, path

    def _calibration(self, base, config):
        return calibrate.load_or_calibrate(
            self.spec, lambda: bert.PackedBertEncoder(base, config, self.device, self.dtype, "float32"))

    def build_path(self, base, config, path: tuning.PathSpec):
        """(encoder, path name) for a measured path (BERT family, CPU)."""
        if path.backend == "openvino":
            int8 = path.precision == "int8"
            encoder = OpenVINOEncoder(self.spec, config, path.precision, self.threads,
                                      keep_float=path.keep_float if int8 else None,
                                      float_dtype=(path.float_dtype or None) if int8 else None)
            return encoder, f"openvino/cpu/{path.label.split(' ', 1)[1]}"
        plan = None
        if path.precision == "int8":
            plan = bert.Int8Plan(frozenset(path.keep_float), path.float_dtype or "float32", path.activations == "per_token")
        encoder = bert.PackedBertEncoder(base, config, self.device, self.dtype, path.precision,
                                         calibration=self._calibration(base, config) if plan else None, plan=plan)
        kernel = attention_kernel_name(self.device, self.dtype, encoder.head_dim)
        return encoder, f"packed-bert/{self.device.type}/{kernel}/{path.label.split(' ', 1)[1]}"

    def _build_packed(self, cls, base, config):
        """The packed encoder; BERT-family int8 is static, with ranges calibrated once and cached."""
        if self.precision == "int8" and cls is bert.PackedBertEncoder and onednn_int8_available():
            stats = calibrate.load_or_calibrate(
                self.spec, lambda: cls(base, config, self.device, self.dtype, "float32")
            )
            return cls(base, config, self.device, self.dtype, "int8", calibration=stats)
        return cls(base, config, self.device, self.dtype, self.precision)

    def _precision_label(self) -> str:
        if self.precision == "bfloat16" and self.device.type == "cpu" and not cpu_has_native_bf16():
            return "bfloat16-emulated"
        return self.precision

    def describe(self) -> str:
        """The path that runs; when tuned, also what it measured, against the runner-up and float32's best."""
        if self.choice is None:
            return self.path
        c = self.choice
        unit = (lambda m: f"{m.bulk_tok_s:,.0f} tok/s") if c.shape == "bulk" else (lambda m: f"{m.query_ms:.2f} ms/query")
        won = c.winner
        text = (f"{self.path} [tuned for {c.shape} at {c.floor}: {unit(won)}, recall@10 {won.recall_at_10:.3f}, "
                f"min cos {won.min_cos:.5f}")
        if c.runner_up is not None:
            text += f"; runner-up {c.runner_up.path.label} {unit(c.runner_up)}"
        return text + "]"

    def flops_per_token(self, length: int) -> float:
        return self.encoder.flops_per_token(length)

    def pack(self, items: list[Tokenized]) -> PackedBatch:
        """Pack for this device: straight into pinned memory on CUDA (async copies), plain on CPU."""
        return pack_sequences(items, pin_memory=self.feeder.pins_memory)

    def stage(self, batch: PackedBatch) -> StagedBatch:
        """Start the batch's host -> device copy and return at once (CPU: no copy); ``embed``/``score``
        take the result. Staging batch i+1 before running batch i overlaps its copy with i's forward."""
        return self.feeder.stage(batch)

    def _on_device(self, batch: PackedBatch | StagedBatch) -> PackedBatch:
        return self.feeder.wait(batch if isinstance(batch, StagedBatch) else self.feeder.stage(batch))

    def embed(self, batch: PackedBatch | StagedBatch, timings: ForwardTimings) -> torch.Tensor:
        """Pooled (and projected) float32 vectors [B, D] on the host, in packed order (batch.order maps
        back to callers). One copy back and one synchronisation per batch on CUDA."""
        return self._embed(batch, timings, ())[0]

    def embed_keeping_tokens(self, batch: PackedBatch | StagedBatch, timings: ForwardTimings,
                             sequences: list[int]) -> tuple[torch.Tensor, list[np.ndarray]]:
        """``embed``, plus the last hidden states of the packed ``sequences`` (positions in packed order), each
        float32 [its tokens, hidden] on the host: the same pass's rows, no padding, no pooling."""
        return self._embed(batch, timings, sequences)

    @torch.inference_mode()
    def _embed(self, batch: PackedBatch | StagedBatch, timings: ForwardTimings,
               sequences) -> tuple[torch.Tensor, list[np.ndarray]]:
        spans = self.feeder.spans()
        on_device = self._on_device(batch)
        hidden = self.encoder(on_device)
        spans.mark()
        projected = self.head.project(hidden, on_device)
        kept: list[np.ndarray] = []
        if sequences:
            cu = on_device.cu_seqlens.tolist()
            rows = torch.cat([hidden[cu[k]:cu[k + 1]] for k in sequences]).float()
            flat = self.feeder.to_host(rows).numpy().copy()  # owned: the encoder may reuse its buffers
            starts = np.cumsum([0] + [cu[k + 1] - cu[k] for k in sequences])
            kept = [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]
        vectors = self.feeder.to_host(projected)
        forward_ms, pool_ms = spans.split_ms()
        timings.forward_ms += forward_ms
        timings.pool_ms += pool_ms
        return vectors, kept

    @torch.inference_mode()
    def score(self, batch: PackedBatch | StagedBatch, timings: ForwardTimings) -> torch.Tensor:
        """Cross-encoder relevance [B] on the host in packed order, through the model's own head."""
        start = time.perf_counter()
        on_device = self._on_device(batch)
        scores = self.feeder.to_host(self.head(self.encoder(on_device), on_device))
        timings.forward_ms += (time.perf_counter() - start) * 1000
        return scores
