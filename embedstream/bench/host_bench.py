"""`embedstream bench host`: how fast one worker's host path feeds the model, Kafka -> Qdrant.

For each model (a 2-layer, 32-wide BERT with MiniLM's tokenizer, whose forward pass is nearly free,
so the host path sets the pace; and all-MiniLM-L6-v2 itself) one backlog of ~200-token chunks is
published twice to the local broker: as text events, and as pre-tokenized events (``token_ids`` +
the tokenizer fingerprint, :mod:`embedstream.schemas.token_ids`). Then, in turns in one run:

* the engine alone on the same chunks in this process (one torch thread, as a worker runs), from
  text and from the ids,
* bulk worker processes (one torch thread each, embedded qdrant-edge store) for each event kind,
  with 1 and then 2 processes in one consumer group. Each run gets a fresh topic: its workers start
  and settle their partition assignment first, then the backlog's records (encoded once) are sent,
  so no rebalance happens while a backlog drains.

A run's rate is taken over the drain only (from the first record sent, to the workers already up
and assigned, until every offset is committed; start-up excluded): committed offsets follow the
store writes, so committed == written. Each
worker's ``/metrics`` is scraped at both ends of that window for its stages' busy/idle seconds
(``embedstream_stage_busy_seconds_total`` and friends, where the worker exports them), and its
peak RSS is read from ``/proc``. The host is shared: quote the ratios taken within one run.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from embedstream import devkafka, logs
from embedstream.corpus import documents
from embedstream.bench.pipeline_bench import _LagProbe
from embedstream.config import Settings, default_registry
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.engine.model_spec import ModelSpec, resolve_model, resolve_path
from embedstream.gcfreeze import freeze_startup_objects
from embedstream.producers.chunker import Chunker
from embedstream.producers.topics import ensure_topics
from embedstream.schemas.codec import encode
from embedstream.schemas.events import ChunkEvent
from embedstream.schemas.token_ids import decode_token_ids

PADDED_PATH = "engine alone, transformers padded"
BASELINE_CHUNKS_PER_S = 3150.0  # issue #14: tiny model, one worker process, text events, before the staged worker
EVENT_KINDS = ("text", "ids")
MODELS = ("tiny", "minilm")
CHUNK_TOKENS = 200
PARTITIONS = 4
_STAGE_METRICS = {"busy": "embedstream_stage_busy_seconds_total", "idle": "embedstream_stage_idle_seconds_total",
                  "blocked": "embedstream_stage_blocked_seconds_total"}


@dataclass
class Backlog:
    """One model's chunks, published once per event kind to its own topic."""

    model: str
    spec: ModelSpec
    texts: list[str]
    ids: list[str]
    token_dtype: str
    fingerprint: str
    tokens: int
    records: dict[str, list[bytes]] = field(default_factory=dict)  # event kind -> encoded events


@dataclass
class Row:
    model: str
    path: str  # "engine alone" or "end to end"
    events: str
    processes: int
    chunks: int
    tokens: int
    seconds: float
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> {busy, idle, blocked} fraction
    rss_peak_mb: float | None = None

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def tiny_model(folder: Path | None = None) -> Path:
    """A 2-layer, hidden-32 BERT (random weights) with all-MiniLM-L6-v2's own tokenizer files and mean
    pooling, built once into the cache: its forward pass is nearly free, so a run measures the host path."""
    folder = folder or Path.home() / ".cache" / "embedstream" / "bench" / "tiny-host-bert"
    if (folder / "modules.json").is_file():
        return folder
    import torch
    from transformers import BertConfig, BertModel

    minilm = resolve_path(default_registry()["all-MiniLM-L6-v2"].path)
    staging = Path(tempfile.mkdtemp(prefix="tiny-host-", dir=folder.parent if folder.parent.is_dir() else None))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512)
    BertModel(config).eval().save_pretrained(staging)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                 "sentence_bert_config.json", "modules.json"):
        if (minilm / name).is_file():
            shutil.copy(minilm / name, staging / name)
    (staging / "1_Pooling").mkdir()
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    (staging / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 32}))
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(staging, folder)  # atomic: a concurrent builder's folder wins, ours is dropped
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _backlog(model: str, spec: ModelSpec, count: int) -> Backlog:
    """``count`` chunks of up to 200 tokens cut from real prose by the model's chunker, with their ids."""
    chunker = Chunker.for_model(spec, chunk_tokens=CHUNK_TOKENS, overlap_tokens=24)
    texts: list[str] = []
    seed = 0
    while len(texts) < count:
        batch = documents(max(50, count // 10), seed=100 + seed)
        texts += [c for chunks in chunker.chunk_many([d["text"] for d in batch]) for c in chunks]
        seed += 1
    texts = texts[:count]
    ids = chunker.token_ids_many(texts)
    dtype = chunker.ids.dtype
    tokens = sum(decode_token_ids(i, dtype).size for i in ids)
    return Backlog(model, spec, texts, ids, dtype, chunker.ids.fingerprint, tokens)


def _encode_records(backlog: Backlog) -> None:
    """Each chunk as a text event and as a pre-tokenized event, encoded once for every run."""
    for kind in EVENT_KINDS:
        backlog.records[kind] = [encode(ChunkEvent(
            doc_id=f"{backlog.model}-{i // 8}", chunk_id=i % 8, text=text, lane="bulk",
            **({"token_ids": backlog.ids[i], "token_dtype": backlog.token_dtype, "tokenizer": backlog.fingerprint}
               if kind == "ids" else {}))) for i, text in enumerate(backlog.texts)]


def _send(settings: Settings, topic: str, records: list[bytes]) -> None:
    """The backlog through librdkafka: the harness's sends share the workers' two cores during a drain,
    and librdkafka's C sender costs a fraction of kafka-python's Python one."""
    producer = Producer(settings.kafka.librdkafka_config(**{
        "client.id": "embedstream-bench-host", "acks": "all", "linger.ms": 5, "batch.size": 256 * 1024,
        "compression.type": "lz4", "queue.buffering.max.messages": max(100_000, len(records))}))
    failed: list[str] = []
    delivered = lambda error, _msg: error is not None and failed.append(error.str())  # noqa: E731
    for i, value in enumerate(records):
        producer.produce(topic, key=f"k{i // 8}".encode(), value=value, on_delivery=delivered)
        if i % 1000 == 999:
            producer.poll(0)
    left = producer.flush(60)
    if left or failed:
        raise RuntimeError(f"{left + len(failed)} backlog records not acknowledged by the broker, e.g. {failed[:1]}")


def _engine_alone(engine: Engine, backlog: Backlog, kind: str, path: str = "engine alone") -> Row:
    """The engine in this process on the same chunks, in arrival order (as a bulk worker takes them)."""
    if kind == "ids":
        requests = [EmbedRequest(i, t, prompt="document", token_ids=decode_token_ids(ids, backlog.token_dtype),
                                 tokenizer=backlog.fingerprint) for i, (t, ids) in enumerate(zip(backlog.texts, backlog.ids))]
    else:
        requests = [EmbedRequest(i, t, prompt="document") for i, t in enumerate(backlog.texts)]
    seconds = float("inf")
    for _ in range(2):  # best of two: the host is shared, and the faster pass is the engine's own speed
        start = time.perf_counter()
        results, timings = engine.embed(requests, sort_by_length=False)
        seconds = min(seconds, time.perf_counter() - start)
    failed = [r for r in results if r.error]
    if failed:
        raise RuntimeError(f"engine refused {len(failed)} chunks, e.g. {failed[0].error.message}")
    return Row(backlog.model, path, kind, 1, len(requests), timings.tokens, seconds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Worker:
    """One bulk worker process (one torch thread) with its own store folder, log file and metrics port."""

    def __init__(self, settings: Settings, model: str, topic: str, group: str, run_dir: Path, index: int):
        k = settings.kafka
        self.port = _free_port()
        self.log_path = run_dir / f"worker-{index}.log"
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false",
               "EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
               "EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_BULK": topic,
               "EMBEDSTREAM_KAFKA__TOPIC_DEAD_LETTERS": k.topic_dead_letters,
               "EMBEDSTREAM_KAFKA__GROUP_BULK": group,
               "EMBEDSTREAM_QDRANT__COLLECTION": "bench",
               "EMBEDSTREAM_QDRANT__PATH": str(run_dir / f"store-{index}"),
               "EMBEDSTREAM_QDRANT_PATH": str(run_dir / f"store-{index}"),
               "EMBEDSTREAM_ENGINE__THREADS": "1"}
        with open(self.log_path, "wb") as log:  # a file, not a pipe: never blocks the worker
            self.proc = subprocess.Popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk",
                                          "--model", model, "--metrics-port", str(self.port), "--no-search"],
                                         env=env, stdout=log, stderr=subprocess.STDOUT)

    def assigned(self) -> list[str] | None:
        """The partitions of the worker's latest assignment (None before its first)."""
        text = self.log_path.read_text(errors="replace")
        if "Traceback" in text:
            raise RuntimeError(f"a bench worker failed; see {self.log_path}")
        self.check_running()
        lines = [line for line in text.splitlines() if '"partitions assigned"' in line]
        return json.loads(lines[-1]).get("partitions", []) if lines else None

    def check_running(self) -> None:
        """A worker that exited mid-drain fails the run at once, not after the drain's timeout."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"a bench worker exited with {self.proc.returncode}; see {self.log_path}")

    def stage_seconds(self) -> dict[tuple[str, str], float]:
        """(kind, stage) -> seconds from the worker's /metrics; empty when it exports none."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            for kind, metric in _STAGE_METRICS.items():
                if line.startswith(metric + "{"):
                    stage = line.split('stage="', 1)[1].split('"', 1)[0]
                    out[(kind, stage)] = float(line.rsplit(" ", 1)[1])
        return out

    def rss_peak_mb(self) -> float | None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _settled(workers: list[_Worker]) -> bool:
    """Every worker holds its share of the partitions, none twice: the group's assignment is final."""
    assignments = [w.assigned() for w in workers]
    if any(a is None for a in assignments):
        return False
    held = [p for a in assignments for p in a]
    return len(held) == len(set(held)) == PARTITIONS and all(assignments)


def _end_to_end(settings: Settings, backlog: Backlog, kind: str, processes: int, model_arg: str, root: Path,
                timeout_s: float) -> Row:
    """Drain the kind's backlog with ``processes`` workers in one group; the rate over the drain only."""
    group = f"host-{uuid.uuid4().hex[:8]}"
    topic = f"bench-host.{backlog.model}.{kind}.{group}"
    ensure_topics(settings.kafka, PARTITIONS, topics=[topic])
    run_dir = root / f"{backlog.model}-{kind}-{processes}p-{group}"
    run_dir.mkdir(parents=True)
    workers = [_Worker(settings, model_arg, topic, group, run_dir, i) for i in range(processes)]
    total = len(backlog.records[kind])
    end = time.monotonic() + timeout_s
    try:
        while not _settled(workers):
            _check_time(end, run_dir, "bench workers not assigned their partitions")
            time.sleep(0.2)
        k = settings.kafka.model_copy(update={"topic_chunks_bulk": topic})
        with _LagProbe(k, group) as probe:
            before = [w.stage_seconds() for w in workers]
            start = time.perf_counter()
            _send(settings, topic, backlog.records[kind])
            while probe.lag() > 0:
                _check_time(end, run_dir, "backlog not drained")
                for w in workers:
                    w.check_running()
                time.sleep(0.05)
            seconds = time.perf_counter() - start
            after = [w.stage_seconds() for w in workers]
        rss = [w.rss_peak_mb() for w in workers]
    finally:
        for w in workers:
            w.stop()
    return Row(backlog.model, "end to end", kind, processes, total, backlog.tokens, seconds,
               _fractions(before, after, seconds), max((r for r in rss if r is not None), default=None))


def _check_time(end: float, run_dir: Path, what: str) -> None:
    if time.monotonic() > end:
        raise RuntimeError(f"{what} in time; see {run_dir}")


def _fractions(before: list[dict], after: list[dict], seconds: float) -> dict[str, dict[str, float]]:
    """stage -> {busy, idle, blocked}: seconds per second of the window, averaged over the processes."""
    out: dict[str, dict[str, float]] = {}
    for b, a in zip(before, after):
        for (kind, stage), value in a.items():
            share = (value - b.get((kind, stage), 0.0)) / seconds / len(after)
            out.setdefault(stage, {}).setdefault(kind, 0.0)
            out[stage][kind] += share
    return out


def run(chunks: int = 20_000, minilm_chunks: int = 2_000, processes: tuple[int, ...] = (1, 2), port: int = 9092,
        models: tuple[str, ...] = MODELS, bootstrap: str | None = None, timeout_s: float = 900.0) -> dict:
    """Engine alone and end to end, text and pre-tokenized events, per model and process count (in turns)."""
    import torch

    if bootstrap is None:
        bootstrap = devkafka.start(port=port).bootstrap
    settings = Settings()
    settings.kafka.bootstrap_servers = bootstrap
    prefix = f"bench-host-{uuid.uuid4().hex[:6]}"
    settings.kafka.topic_dead_letters = f"{prefix}.dlq"
    ensure_topics(settings.kafka, 1, topics=[settings.kafka.topic_dead_letters])
    torch.set_num_threads(1)  # as each worker process runs
    root = Path(tempfile.mkdtemp(prefix="embedstream-bench-host-"))
    rows: list[Row] = []
    try:
        for model in models:
            model_arg = str(tiny_model()) if model == "tiny" else "all-MiniLM-L6-v2"
            spec = resolve_model(model_arg, settings.models)
            engine = Engine(spec, settings.engine)
            backlog = _backlog(model, spec, chunks if model == "tiny" else minilm_chunks)
            _encode_records(backlog)
            engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(backlog.texts[:256])])  # warm
            freeze_startup_objects()  # as workers do: a full collection over torch's objects is not the engine's cost
            if model == "tiny":  # the padded transformers forward (no Kafka): what the baseline is set against
                padded = Engine(spec, settings.engine.model_copy(update={"backend": "hf"}))
                rows.append(_engine_alone(padded, backlog, "text", PADDED_PATH))
                del padded
            for kind in EVENT_KINDS:
                rows.append(_engine_alone(engine, backlog, kind))
                for count in processes:
                    rows.append(_end_to_end(settings, backlog, kind, count, model_arg, root, timeout_s))
            del engine
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"rows": rows, "processes": processes}


def _row(rows: list[Row], model: str, path: str, events: str, processes: int = 1) -> Row | None:
    return next((r for r in rows if (r.model, r.path, r.events, r.processes) == (model, path, events, processes)), None)


def summary(out: dict) -> list[tuple[str, str, str]]:
    """(measure, value, target) lines: the issue's targets, each a ratio within this run."""
    rows: list[Row] = out["rows"]
    lines = []
    for events, target in (("ids", 4.0), ("text", 2.0)):
        row = _row(rows, "tiny", "end to end", events)
        if row:
            lines.append((f"tiny, 1 process, {events} events: chunks/s / {BASELINE_CHUNKS_PER_S:.0f} (issue's baseline)",
                          f"{row.chunks_per_s / BASELINE_CHUNKS_PER_S:.2f}", f">= {target:g}"))
    alone = [r for r in rows if r.model == "tiny" and r.path.startswith("engine alone")]
    if alone:  # no end-to-end rate can pass the engine's own: is the baseline reachable on this host at all?
        best = max(alone, key=lambda r: r.chunks_per_s)
        lines.append((f"tiny, fastest engine alone, no Kafka ({best.path}, {best.events}): chunks/s / "
                      f"{BASELINE_CHUNKS_PER_S:.0f}", f"{best.chunks_per_s / BASELINE_CHUNKS_PER_S:.2f}",
                      ">= 4 for the targets to be reachable"))
    for model in MODELS:
        for events in EVENT_KINDS:
            one, two = _row(rows, model, "end to end", events), _row(rows, model, "end to end", events, 2)
            if one and two:
                lines.append((f"{model}, {events} events: 2 processes / 1", f"{two.chunks_per_s / one.chunks_per_s:.2f}",
                              ">= 1.7"))
    for events in EVENT_KINDS:
        e2e, alone = _row(rows, "minilm", "end to end", events), _row(rows, "minilm", "engine alone", events)
        if e2e and alone:
            lines.append((f"minilm, {events} events: end to end / engine alone", f"{e2e.chunks_per_s / alone.chunks_per_s:.2f}",
                          ">= 0.97"))
        model_idle = e2e.stages.get("model", {}).get("idle") if e2e else None
        if model_idle is not None:
            lines.append((f"minilm, {events} events: model stage idle while the backlog drains", f"{model_idle:.1%}", "< 5%"))
    return lines


def print_table(out: dict) -> None:
    from rich.table import Table

    table = Table(title="bench host: Kafka -> worker -> Qdrant (embedded), one torch thread per process; "
                        "stage fractions are seconds per second of the drain, averaged over processes")
    for name in ("model", "path", "events", "procs", "chunks", "chunks/s", "tokens/s", "intake busy", "model busy",
                 "model idle", "output busy", "RSS peak MB"):
        table.add_column(name, justify="left" if name in ("model", "path", "events") else "right")

    def frac(row: Row, stage: str, kind: str) -> str:
        value = row.stages.get(stage, {}).get(kind)
        return "" if value is None else f"{value:.0%}"

    for r in out["rows"]:
        table.add_row(r.model, r.path, r.events, str(r.processes), str(r.chunks), f"{r.chunks_per_s:,.0f}",
                      f"{r.tokens_per_s:,.0f}", frac(r, "intake", "busy"), frac(r, "model", "busy"),
                      frac(r, "model", "idle"), frac(r, "output", "busy"),
                      "" if r.rss_peak_mb is None else f"{r.rss_peak_mb:,.0f}")
    console = logs.console()
    console.print(table)
    targets = Table(title="targets (issue #14), as ratios within this run")
    for name in ("measure", "value", "target"):
        targets.add_column(name, justify="left" if name == "measure" else "right")
    for line in summary(out):
        targets.add_row(*line)
    console.print(targets)
