"""What the user gives `embedstream plan`: validated numbers, the bench file and the list-valued flags.

Every failure is a :class:`PlanError` whose message names the flag to fix (the command prints it and
exits 2). The bench file format is described in :mod:`embedstream.plan`.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from embedstream.errors import CodedError

BENCH_KEYS = ("tokens_per_s", "pairs_per_s", "texts_per_s")

STAGES = ("queue", "embed", "search", "rerank", "llm")
STAGE_ALIASES = {"queue_wait": "queue", "queue-wait": "queue", "wait": "queue", "embedding": "embed",
                 "reranking": "rerank", "generate": "llm", "generation": "llm"}


class PlanError(CodedError, ValueError):
    """A bad or missing input; the message names the flag to fix."""

    code = "bad_plan_input"

    def __init__(self, message: str):
        super().__init__(self.code, message)


def checked_number(value, flag: str, *, integer: bool = False, allow_zero: bool = False) -> float:
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


def flag(name: str, default: Any = MISSING, *, whole: bool = False, zero_ok: bool = False) -> Any:
    """A dataclass field holding the number given as command-line ``name``; see :func:`check_flags`."""
    meta = {"flag": name, "whole": whole, "zero_ok": zero_ok}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def check_flags(inputs: Any) -> None:
    """Every :func:`flag` field of a dataclass is a finite number > 0 (>= 0 where ``zero_ok``), or None where
    None is its default (not given); a PlanError names the flag. Called from ``__post_init__``, so an
    invalid input never exists."""
    for f in fields(inputs):
        value = getattr(inputs, f.name)
        if "flag" not in f.metadata or (value is None and f.default is None):
            continue
        checked_number(value, f.metadata["flag"], integer=f.metadata["whole"], allow_zero=f.metadata["zero_ok"])


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
    values = {key: checked_number(data[key], f"--from-bench {p}: \"{key}\"") for key in BENCH_KEYS if key in data}
    if not values:
        raise PlanError(f"--from-bench: {p} has none of the keys {', '.join(BENCH_KEYS)} "
                        f"(found: {', '.join(map(str, data)) or 'nothing'})")
    return BenchThroughput(path=str(p), **{k: float(v) for k, v in values.items()})


def resolve_throughput(flag_value: Optional[float], bench: Optional[BenchThroughput], key: str, flag: str
                ) -> tuple[Optional[float], Optional[str]]:
    """(value, source): the flag wins over the bench file; None if neither has it."""
    if flag_value is not None:
        return checked_number(flag_value, flag), flag
    value = getattr(bench, key) if bench is not None else None
    if value is not None:
        return value, "bench file"
    return None, None


def missing_throughput(key: str, flag: str, bench: Optional[BenchThroughput]) -> str:
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


def parse_named_numbers(text: Optional[str], flag: str, known: tuple[str, ...], example: str, *,
                        noun: str, form: str, unit: str, aliases: Optional[dict[str, str]] = None,
                        allow_zero: bool = True) -> dict[str, float]:
    """'a=5,b=4' -> {'a': 5.0, 'b': 4.0}: ``noun`` names from ``known`` (or an alias of one), finite numbers."""
    if text is None or not text.strip():
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        name = (aliases or {}).get(name, name)
        if not sep:
            raise PlanError(f"{flag}: {part!r} must be {form}, e.g. \"{example}\"")
        if name not in known:
            raise PlanError(f"{flag}: unknown {noun} {name!r} (known: {', '.join(known)})")
        try:
            number = float(value)
        except ValueError:
            raise PlanError(f"{flag}: {name}={value.strip()!r} is not {unit}") from None
        out[name] = checked_number(number, f"{flag} {name}", allow_zero=allow_zero)
    return out


def parse_stage_ms(text: Optional[str]) -> dict[str, float]:
    """'embed=5,search=4,rerank=40' -> {'embed': 5.0, ...}. Stages: queue, embed, search, rerank, llm."""
    return parse_named_numbers(text, "--stage-ms", STAGES, "embed=5,search=4,rerank=40", noun="stage",
                               form="STAGE=MS", unit="a number of milliseconds", aliases=STAGE_ALIASES)
