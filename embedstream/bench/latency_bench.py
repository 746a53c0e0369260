"""`embedstream bench latency`: load curves of the online lanes, per batching policy, in one run.

Open-loop arrivals (Poisson: the next request does not wait for the last reply, as real users do not)
at stepped offered rates, each step bounded in count and time, over loopback with the local broker;
a worker process per policy (fixed windows 0, 2, 5, 10 ms; the admission controller: ``aimd``,
``deadline``), each measured idle and while a saturating bulk backlog drains in the same process
(the scheduler decides what yields). Every request carries a deadline (``--deadline-ms``, default:
the target), as the project's clients do. Per step: offered and achieved QPS, client-side round-trip
p50 / p95 / p99 of the requests answered, the share answered ``deadline_exceeded`` (shed), and the
bulk chunks/s committed meanwhile. The same for the rerank worker (50 candidates) at its own rates.

A rate is *sustained* by a policy when at least 95% of the requests sent were answered within the
target: the p95 over every request, a shed or failed one counting as a miss, so neither shedding
(the controller) nor answering late (a fixed window) is rewarded; the summary compares the highest
sustained rate per policy. A table
(text and JSON) and a PNG (p95 against offered QPS, a line per policy, the target drawn in) are
written to ``--out``.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from embedstream import devkafka, logs
from embedstream.corpus import documents, stdlib_paragraphs
from embedstream.bench.pipeline_bench import _env, _LagProbe, _wait_ready
from embedstream.config import Settings
from embedstream.schemas.events import QueryReply, QueryRequest, now_ms
from embedstream.schemas.rerank import Candidate, RerankReply, RerankRequest
from embedstream.workers.admission import ON_ARRIVAL, SHED_MESSAGES

_SHED_REASONS = {message: reason for reason, message in SHED_MESSAGES.items()}

#: policy name -> (EMBEDSTREAM_WORKER__ADMISSION_POLICY, EMBEDSTREAM_WORKER__BATCH_WINDOW_MS)
POLICIES: dict[str, tuple[str, float]] = {
    "fixed-0": ("fixed", 0.0), "fixed-2": ("fixed", 2.0), "fixed-5": ("fixed", 5.0), "fixed-10": ("fixed", 10.0),
    "aimd": ("aimd", 2.0), "deadline": ("deadline", 2.0),
}
SUSTAINED_IN_TARGET = 95.0  # % of requests sent answered within the target for a rate to count as sustained


@dataclass
class Step:
    """One offered rate for one policy: what the clients saw."""

    kind: str  # embed | rerank
    policy: str
    backlog: bool
    offered_qps: float
    sent: int
    achieved_qps: float
    p50: float
    p95: float
    p99: float
    shed_pct: float
    shed: int
    failed: int  # timeouts and other errors
    bulk_chunks_per_s: float | None = None
    shed_reply_ms_p50: float | None = None  # how fast a shed request got its answer (client round trip)
    backlog_left: int | None = None
    in_target_pct: float = 0.0  # answered (not shed) within the target: the goodput a caller with that SLO sees
    shed_reasons: dict[str, int] = field(default_factory=dict)  # workers/admission.py's reasons
    shed_in_worker_ms_p95: float | None = None  # refused on arrival: from arrival in the worker to the refusal
    expired_in_worker_ms_p95: float | None = None  # refused later, at its turn (expired or late at its pass)

    def sustained(self) -> bool:
        return self.sent > 0 and self.in_target_pct >= SUSTAINED_IN_TARGET


@dataclass
class LatencyBenchResult:
    cpu: str
    target_ms: float
    rerank_target_ms: float
    deadline_ms: float
    steps: list[Step] = field(default_factory=list)
    png: str = ""
    table: str = ""
    logs: str = ""


def cpu_line() -> str:
    """The machine: CPU model, logical CPUs, load average (the bench shares the host)."""
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from embedstream.bench.engine_bench import cpu_summary

    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model or 'unknown CPU'} ({cpu_summary()}), {os.cpu_count()} logical CPUs, load average {load}"


# -- load generation ---------------------------------------------------------------------------------

def open_loop(client, topic: str, make, reply_model, rate: float, duration_s: float, max_requests: int,
              deadline_ms: float, seed: int) -> tuple[list[float], list[float], int, float, dict[str, int]]:
    """Send at Poisson times of mean ``rate``/s for ``duration_s`` (at most ``max_requests``); returns the round
    trips (ms) of answered requests, those of shed ones, the failures, the seconds the sending took, and the
    shed requests per reason (read from the reply's message)."""
    rng = random.Random(seed)
    count = max(1, min(max_requests, int(rate * duration_s)))
    done: list[tuple[float, float, object]] = []
    lock = threading.Lock()
    pending = []
    start = time.perf_counter()
    at = start
    for n in range(count):
        at += rng.expovariate(rate)
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        request = make(n, now_ms() + int(deadline_ms))
        sent = time.perf_counter()
        future = client.submit(topic, request, reply_model, timeout_s=deadline_ms / 1000 + 10)

        def finished(f, sent=sent):
            with lock:
                done.append((sent, time.perf_counter(), f))
        future.add_done_callback(finished)
        pending.append(future)
    elapsed = time.perf_counter() - start
    for future in pending:
        try:
            future.result(timeout=deadline_ms / 1000 + 15)
        except Exception:  # noqa: BLE001 - counted below as a failure
            pass
    ok, shed, failed = [], [], 0
    shed_in_worker: dict[bool, list[float]] = {True: [], False: []}  # refused on arrival or not: their times
    reasons: Counter[str] = Counter()
    for sent, got, future in done:
        exc = future.exception()
        reply = None if exc is not None else future.result()
        if reply is None:
            failed += 1
        elif reply.error is None:
            ok.append((got - sent) * 1000)
        elif reply.error.code == "deadline_exceeded":
            shed.append((got - sent) * 1000)
            reason = _SHED_REASONS.get(reply.error.message, "other")
            reasons[reason] += 1
            if "total" in reply.timings_ms:
                shed_in_worker[reason in ON_ARRIVAL].append(reply.timings_ms["total"])
        else:
            failed += 1
    failed += count - len(done)
    return ok, shed, failed, elapsed, dict(reasons), shed_in_worker


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _step(kind: str, policy: str, backlog: bool, rate: float, result, target_ms: float,
          bulk_cps: float | None = None, backlog_left: int | None = None) -> Step:
    ok, shed, failed, elapsed, reasons, shed_in_worker = result
    sent = len(ok) + len(shed) + failed
    in_target = 100.0 * sum(1 for ms in ok if ms <= target_ms) / sent if sent else 0.0
    return Step(kind, policy, backlog, rate, sent, len(ok) / elapsed if elapsed else 0.0, _pct(ok, 50), _pct(ok, 95),
                _pct(ok, 99), 100.0 * len(shed) / sent if sent else 0.0, len(shed), failed, bulk_cps,
                _pct(shed, 50) if shed else None, backlog_left, in_target, reasons,
                _pct(shed_in_worker[True], 95) if shed_in_worker[True] else None,
                _pct(shed_in_worker[False], 95) if shed_in_worker[False] else None)


# -- workers -------------------------------------------------------------------------------------------

class _Process:
    """A worker process with its own log; terminated on exit."""

    def __init__(self, args: list[str], env: dict, log_dir: str, name: str):
        self.log_path = os.path.join(log_dir, f"worker-{name}.log")
        self.name = name
        self.log_dir = log_dir
        log = open(self.log_path, "wb")  # a file, not a pipe: never blocks the worker
        self.proc = subprocess.Popen([sys.executable, "-m", "embedstream.cli", "worker", *args], env=env, stdout=log,
                                     stderr=subprocess.STDOUT)

    def __enter__(self) -> "_Process":
        _wait_ready(self.log_dir, [self.name])
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _policy_env(base: dict, policy: str, target_ms: float, rerank_target_ms: float) -> dict:
    mode, window = POLICIES[policy]
    return {**base, "EMBEDSTREAM_WORKER__ADMISSION_POLICY": mode, "EMBEDSTREAM_WORKER__BATCH_WINDOW_MS": str(window),
            "EMBEDSTREAM_WORKER__LATENCY_TARGET_MS": str(target_ms),
            "EMBEDSTREAM_WORKER__RERANK_LATENCY_TARGET_MS": str(rerank_target_ms),
            "EMBEDSTREAM_ENGINE__PRECISION": "fast", "EMBEDSTREAM_LOG_JSON": "false"}


def _topics(settings: Settings, prefix: str) -> Settings:
    s = settings.model_copy(deep=True)
    k = s.kafka
    k.topic_chunks_online, k.topic_chunks_bulk = f"{prefix}.chunks.online", f"{prefix}.chunks.bulk"
    k.topic_queries, k.topic_replies, k.topic_dead_letters = f"{prefix}.queries", f"{prefix}.replies", f"{prefix}.dlq"
    k.topic_rerank, k.topic_search = f"{prefix}.rerank", f"{prefix}.search"
    k.group_rerank = f"{prefix}-rerank"
    return s


# -- the two benches ------------------------------------------------------------------------------------

def _query_texts() -> list[str]:
    return [" ".join(p.split()[:12]) for p in stdlib_paragraphs()[:200]]  # query-sized: 15-25 tokens


def _embed_policy(settings: Settings, policy: str, rates: list[float], opts: dict, work_dir: str,
                  chunker, out: list[Step]) -> None:
    from embedstream.producers.publisher import ChunkPublisher
    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.topics import ensure_topics

    prefix = f"lat-{uuid.uuid4().hex[:6]}-{policy}"
    s = _topics(settings, prefix)
    k = s.kafka
    ensure_topics(k, partitions=2)
    log_dir = os.path.join(work_dir, policy)
    os.makedirs(log_dir, exist_ok=True)
    env = _policy_env(_env(s, prefix, os.path.join(log_dir, "store"), "bench", 1), policy, opts["target_ms"],
                      opts["rerank_target_ms"])
    texts = _query_texts()

    def make(n: int, deadline: int) -> QueryRequest:
        return QueryRequest(request_id=uuid.uuid4().hex, text=texts[n % len(texts)], prompt="query",
                            reply_to=k.topic_replies, deadline_ms=deadline, sent_at_ms=now_ms())

    with _Process(["embed", "--lanes", "online,bulk", "--metrics-port", "0"], env, log_dir, "online,bulk"), \
            QueryClient(k) as client:
        for n in range(opts["warmup"]):  # fresh topics and clients: the first ~100 round trips are slow
            client.embed(texts[n % len(texts)], timeout_s=30)
        for i, rate in enumerate(rates):
            result = open_loop(client, k.topic_queries, make, QueryReply, rate, opts["step_s"], opts["max_requests"],
                               opts["deadline_ms"], seed=i)
            out.append(_step("embed", policy, False, rate, result, opts["target_ms"]))
            _progress(out[-1])
        if not opts["backlog"]:
            return
        with ChunkPublisher(k, lane="bulk") as pub, _LagProbe(k, f"{prefix}-bulk") as probe:
            pub.publish_documents(_backlog_docs(opts["backlog_docs"], prefix), chunker)
            pub.flush()
            time.sleep(opts["step_s"] / 2)  # the bulk lane is draining before the first step
            for i, rate in enumerate(rates):
                before, t0 = probe.lag(), time.perf_counter()
                result = open_loop(client, k.topic_queries, make, QueryReply, rate, opts["step_s"],
                                   opts["max_requests"], opts["deadline_ms"], seed=100 + i)
                after = probe.lag()
                out.append(_step("embed", policy, True, rate, result, opts["target_ms"],
                                 (before - after) / (time.perf_counter() - t0), after))
                _progress(out[-1])


def _backlog_docs(count: int, tag: str) -> list[dict]:
    return [dict(d, doc_id=f"{tag}-{d['doc_id']}") for d in documents(count, seed=5)]


def _rerank_policy(settings: Settings, policy: str, rates: list[float], opts: dict, work_dir: str, ce_dir: str,
                   out: list[Step]) -> None:
    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.topics import ensure_topics

    prefix = f"latr-{uuid.uuid4().hex[:6]}-{policy}"
    s = _topics(settings, prefix)
    k = s.kafka
    ensure_topics(k, partitions=2)
    log_dir = os.path.join(work_dir, f"rerank-{policy}")
    os.makedirs(log_dir, exist_ok=True)
    env = _policy_env(_env(s, prefix, None, "bench", 1), policy, opts["target_ms"], opts["rerank_target_ms"])
    env.update({"EMBEDSTREAM_KAFKA__TOPIC_RERANK": k.topic_rerank, "EMBEDSTREAM_KAFKA__TOPIC_SEARCH": k.topic_search,
                "EMBEDSTREAM_KAFKA__GROUP_RERANK": k.group_rerank})
    paras = stdlib_paragraphs()
    words = opts["candidate_words"]
    candidates = [[Candidate(id=f"c{i}", text=" ".join(paras[(300 + 50 * q + i) % len(paras)].split()[:words]))
                   for i in range(50)] for q in range(8)]
    queries = _query_texts()

    def make(n: int, deadline: int) -> RerankRequest:
        return RerankRequest(request_id=uuid.uuid4().hex, query=queries[n % len(queries)],
                             candidates=candidates[n % len(candidates)], top_n=10, reply_to=k.topic_replies,
                             deadline_ms=deadline, sent_at_ms=now_ms())

    args = ["rerank", "--model", ce_dir, "--no-search", "--threads", "1", "--metrics-port", "0"]
    with _Process(args, env, log_dir, "rerank"), QueryClient(k) as client:
        for n in range(opts["rerank_warmup"]):
            client.request(k.topic_rerank, make(n, now_ms() + 30000), RerankReply, timeout_s=30)
        for i, rate in enumerate(rates):
            result = open_loop(client, k.topic_rerank, make, RerankReply, rate, opts["rerank_step_s"],
                               opts["max_requests"], opts["rerank_deadline_ms"], seed=200 + i)
            out.append(_step("rerank", policy, False, rate, result, opts["rerank_target_ms"]))
            _progress(out[-1])


def _progress(step: Step) -> None:
    logs.console().print(f"  {step.kind} {step.policy:9s} {'backlog' if step.backlog else 'idle':7s} "
                         f"{step.offered_qps:6.1f} qps: p95 {step.p95:7.1f} ms, shed {step.shed_pct:5.1f}%, "
                         f"failed {step.failed}" + (f" {step.shed_reasons}" if step.shed_reasons else ""),
                         highlight=False)


def run(rates: list[float], rerank_rates: list[float], policies: list[str], port: int = 9092, step_s: float = 6.0,
        rerank_step_s: float = 10.0, max_requests: int = 2000, target_ms: float = 30.0, rerank_target_ms: float = 1000.0,
        deadline_ms: float | None = None, rerank_deadline_ms: float | None = None, backlog: bool = True,
        backlog_docs: int = 400, warmup: int = 120, rerank_warmup: int = 5, candidate_words: int = 8,
        rerank: bool = True, out_dir: str = "bench-results", keep_logs: bool = False) -> LatencyBenchResult:
    from embedstream.bench.rerank_bench import build_minilm_cross_encoder
    from embedstream.engine.model_spec import resolve_model
    from embedstream.gcfreeze import freeze_startup_objects
    from embedstream.producers.chunker import Chunker

    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"unknown policies {bad}; known: {list(POLICIES)}")
    result = LatencyBenchResult(cpu_line(), target_ms, rerank_target_ms, deadline_ms or target_ms)
    opts = {"step_s": step_s, "rerank_step_s": rerank_step_s, "max_requests": max_requests, "target_ms": target_ms,
            "rerank_target_ms": rerank_target_ms, "deadline_ms": deadline_ms or target_ms,
            "rerank_deadline_ms": rerank_deadline_ms or rerank_target_ms, "backlog": backlog,
            "backlog_docs": backlog_docs, "warmup": warmup, "rerank_warmup": rerank_warmup,
            "candidate_words": candidate_words}
    info = devkafka.start(port=port)
    settings = Settings()
    settings.kafka.bootstrap_servers = info.bootstrap
    chunker = Chunker.for_model(resolve_model(settings.default_model, settings.models), chunk_tokens=96,
                                overlap_tokens=16)
    ce_dir = str(build_minilm_cross_encoder()) if rerank and rerank_rates else ""
    freeze_startup_objects()
    work_dir = tempfile.mkdtemp(prefix="embedstream-latency-")
    result.logs = work_dir
    for policy in policies:
        _embed_policy(settings, policy, rates, opts, work_dir, chunker, result.steps)
    if ce_dir:
        for policy in policies:
            _rerank_policy(settings, policy, rerank_rates, opts, work_dir, ce_dir, result.steps)
    os.makedirs(out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result.table = os.path.join(out_dir, f"latency-{stamp}.json")
    result.png = os.path.join(out_dir, f"latency-{stamp}.png")
    Path(result.table).write_text(json.dumps(asdict(result), indent=1))
    try:
        plot(result, result.png)
    except ImportError as exc:  # matplotlib is an optional extra: the table still prints
        result.png = f"none ({exc}; pip install 'embedstream[bench]' for it)"
    if not keep_logs:
        shutil.rmtree(work_dir, ignore_errors=True)
    return result


# -- reading the results ----------------------------------------------------------------------------------

def sustained_rates(result: LatencyBenchResult, served: bool = False) -> dict[tuple[str, bool, str], float]:
    """(kind, backlog, policy) -> the highest offered rate sustained (0 when none): >= 95% of the requests
    sent answered within the target, or with ``served`` the p95 of the answered ones within the target
    (what a policy that sheds keeps for those it serves)."""
    best: dict[tuple[str, bool, str], float] = {}
    for step in result.steps:
        key = (step.kind, step.backlog, step.policy)
        best.setdefault(key, 0.0)
        target = result.target_ms if step.kind == "embed" else result.rerank_target_ms
        ok = (step.sent > 0 and step.achieved_qps > 0 and step.p95 <= target) if served else step.sustained()
        if ok:
            best[key] = max(best[key], step.offered_qps)
    return best


def summary(result: LatencyBenchResult) -> list[str]:
    return _summary(result, False) + _summary(result, True)


def _summary(result: LatencyBenchResult, served: bool) -> list[str]:
    best = sustained_rates(result, served)
    criterion = "p95 of the answered requests within the target" if served else \
        ">= 95% of requests answered within the target"
    lines = []
    for kind in ("embed", "rerank"):
        for backlog in (False, True):
            rows = {p: r for (k, b, p), r in best.items() if k == kind and b == backlog}
            if not rows:
                continue
            fixed = {p: r for p, r in rows.items() if p.startswith("fixed-")}
            controllers = {p: r for p, r in rows.items() if p in ("aimd", "deadline")}
            where = "with bulk backlog" if backlog else "idle"
            text = ", ".join(f"{p} {r:g}" for p, r in rows.items())
            lines.append(f"{kind} {where}: highest rate sustained ({criterion}): {text}")
            if controllers and fixed:
                name, rate = max(controllers.items(), key=lambda kv: kv[1])
                best_fixed = max(fixed.values())
                zero = fixed.get("fixed-0")
                ratio = lambda a, b: f"{a / b:.2f}x" if b else "n/a"  # noqa: E731
                lines.append(f"  controller ({name}) {rate:g} vs best fixed {best_fixed:g} ({ratio(rate, best_fixed)})"
                             + (f", vs fixed-0 {zero:g} ({ratio(rate, zero)})" if zero is not None else ""))
    for name in ("aimd", "deadline"):
        idle, busy = best.get(("embed", False, name)), best.get(("embed", True, name))
        if idle and busy is not None:
            lines.append(f"embed {name}: sustained under backlog {busy:g} = {busy / idle:.0%} of idle {idle:g} ({criterion})")
    return lines


def print_table(result: LatencyBenchResult) -> None:
    from rich.table import Table

    table = Table(title=f"bench latency: target p95 {result.target_ms:g} ms (rerank {result.rerank_target_ms:g} ms), "
                        f"deadline {result.deadline_ms:g} ms; CPU: {result.cpu}")
    for name, justify in (("lane", "left"), ("policy", "left"), ("backlog", "left"), ("offered QPS", "right"),
                          ("achieved QPS", "right"), ("p50 ms", "right"), ("p95 ms", "right"), ("p99 ms", "right"),
                          ("shed %", "right"), ("shed reply p50 ms", "right"),
                          ("refused on arrival: in worker p95 ms", "right"), ("refused at its turn: in worker p95 ms", "right"),
                          ("failed", "right"),
                          ("in target %", "right"),
                          ("bulk chunks/s", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in result.steps:
        table.add_row(s.kind, s.policy, "yes" if s.backlog else "no", f"{s.offered_qps:g}", f"{s.achieved_qps:.1f}",
                      f"{s.p50:.1f}", f"{s.p95:.1f}", f"{s.p99:.1f}", f"{s.shed_pct:.1f}",
                      "" if s.shed_reply_ms_p50 is None else f"{s.shed_reply_ms_p50:.1f}",
                      "" if s.shed_in_worker_ms_p95 is None else f"{s.shed_in_worker_ms_p95:.2f}",
                      "" if s.expired_in_worker_ms_p95 is None else f"{s.expired_in_worker_ms_p95:.2f}", str(s.failed),
                      f"{s.in_target_pct:.0f}",
                      "" if s.bulk_chunks_per_s is None else f"{s.bulk_chunks_per_s:.1f}"
                      + (" (drained)" if s.backlog_left == 0 else ""))
    console = logs.console()
    console.print(table)
    for line in summary(result):
        console.print(line, highlight=False)
    console.print("in target %: requests answered (not shed) within the target, of all sent: what a caller with "
                  "that latency budget gets", highlight=False)
    console.print(f"table: {result.table}\nplot: {result.png}", highlight=False)


def plot(result: LatencyBenchResult, path: str) -> None:
    """p95 against offered QPS, a line per policy, the target dashed; one column per lane and load, shed % below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(s.kind, s.backlog) for s in result.steps})
    fig, axes = plt.subplots(2, max(1, len(panels)), figsize=(5.5 * max(1, len(panels)), 7.5), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.4]})
    for column, (kind, backlog) in enumerate(panels):
        ax, shed_ax = axes[0][column], axes[1][column]
        target = result.target_ms if kind == "embed" else result.rerank_target_ms
        for policy in POLICIES:
            steps = sorted((s for s in result.steps if s.kind == kind and s.backlog == backlog and s.policy == policy),
                           key=lambda s: s.offered_qps)
            if steps:
                width = 2.5 if policy in ("aimd", "deadline") else 1.2
                rates = [s.offered_qps for s in steps]
                ax.plot(rates, [s.p95 for s in steps], marker="o", label=policy, linewidth=width)
                shed_ax.plot(rates, [s.shed_pct + 100.0 * s.failed / max(1, s.sent) for s in steps], marker=".",
                             linewidth=width)
        ax.axhline(target, color="red", linestyle="--", label=f"target {target:g} ms")
        ax.set_yscale("log")
        ax.set_xlabel("offered QPS")
        ax.set_ylabel("p95 round trip of answered requests, ms")
        ax.set_title(f"{kind}, {'bulk backlog draining' if backlog else 'idle'}")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        shed_ax.set_xlabel("offered QPS")
        shed_ax.set_ylabel("shed or failed, %")
        shed_ax.set_ylim(-2, 102)
        shed_ax.grid(True, alpha=0.3)
    fig.suptitle(f"bench latency - {result.cpu}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
