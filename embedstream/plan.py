"""`embedstream plan`: indexing, serving, storage and per-request stage arithmetic.

Everything here is plain arithmetic over numbers you measured (or assumed); nothing is run.
The pure functions return frozen dataclasses; :func:`render` prints them as rich tables, and
:func:`plan_command` is the typer command (registered elsewhere as ``app.command("plan")``).

Indexing
    total tokens = chunks × average tokens per chunk;
    seconds = total tokens ÷ (tokens/s per device × devices);
    cost = hours × devices × price per device-hour (= device-hours × price, the same on 1 or N devices).
    Reference: 10M chunks × 256 tokens = 2.56e9 tokens at 8,000 tokens/s → 320,000 s = 88.9 h on
    one device, 40,000 s = 11.1 h on eight.

Serving
    rerank pairs/s = QPS × candidates; rerank devices = ceil(pairs/s ÷ (pairs/s per device × headroom));
    query-embedding texts/s = QPS; embedding devices = ceil(QPS ÷ (texts/s per device × headroom)).
    ``headroom`` (default 0.7) is the fraction of a device's measured throughput you plan to use.

Storage
    bytes = vectors × bytes per vector; bytes per vector = dims × bytes per dim (float32 4, float16 2,
    int8/uint8 1) and ceil(dims / 8) for binary (one bit per dim, packed per vector). Raw vectors
    only: no HNSW graph, payloads or replicas. Printed in decimal GB (1e9) and GiB (2^30), for the
    full size and each Matryoshka size given.

Stages (one request)
    queue wait, embed, search, rerank and an optional LLM stage, each in ms. Each stage's ms comes
    from ``--stage-ms`` if given, else from a measured throughput when one is known (embed = 1000 ÷
    texts/s, rerank = candidates × 1000 ÷ pairs/s: the device time one request costs at that
    throughput), else from a built-in default. $ per 1M requests for a stage = ms × price per
    device-hour ÷ 3.6e6 (price per device-ms) × 1e6. Queue wait holds no device and costs $0.

Bench file (``--from-bench FILE``)
    A JSON object with any of these keys (numbers > 0, per device); other keys are ignored::

        {"tokens_per_s": 3500, "pairs_per_s": 900, "texts_per_s": 30}

    ``tokens_per_s``: document tokens embedded per second (indexing);
    ``pairs_per_s``: (query, passage) pairs reranked per second (serving, rerank stage);
    ``texts_per_s``: query texts embedded per second (serving, embed stage).
    A flag given on the command line (``--tokens-per-s`` etc.) overrides the file's key; a key the
    file lacks falls back to the flag; a number needed by neither is an error that says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import typer

from embedstream import logs

__all__ = [
    "BENCH_KEYS",
    "DEFAULT_STAGE_MS",
    "DTYPE_BYTES",
    "BenchThroughput",
    "IndexingInputs",
    "IndexingPlan",
    "Plan",
    "PlanError",
    "ServingInputs",
    "ServingPlan",
    "ServingRow",
    "StageInputs",
    "StagePlan",
    "StageRow",
    "StorageInputs",
    "StoragePlan",
    "StorageRow",
    "build_plan",
    "ceil_devices",
    "load_bench",
    "parse_mrl",
    "parse_stage_ms",
    "plan_command",
    "plan_indexing",
    "plan_serving",
    "plan_stages",
    "plan_storage",
    "render",
    "vector_bytes",
]


class PlanError(ValueError):
    """A bad or missing input; the message names the flag to fix."""


# --------------------------------------------------------------------------------------------- inputs

BENCH_KEYS = ("tokens_per_s", "pairs_per_s", "texts_per_s")

#: bytes per dimension; binary is one packed bit per dimension (see :func:`vector_bytes`).
DTYPE_BYTES: dict[str, float] = {"float32": 4, "float16": 2, "int8": 1, "uint8": 1, "binary": 1 / 8}
#: dtypes printed in the storage table (int8 and uint8 share a row: same size).
STORAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("float32", "float32"), ("float16", "float16"), ("int8", "int8/uint8"), ("binary", "binary"),
)

STAGES = ("queue", "embed", "search", "rerank", "llm")
STAGE_LABELS = {"queue": "queue wait", "embed": "embed", "search": "search", "rerank": "rerank", "llm": "LLM"}
STAGE_ALIASES = {"queue_wait": "queue", "queue-wait": "queue", "wait": "queue", "embedding": "embed",
                 "reranking": "rerank", "generate": "llm", "generation": "llm"}
#: built-in per-request ms when neither --stage-ms nor a measured throughput gives one. No LLM by default.
DEFAULT_STAGE_MS: dict[str, float] = {"queue": 2.0, "embed": 5.0, "search": 4.0, "rerank": 40.0}
#: stages that hold no device while they run (costed at $0).
NO_DEVICE_STAGES = frozenset({"queue"})


def _number(value, flag: str, *, integer: bool = False, allow_zero: bool = False) -> float:
    """A finite number > 0 (or >= 0), else PlanError naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"{flag} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise PlanError(f"{flag} must be a finite number, got {value!r}")
    if integer and value != int(value):
        raise PlanError(f"{flag} must be a whole number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise PlanError(f"{flag} must be {'>= 0' if allow_zero else 'a positive number'}, got {value!r}")
    return value


def ceil_devices(demand: float, capacity: float) -> int:
    """ceil(demand ÷ capacity), tolerant of float noise (70 ÷ (100 × 0.7) is 1, not 2)."""
    ratio = demand / capacity
    nearest = round(ratio)
    if abs(ratio - nearest) <= 1e-9 * max(1.0, ratio):
        return max(1, int(nearest))
    return max(1, math.ceil(ratio))


@dataclass(frozen=True)
class BenchThroughput:
    """Per-device throughputs read from a bench file; None where the file lacks the key."""

    tokens_per_s: Optional[float] = None
    pairs_per_s: Optional[float] = None
    texts_per_s: Optional[float] = None
    path: Optional[str] = None


def load_bench(path: str | Path) -> BenchThroughput:
    """Read a bench JSON object ({"tokens_per_s", "pairs_per_s", "texts_per_s"}; any subset)."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise PlanError(f"--from-bench: no such file: {p}") from None
    except OSError as exc:
        raise PlanError(f"--from-bench: cannot read {p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"--from-bench: {p} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PlanError(f"--from-bench: {p} must hold a JSON object with any of {', '.join(BENCH_KEYS)}; "
                        f"got a JSON {type(data).__name__}")
    values = {key: _number(data[key], f"--from-bench {p}: \"{key}\"") for key in BENCH_KEYS if key in data}
    if not values:
        raise PlanError(f"--from-bench: {p} has none of the keys {', '.join(BENCH_KEYS)} "
                        f"(found: {', '.join(map(str, data)) or 'nothing'})")
    return BenchThroughput(path=str(p), **{k: float(v) for k, v in values.items()})


def _throughput(flag_value: Optional[float], bench: Optional[BenchThroughput], key: str, flag: str
                ) -> tuple[Optional[float], Optional[str]]:
    """(value, source): the flag wins over the bench file; None if neither has it."""
    if flag_value is not None:
        return _number(flag_value, flag), flag
    value = getattr(bench, key) if bench is not None else None
    if value is not None:
        return value, "bench file"
    return None, None


def _missing(key: str, flag: str, bench: Optional[BenchThroughput]) -> str:
    where = f"; {bench.path} has no \"{key}\"" if bench is not None else ""
    return f"pass {flag} or --from-bench FILE with \"{key}\"{where}"


def parse_mrl(text: Optional[str], dims: Optional[int] = None) -> tuple[int, ...]:
    """'256,128' -> (256, 128); sizes must be positive whole numbers, at most ``dims``."""
    if text is None or not text.strip():
        return ()
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            size = int(part)
        except ValueError:
            raise PlanError(f"--mrl: {part!r} is not a whole number (expected e.g. --mrl 256,128)") from None
        if size <= 0:
            raise PlanError(f"--mrl: sizes must be positive, got {size}")
        if dims is not None and size > dims:
            raise PlanError(f"--mrl: Matryoshka size {size} exceeds --dims {dims}")
        if size not in out and size != dims:
            out.append(size)
    return tuple(out)


def parse_stage_ms(text: Optional[str]) -> dict[str, float]:
    """'embed=5,search=4,rerank=40' -> {'embed': 5.0, ...}. Stages: queue, embed, search, rerank, llm."""
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        name = STAGE_ALIASES.get(name, name)
        if not sep:
            raise PlanError(f"--stage-ms: {part!r} must be STAGE=MS, e.g. \"embed=5,search=4,rerank=40\"")
        if name not in STAGES:
            raise PlanError(f"--stage-ms: unknown stage {name!r} (known: {', '.join(STAGES)})")
        try:
            ms = float(value)
        except ValueError:
            raise PlanError(f"--stage-ms: {name}={value.strip()!r} is not a number of milliseconds") from None
        out[name] = _number(ms, f"--stage-ms {name}", allow_zero=True)
    return out


# ------------------------------------------------------------------------------------------- indexing


@dataclass(frozen=True)
class IndexingInputs:
    chunks: int
    tokens_per_chunk: float
    tokens_per_s: float  # per device
    devices: int = 1
    price_per_device_hour: float = 2.0
    throughput_source: str = "--tokens-per-s"

    def __post_init__(self) -> None:
        _number(self.chunks, "--chunks", integer=True)
        _number(self.tokens_per_chunk, "--tokens")
        _number(self.tokens_per_s, "--tokens-per-s")
        _number(self.devices, "--devices", integer=True)
        _number(self.price_per_device_hour, "--price-per-device-hour", allow_zero=True)


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
    qps: float
    candidates: int = 50
    pairs_per_s: Optional[float] = None  # per device, measured
    texts_per_s: Optional[float] = None  # per device, measured
    headroom: float = 0.7
    price_per_device_hour: float = 2.0
    pairs_source: Optional[str] = None
    texts_source: Optional[str] = None

    def __post_init__(self) -> None:
        _number(self.qps, "--qps")
        _number(self.candidates, "--candidates", integer=True)
        if self.pairs_per_s is not None:
            _number(self.pairs_per_s, "--pairs-per-s")
        if self.texts_per_s is not None:
            _number(self.texts_per_s, "--texts-per-s")
        _number(self.headroom, "--headroom")
        if self.headroom > 1:
            raise PlanError(f"--headroom is the usable fraction of measured throughput, in (0, 1]; got {self.headroom!r}")
        _number(self.price_per_device_hour, "--price-per-device-hour", allow_zero=True)


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
    vectors: int
    dims: int
    mrl: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _number(self.vectors, "--vectors", integer=True)
        _number(self.dims, "--dims", integer=True)
        for size in self.mrl:
            _number(size, "--mrl", integer=True)
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
    price_per_device_hour: float = 2.0
    candidates: int = 50
    texts_per_s: Optional[float] = None  # measured; gives the embed default
    pairs_per_s: Optional[float] = None  # measured; gives the rerank default

    def __post_init__(self) -> None:
        for name, ms in self.ms.items():
            if name not in STAGES:
                raise PlanError(f"--stage-ms: unknown stage {name!r} (known: {', '.join(STAGES)})")
            _number(ms, f"--stage-ms {name}", allow_zero=True)
        _number(self.price_per_device_hour, "--price-per-device-hour", allow_zero=True)
        _number(self.candidates, "--candidates", integer=True)


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
) -> Plan:
    """All sections the given options ask for: indexing (--chunks), serving and the per-request
    stage table (--qps), storage (--vectors), the stage table alone (--stage-ms)."""
    bench = load_bench(from_bench) if from_bench is not None else None
    _number(price_per_device_hour, "--price-per-device-hour", allow_zero=True)
    _number(devices, "--devices", integer=True)
    _number(candidates, "--candidates", integer=True)
    tok_s, tok_src = _throughput(tokens_per_s, bench, "tokens_per_s", "--tokens-per-s")
    pairs_s, pairs_src = _throughput(pairs_per_s, bench, "pairs_per_s", "--pairs-per-s")
    texts_s, texts_src = _throughput(texts_per_s, bench, "texts_per_s", "--texts-per-s")

    if chunks is None and vectors is None and qps is None and stage_ms is None:
        raise PlanError("nothing to plan: give --chunks (indexing), --qps (serving), --vectors (storage) "
                        "or --stage-ms (per-request stages); see --help")

    indexing = None
    if chunks is not None:
        if tokens is None:
            raise PlanError("indexing needs --tokens (average tokens per chunk) with --chunks")
        if tok_s is None:
            raise PlanError("indexing needs a throughput: " + _missing("tokens_per_s", "--tokens-per-s", bench))
        indexing = plan_indexing(IndexingInputs(chunks, tokens, tok_s, devices, price_per_device_hour, tok_src))
    elif tokens is not None:
        raise PlanError("--tokens is tokens per chunk for indexing: give --chunks too")

    serving = None
    if qps is not None:
        serving = plan_serving(ServingInputs(qps, candidates, pairs_s, texts_s, headroom, price_per_device_hour,
                                             pairs_src, texts_src))
    else:
        _number(headroom, "--headroom")

    storage = None
    if vectors is not None:
        if dims is None:
            raise PlanError("storage needs --dims (full embedding size) with --vectors")
        _number(dims, "--dims", integer=True)
        storage = plan_storage(StorageInputs(vectors, dims, parse_mrl(mrl, dims)))
    elif dims is not None or mrl:
        raise PlanError("--dims/--mrl size stored vectors: give --vectors too")

    stages = None
    if stage_ms is not None or qps is not None:
        stages = plan_stages(StageInputs(parse_stage_ms(stage_ms), price_per_device_hour, candidates,
                                         texts_s, pairs_s))
    return Plan(indexing, serving, storage, stages, bench)


# -------------------------------------------------------------------------------------------- output


def _sci(x: float) -> str:
    """2.56e9 style: three significant figures, no '+' or leading zeros in the exponent."""
    if x == 0:
        return "0"
    exp = math.floor(math.log10(abs(x)))
    mantissa = round(x / 10**exp, 2)
    if abs(mantissa) >= 10:
        mantissa /= 10
        exp += 1
    return f"{mantissa:g}e{exp}"


def _sig3(x: float) -> str:
    """Three significant figures, no exponent: 409.6 -> 410, 51.2 -> 51.2, 0.0128 -> 0.0128."""
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{round(x, digits):,.{digits}f}"


def _size(n_bytes: float, sep: str = " (", end: str = ")") -> str:
    """Decimal and binary units: '410 GB (381 GiB)'."""
    dec = ((1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
    binary = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))

    def pick(units):
        for scale, unit in units:
            if n_bytes >= scale:
                return f"{_sig3(n_bytes / scale)} {unit}"
        return f"{n_bytes:,.0f} B"

    return f"{pick(dec)}{sep}{pick(binary)}{end}"


def _duration(seconds: float, days: bool = False) -> str:
    hours = seconds / 3600
    if hours >= 1:
        text = f"{hours:,.1f} h"
        return text + (f" ({hours / 24:,.1f} days)" if days and hours >= 48 else "")
    if seconds >= 60:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds:,.1f} s"


def _money(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.01 or x == 0 else f"${x:,.4f}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def indexing_line(p: IndexingPlan) -> str:
    i = p.inputs
    parts = [f"{_duration(p.seconds_one_device)} on 1 device"]
    if i.devices != 1:
        parts.append(f"{_duration(p.seconds)} on {_plural(i.devices, 'device')}")
    return (f"indexing: {_sci(p.total_tokens)} tokens → {', '.join(parts)}, {_money(p.cost)} "
            f"({p.device_hours:,.1f} device-hours × {_money(i.price_per_device_hour)})")


def serving_line(p: ServingPlan) -> str:
    i = p.inputs
    text = f"serving: {_num(i.qps)} QPS × {i.candidates:,} candidates = {_num(p.pairs_per_s)} rerank pairs/s"
    counts = []
    for row in (p.rerank, p.embed):
        counts.append(f"{_plural(row.devices, row.name + ' device')}" if row.devices is not None
                      else f"{row.name} devices unknown")
    text += " → " + ", ".join(counts) + f" at {i.headroom:.0%} headroom"
    if p.complete:
        text += f", {_money(p.cost_per_hour)}/h, {_money(p.cost_per_million_requests)} per 1M requests"
    return text


def storage_line(p: StoragePlan) -> str:
    i = p.inputs
    return (f"storage: {i.vectors:,} vectors × {i.dims:,} dims × 4 B (float32) = "
            f"{_size(p.bytes(i.dims, 'float32'))}")


def stages_line(p: StagePlan) -> str:
    slow = p.slowest
    return (f"request: {_num(round(p.total_ms, 1))} ms end to end, {slow.label} is {slow.share:.0%} of it; "
            f"{_money(p.total_cost_per_million)} device time per 1M requests")


def render(plan: Plan, console=None) -> None:
    """Print the plan: one summary line per section, then its table."""
    from rich.table import Table

    console = console or logs.console()
    say = lambda text: console.print(text, soft_wrap=True, highlight=False, markup=False)  # noqa: E731

    if plan.bench is not None:
        b = plan.bench
        found = ", ".join(f"{k}={_num(getattr(b, k))}" for k in BENCH_KEYS if getattr(b, k) is not None)
        say(f"bench file {b.path}: {found}")

    if plan.indexing is not None:
        p, i = plan.indexing, plan.indexing.inputs
        say(indexing_line(p))
        t = Table(title="indexing", title_justify="left")
        for col in ("devices", "tokens/s", "time", "device-hours", "cost"):
            t.add_column(col, justify="right")
        rows = [1] if i.devices == 1 else [1, i.devices]
        for n in rows:
            secs = p.total_tokens / (i.tokens_per_s * n)
            t.add_row(str(n), f"{i.tokens_per_s * n:,.0f}", _duration(secs, days=True), f"{secs / 3600 * n:,.1f}",
                      _money(secs / 3600 * n * i.price_per_device_hour))
        t.caption = (f"{i.chunks:,} chunks × {_num(i.tokens_per_chunk)} tokens = {p.total_tokens:,.0f} tokens; "
                     f"{_num(i.tokens_per_s)} tokens/s per device ({i.throughput_source})")
        console.print(t)

    if plan.serving is not None:
        p, i = plan.serving, plan.serving.inputs
        say(serving_line(p))
        t = Table(title="serving", title_justify="left")
        for col in ("component", "needed", "per device", f"usable {i.headroom:.0%}", "devices", "source"):
            t.add_column(col, justify="left" if col in ("component", "source") else "right", no_wrap=True)
        for row in (p.rerank, p.embed):
            if row.devices is None:
                t.add_row(row.name, f"{_num(row.demand)} {row.unit}", "?", "?", "?", "not given")
            else:
                t.add_row(row.name, f"{_num(row.demand)} {row.unit}", _num(row.per_device),
                          _num(round(row.usable_per_device, 1)), str(row.devices),
                          "flag" if row.source.startswith("--") else row.source)
        t.caption = f"devices = ceil(needed ÷ (per device × {i.headroom:g})); {_money(i.price_per_device_hour)}/device-hour"
        console.print(t)
        for row in (p.rerank, p.embed):
            if row.devices is None:
                say(f"note: {row.name} devices unknown: {row.missing}")

    if plan.storage is not None:
        p = plan.storage
        say(storage_line(p))
        t = Table(title=f"storage, {p.inputs.vectors:,} vectors (raw vectors only)", title_justify="left")
        t.add_column("dims", justify="right")
        for _, label in STORAGE_COLUMNS:
            t.add_column(label, justify="right")
        for row in p.rows:
            name = f"{row.dims:,}" + (" (MRL)" if row.matryoshka else "")
            t.add_row(name, *[_size(row.bytes[dt], "\n", "") for dt, _ in STORAGE_COLUMNS])
        t.caption = "GB = 1e9 B, GiB = 2^30 B; binary = ceil(dims/8) B per vector; no index, payload or replicas"
        console.print(t)

    if plan.stages is not None:
        p = plan.stages
        say(stages_line(p))
        t = Table(title="one request, per stage", title_justify="left")
        for col in ("stage", "ms", "share", "$ per 1M requests", "source"):
            t.add_column(col, justify="left" if col in ("stage", "source") else "right")
        for row in p.rows:
            cost = _money(row.cost_per_million) if row.uses_device else "$0 (no device)"
            t.add_row(row.label, f"{row.ms:,.1f}", f"{row.share:.1%}", cost, row.source)
        t.add_row("total", f"{p.total_ms:,.1f}", "100.0%", _money(p.total_cost_per_million), "", style="bold")
        t.caption = (f"$ = ms × {_money(p.inputs.price_per_device_hour)}/device-hour ÷ 3.6e6 per device-ms, "
                     "one request holding one device for its stage")
        console.print(t)


# -------------------------------------------------------------------------------------------- command


def plan_command(
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Indexing: number of chunks to embed"),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Indexing: average tokens per chunk"),
    tokens_per_s: Optional[float] = typer.Option(None, "--tokens-per-s", help="Indexing: measured tokens/s per device"),
    devices: int = typer.Option(1, "--devices", help="Indexing: devices working in parallel"),
    price_per_device_hour: float = typer.Option(2.0, "--price-per-device-hour", help="$ per device-hour"),
    qps: Optional[float] = typer.Option(None, "--qps", help="Serving: queries per second"),
    candidates: int = typer.Option(50, "--candidates", help="Serving: passages reranked per query"),
    pairs_per_s: Optional[float] = typer.Option(None, "--pairs-per-s", help="Serving: measured rerank pairs/s per device"),
    texts_per_s: Optional[float] = typer.Option(None, "--texts-per-s", help="Serving: measured query embeddings/s per device"),
    headroom: float = typer.Option(0.7, "--headroom", help="Usable fraction of measured throughput, (0, 1]"),
    vectors: Optional[int] = typer.Option(None, "--vectors", help="Storage: number of stored vectors"),
    dims: Optional[int] = typer.Option(None, "--dims", help="Storage: full embedding size"),
    mrl: Optional[str] = typer.Option(None, "--mrl", help="Storage: Matryoshka sizes, e.g. 256,128"),
    from_bench: Optional[Path] = typer.Option(
        None, "--from-bench",
        help='JSON object {"tokens_per_s", "pairs_per_s", "texts_per_s"} (any subset, per device); flags override it'),
    stage_ms: Optional[str] = typer.Option(
        None, "--stage-ms", help="Per-request ms as STAGE=MS, stages queue, embed, search, rerank, llm; e.g. embed=5,search=4,rerank=40"),
) -> None:
    """Indexing time and cost, serving device counts, vector storage and per-stage request latency/cost."""
    try:
        plan = build_plan(
            chunks=chunks, tokens=tokens, tokens_per_s=tokens_per_s, devices=devices,
            price_per_device_hour=price_per_device_hour, qps=qps, candidates=candidates,
            pairs_per_s=pairs_per_s, texts_per_s=texts_per_s, headroom=headroom, vectors=vectors,
            dims=dims, mrl=mrl, from_bench=from_bench, stage_ms=stage_ms,
        )
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    render(plan)
