"""`embedstream bench quality`: what each storage form costs in recall, against exact float32 search.

Corpus: the stdlib prose paragraphs (:func:`embedstream.corpus.stdlib_paragraphs`), long ones
split at sentence boundaries into chunks of at most ``chunk_words`` words, 200 paragraphs held out
as queries (none of their chunks is in the corpus). The chunks are embedded once with the engine
(MiniLM by default) and the float32 matrix is cached in ``~/.cache/embedstream/quality-<hash>.npy``
(the embedding takes minutes on a small machine; everything after it takes seconds).

Every form is scored by brute force in numpy, so the numbers are exact, not an index's estimate:
* float16: stored vectors cast to float16, float32 query;
* int8: symmetric per-vector scale (scale = max|v| / 127), float32 query;
* uint8 as the sink stores it in Qdrant (int8 shifted by 128) compared by cosine of the shifted
  integers, which is what a store does with it before any rescoring;
* binary: sign bits, Hamming distance to the query's sign bits, no rescoring;
* each of them again with a rescoring pass: ``rescore`` x k candidates from the form, reranked on
  the full float32 vectors (which then live on disk or in a slower tier);
* float32 vectors searched with the queries embedded at bf16 (what precision ``fast`` gives the
  online lane where the CPU has native bf16): the cost of the query path's precision alone.
* queries *and* documents embedded with the engine at int8 (static, calibrated: engine/calibrate.py)
  and searched exactly: what the int8 engine costs in recall (target: >= 0.98 of float32's 1.0); the same
  with the OpenVINO backend's int8 where the ``openvino`` extra is installed.
Matryoshka sizes are not measured: MiniLM is not Matryoshka-trained, its truncated vectors are
not a supported form (the engine refuses them), and the table says so.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedstream import logs
from embedstream.corpus import sentence_chunks, stdlib_paragraphs

CACHE_DIR = Path.home() / ".cache" / "embedstream"
TARGET_RECALL = 0.98
OVERSAMPLING_LADDER = (1, 2, 3, 4, 6, 8, 10, 12, 16, 24, 32)  # rescoring factors tried per form


def build_corpus(queries: int = 200, chunk_words: int = 40, seed: int = 17) -> tuple[list[str], list[str]]:
    """(chunks, held-out query paragraphs): real prose, deterministic, no chunk taken from a query paragraph."""
    paras = list(stdlib_paragraphs())
    rng = random.Random(seed)
    held = set(rng.sample(range(len(paras)), queries))
    chunks: list[str] = []
    for i, para in enumerate(paras):
        if i in held:
            continue
        chunks.extend(sentence_chunks(para, chunk_words))
    chunks = list(dict.fromkeys(chunks))  # exact duplicates would make "the" nearest neighbour ambiguous
    return chunks, [paras[i] for i in sorted(held)]


def embed_cached(model: str, texts: list[str], threads: int | None = None, progress: bool = True,
                 precision: str = "float32", backend: str = "auto", prompt: str = "document") -> np.ndarray:
    """float32 [N, D] normalised embeddings of texts (as documents, or with ``prompt="query"`` as queries: the
    model's query prompt), computed once per (model, precision, backend, prompt, texts) and cached."""
    from embedstream.config import Settings
    from embedstream.engine.engine import EmbedRequest, Engine
    from embedstream.engine.model_spec import resolve_model

    settings = Settings()
    settings.engine.threads = threads
    settings.engine.precision = precision
    settings.engine.backend = backend
    spec = resolve_model(model, settings.models)
    digest = hashlib.sha256()
    digest.update(f"{spec.name}\x1f{spec.path}\x1f{spec.pooling}\x1f{spec.max_tokens}\x1e".encode())
    if precision != "float32":  # float32 keeps its old cache key
        digest.update(f"precision={precision}\x1e".encode())
    if backend != "auto":  # auto keeps its old cache key
        digest.update(f"backend={backend}\x1e".encode())
    if prompt != "document":  # documents keep their old cache key
        digest.update(f"prompt={prompt}\x1e".encode())
    if precision == "int8" and backend == "openvino":
        from embedstream.engine.backends.openvino_encoder import INT8_RECIPE as OPENVINO_INT8_RECIPE

        digest.update(f"recipe={OPENVINO_INT8_RECIPE}\x1e".encode())
    elif precision == "int8":  # a new int8 recipe must not read the old recipe's vectors
        from embedstream.engine.backends.bert import INT8_RECIPE
        from embedstream.engine.calibrate import CALIBRATION_VERSION

        digest.update(f"recipe={sorted(INT8_RECIPE.items())}/{CALIBRATION_VERSION}\x1e".encode())
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\x1e")
    path = CACHE_DIR / f"quality-{digest.hexdigest()[:16]}.npy"
    if path.is_file():
        matrix = np.load(path)
        if matrix.shape[0] == len(texts):
            return matrix
    engine = Engine.from_name(model, settings)
    out = np.empty((len(texts), engine.dimensions), dtype=np.float32)
    step = 1024
    requests = [EmbedRequest(i, t, truncate=True, prompt=prompt) for i, t in enumerate(texts)]

    def work(advance) -> None:
        for start in range(0, len(texts), step):
            results, _ = engine.embed(requests[start : start + step])
            for r in results:
                if r.error is not None:
                    raise RuntimeError(f"text {r.id}: {r.error.code}: {r.error.message}")
                out[r.id] = r.full
            advance(len(results))

    if progress:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"embedding {len(texts)} texts with {spec.name} (cached afterwards)", total=len(texts))
            work(lambda n: bar.update(task, advance=n))
    else:
        work(lambda n: None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, out)
    os.replace(tmp, path)
    return out


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best per row, best first (ties: lower index first)."""
    part = np.argpartition(-scores, kth=min(k, scores.shape[1] - 1), axis=1)[:, :k]
    rows = np.arange(scores.shape[0])[:, None]
    order = np.lexsort((part, -scores[rows, part]), axis=1)
    return part[rows, order]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    k = truth.shape[1]
    return float(np.mean([len(set(f[:k]) & set(t)) / k for f, t in zip(found, truth)]))


def _rescore(candidates: np.ndarray, full: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    exact = np.einsum("qcd,qd->qc", full[candidates], queries)
    order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(candidates, order, axis=1)


@dataclass
class FormRow:
    form: str
    bytes_per_vector: float
    recall: float | None
    recall_rescored: float | None
    note: str = ""
    oversampling_needed: int | None = None  # smallest rescoring factor reaching TARGET_RECALL (0: not within the ladder)


@dataclass
class QualityResult:
    model: str
    dims: int
    chunks: int
    queries: int
    k: int
    rescore: int
    rows: list[FormRow]
    embed_s: float
    score_s: float


def evaluate(vectors: np.ndarray, queries: np.ndarray, k: int = 10, rescore: int = 4,
             other_queries: dict[str, np.ndarray] | None = None,
             other_engines: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> list[FormRow]:
    """Recall@k of every storage form against exact float32 brute force, plain and rescored.

    ``other_queries``: the same queries embedded another way (e.g. at the online lane's bf16),
    searched against the float32 vectors: what the query path's precision costs on its own.
    ``other_engines``: (documents, queries) both embedded another way (e.g. the int8 engine),
    searched exactly among themselves: what that precision costs end to end."""
    d = vectors.shape[1]
    truth = _topk(queries @ vectors.T, k)
    wide = k * rescore
    rows: list[FormRow] = []

    def add(name: str, nbytes: float, scores: np.ndarray, note: str = "") -> None:
        plain = _topk(scores, k)
        ranked = _topk(scores, k * OVERSAMPLING_LADDER[-1])  # best first: every factor is a prefix
        rescored = {f: recall(_rescore(ranked[:, : k * f], vectors, queries, k), truth) for f in OVERSAMPLING_LADDER}
        needed = next((f for f in OVERSAMPLING_LADDER if rescored[f] >= TARGET_RECALL), 0)
        at_rescore = rescored.get(rescore)
        if at_rescore is None:
            at_rescore = recall(_rescore(_topk(scores, wide), vectors, queries, k), truth)
        rows.append(FormRow(name, nbytes, recall(plain, truth), at_rescore, note, needed))

    rows.append(FormRow("float32 (exact)", 4 * d, 1.0, None, "the reference"))
    for name, other in (other_queries or {}).items():
        rows.append(FormRow(name, 4 * d, recall(_topk(other @ vectors.T, k), truth), None,
                            "float32 vectors, queries embedded at this precision"))
    for name, (other_vectors, other_q) in (other_engines or {}).items():
        rows.append(FormRow(name, 4 * d, recall(_topk(other_q @ other_vectors.T, k), truth), None,
                            "documents and queries embedded at this precision, exact search"))
    f16 = vectors.astype(np.float16).astype(np.float32)
    add("float16", 2 * d, queries @ f16.T)
    peak = np.abs(vectors).max(axis=1, keepdims=True)
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    codes = np.clip(np.rint(vectors / scale), -127, 127).astype(np.int8)
    add("int8, per-vector scale", d + 4, (queries @ codes.astype(np.float32).T) * scale.T, "float32 query, scale as float32")
    shifted = codes.astype(np.float32) + 128.0
    q_peak = np.abs(queries).max(axis=1, keepdims=True)
    q_shifted = np.clip(np.rint(queries / (q_peak / 127.0)), -127, 127) + 128.0
    cos = (q_shifted @ shifted.T) / np.linalg.norm(q_shifted, axis=1, keepdims=True) / np.linalg.norm(shifted, axis=1)
    add("uint8 as stored in Qdrant (int8 + 128, cosine)", d + 4, cos, "why workers.search rescores uint8")
    signs = np.where(vectors > 0, 1.0, -1.0).astype(np.float32)
    q_signs = np.where(queries > 0, 1.0, -1.0).astype(np.float32)
    hamming = (d - q_signs @ signs.T) / 2
    add("binary (sign bits, Hamming)", d / 8, -hamming, "binary query too; rescored = float32 on candidates")
    rows.append(FormRow("Matryoshka (mrl_<d>)", float("nan"), None, None,
                        "not measured: MiniLM is not Matryoshka-trained (the engine refuses truncated sizes)"))
    return rows


def run(model: str = "all-MiniLM-L6-v2", queries: int = 200, k: int = 10, rescore: int = 4, threads: int | None = None,
        chunk_words: int = 40, min_chunks: int = 10_000, engine_precisions: tuple[str, ...] = ("int8",)
        ) -> QualityResult:
    chunks, held = build_corpus(queries, chunk_words)
    if len(chunks) < min_chunks:
        raise RuntimeError(f"only {len(chunks)} chunks (< {min_chunks}); lower --chunk-words")
    t0 = time.perf_counter()
    matrix = embed_cached(model, chunks + held, threads)
    vectors, qvecs = matrix[: len(chunks)], matrix[len(chunks) :]
    bf16_queries = embed_cached(model, held, threads, progress=False, precision="bfloat16")
    others = {}
    from embedstream.engine.backends import openvino_encoder

    openvino = [] if openvino_encoder.missing() else ["openvino"]
    for precision in engine_precisions:
        for backend in ["auto", *openvino]:
            other = embed_cached(model, chunks + held, threads, precision=precision, backend=backend)
            label = f"engine at {precision}" + (f" ({backend} backend)" if backend != "auto" else "")
            others[f"{label}: documents and queries"] = (other[: len(chunks)], other[len(chunks) :])
    embed_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    rows = evaluate(vectors, qvecs, k, rescore, {"float32, queries at bfloat16 (precision 'fast')": bf16_queries},
                    others)
    return QualityResult(model, vectors.shape[1], len(chunks), len(held), k, rescore, rows, embed_s,
                         time.perf_counter() - t1)


def print_table(result: QualityResult, console=None) -> None:
    from rich.table import Table

    console = console or logs.console()
    table = Table(title=(f"recall@{result.k} vs exact float32: {result.model} ({result.dims}-d), {result.chunks} real chunks, "
                         f"{result.queries} held-out paragraph queries, rescoring = float32 on {result.k * result.rescore} "
                         f"candidates"))
    for col in ("form", "bytes/vector", "per 1M vectors", f"recall@{result.k}", f"recall@{result.k} rescored",
                f"oversampling for ≥{TARGET_RECALL}", "note"):
        table.add_column(col, justify="left" if col in ("form", "note") else "right")

    def fmt(value: float | None) -> str:
        if value is None:
            return "-"
        colour = "green" if value >= TARGET_RECALL else "yellow"
        return f"[{colour}]{value:.4f}[/{colour}]"

    for row in result.rows:
        nbytes = "-" if row.bytes_per_vector != row.bytes_per_vector else f"{row.bytes_per_vector:g}"
        mb = "-" if row.bytes_per_vector != row.bytes_per_vector else f"{row.bytes_per_vector * 1e6 / 2**20:,.0f} MiB"
        needed = "-" if row.oversampling_needed is None else (
            f"x{row.oversampling_needed}" if row.oversampling_needed else f"> x{OVERSAMPLING_LADDER[-1]}")
        table.add_row(row.form, nbytes, mb, fmt(row.recall), fmt(row.recall_rescored), needed, row.note)
    console.print(table)
    console.print(f"target: recall@{result.k} ≥ {TARGET_RECALL} with rescoring; embeddings {result.embed_s:.1f} s "
                  f"(cached after the first run), scoring {result.score_s:.1f} s. per 1M vectors: the vectors alone "
                  f"(Qdrant adds ids, payload and index; rescoring also keeps float32 on disk).")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--rescore", type=int, default=4)
    parser.add_argument("--threads", type=int)
    a = parser.parse_args(argv)
    print_table(run(a.model, a.queries, a.k, a.rescore, a.threads))


if __name__ == "__main__":
    main()
