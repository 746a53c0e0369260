"""KEDA's ``lagThreshold`` per lane from measured throughput: how many records of lag one worker is given.

KEDA's kafka scaler runs ceil(total lag ÷ lagThreshold) workers (within the lane's bounds and its
partitions). With lagThreshold = records one worker drains in ``drain_s`` seconds at the planned
headroom, that is the count that drains the current backlog in about ``drain_s``:

    records/s per worker = measured throughput × headroom ÷ cost of one record
    lagThreshold         = floor(records/s per worker × drain_s), at least 1

One record costs, per topic of a lane's consumer group (the chart's ``autoscaling.lagThreshold`` keys):
a chunk ``--tokens`` tokens of ``--tokens-per-s`` (bulk) or ``--online-tokens-per-s`` (online, default the
same: measure it at the online lane's threads and precision); a query one text of ``--texts-per-s`` (the
shared queries topic and the collection's own, ``collection_queries``: its searches' query embeddings);
a rerank or search request ``--candidates`` pairs of ``--pairs-per-s``; a change event one event of
``--events-per-s`` (the CDC bridge's own rate). A search of the online lane's collection
(``collection_search``) is answered one at a time by its worker's search lane: queue + embed + search ms
(``--stage-ms``, else 2 + 1000 ÷ texts/s + 4), so 1000 ÷ that many per second. Throughputs are per worker
process, measured with the lane's threads and precision.

**Overload** (the online lane's prometheus trigger, ``offeredQueriesPerS``): a query the online lane sheds
(``deadline_exceeded`` at once, predicted late) is committed, so overload never shows as lag. The trigger
scales on the queries *offered* per second, answered + shed (``embedstream_texts_total{kind="query"}`` +
``embedstream_shed_total``), against what one worker takes at the headroom: ``--texts-per-s × headroom``.
KEDA runs ceil(offered ÷ that) workers: at 90 texts/s and 0.7, a lane offered 200 queries/s gets 4.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from embedstream.plan.inputs import PlanError, check_flags, flag, parse_named_numbers

#: seconds a lane's backlog may take to drain once scaled (``--drain-s LANE=S``): interactive lanes
#: short, the bulk lane long enough that a worker's start-up (model load) is a small part of it.
DEFAULT_DRAIN_S: dict[str, float] = {"online": 2.0, "bulk": 300.0, "rerank": 2.0, "cdc": 10.0}


def parse_drain_s(text: Optional[str]) -> tuple[tuple[str, float], ...]:
    """'bulk=600,online=1' over the defaults -> (('online', 1.0), ('bulk', 600.0), ...)."""
    given = parse_named_numbers(text, "--drain-s", tuple(DEFAULT_DRAIN_S), "online=2,bulk=300", noun="lane",
                                form="LANE=SECONDS", unit="a number of seconds", allow_zero=False)
    return tuple({**DEFAULT_DRAIN_S, **given}.items())


@dataclass(frozen=True)
class LaneTopic:
    lane: str  # --drain-s name
    values_key: str  # the chart's lane block
    topic_key: str  # the chart's autoscaling.lagThreshold key (the topic's name in kafka.topics)
    record: str  # what one record is
    throughput: str  # AutoscaleInputs field giving its records/s


#: Every kafka trigger the chart renders (deploy/helm/embedstream/templates/lanes.yaml), in its order.
LANE_TOPICS: tuple[LaneTopic, ...] = (
    LaneTopic("online", "embedOnline", "chunks_online", "chunk", "online_tokens_per_s"),
    LaneTopic("online", "embedOnline", "queries", "query", "texts_per_s"),
    LaneTopic("online", "embedOnline", "collection_queries", "query", "texts_per_s"),
    LaneTopic("online", "embedOnline", "collection_search", "search request", "searches_per_s"),
    LaneTopic("bulk", "embedBulk", "chunks_bulk", "chunk", "tokens_per_s"),
    LaneTopic("rerank", "rerank", "rerank", "rerank request", "pairs_per_s"),
    LaneTopic("rerank", "rerank", "search", "search request", "pairs_per_s"),
    LaneTopic("cdc", "cdc", "changes", "change event", "events_per_s"),
)
_FLAGS = {"tokens_per_s": "--tokens-per-s", "online_tokens_per_s": "--online-tokens-per-s or --tokens-per-s", "texts_per_s": "--texts-per-s", "pairs_per_s": "--pairs-per-s",
          "events_per_s": "--events-per-s", "searches_per_s": "--texts-per-s"}
#: a search's stages besides its query embedding, ms (``embedstream.plan.arithmetic.DEFAULT_STAGE_MS``'s)
SEARCH_STAGE_MS = {"queue": 2.0, "search": 4.0}


@dataclass(frozen=True)
class AutoscaleInputs:
    tokens_per_chunk: Optional[float] = flag("--tokens", None)
    tokens_per_s: Optional[float] = flag("--tokens-per-s", None)
    texts_per_s: Optional[float] = flag("--texts-per-s", None)
    pairs_per_s: Optional[float] = flag("--pairs-per-s", None)
    events_per_s: Optional[float] = flag("--events-per-s", None)
    online_tokens_per_s: Optional[float] = flag("--online-tokens-per-s", None)  # None: tokens_per_s
    candidates: int = flag("--candidates", 50, whole=True)
    headroom: float = flag("--headroom", 0.7)
    drain_s: tuple[tuple[str, float], ...] = tuple(DEFAULT_DRAIN_S.items())
    stage_ms: tuple[tuple[str, float], ...] = ()  # --stage-ms (queue, embed, search) for a search's time

    def search_ms(self) -> Optional[float]:
        """One search's time on its worker's search lane: queue + embed + search ms (None: no --texts-per-s and
        no embed ms given)."""
        given = dict(self.stage_ms)
        embed = given.get("embed", 1000.0 / self.texts_per_s if self.texts_per_s else None)
        if embed is None:
            return None
        return given.get("queue", SEARCH_STAGE_MS["queue"]) + embed + given.get("search", SEARCH_STAGE_MS["search"])

    def offered_queries_per_s(self) -> Optional[float]:
        """Queries offered per second (answered + shed) one online worker takes at the headroom."""
        return None if self.texts_per_s is None else self.texts_per_s * self.headroom

    def __post_init__(self) -> None:
        check_flags(self)
        if self.headroom > 1:
            raise PlanError(f"--headroom is the usable fraction of measured throughput, in (0, 1]; got {self.headroom!r}")

    def drain(self, lane: str) -> float:
        return dict(self.drain_s)[lane]


@dataclass(frozen=True)
class ThresholdRow:
    topic: LaneTopic
    drain_s: float
    records_per_s: Optional[float]  # per worker, at the headroom; None when its throughput is not given
    lag_threshold: Optional[int]
    missing: Optional[str] = None  # what to give for an unknown row


@dataclass(frozen=True)
class AutoscalePlan:
    inputs: AutoscaleInputs
    rows: tuple[ThresholdRow, ...]

    def values(self) -> dict:
        """The chart's values for the known rows: {lane block: {autoscaling: {lagThreshold: {topic: n}}}}, and the
        online lane's ``offeredQueriesPerS``."""
        out: dict = {}
        for row in self.rows:
            if row.lag_threshold is not None:
                lane = out.setdefault(row.topic.values_key, {"autoscaling": {"lagThreshold": {}}})
                lane["autoscaling"]["lagThreshold"][row.topic.topic_key] = row.lag_threshold
        offered = self.inputs.offered_queries_per_s()
        if offered is not None and "embedOnline" in out:
            out["embedOnline"]["autoscaling"]["offeredQueriesPerS"] = round(offered, 3)
        return out

    def write_values(self, path: str | Path) -> None:
        """A Helm values file (JSON, which Helm reads as YAML) with the known thresholds."""
        values = self.values()
        if not values:
            raise PlanError("--helm-values: no lane has a threshold; give a throughput (see the table's notes)")
        try:
            Path(path).write_text(json.dumps(values, indent=2) + "\n")
        except OSError as exc:
            raise PlanError(f"--helm-values: cannot write {path}: {exc.strerror or exc}") from None


def _records_per_s(topic: LaneTopic, i: AutoscaleInputs) -> tuple[Optional[float], Optional[str]]:
    if topic.throughput == "searches_per_s":
        ms = i.search_ms()
        return (None, "pass --texts-per-s (or --stage-ms embed=MS)") if ms is None else (1000.0 / ms * i.headroom, None)
    measured = getattr(i, topic.throughput)
    if topic.throughput == "online_tokens_per_s" and measured is None:
        measured = i.tokens_per_s
    if measured is None:
        return None, f"pass {_FLAGS[topic.throughput]}"
    if topic.throughput in ("tokens_per_s", "online_tokens_per_s"):
        if i.tokens_per_chunk is None:
            return None, "pass --tokens (average tokens per chunk)"
        return measured * i.headroom / i.tokens_per_chunk, None
    if topic.throughput == "pairs_per_s":
        return measured * i.headroom / i.candidates, None
    return measured * i.headroom, None


def plan_autoscaling(inputs: AutoscaleInputs) -> AutoscalePlan:
    rows = []
    for topic in LANE_TOPICS:
        drain = inputs.drain(topic.lane)
        per_s, missing = _records_per_s(topic, inputs)
        threshold = None if per_s is None else max(1, math.floor(per_s * drain + 1e-9))
        rows.append(ThresholdRow(topic, drain, per_s, threshold, missing))
    return AutoscalePlan(inputs, tuple(rows))
