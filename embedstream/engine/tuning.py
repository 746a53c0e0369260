"""The engine's path choice as a pure function of measurements (no torch, no timing: ``tuner.py`` measures).

A *path* is what the runner can build: a backend (packed, openvino), a precision (float32, bfloat16, int8)
and, for int8, its recipe (activation scales static or per token, the linears left unquantised and the
dtype they run in). A :class:`Measurement` holds what one path did on this host: bulk tokens/s, one
query's latency, and its quality against float32 (recall@10 and min cosine on a fixed query/document set).

:func:`choose` picks, for a worker's *shape*, the fastest path that meets the user's :class:`QualityFloor`:

* ``bulk``: highest tokens/s (a bulk-only worker);
* ``online``: lowest single-query latency (an online-only worker);
* ``shared``: lowest single-query latency among paths that yield to queries between layers (a worker on
  both lanes: an OpenVINO pass does not yield, so a query would wait for a whole bulk pass).

An approximate path must beat the fastest exact (float32) path by :data:`MARGIN` to be picked: timings on
a shared host are noisy, and a loss of quality for a gain inside the noise is no trade.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

SHAPES = ("bulk", "online", "shared")
MARGIN = 1.05  # an approximate path must be this much faster than the fastest float32 path
DEFAULT_FLOOR = "recall@10>=0.98"


@dataclass(frozen=True)
class PathSpec:
    """One buildable execution path. ``keep_float``: int8 linears left unquantised (runner names, e.g.
    ``layers.3.down``); ``float_dtype``: what those run in (float32 or bfloat16)."""

    backend: str  # packed | openvino
    precision: str  # float32 | bfloat16 | int8
    activations: str = ""  # int8: static | per_token
    keep_float: tuple[str, ...] = ()
    float_dtype: str = ""

    @property
    def exact(self) -> bool:
        return self.precision == "float32"

    @property
    def yields(self) -> bool:
        """Whether a pass stops between layers to serve queued queries (engine/yield_points.py)."""
        return self.backend == "packed"

    @property
    def label(self) -> str:
        short = {"float32": "fp32", "bfloat16": "bf16"}
        text = f"{self.backend} {short.get(self.precision, self.precision)}"
        if self.precision == "int8":
            kinds: dict[str, int] = {}
            for name in self.keep_float:
                kind = name.rsplit(".", 1)[-1]
                kinds[kind] = kinds.get(kind, 0) + 1
            kept = (f"kept {short.get(self.float_dtype, self.float_dtype)}: "
                    + " ".join(f"{n} {k}" for k, n in sorted(kinds.items()))) if kinds else "all int8"
            text += f" {self.activations.replace('_', '-')}, {kept}"
        return text

    def to_json(self) -> dict:
        return {**asdict(self), "keep_float": list(self.keep_float)}

    @classmethod
    def from_json(cls, data: dict) -> "PathSpec":
        return cls(data["backend"], data["precision"], data.get("activations", ""),
                   tuple(data.get("keep_float", ())), data.get("float_dtype", ""))


@dataclass(frozen=True)
class Measurement:
    path: PathSpec
    bulk_tok_s: float  # real tokens/s over the bulk timing set, median of rounds
    query_ms: float  # one short text alone, median
    recall_at_10: float  # of this path's query and document vectors against float32's top 10
    min_cos: float  # against float32, over the quality set

    def to_json(self) -> dict:
        return {**asdict(self), "path": self.path.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> "Measurement":
        return cls(PathSpec.from_json(data["path"]), float(data["bulk_tok_s"]), float(data["query_ms"]),
                   float(data["recall_at_10"]), float(data["min_cos"]))


@dataclass(frozen=True)
class QualityFloor:
    """``exact``: float32 paths only; else recall@10 (against float32's) and optionally min cosine."""

    exact: bool = False
    recall_at_10: float = 0.98
    min_cos: float | None = None

    def met_by(self, m: Measurement) -> bool:
        if m.path.exact:
            return True
        if self.exact:
            return False
        return m.recall_at_10 >= self.recall_at_10 and (self.min_cos is None or m.min_cos >= self.min_cos)

    def __str__(self) -> str:
        if self.exact:
            return "exact"
        return f"recall@10>={self.recall_at_10:g}" + (f",min_cos>={self.min_cos:g}" if self.min_cos is not None else "")


_TERM = re.compile(r"^\s*(recall@10|min_cos)\s*>=\s*([0-9.]+)\s*$")


def parse_floor(text: str) -> QualityFloor:
    """``exact`` | ``0.98`` (recall@10) | ``recall@10>=0.98`` | ``recall@10>=0.98,min_cos>=0.999``."""
    text = (text or "").strip().lower()
    if text == "exact":
        return QualityFloor(exact=True)
    try:
        return _bounded(QualityFloor(recall_at_10=float(text)))
    except ValueError:
        pass
    values: dict[str, float] = {}
    for term in text.split(","):
        match = _TERM.match(term)
        if not match:
            raise ValueError(f"quality floor {text!r}: expected 'exact', a recall@10 like 0.98, or terms like "
                             "'recall@10>=0.98,min_cos>=0.999'")
        values[match.group(1)] = float(match.group(2))
    return _bounded(QualityFloor(recall_at_10=values.get("recall@10", 0.0), min_cos=values.get("min_cos")))


def _bounded(floor: QualityFloor) -> QualityFloor:
    for value in (floor.recall_at_10, floor.min_cos):
        if value is not None and not 0.0 <= value <= 1.0:
            raise ValueError(f"quality floor values lie in [0, 1], got {value}")
    return floor


def shape_for_lanes(lanes) -> str:
    """The shape a worker on ``lanes`` is tuned for."""
    lanes = set(lanes)
    if lanes == {"bulk"}:
        return "bulk"
    return "shared" if "bulk" in lanes else "online"


def speed(m: Measurement, shape: str) -> float:
    """Higher is faster: tokens/s for bulk, queries/s for the latency shapes."""
    if shape == "bulk":
        return m.bulk_tok_s
    return 1000.0 / m.query_ms if m.query_ms > 0 else 0.0


@dataclass(frozen=True)
class Choice:
    winner: Measurement
    runner_up: Measurement | None
    exact_best: Measurement | None  # the fastest float32 path (what the winner is compared with)
    shape: str
    floor: QualityFloor
    considered: tuple[Measurement, ...] = field(default=())

    def summary(self) -> dict:
        """What the start-up log and ``describe()`` say about the choice."""

        def brief(m: Measurement | None) -> dict | None:
            if m is None:
                return None
            return {"path": m.path.label, "tok_s": round(m.bulk_tok_s), "query_ms": round(m.query_ms, 2),
                    "recall_at_10": round(m.recall_at_10, 4), "min_cos": round(m.min_cos, 6)}

        return {"shape": self.shape, "floor": str(self.floor), "chosen": brief(self.winner),
                "runner_up": brief(self.runner_up), "exact_best": brief(self.exact_best)}


def choose(measurements: list[Measurement], floor: QualityFloor, shape: str) -> Choice:
    """The fastest path for ``shape`` that meets ``floor``; approximate paths need :data:`MARGIN` over the
    fastest float32 path. Raises ValueError when no float32 path was measured (it is the reference)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    pool = [m for m in measurements if shape != "shared" or m.path.yields]
    exact = [m for m in pool if m.path.exact]
    if not exact:
        raise ValueError("no float32 path was measured: it is the reference every other path is judged against")
    exact_best = max(exact, key=lambda m: speed(m, shape))
    bar = speed(exact_best, shape) * MARGIN
    eligible = [m for m in pool if floor.met_by(m) and (m.path.exact or speed(m, shape) >= bar)]
    ranked = sorted(eligible, key=lambda m: speed(m, shape), reverse=True)
    return Choice(ranked[0], ranked[1] if len(ranked) > 1 else None, exact_best, shape, floor, tuple(pool))
