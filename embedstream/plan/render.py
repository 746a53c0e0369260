"""`embedstream plan`'s output: one summary line per section, then its rich table.

Numbers are printed the way people quote them: 2.56e9 tokens, 410 GB (381 GiB), 88.9 h (3.7 days).
"""

from __future__ import annotations

import math

from embedstream import logs
from embedstream.plan.arithmetic import IndexingPlan, Plan, ServingPlan, StagePlan, StoragePlan
from embedstream.plan.autoscale import AutoscalePlan
from embedstream.plan.inputs import BENCH_KEYS

#: dtypes printed in the storage table (int8 and uint8 share a row: same size).
STORAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("float32", "float32"), ("float16", "float16"), ("int8", "int8/uint8"), ("binary", "binary"),
)


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


def autoscaling_line(p: AutoscalePlan) -> str:
    known = [r for r in p.rows if r.lag_threshold is not None]
    lanes = ", ".join(f"{r.topic.values_key}.{r.topic.topic_key} {r.lag_threshold:,}" for r in known) or "none known"
    return (f"autoscaling: KEDA lagThreshold (records of lag per worker, a backlog drained in the lane's drain time "
            f"at {p.inputs.headroom:.0%} headroom): {lanes}")


def overload_line(p: AutoscalePlan) -> str:
    """The online lane's overload trigger: queries offered (answered + shed) per worker."""
    offered = p.inputs.offered_queries_per_s()
    if offered is None:
        return "overload: embedOnline.autoscaling.offeredQueriesPerS unknown: pass --texts-per-s"
    return (f"overload: embedOnline.autoscaling.offeredQueriesPerS {_sig3(offered)} (--texts-per-s × headroom): KEDA's "
            f"prometheus trigger runs ceil(queries offered per second, answered + shed, ÷ {_sig3(offered)}) online "
            f"workers; a shed query is committed, so it never shows as lag")


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

    if plan.autoscaling is not None:
        p = plan.autoscaling
        say(autoscaling_line(p))
        t = Table(title="autoscaling: KEDA lagThreshold per lane and topic", title_justify="left")
        for col in ("lane (chart values)", "topic", "one record", "records/s per worker", "drain s", "lagThreshold"):
            t.add_column(col, justify="left" if col in ("lane (chart values)", "topic", "one record") else "right",
                         no_wrap=True)
        for row in p.rows:
            if row.lag_threshold is None:
                t.add_row(row.topic.values_key, row.topic.topic_key, row.topic.record, "?", _num(row.drain_s), "?")
            else:
                t.add_row(row.topic.values_key, row.topic.topic_key, row.topic.record,
                          _sig3(row.records_per_s), _num(row.drain_s), f"{row.lag_threshold:,}")
        t.caption = ("lagThreshold = floor(measured per worker × headroom ÷ cost of a record × drain s), at least 1; "
                     "KEDA runs ceil(lag ÷ lagThreshold) workers")
        console.print(t)
        for row in p.rows:
            if row.lag_threshold is None:
                say(f"note: {row.topic.values_key} {row.topic.topic_key} unknown: {row.missing}")
        say(overload_line(p))

