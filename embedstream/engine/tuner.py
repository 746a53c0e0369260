"""Measures the engine's candidate paths on this host and caches the measurements (``tuning.choose`` picks).

At the first start of ``precision=tuned`` (or ``embedstream engine tune``) every path the runner can build
for the model on this CPU is timed and judged against float32:

* float32 and, where the CPU has bf16 dot products, bfloat16: packed and OpenVINO;
* int8, packed: activation scales per token or static, with the linears whose int8 error is largest kept
  unquantised (none, one per layer, two per layer), measured per linear first (*sensitivity*: each linear
  alone in int8, mean 1 - cos of the pooled vectors); the kept ones run at float32 or bf16, whichever a
  GEMM of the model's FFN shape runs faster here;
* int8, OpenVINO: NNCF static, with none or one linear per layer kept (the same ranking).

Quality: recall@10 of the path's query and document vectors against float32's top 10, and min cosine,
on a fixed set (:data:`QUALITY_DOCS` chunks of the stdlib prose corpus, :data:`QUALITY_QUERIES` held-out
paragraph openings). Speed: the documents as one bulk pass (real tokens/s) and the queries one at a time
(the online shape's latency), candidates in turns for :data:`ROUNDS` rounds, medians: a burst of load from
another process hits every candidate alike.

The measurements, not the choice, are cached (a JSON file beside the calibration ranges, named by a
hash of the CPU model and flags, the thread count, the library versions and the model), so a new
quality floor or lane shape re-chooses without measuring again.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from embedstream import logs
from embedstream.engine import calibrate
from embedstream.engine.backends.linear import DenseLinear, cpu_flags, cpu_has_native_bf16, onednn_int8_available
from embedstream.engine.packed import PackedBatch, pack_sequences
from embedstream.engine.tuning import Measurement, PathSpec

TUNING_VERSION = 4  # bump when what is measured or how changes: old files are then ignored
QUALITY_QUERIES = 24
DOCS_PER_QUERY = 5  # documents made of the paragraphs after the query's: each query has real neighbours
QUERY_WORDS = 16
DOC_WORDS = 48
SENSITIVITY_DOCS = 12
ROUNDS = 3
BATCH_TOKENS = 2048
TIMED_BATCHES = 2  # bulk timing: the first batches (their shapes were built in the quality pass)
TIMED_QUERIES = 16
QUALITY_SEED = 211  # not the quality bench's 17: the tuner never sees the texts it is judged on there

log = logs.get("embedstream.engine.tuner")
tunings_run = 0  # how many times this process measured (tests: a second start reads the cache)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def host_key(threads: int, backends: tuple[str, ...] = ("openvino", "packed")) -> dict:
    """What the measurements depend on besides the model: the CPU, the threads, the libraries, the backends."""
    return {"tuning_version": TUNING_VERSION, "cpu": cpu_model(), "backends": sorted(backends),
            "flags": hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16],
            "threads": int(threads), "torch": torch.__version__,
            "openvino": _version("openvino"), "nncf": _version("nncf")}


def cache_path(spec, threads: int, backends: tuple[str, ...] = ("openvino", "packed")) -> Path:
    model = calibrate.model_key(spec.path)
    digest = hashlib.sha256(json.dumps(host_key(threads, backends), sort_keys=True).encode()).hexdigest()[:16]
    return calibrate.artifacts_dir(spec.path, model) / "tuning" / f"{digest}.json"


@dataclass
class Tuning:
    measurements: list[Measurement]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path label, why it could not run)
    key: dict = field(default_factory=dict)
    seconds: float = 0.0
    sensitivity: list[tuple[str, float]] = field(default_factory=list)  # linear, mean 1 - cos alone in int8

    def to_json(self) -> dict:
        return {"key": self.key, "seconds": self.seconds, "measurements": [m.to_json() for m in self.measurements],
                "skipped": [list(s) for s in self.skipped], "sensitivity": [list(s) for s in self.sensitivity]}

    @classmethod
    def from_json(cls, data: dict) -> "Tuning":
        return cls([Measurement.from_json(m) for m in data["measurements"]], [tuple(s) for s in data["skipped"]],
                   data["key"], float(data["seconds"]), [(n, float(v)) for n, v in data.get("sensitivity", [])])


def load(spec, threads: int, backends: tuple[str, ...] = ("openvino", "packed")) -> Tuning | None:
    path = cache_path(spec, threads, backends)
    if not path.is_file():
        return None
    try:
        tuning = Tuning.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:  # torn or foreign: measure again, say why
        log.warning("tuning_cache_unreadable", path=str(path), error=str(exc))
        return None
    return tuning if tuning.key == host_key(threads, backends) else None


def save(spec, threads: int, tuning: Tuning) -> Path:
    path = cache_path(spec, threads, tuple(tuning.key.get("backends", ("openvino", "packed"))))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(tuning.to_json(), indent=1))
    os.replace(tmp, path)  # atomic: two workers starting together never read half a file
    return path


# -- the fixed texts ------------------------------------------------------------------------------------------

def quality_texts() -> tuple[list[str], list[str]]:
    """(documents, queries): fixed, deterministic, real prose. Each query is a paragraph's opening and its
    documents are the paragraphs after it (the same module's docs, three to a document), so every query
    has close neighbours among a few hundred documents, as in a real index: random documents would leave
    its top 10 to near-ties that any rounding reorders."""
    import random

    from embedstream.corpus import stdlib_paragraphs

    paras = stdlib_paragraphs()
    span = 3 * DOCS_PER_QUERY
    rng = random.Random(QUALITY_SEED)
    starts = sorted(rng.sample(range(0, len(paras) - span - 1, span + 1), QUALITY_QUERIES))
    docs, queries = [], []
    for i in starts:
        queries.append(" ".join(paras[i].split()[:QUERY_WORDS]))
        for d in range(DOCS_PER_QUERY):
            docs.append(" ".join(" ".join(paras[i + 1 + 3 * d : i + 4 + 3 * d]).split()[:DOC_WORDS]))
    return docs, queries


@dataclass
class _Sets:
    bulk: list[PackedBatch]  # the documents, token-budget batches, longest first
    doc_order: np.ndarray  # packed row -> document index
    queries: list[PackedBatch]  # one batch per query
    sensitivity: PackedBatch
    tokens: int  # real tokens of the timed batches


def _sets(tokenizer) -> _Sets:
    docs, queries = quality_texts()
    items = tokenizer.encode_many(docs, [True] * len(docs))
    order = sorted(range(len(items)), key=lambda i: -len(items[i]))
    bulk, rows, current, used = [], [], [], 0
    for i in order:
        if current and used + len(items[i]) > BATCH_TOKENS:
            bulk.append(pack_sequences([items[j] for j in current]))
            current, used = [], 0
        current.append(i)
        rows.append(i)
        used += len(items[i])
    bulk.append(pack_sequences([items[j] for j in current]))
    qitems = tokenizer.encode_many(queries, [True] * len(queries))
    sens = pack_sequences(items[:SENSITIVITY_DOCS])
    timed = sum(b.total_tokens for b in bulk[:TIMED_BATCHES])
    return _Sets(bulk, np.asarray(rows), [pack_sequences([q]) for q in qitems], sens, timed)


# -- measuring ------------------------------------------------------------------------------------------------

Encoder = Callable[[PackedBatch], torch.Tensor]


class _Probe:
    """Vectors and timings of one encoder through the model's head."""

    def __init__(self, encoder: Encoder, head, sets: _Sets):
        self.encoder, self.head, self.sets = encoder, head, sets

    @torch.inference_mode()
    def vectors(self, batch: PackedBatch) -> np.ndarray:
        v = self.head.project(self.encoder(batch), batch).float().numpy()
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def docs(self) -> np.ndarray:
        packed = np.concatenate([self.vectors(b) for b in self.sets.bulk])
        out = np.empty_like(packed)
        out[self.sets.doc_order] = packed
        return out

    def queries(self) -> np.ndarray:
        return np.concatenate([self.vectors(q) for q in self.sets.queries])

    def time_bulk(self) -> float:
        start = time.perf_counter()
        for b in self.sets.bulk[:TIMED_BATCHES]:
            self.vectors(b)
        return time.perf_counter() - start

    def time_query(self) -> float:
        """Median ms of one query alone."""
        times = []
        for q in self.sets.queries[:TIMED_QUERIES]:
            start = time.perf_counter()
            self.vectors(q)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1000


def recall_at_10(docs: np.ndarray, queries: np.ndarray, ref_docs: np.ndarray, ref_queries: np.ndarray) -> float:
    k = min(10, docs.shape[0])
    found = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :k]
    truth = np.argsort(-(ref_queries @ ref_docs.T), axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(f) & set(t)) / k for f, t in zip(found, truth)]))


def faster_float_dtype(hidden: int, intermediate: int, rows: int = 512, repeats: int = 5) -> str:
    """float32 or bfloat16, whichever runs the model's FFN-up GEMM faster here (bf16 only where native)."""
    if not cpu_has_native_bf16():
        return "float32"
    w = torch.randn(intermediate, hidden) * 0.05
    x = torch.randn(rows, hidden)
    best = {}
    for dtype in (torch.float32, torch.bfloat16):
        layer = DenseLinear(w, None, dtype)
        layer(x)
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            layer(x)
            runs.append(time.perf_counter() - start)
        best[dtype] = min(runs)
    return "bfloat16" if best[torch.bfloat16] < best[torch.float32] else "float32"


def sensitivity(reference, int8_encoder, probe_sets: _Sets, head) -> list[tuple[str, float]]:
    """Per linear, mean 1 - cos of the pooled vectors when only that linear runs int8; most sensitive first."""
    batch = probe_sets.sensitivity
    want = _Probe(reference, head, probe_sets).vectors(batch)
    quantised = dict(int8_encoder.named_linears())
    out = []
    for name, layer in list(reference.named_linears()):
        reference.set_linear(name, quantised[name])
        try:
            got = _Probe(reference, head, probe_sets).vectors(batch)
        finally:
            reference.set_linear(name, layer)
        out.append((name, float(np.mean(1.0 - (got * want).sum(1)))))
    return sorted(out, key=lambda x: -x[1])


def candidates(ranking: list[str], layers: int, float_dtype: str, openvino_why: Callable[[str], str | None] | None
               ) -> list[PathSpec]:
    """Every path worth measuring on this CPU (``ranking``: linears, most int8-sensitive first)."""
    paths = [PathSpec("packed", "float32")]
    if cpu_has_native_bf16():
        paths.append(PathSpec("packed", "bfloat16"))
    if onednn_int8_available() and ranking:
        for activations, kept in (("per_token", 0), ("per_token", layers), ("per_token", 2 * layers),
                                  ("static", 0), ("static", layers)):
            paths.append(PathSpec("packed", "int8", activations, tuple(sorted(ranking[:kept])),
                                  float_dtype if kept else ""))
        # The hand-measured recipe (bert.INT8_RECIPE: every FFN-down kept) as one more point on the frontier.
        downs = tuple(sorted(n for n in ranking if n.endswith(".down")))
        if downs != tuple(sorted(ranking[:layers])):
            paths.append(PathSpec("packed", "int8", "per_token", downs, float_dtype))
    for precision in ("float32", "bfloat16", "int8") if openvino_why else ():
        if openvino_why(precision) is not None:
            continue
        if precision != "int8":
            paths.append(PathSpec("openvino", precision))
            continue
        for kept in (0, layers):
            paths.append(PathSpec("openvino", "int8", "static", tuple(sorted(ranking[:kept])),
                                  float_dtype if kept else ""))
    return paths


def tune(reference, head, tokenizer, build: Callable[[PathSpec], Encoder], threads: int,
         openvino_why: Callable[[str], str | None] | None, int8_encoder: Callable[[], object] | None) -> Tuning:
    """Measure every candidate path; ``reference`` is the packed float32 encoder, ``build`` makes the others,
    ``openvino_why(precision)`` why OpenVINO cannot run a precision (None: OpenVINO not wanted), ``int8_encoder``
    the all-int8 packed encoder the sensitivity ranking swaps linears from (None: no int8)."""
    global tunings_run
    start = time.perf_counter()
    sets = _sets(tokenizer)
    ranked: list[tuple[str, float]] = []
    if int8_encoder is not None and onednn_int8_available():
        ranked = sensitivity(reference, int8_encoder(), sets, head)
    layers = len(getattr(reference, "layers", ())) or 1
    float_dtype = faster_float_dtype(reference.hidden, reference.intermediate)
    paths = candidates([n for n, _ in ranked], layers, float_dtype, openvino_why)
    probes: list[tuple[PathSpec, _Probe]] = []
    skipped: list[tuple[str, str]] = []
    for path in paths:
        try:
            encoder = reference if path == PathSpec("packed", "float32") else build(path)
        except Exception as exc:  # noqa: BLE001 - a path that cannot build here is a row with its reason
            skipped.append((path.label, f"{type(exc).__name__}: {exc}"))
            continue
        probes.append((path, _Probe(encoder, head, sets)))
    ref_docs, ref_queries = probes[0][1].docs(), probes[0][1].queries()
    quality = {}
    for path, probe in probes:  # also the warm-up pass of every shape the timing runs
        docs, queries = probe.docs(), probe.queries()
        cos = float(min((docs * ref_docs).sum(1).min(), (queries * ref_queries).sum(1).min()))
        quality[path] = (recall_at_10(docs, queries, ref_docs, ref_queries), cos)
    bulk: dict[PathSpec, list[float]] = {p: [] for p, _ in probes}
    query: dict[PathSpec, list[float]] = {p: [] for p, _ in probes}
    for _ in range(ROUNDS):  # candidates in turns: load from other processes lands on all alike
        for path, probe in probes:
            bulk[path].append(probe.time_bulk())
            query[path].append(probe.time_query())
    measurements = [Measurement(p, sets.tokens / statistics.median(bulk[p]), statistics.median(query[p]),
                                *quality[p]) for p, _ in probes]
    tunings_run += 1
    backends = ("openvino", "packed") if openvino_why else ("packed",)
    return Tuning(measurements, skipped, host_key(threads, backends), round(time.perf_counter() - start, 1), ranked)
