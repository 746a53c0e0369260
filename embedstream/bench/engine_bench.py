"""`embedstream bench engine`: the engine against sentence-transformers and naive padded batches.

One run, one corpus, side by side: texts/s, real tokens/s, padding fraction, peak memory, the
share of the machine's measured peak fp32 GEMM rate spent on useful (real-token) FLOPs, and ratios.
Machines here are small and noisy: each method runs ``repeats`` times and the median is reported.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from embedstream import logs
from embedstream.bench.corpus import mixed_length_texts
from embedstream.config import Settings
from embedstream.engine.backends.linear import DenseLinear, cpu_flags, cpu_has_native_bf16
from embedstream.engine.engine import EmbedRequest, Engine


@dataclass
class MethodResult:
    method: str
    threads: int
    seconds: float
    texts: int
    real_tokens: int
    computed_tokens: int
    peak_mem_mb: float
    useful_gflops: float
    min_cos: float | None = None

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / self.seconds

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds


class PeakRSS:
    """Samples this process's resident memory in a thread; reports the peak above the start."""

    def __init__(self, interval_s: float = 0.01):
        self.interval = interval_s
        self.proc = psutil.Process()
        self.base = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.proc.memory_info().rss)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def measure_peak_gemm_gflops(threads: int, size: int = 2048, repeats: int = 5) -> float:
    """Best observed fp32 GEMM rate, the roofline the engine is compared with: the faster of
    torch.mm (MKL, which runs its AVX2 code on AMD CPUs) and oneDNN's packed-weight linear (which
    uses AVX-512 where present), so a faster kernel never shows up as more than 100% of "peak"."""
    torch.set_num_threads(threads)
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    packed = DenseLinear(b.t().contiguous(), None)  # the engine's own layer: oneDNN where available
    candidates = [lambda: torch.mm(a, b), lambda: packed(a)]
    best = float("inf")
    for fn in candidates:
        fn()
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def _timed_round_robin(methods: list[tuple[str, Callable]], corpus: list[str], repeats: int
                       ) -> list[tuple[float, np.ndarray, int, float]]:
    """Per method: median seconds, last output, computed tokens, peak MB.

    Methods take turns (A B C A B C ...) so a burst of load from another process on this small
    machine hits them alike, instead of landing on whichever method happened to run then."""
    for _, fn in methods:
        fn(corpus[:64])  # warm-up: allocator, thread pool, caches
    times: list[list[float]] = [[] for _ in methods]
    peaks = [0.0] * len(methods)
    outputs: list[tuple[np.ndarray, int]] = [(np.empty(0), 0)] * len(methods)
    for _ in range(repeats):
        for m, (_, fn) in enumerate(methods):
            with PeakRSS() as mem:
                start = time.perf_counter()
                outputs[m] = fn(corpus)
                times[m].append(time.perf_counter() - start)
            peaks[m] = max(peaks[m], mem.delta_mb)
    return [(statistics.median(times[m]), *outputs[m], peaks[m]) for m in range(len(methods))]


def _naive_padded(engine: Engine, batch_size: int = 32) -> Callable[[list[str]], tuple[np.ndarray, int]]:
    """Arrival-order batches of 32 padded to their longest, plain HF forward, mean pooling."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(engine.spec.path))
    model = AutoModel.from_pretrained(str(engine.spec.path)).eval()

    @torch.inference_mode()
    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        outs, computed = [], 0
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i : i + batch_size], padding=True, truncation=True,
                            max_length=engine.spec.max_tokens, return_tensors="pt")
            computed += int(enc["input_ids"].numel())
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            outs.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(outs), computed

    return run


def _sentence_transformers(engine: Engine) -> Callable[[list[str]], tuple[np.ndarray, int]]:
    """sentence-transformers encode(batch_size=32): sorts by length, pads within each batch."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(engine.spec.path), device="cpu")

    def computed_tokens(texts: list[str]) -> int:
        """Positions encode() computes: it sorts by length and pads each batch of 32 to its longest."""
        lengths = sorted((len(ids) for ids in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]), reverse=True)
        return sum(len(lengths[i : i + 32]) * lengths[i] for i in range(0, len(lengths), 32))

    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        return model.encode(texts, batch_size=32, convert_to_numpy=True), computed_tokens(texts)

    return run


def _embedstream(engine: Engine) -> Callable[[list[str]], tuple[np.ndarray, int]]:
    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        results, timings = engine.embed([EmbedRequest(i, t) for i, t in enumerate(texts)])
        return np.stack([r.vector.values for r in results]), timings.tokens

    return run


def default_approximate_precisions() -> list[str]:
    """The approximate paths worth a row on this CPU: int8 always, bf16 only where it is native."""
    return ["int8"] + (["bfloat16"] if cpu_has_native_bf16() else [])


def cpu_summary() -> str:
    """The SIMD features that decide which precision is fast here."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    have = [f for f in wanted if f in cpu_flags()]
    return " ".join(have) or "unknown"


def _engine(model: str, precision: str) -> Engine:
    settings = Settings()
    settings.engine.precision = precision
    return Engine.from_name(model, settings)


def run(model: str = "all-MiniLM-L6-v2", threads: list[int] | None = None, texts: int = 600, repeats: int = 1,
        baselines: bool = True, precisions: list[str] | None = None) -> tuple[list[MethodResult], dict]:
    """Run every method for each thread count on one corpus; returns rows and machine facts.

    The first row is always the exact float32 path; ``precisions`` add approximate rows (int8,
    bfloat16) whose min cosine is taken against it."""
    threads = threads or [1, 2]
    precisions = default_approximate_precisions() if precisions is None else precisions
    engine = _engine(model, "float32")
    tok = engine.tokenizer.tokenizer
    corpus = mixed_length_texts(texts, lambda s: len(tok.encode(s).ids), engine.spec.max_tokens)
    lengths = [len(tok.encode(t).ids) for t in corpus]
    useful_flops = sum(n * engine.runner.flops_per_token(n) for n in lengths)
    methods: list[tuple[str, Callable]] = [("embedstream (packed, fp32)", _embedstream(engine))]
    for precision in precisions:
        if precision != "float32":
            fast = _engine(model, precision)
            methods.append((f"embedstream (packed, {fast.runner.describe().rsplit('/', 1)[-1]})", _embedstream(fast)))
    if baselines:
        methods.append(("sentence-transformers bs=32", _sentence_transformers(engine)))
        methods.append(("naive arrival-order bs=32", _naive_padded(engine)))
    facts = {"model": model, "path": engine.runner.describe(), "cpu": cpu_summary(), "texts": len(corpus), "real_tokens": sum(lengths),
             "length_p50": float(np.median(lengths)), "length_max": max(lengths), "peak_gflops": {}}
    rows: list[MethodResult] = []
    for n in threads:
        torch.set_num_threads(n)
        facts["peak_gflops"][n] = measure_peak_gemm_gflops(n)
        reference = None
        for (name, _), (seconds, vectors, computed, peak) in zip(methods, _timed_round_robin(methods, corpus, repeats)):
            vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
            if reference is None:
                reference = vectors
            min_cos = float((vectors * reference).sum(1).min())
            rows.append(MethodResult(name, n, seconds, len(corpus), sum(lengths), computed, peak,
                                     useful_flops / seconds / 1e9, min_cos))
    return rows, facts


def print_table(rows: list[MethodResult], facts: dict) -> None:
    from rich.table import Table

    console = logs.console()
    console.print(f"cpu: {facts['cpu']}")
    console.print(f"model {facts['model']} via {facts['path']}; corpus {facts['texts']} texts, "
                  f"{facts['real_tokens']} real tokens (p50 {facts['length_p50']:.0f}, max {facts['length_max']})")
    table = Table(title="bench engine (median of repeats)")
    for col in ("threads", "method", "texts/s", "real tok/s", "padding", "peak MB", "useful GFLOP/s",
                "% fp32 peak", "vs sentence-tf", "vs naive", "min cos vs fp32"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for n in sorted({r.threads for r in rows}):
        group = [r for r in rows if r.threads == n]
        peak = facts["peak_gflops"][n]
        base = {r.method.split()[0]: r.tokens_per_s for r in group}
        for r in group:
            table.add_row(
                str(n), r.method, f"{r.texts_per_s:,.1f}", f"{r.tokens_per_s:,.0f}", f"{r.padding_fraction:.1%}",
                f"{r.peak_mem_mb:,.0f}", f"{r.useful_gflops:,.1f}", f"{r.useful_gflops / peak:.0%}",
                f"{r.tokens_per_s / base['sentence-transformers']:.2f}x" if "sentence-transformers" in base else "-",
                f"{r.tokens_per_s / base['naive']:.2f}x" if "naive" in base else "-",
                f"{r.min_cos:.6f}" if r.min_cos is not None else "-",
            )
        table.add_row(str(n), f"[dim]peak fp32 GEMM measured: {peak:,.1f} GFLOP/s[/dim]", *[""] * 9)
    console.print(table)
