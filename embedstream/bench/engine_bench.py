"""`embedstream bench engine`: the engine against sentence-transformers, naive padded batches and
the other CPU engines (OpenVINO, ONNX Runtime: bench/peers.py, rows present when ``.[bench]`` is).

One run, one corpus, side by side: texts/s, real tokens/s, padding fraction, peak memory, the
share of the machine's measured peak GEMM rate *for the row's precision* (float32, bf16, int8)
spent on useful (real-token) FLOPs, ratios, and the min cosine against sentence-transformers
float32. Machines here are small and noisy: methods take turns, ``repeats`` rounds, median reported.
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
from embedstream.corpus import mixed_length_texts
from embedstream.config import Settings
from embedstream.engine.backends.linear import (
    DenseLinear,
    cpu_flags,
    cpu_has_native_bf16,
    onednn_int8_available,
)
from embedstream.engine.engine import EmbedRequest, Engine


@dataclass
class MethodResult:
    method: str
    precision: str
    threads: int
    seconds: float
    texts: int
    real_tokens: int
    computed_tokens: int
    peak_mem_mb: float
    useful_gflops: float
    min_cos: float | None = None
    recall_at_10: float | None = None  # on the tuner's fixed query/document set, against the packed float32 row

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


def measure_peak_gflops(threads: int, precision: str, size: int = 2048, repeats: int = 5) -> float:
    """Peak GEMM rate for ``precision``: float32 (above), bf16 through the packed oneDNN linear, int8 as
    oneDNN's u8 x s8 linear on already-quantised input (ops counted like FLOPs)."""
    if precision == "float32":
        return measure_peak_gemm_gflops(threads, size, repeats)
    torch.set_num_threads(threads)
    b = torch.randn(size, size)
    if precision == "bfloat16":
        layer, a = DenseLinear(b, None, torch.bfloat16), torch.randn(size, size).bfloat16()
        fn = lambda: layer(a)  # noqa: E731
    elif precision == "int8" and onednn_int8_available():
        packed = torch.ops.onednn.qlinear_prepack(torch.randint(-127, 128, (size, size), dtype=torch.int8), None)
        a, w_scales, w_zps = torch.randint(0, 256, (size, size), dtype=torch.uint8), torch.ones(size), torch.zeros(size, dtype=torch.int32)
        fn = lambda: torch.ops.onednn.qlinear_pointwise(a, 1.0, 128, packed, w_scales, w_zps, None, 1.0, 0,  # noqa: E731
                                                        torch.float32, "none", [], "")
    else:
        return float("nan")
    fn()
    best = float("inf")
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

    device = engine.runner.device  # float32, on the engine's device
    tokenizer = AutoTokenizer.from_pretrained(str(engine.spec.path))
    model = AutoModel.from_pretrained(str(engine.spec.path)).to(device).eval()

    @torch.inference_mode()
    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        outs, computed = [], 0
        for i in range(0, len(texts), batch_size):
            enc = tokenizer(texts[i : i + batch_size], padding=True, truncation=True,
                            max_length=engine.spec.max_tokens, return_tensors="pt").to(device)
            computed += int(enc["input_ids"].numel())
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            outs.append(torch.nn.functional.normalize(pooled, dim=-1).cpu().numpy())
        return np.concatenate(outs), computed

    return run


def _sentence_transformers(engine: Engine) -> Callable[[list[str]], tuple[np.ndarray, int]]:
    """sentence-transformers encode(batch_size=32): sorts by length, pads within each batch."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(engine.spec.path), device=engine.runner.device.type)  # float32

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


def _openvino_methods(model: str, threads: int, precisions: list[str]) -> list[tuple[str, str, Callable]]:
    """embedstream's OpenVINO backend rows (its thread pool is fixed when the model is compiled, so one set per
    thread count): float32 and each approximate precision asked for."""
    rows = []
    for precision in ["float32", *[p for p in precisions if p != "float32"]]:
        settings = Settings()
        settings.engine.backend, settings.engine.precision, settings.engine.threads = "openvino", precision, threads
        engine = Engine.from_name(model, settings)
        encoder = engine.runner.encoder

        def run(texts: list[str], embed=_embedstream(engine), encoder=encoder) -> tuple[np.ndarray, int]:
            before = encoder.padding_tokens
            vectors, real = embed(texts)
            return vectors, real + encoder.padding_tokens - before

        label = {"float32": "fp32", "bfloat16": "bf16"}.get(precision, precision)
        rows.append((f"embedstream (openvino, {label}, length groups)", precision, run))
    return rows


def default_approximate_precisions() -> list[str]:
    """The approximate paths worth a row on this CPU: int8 always, bf16 only where it is native."""
    return ["int8"] + (["bfloat16"] if cpu_has_native_bf16() else [])


def cpu_summary() -> str:
    """The SIMD features that decide which precision is fast here."""
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    have = [f for f in wanted if f in cpu_flags()]
    return " ".join(have) or "unknown"


def _engine(model: str, precision: str, device: str | None = None) -> Engine:
    settings = Settings()
    settings.engine.precision = precision
    if device:
        settings.engine.device = device
    return Engine.from_name(model, settings)


def _own_methods(model: str, engine: Engine, precisions: list[str], baselines: bool, device: str | None = None
                 ) -> list[tuple[str, str, Callable]]:
    """(name, precision, run) for embedstream's rows and the in-process baselines."""
    methods: list[tuple[str, str, Callable]] = [("embedstream (packed, fp32)", "float32", _embedstream(engine))]
    for precision in precisions:
        if precision != "float32":
            fast = _engine(model, precision, device)
            label = fast.runner.describe().rsplit("/", 1)[-1]
            methods.append((f"embedstream (packed, {label})", fast.runner.precision, _embedstream(fast)))
    if baselines:
        methods.append(("sentence-transformers bs=32", "float32", _sentence_transformers(engine)))
        methods.append(("naive arrival-order bs=32", "float32", _naive_padded(engine)))
    return methods


def _tuned_methods(model: str, threads: int, floors: list[str]) -> tuple[list[tuple[str, str, Callable]], dict]:
    """One row per quality floor: the engine on precision tuned at ``threads`` (measured once per host and cached;
    the first bench run on a host measures). Returns the rows and, per floor, the runner's tuning.Choice."""
    rows, choices = [], {}
    for floor in floors:
        settings = Settings()
        settings.engine.precision, settings.engine.threads, settings.engine.quality_floor = "tuned", threads, floor
        engine = Engine.from_name(model, settings)
        choice = engine.runner.choice
        if choice is None:  # a model the tuner does not cover: it runs float32, a row like any other
            continue
        choices[str(choice.floor)] = (choice, engine.runner.tuning)
        rows.append((f"embedstream (tuned @ {choice.floor}: {choice.winner.path.label})", engine.runner.precision,
                     _embedstream(engine)))
    return rows, choices


def _quality_on_tuner_set(methods: list[tuple[str, str, Callable]]) -> list[float]:
    """recall@10 of each method's query and document vectors against the first (packed float32) method's top 10,
    on the tuner's fixed set (the quality the floor is judged on)."""
    from embedstream.engine.tuner import quality_texts, recall_at_10

    docs, queries = quality_texts()

    def vectors(fn, texts):
        v = fn(texts)[0]
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    got = [(vectors(fn, docs), vectors(fn, queries)) for _, _, fn in methods]
    return [recall_at_10(d, q, *got[0]) for d, q in got]


def run(model: str = "all-MiniLM-L6-v2", threads: list[int] | None = None, texts: int = 600, repeats: int = 1,
        baselines: bool = True, precisions: list[str] | None = None, peers: bool = True, device: str | None = None,
        floors: list[str] | None = None) -> tuple[list[MethodResult], dict]:
    """Run every method for each thread count on one corpus; returns rows and machine facts.

    The first row is always the exact float32 path; ``precisions`` add approximate rows (int8,
    bfloat16). Min cosine is taken against sentence-transformers float32 (the embedstream float32
    row when baselines are off). ``peers``: OpenVINO / ONNX Runtime rows, built per thread count
    (both fix their thread pools when a model is compiled); the ones that cannot run are listed.
    ``device`` (auto, cpu, cuda; default: the engine settings'): every embedstream row and both baselines
    run there (on CUDA the default extra row is bfloat16, int8 being CPU-only). ``floors``: a precision tuned
    row per quality floor (default: the settings' floor and exact; CPU only), and the frontier (``facts``)."""
    from embedstream.bench import peers as peer_rows

    threads = threads or [1, 2]
    engine = _engine(model, "float32", device)
    on_gpu = engine.runner.device.type == "cuda"
    if precisions is None:
        precisions = ["bfloat16"] if on_gpu else default_approximate_precisions()
    tok = engine.tokenizer.tokenizer
    corpus = mixed_length_texts(texts, lambda s: len(tok.encode(s).ids), engine.spec.max_tokens)
    lengths = [len(tok.encode(t).ids) for t in corpus]
    useful_flops = sum(n * engine.runner.flops_per_token(n) for n in lengths)
    own = _own_methods(model, engine, precisions, baselines, device)
    found, skipped = peer_rows.peers(engine.spec) if peers and not on_gpu else ([], [])  # peers are CPU engines
    from embedstream.engine.backends import openvino_encoder

    ov_why = None if on_gpu else openvino_encoder.supports(engine.runner.config, "float32")
    if ov_why and not on_gpu:
        skipped.append(peer_rows.Skipped("embedstream (openvino)", ov_why))
    facts = {"model": model, "path": engine.runner.describe(), "cpu": cpu_summary(), "texts": len(corpus), "real_tokens": sum(lengths),
             "length_p50": float(np.median(lengths)), "length_max": max(lengths), "peak_gflops": {},
             "skipped": [(s.name, s.reason) for s in skipped], "choices": {}}
    if floors is None:
        floors = [] if on_gpu else list(dict.fromkeys([Settings().engine.quality_floor, "exact"]))
    rows: list[MethodResult] = []
    for n in threads:
        torch.set_num_threads(n)
        ov_rows = _openvino_methods(model, n, precisions) if not (on_gpu or ov_why) else []
        tuned_rows, facts["choices"][n] = _tuned_methods(model, n, floors) if floors else ([], {})
        torch.set_num_threads(n)
        methods = own + tuned_rows + ov_rows + [(p.name, p.precision, p.build(n)) for p in found]
        recalls = _quality_on_tuner_set(methods) if floors else [None] * len(methods)
        facts["peak_gflops"][n] = {p: measure_peak_gflops(n, p) for p in sorted({m[1] for m in methods})}
        torch.set_num_threads(n)
        timed = _timed_round_robin([(name, fn) for name, _, fn in methods], corpus, repeats)
        names = [name for name, _, _ in methods]
        ref_at = next((i for i, name in enumerate(names) if name.startswith("sentence-transformers")), 0)
        normed = [vectors / np.linalg.norm(vectors, axis=1, keepdims=True) for _, vectors, _, _ in timed]
        for (name, precision, _), (seconds, _, computed, peak), vectors, recall in zip(methods, timed, normed, recalls):
            min_cos = float((vectors * normed[ref_at]).sum(1).min())
            rows.append(MethodResult(name, precision, n, seconds, len(corpus), sum(lengths), computed, peak,
                                     useful_flops / seconds / 1e9, min_cos, recall))
        facts["reference"] = names[ref_at]
    return rows, facts


def print_table(rows: list[MethodResult], facts: dict) -> None:
    from rich.table import Table

    console = logs.console()
    console.print(f"cpu: {facts['cpu']}")
    console.print(f"model {facts['model']} via {facts['path']}; corpus {facts['texts']} texts, "
                  f"{facts['real_tokens']} real tokens (p50 {facts['length_p50']:.0f}, max {facts['length_max']})")
    for name, reason in facts.get("skipped", []):
        console.print(f"[dim]skipped {name}: {reason}[/dim]")
    table = Table(title="bench engine (median of repeats)")
    for col in ("threads", "method", "texts/s", "real tok/s", "padding", "peak MB", "useful GFLOP/s",
                "% peak (own precision)", "vs sentence-tf", "vs naive", f"min cos vs {facts.get('reference', 'fp32')}"):
        table.add_column(col, justify="right" if col != "method" else "left")
    short = {"float32": "fp32", "bfloat16": "bf16", "int8": "int8"}
    for n in sorted({r.threads for r in rows}):
        group = [r for r in rows if r.threads == n]
        peaks = facts["peak_gflops"][n]
        base = {r.method.split()[0]: r.tokens_per_s for r in group}
        for r in group:
            table.add_row(
                str(n), r.method, f"{r.texts_per_s:,.1f}", f"{r.tokens_per_s:,.0f}", f"{r.padding_fraction:.1%}",
                f"{r.peak_mem_mb:,.0f}", f"{r.useful_gflops:,.1f}",
                f"{r.useful_gflops / peaks[r.precision]:.0%} {short.get(r.precision, r.precision)}",
                f"{r.tokens_per_s / base['sentence-transformers']:.2f}x" if "sentence-transformers" in base else "-",
                f"{r.tokens_per_s / base['naive']:.2f}x" if "naive" in base else "-",
                f"{r.min_cos:.6f}" if r.min_cos is not None else "-",
            )
        measured = ", ".join(f"{short.get(p, p)} {g:,.1f}" for p, g in peaks.items())
        table.add_row(str(n), f"[dim]peak GEMM measured (GFLOP/s): {measured}[/dim]", *[""] * 9)
    console.print(table)
    console.print(family_table(rows, facts))
    for n in sorted(facts.get("choices", {})):
        for floor, (choice, measured) in facts["choices"][n].items():
            from embedstream.engine.tuning import SHAPES, choose

            print_frontier(measured, {shape: choose(measured.measurements, choice.floor, shape) for shape in SHAPES},
                           f"{facts['model']}, {n} thread(s), floor {floor}")
        group = [r for r in rows if r.threads == n]
        if any(r.recall_at_10 is not None for r in group):
            console.print(frontier_table(group, facts["choices"][n], n))


def family_table(rows: list[MethodResult], facts: dict):
    """Per precision family and thread count: embedstream's fastest row against the fastest other row, and
    embedstream's scaling from the fewest to the most threads (the issue's ratios, side by side)."""
    from rich.table import Table

    table = Table(title="embedstream vs the fastest peer, by precision (real tokens/s)")
    for col in ("precision", "threads", "embedstream best", "tok/s", "% peak", "fastest peer", "tok/s", "ratio",
                "threads scaling"):
        table.add_column(col, justify="left" if col in ("precision", "embedstream best", "fastest peer") else "right")
    threads = sorted({r.threads for r in rows})
    for precision in ("float32", "bfloat16", "int8"):
        ours_by_n = {}
        for n in threads:
            group = [r for r in rows if r.threads == n and r.precision == precision]
            ours = max((r for r in group if r.method.startswith("embedstream")), key=lambda r: r.tokens_per_s, default=None)
            peer = max((r for r in group if not r.method.startswith("embedstream")), key=lambda r: r.tokens_per_s,
                       default=None)
            if ours is None:
                continue
            ours_by_n[n] = ours.tokens_per_s
            peak = facts["peak_gflops"][n].get(precision)
            scaling = f"{ours.tokens_per_s / ours_by_n[threads[0]]:.2f}x" if n != threads[0] and threads[0] in ours_by_n else "-"
            table.add_row(precision, str(n), ours.method, f"{ours.tokens_per_s:,.0f}",
                          f"{ours.useful_gflops / peak:.0%}" if peak else "-", peer.method if peer else "-",
                          f"{peer.tokens_per_s:,.0f}" if peer else "-",
                          f"{ours.tokens_per_s / peer.tokens_per_s:.2f}x" if peer else "-", scaling)
    return table


def print_frontier(measured, choices: dict, title: str) -> None:
    """The tuner's measurements on this host: per path tok/s and query latency against recall@10 and min cos,
    fastest first, the path each lane shape gets at the floor marked (``choices``: shape -> tuning.Choice)."""
    from rich.table import Table

    from embedstream.engine.tuner import cpu_model

    console = logs.console()
    console.print(f"cpu: {cpu_model()} ({cpu_summary()}); measured in {measured.seconds:.0f} s")
    table = Table(title=f"engine paths measured on this host: {title}")
    for col in ("path", "tok/s (bulk)", "ms/query", "recall@10 vs fp32", "min cos vs fp32", "meets floor",
                *[f"{shape}" for shape in choices]):
        table.add_column(col, justify="left" if col == "path" else "right")
    floor = next(iter(choices.values())).floor if choices else None
    for m in sorted(measured.measurements, key=lambda m: -m.bulk_tok_s):
        marks = []
        for c in choices.values():
            marks.append("[bold green]chosen[/]" if c.winner.path == m.path else
                         "runner-up" if c.runner_up is not None and c.runner_up.path == m.path else "")
        table.add_row(m.path.label, f"{m.bulk_tok_s:,.0f}", f"{m.query_ms:.2f}", f"{m.recall_at_10:.4f}",
                      f"{m.min_cos:.6f}", "yes" if floor is not None and floor.met_by(m) else "no", *marks)
    console.print(table)
    for label, why in measured.skipped:
        console.print(f"[dim]not measured: {label}: {why}[/dim]")


def frontier_table(group: list[MethodResult], choices: dict, threads: int):
    """One thread count's rows on the speed / quality frontier, fastest first: real tok/s on the bench corpus
    against recall@10 (the tuner's set) and min cos; each tuned row against the fastest non-tuned row that
    meets its floor (peers and embedstream's fixed paths alike), and against float32."""
    from rich.table import Table

    table = Table(title=f"frontier, {threads} thread(s): tok/s vs quality (bench corpus; recall@10 on the tuner's set)")
    for col in ("method", "tok/s", "recall@10", "min cos", *[f"meets {f}" for f in choices], "note"):
        table.add_column(col, justify="left" if col in ("method", "note") else "right")
    floors = {f: c.floor for f, (c, _) in choices.items()}
    exact_ref = next((r for r in group if r.method == "embedstream (packed, fp32)"), None)

    def meets(r: MethodResult, floor) -> bool:
        if r.precision == "float32":
            return True
        return not floor.exact and r.recall_at_10 is not None and r.recall_at_10 >= floor.recall_at_10 and (
            floor.min_cos is None or (r.min_cos or 0) >= floor.min_cos)

    notes = {}
    for f, floor in floors.items():
        tuned = next((r for r in group if r.method.startswith(f"embedstream (tuned @ {f}:")), None)
        if tuned is None:
            continue
        others = [r for r in group if not r.method.startswith("embedstream (tuned") and meets(r, floor)]
        peer = max((r for r in others if not r.method.startswith("embedstream")), key=lambda r: r.tokens_per_s,
                   default=None)
        best = max(others, key=lambda r: r.tokens_per_s, default=None)
        note = [f"chosen at {f}"]
        if peer:
            note.append(f"{tuned.tokens_per_s / peer.tokens_per_s:.2f}x fastest peer meeting it ({peer.method})")
        if best and best is not peer:
            note.append(f"{tuned.tokens_per_s / best.tokens_per_s:.2f}x fastest row meeting it")
        if exact_ref:
            note.append(f"{tuned.tokens_per_s / exact_ref.tokens_per_s:.2f}x packed fp32")
        notes[tuned.method] = "; ".join(note)
    for r in sorted(group, key=lambda r: -r.tokens_per_s):
        table.add_row(r.method, f"{r.tokens_per_s:,.0f}", "-" if r.recall_at_10 is None else f"{r.recall_at_10:.4f}",
                      "-" if r.min_cos is None else f"{r.min_cos:.6f}",
                      *["yes" if meets(r, floor) else "no" for floor in floors.values()], notes.get(r.method, ""))
    return table
