"""One ranking rule, used wherever results are ordered, merged or fused, and the fusions of ranked lists.

**The rule** (the same in every process and on every store, so the same index gives the same top-k):

1. the score, best first, compared as an exact number: float scores (a store's cosine, a rescored or
   reranked score, a fused score) at :data:`SCORE_DECIMALS` decimal places (:func:`score_key`), so the
   last bits in which two engines' arithmetic differs (qdrant-edge's SIMD, a server, numpy) never
   order two hits; a reciprocal-rank score is an exact fraction;
2. for a fused list, the better single-list rank (the best rank the point has in any input list);
3. the point id (its canonical UUID string), ascending.

**Fusion** (:func:`fuse`) is done here, on the candidate lists the store returns (dense and sparse), not
by the store's own Query API fusion, whose order of ties differs from process to process and between
qdrant-edge and a server. Each input list is first put in the rule's order, so the rank a point gets
does not depend on the order in which the store returned equal scores. Methods (:data:`FUSIONS`):

* ``rrf``: reciprocal rank fusion, ``sum 1 / (k + rank)`` with k = 60 (Qdrant's default);
* ``wrrf``: weighted RRF, ``sum w_i / (k + rank_i)``;
* ``dbsf``: distribution-based score fusion as Qdrant defines it: each list's scores mapped by
  ``(s - (mean - 3 sd)) / (6 sd)`` (sample sd; a list of one, or of equal scores, maps to 0.5), summed;
* ``convex``: a convex combination of normalised scores, ``alpha * dense + (1 - alpha) * sparse``, each
  list's scores divided by its best one (a score's theoretical floor is 0 for BM25 and for the cosine
  of a text embedding in practice; negatives clip to 0); a point absent from a list scores 0 there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, TypeVar

T = TypeVar("T")

#: Decimal places at which float scores are compared (cosines differ between engines around 1e-7).
SCORE_DECIMALS = 6
_SCALE = 10**SCORE_DECIMALS


def score_key(score: float) -> int:
    """A float score as an exact integer at :data:`SCORE_DECIMALS` places: equal keys are a tie."""
    if not math.isfinite(score):
        return -(10**30) if score != score or score < 0 else 10**30
    return round(score * _SCALE)


def ordered(items: Iterable[T], score: Callable[[T], float] = lambda h: h.score,
            ident: Callable[[T], str] = lambda h: h.id) -> list[T]:
    """``items`` in the rule's order: score (at :data:`SCORE_DECIMALS` places), best first, then id."""
    return sorted(items, key=lambda item: (-score_key(score(item)), ident(item)))


Method = Literal["rrf", "dbsf", "convex"]


@dataclass(frozen=True)
class Fusion:
    """How ranked lists are fused: ``method``, RRF's ``k``, and one weight per input list (dense first).
    For ``convex`` the weights are ``alpha`` and ``1 - alpha``."""

    name: str
    method: Method
    weights: tuple[Fraction, ...] = (Fraction(1), Fraction(1))
    k: int = 60

    def describe(self) -> str:
        weights = "/".join(str(w) for w in self.weights)
        if self.method == "rrf":
            return f"RRF k={self.k}" + ("" if len(set(self.weights)) == 1 else f", weights {weights}")
        if self.method == "convex":
            return f"convex, alpha (dense) {self.weights[0]}"
        return "DBSF"


@dataclass(frozen=True)
class Fused:
    """One fused result: the point, its fused score and its 1-based rank in each input list (None: absent)."""

    id: str
    score: float
    ranks: tuple[int | None, ...]

    @property
    def best_rank(self) -> int:
        return min(r for r in self.ranks if r is not None)


def fuse(lists: Sequence[Sequence[tuple[str, float]]], fusion: Fusion, limit: int) -> list[Fused]:
    """The ``limit`` best of the lists' points (``(id, score)`` pairs, any order), fused by ``fusion`` and
    ordered by the rule: fused score, the better single-list rank, the point id."""
    if len(lists) != len(fusion.weights):
        raise ValueError(f"{fusion.name}: {len(fusion.weights)} weights for {len(lists)} lists")
    ranked = [ordered(dict(pairs).items(), score=lambda p: p[1], ident=lambda p: p[0]) for pairs in lists]
    ranks: dict[str, list[int | None]] = {}
    for n, pairs in enumerate(ranked):
        for rank, (pid, _) in enumerate(pairs, 1):
            ranks.setdefault(pid, [None] * len(lists))[n] = rank
    if fusion.method == "rrf":
        exact = {pid: sum((w / (fusion.k + r) for w, r in zip(fusion.weights, rs) if r is not None), Fraction(0))
                 for pid, rs in ranks.items()}
        keys = exact  # exact fractions: ties are true ties
        scores = {pid: float(value) for pid, value in exact.items()}
    else:
        normalise = _dbsf if fusion.method == "dbsf" else _by_best
        parts = [normalise([score_key(s) / _SCALE for _, s in pairs]) for pairs in ranked]
        scores = {pid: 0.0 for pid in ranks}
        for w, pairs, normalised in zip(fusion.weights, ranked, parts):
            for (pid, _), value in zip(pairs, normalised):
                scores[pid] += float(w) * value
        keys = {pid: score_key(value) for pid, value in scores.items()}
    best = sorted(ranks, key=lambda pid: (-keys[pid], min(r for r in ranks[pid] if r is not None), pid))
    return [Fused(pid, scores[pid], tuple(ranks[pid])) for pid in best[:limit]]


def _dbsf(scores: list[float]) -> list[float]:
    """Qdrant's DBSF normalisation: mean -+ 3 sample standard deviations mapped to 0..1."""
    if len(scores) < 2:
        return [0.5] * len(scores)
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
    if sd == 0:
        return [0.5] * len(scores)
    return [(s - (mean - 3 * sd)) / (6 * sd) for s in scores]


def _by_best(scores: list[float]) -> list[float]:
    """Each score over the list's best (theoretical floor 0; negatives clip to 0)."""
    top = max(scores, default=0.0)
    return [max(s, 0.0) / top if top > 0 else 0.0 for s in scores]


def _weights(dense: Fraction) -> tuple[Fraction, Fraction]:
    return (dense, 1 - dense)


#: Every fusion `bench quality --hybrid` compares, by name (the request's ``fusion``).
FUSIONS: dict[str, Fusion] = {
    "rrf": Fusion("rrf", "rrf"),
    "wrrf": Fusion("wrrf", "rrf", (Fraction(2), Fraction(1))),
    "dbsf": Fusion("dbsf", "dbsf"),
    "convex": Fusion("convex", "convex", _weights(Fraction(1, 2))),
}
