"""`embedstream plan`'s arithmetic: indexing, serving, storage and per-request stages.

Plain arithmetic over numbers you measured (or assumed); nothing is run. Each section is a pure
function from frozen inputs to a frozen plan; :func:`build_plan` picks the sections the options ask
for. The formulas are in :mod:`embedstream.plan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from embedstream.plan.autoscale import AutoscaleInputs, AutoscalePlan, parse_drain_s, plan_autoscaling
from embedstream.plan.inputs import (
    STAGES,
    BenchThroughput,
    PlanError,
    check_flags,
    checked_number,
    flag,
    load_bench,
    missing_throughput,
    parse_mrl,
    parse_stage_ms,
    resolve_throughput,
)

#: bytes per dimension; binary is one packed bit per dimension (see :func:`vector_bytes`).
DTYPE_BYTES: dict[str, float] = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "binary": 1 / 8}
STAGE_LABELS = {"queue": "queue wait", "embed": "embed", "search": "search", "rerank": "rerank", "llm": "LLM"}
#: built-in per-request ms when neither --stage-ms nor a measured throughput gives one. No LLM by default.
DEFAULT_STAGE_MS: dict[str, float] = {"queue": 2.0, "embed": 5.0, "search": 4.0, "rerank": 40.0}
#: stages that hold no device while they run (costed at $0).
NO_DEVICE_STAGES = frozenset({"queue"})


def ceil_devices(demand: float, capacity: float) -> int:
    """ceil(demand ÷ capacity), tolerant of float noise (70 ÷ (100 × 0.7) is 1, not 2)."""
    ratio = demand / capacity
    nearest = round(ratio)
    if abs(ratio - nearest) <= 1e-9 * max(1.0, ratio):
        return max(1, int(nearest))
    return max(1, math.ceil(ratio))


# ------------------------------------------------------------------------------------------- indexing


@dataclass(frozen=True)
class IndexingInputs:
    chunks: int = flag("--chunks", whole=True)
    tokens_per_chunk: float = flag("--tokens")
    tokens_per_s: float = flag("--tokens-per-s")  # per device
    devices: int = flag("--devices", 1, whole=True)
    price_per_device_hour: float = flag("--price-per-device-hour", 2.0, zero_ok=True)
    throughput_source: str = "--tokens-per-s"

    def __post_init__(self) -> None:
        check_flags(self)


@dataclass(frozen=True)
class IndexingPlan:
    inputs: IndexingInputs
    total_tokens: float
    seconds_one_device: float
    seconds: float  # on inputs.devices
    device_hours: float
    cost: float

    @property
    def hours_one_device(self) -> float:
        return self.seconds_one_device / 3600

    @property
    def hours(self) -> float:
        return self.seconds / 3600


def plan_indexing(inputs: IndexingInputs) -> IndexingPlan:
    total = inputs.chunks * inputs.tokens_per_chunk
    one = total / inputs.tokens_per_s
    seconds = total / (inputs.tokens_per_s * inputs.devices)
    hours = seconds / 3600
    device_hours = hours * inputs.devices
    return IndexingPlan(inputs, total, one, seconds, device_hours, device_hours * inputs.price_per_device_hour)


# -------------------------------------------------------------------------------------------- serving


@dataclass(frozen=True)
class ServingInputs:
    qps: float = flag("--qps")
    candidates: int = flag("--candidates", 50, whole=True)
    pairs_per_s: Optional[float] = flag("--pairs-per-s", None)  # per device, measured
    texts_per_s: Optional[float] = flag("--texts-per-s", None)  # per device, measured
    headroom: float = flag("--headroom", 0.7)
    price_per_device_hour: float = flag("--price-per-device-hour", 2.0, zero_ok=True)
    pairs_source: Optional[str] = None
    texts_source: Optional[str] = None

    def __post_init__(self) -> None:
        check_flags(self)
        if self.headroom > 1:
            raise PlanError(f"--headroom is the usable fraction of measured throughput, in (0, 1]; got {self.headroom!r}")


@dataclass(frozen=True)
class ServingRow:
    name: str  # "rerank" | "query embedding"
    unit: str  # "pairs/s" | "texts/s"
    demand: float  # per second
    per_device: Optional[float]  # measured
    usable_per_device: Optional[float]  # measured × headroom
    devices: Optional[int]  # None when no throughput is known
    source: Optional[str]
    missing: Optional[str] = None  # how to supply the throughput when it is unknown


@dataclass(frozen=True)
class ServingPlan:
    inputs: ServingInputs
    pairs_per_s: float  # rerank pairs/s needed = qps × candidates
    texts_per_s: float  # query embeddings/s needed = qps
    rerank: ServingRow
    embed: ServingRow

    @property
    def rerank_devices(self) -> Optional[int]:
        return self.rerank.devices

    @property
    def embed_devices(self) -> Optional[int]:
        return self.embed.devices

    @property
    def known_devices(self) -> int:
        return sum(r.devices for r in (self.rerank, self.embed) if r.devices is not None)

    @property
    def complete(self) -> bool:
        return self.rerank.devices is not None and self.embed.devices is not None

    @property
    def cost_per_hour(self) -> float:
        """Provisioned devices (those with a known count) × price per device-hour."""
        return self.known_devices * self.inputs.price_per_device_hour

    @property
    def cost_per_million_requests(self) -> float:
        return self.cost_per_hour / (self.inputs.qps * 3600) * 1e6


def _serving_row(name: str, unit: str, demand: float, per_device: Optional[float], headroom: float,
                 source: Optional[str], missing: str) -> ServingRow:
    if per_device is None:
        return ServingRow(name, unit, demand, None, None, None, None, missing)
    usable = per_device * headroom
    return ServingRow(name, unit, demand, per_device, usable, ceil_devices(demand, usable), source)


def plan_serving(inputs: ServingInputs) -> ServingPlan:
    pairs = inputs.qps * inputs.candidates
    texts = inputs.qps
    rerank = _serving_row("rerank", "pairs/s", pairs, inputs.pairs_per_s, inputs.headroom, inputs.pairs_source,
                          "pass --pairs-per-s or --from-bench FILE with \"pairs_per_s\"")
    embed = _serving_row("query embedding", "texts/s", texts, inputs.texts_per_s, inputs.headroom,
                         inputs.texts_source, "pass --texts-per-s or --from-bench FILE with \"texts_per_s\"")
    return ServingPlan(inputs, pairs, texts, rerank, embed)


# -------------------------------------------------------------------------------------------- storage


def vector_bytes(dims: int, dtype: str) -> float:
    """Bytes for one vector: dims × bytes per dim; binary packs 8 dims a byte (ceil(dims / 8))."""
    if dtype not in DTYPE_BYTES:
        raise PlanError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    if dtype == "binary":
        return math.ceil(dims / 8)
    return dims * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class StorageInputs:
    vectors: int = flag("--vectors", whole=True)
    dims: int = flag("--dims", whole=True)
    mrl: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_flags(self)
        for size in self.mrl:
            checked_number(size, "--mrl", integer=True)
            if size > self.dims:
                raise PlanError(f"--mrl: Matryoshka size {size} exceeds --dims {self.dims}")


@dataclass(frozen=True)
class StorageRow:
    dims: int
    matryoshka: bool  # a truncated (MRL) size rather than the full one
    bytes: dict[str, float] = field(default_factory=dict)  # dtype -> total bytes

    def gb(self, dtype: str) -> float:
        return self.bytes[dtype] / 1e9

    def gib(self, dtype: str) -> float:
        return self.bytes[dtype] / 2**30


@dataclass(frozen=True)
class StoragePlan:
    inputs: StorageInputs
    rows: tuple[StorageRow, ...]  # full dims first, then each MRL size

    def bytes(self, dims: int, dtype: str) -> float:
        for row in self.rows:
            if row.dims == dims:
                return row.bytes[dtype]
        raise KeyError(dims)


def plan_storage(inputs: StorageInputs) -> StoragePlan:
    rows = []
    for i, dims in enumerate((inputs.dims, *[m for m in inputs.mrl if m != inputs.dims])):
        rows.append(StorageRow(dims, i > 0, {dt: inputs.vectors * vector_bytes(dims, dt) for dt in DTYPE_BYTES}))
    return StoragePlan(inputs, tuple(rows))


# --------------------------------------------------------------------------------------------- stages


@dataclass(frozen=True)
class StageInputs:
    ms: dict[str, float] = field(default_factory=dict)  # from --stage-ms
    price_per_device_hour: float = flag("--price-per-device-hour", 2.0, zero_ok=True)
    candidates: int = flag("--candidates", 50, whole=True)
    texts_per_s: Optional[float] = None  # measured; gives the embed default
    pairs_per_s: Optional[float] = None  # measured; gives the rerank default

    def __post_init__(self) -> None:
        check_flags(self)
        for name, ms in self.ms.items():
            if name not in STAGES:
                raise PlanError(f"--stage-ms: unknown stage {name!r} (known: {', '.join(STAGES)})")
            checked_number(ms, f"--stage-ms {name}", allow_zero=True)


@dataclass(frozen=True)
class StageRow:
    name: str
    label: str
    ms: float
    share: float  # of the total ms, 0..1
    uses_device: bool
    cost_per_million: float  # $ per 1M requests
    source: str  # "--stage-ms" | "measured texts/s" | "measured pairs/s" | "default"


@dataclass(frozen=True)
class StagePlan:
    inputs: StageInputs
    rows: tuple[StageRow, ...]
    total_ms: float
    total_cost_per_million: float

    def row(self, name: str) -> StageRow:
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def slowest(self) -> StageRow:
        return max(self.rows, key=lambda r: r.ms)


def plan_stages(inputs: StageInputs) -> StagePlan:
    chosen: list[tuple[str, float, str]] = []
    for name in STAGES:
        if name in inputs.ms:
            chosen.append((name, inputs.ms[name], "--stage-ms"))
        elif name == "embed" and inputs.texts_per_s:
            chosen.append((name, 1000.0 / inputs.texts_per_s, "measured texts/s"))
        elif name == "rerank" and inputs.pairs_per_s:
            chosen.append((name, inputs.candidates * 1000.0 / inputs.pairs_per_s, "measured pairs/s"))
        elif name in DEFAULT_STAGE_MS:
            chosen.append((name, DEFAULT_STAGE_MS[name], "default"))
    total = sum(ms for _, ms, _ in chosen)
    if total <= 0:
        raise PlanError("--stage-ms: the stages add up to 0 ms; give at least one stage a positive time")
    per_ms = inputs.price_per_device_hour / 3.6e6  # $ per device-ms
    rows = tuple(
        StageRow(name, STAGE_LABELS[name], ms, ms / total, name not in NO_DEVICE_STAGES,
                 0.0 if name in NO_DEVICE_STAGES else ms * per_ms * 1e6, source)
        for name, ms, source in chosen
    )
    return StagePlan(inputs, rows, total, sum(r.cost_per_million for r in rows))


# ----------------------------------------------------------------------------------------- whole plan


@dataclass(frozen=True)
class Plan:
    indexing: Optional[IndexingPlan] = None
    serving: Optional[ServingPlan] = None
    storage: Optional[StoragePlan] = None
    stages: Optional[StagePlan] = None
    bench: Optional[BenchThroughput] = None
    autoscaling: Optional[AutoscalePlan] = None


def build_plan(
    *,
    chunks: Optional[int] = None,
    tokens: Optional[float] = None,
    tokens_per_s: Optional[float] = None,
    devices: int = 1,
    price_per_device_hour: float = 2.0,
    qps: Optional[float] = None,
    candidates: int = 50,
    pairs_per_s: Optional[float] = None,
    texts_per_s: Optional[float] = None,
    headroom: float = 0.7,
    vectors: Optional[int] = None,
    dims: Optional[int] = None,
    mrl: Optional[str] = None,
    from_bench: Optional[str | Path] = None,
    stage_ms: Optional[str] = None,
    lag_thresholds: bool = False,
    events_per_s: Optional[float] = None,
    drain_s: Optional[str] = None,
    online_tokens_per_s: Optional[float] = None,
) -> Plan:
    """All sections the given options ask for: indexing (--chunks), serving and the per-request
    stage table (--qps), storage (--vectors), the stage table alone (--stage-ms), KEDA's lag
    thresholds per lane (--lag-thresholds)."""
    bench = load_bench(from_bench) if from_bench is not None else None
    checked_number(price_per_device_hour, "--price-per-device-hour", allow_zero=True)
    checked_number(devices, "--devices", integer=True)
    checked_number(candidates, "--candidates", integer=True)
    tok_s, tok_src = resolve_throughput(tokens_per_s, bench, "tokens_per_s", "--tokens-per-s")
    pairs_s, pairs_src = resolve_throughput(pairs_per_s, bench, "pairs_per_s", "--pairs-per-s")
    texts_s, texts_src = resolve_throughput(texts_per_s, bench, "texts_per_s", "--texts-per-s")

    if chunks is None and vectors is None and qps is None and stage_ms is None and not lag_thresholds:
        raise PlanError("nothing to plan: give --chunks (indexing), --qps (serving), --vectors (storage), "
                        "--stage-ms (per-request stages) or --lag-thresholds (autoscaling); see --help")
    if drain_s is not None and not lag_thresholds:
        raise PlanError("--drain-s sets the lag thresholds' drain times: give --lag-thresholds too")

    indexing = None
    if chunks is not None:
        if tokens is None:
            raise PlanError("indexing needs --tokens (average tokens per chunk) with --chunks")
        if tok_s is None:
            raise PlanError("indexing needs a throughput: " + missing_throughput("tokens_per_s", "--tokens-per-s", bench))
        indexing = plan_indexing(IndexingInputs(chunks, tokens, tok_s, devices, price_per_device_hour, tok_src))
    elif tokens is not None and not lag_thresholds:
        raise PlanError("--tokens is tokens per chunk for indexing or --lag-thresholds: give --chunks too")

    serving = None
    if qps is not None:
        serving = plan_serving(ServingInputs(qps, candidates, pairs_s, texts_s, headroom, price_per_device_hour,
                                             pairs_src, texts_src))
    else:
        checked_number(headroom, "--headroom")

    storage = None
    if vectors is not None:
        if dims is None:
            raise PlanError("storage needs --dims (full embedding size) with --vectors")
        checked_number(dims, "--dims", integer=True)
        storage = plan_storage(StorageInputs(vectors, dims, parse_mrl(mrl, dims)))
    elif dims is not None or mrl:
        raise PlanError("--dims/--mrl size stored vectors: give --vectors too")

    stages = None
    if stage_ms is not None or qps is not None:
        stages = plan_stages(StageInputs(parse_stage_ms(stage_ms), price_per_device_hour, candidates,
                                         texts_s, pairs_s))
    autoscaling = None
    if lag_thresholds:
        autoscaling = plan_autoscaling(AutoscaleInputs(tokens, tok_s, texts_s, pairs_s, events_per_s, online_tokens_per_s,
                                                       candidates, headroom, parse_drain_s(drain_s),
                                                       tuple(parse_stage_ms(stage_ms).items()) if stage_ms else ()))
    return Plan(indexing, serving, storage, stages, bench, autoscaling)

