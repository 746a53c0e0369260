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
does not depend on the order in which the store returned equal scores. Methods (:class:`Fusion`):

* ``rrf``: reciprocal rank fusion, ``sum w_i / (k + rank_i)`` (k = 60 and equal weights: Qdrant's);
* ``dbsf``: distribution-based score fusion as Qdrant defines it: each list's scores mapped by
  ``(s - (mean - 3 sd)) / (6 sd)`` (sample sd; a list of one, or of equal scores, maps to 0.5), summed;
* ``convex``: ``alpha * dense + (1 - alpha) * sparse`` of scores normalised by their list's best one
  (a cosine's and a BM25 score's floor taken as 0), 0 where a point is absent;
* ``logit``: ``sum scale_i * score_i``: each retriever's score in log-odds-like units: BM25 is a sum of
  Robertson-Sparck Jones log-odds weights and a SPLADE score is the dot product its contrastive loss took
  as the logit (scale 1 both); a sentence-transformers bi-encoder's logit is its cosine times its loss's
  scale (MultipleNegativesRankingLoss's 20). The dense scale used, :data:`DENSE_LOGIT_SCALE` = 30, is
  the measured one (`bench quality --hybrid`, docs/fusion.md: 20 left known-item recall at dense's, 25-30
  gained it with exact terms kept). Every candidate gets a score from every list: its own, else the
  exact one the caller computed (:attr:`Candidates.extra`: the dense cosine of a sparse-only point),
  else 0 where the store returned fewer than the limit (no other point matches at all: a rare word),
  else the list's lowest score (the best a point below the cut can have).

The fusion the searcher uses when a request names none is :data:`DEFAULT_FUSION`, chosen by
`embedstream bench quality --hybrid` (docs/fusion.md has the tables).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


Method = Literal["rrf", "dbsf", "convex", "logit"]


@dataclass(frozen=True)
class Fusion:
    """How ranked lists are fused: ``method``, RRF's ``k``, and one weight per input list (dense first):
    RRF's list weights, ``convex``'s ``alpha`` and ``1 - alpha``, ``logit``'s scales."""

    method: Method
    weights: tuple[Fraction, ...] = (Fraction(1), Fraction(1))
    k: int = 60

    def describe(self) -> str:
        w = self.weights
        if self.method == "rrf":
            return f"RRF k={self.k}" + ("" if len(set(w)) == 1 else f", weights {'/'.join(str(x) for x in w)}")
        if self.method == "convex":
            return f"convex, alpha {w[0]}"
        if self.method == "logit":
            return f"logit, {w[0]} x cosine + {w[1]} x sparse"
        return "DBSF"


@dataclass(frozen=True)
class Candidates:
    """One input list: ``(id, score)`` pairs as a store returned them for a search asked for ``limit``
    (fewer: the store had no other match), and ``extra``: exact scores the caller has for points not in it."""

    pairs: Sequence[tuple[str, float]]
    limit: int
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Fused:
    """One fused result: the point, its fused score and its 1-based rank in each input list (None: absent)."""

    id: str
    score: float
    ranks: tuple[int | None, ...]


def fuse(lists: Sequence[Candidates], fusion: Fusion, limit: int) -> list[Fused]:
    """The ``limit`` best of the lists' points, fused by ``fusion`` and ordered by the rule: fused score,
    the better single-list rank, the point id."""
    if len(lists) != len(fusion.weights):
        raise ValueError(f"{fusion.describe()}: {len(fusion.weights)} weights for {len(lists)} lists")
    ranked = [ordered(dict(c.pairs).items(), score=lambda p: p[1], ident=lambda p: p[0]) for c in lists]
    ranks: dict[str, list[int | None]] = {}
    for n, pairs in enumerate(ranked):
        for rank, (pid, _) in enumerate(pairs, 1):
            ranks.setdefault(pid, [None] * len(lists))[n] = rank
    if fusion.method == "rrf":
        exact = {pid: sum((w / (fusion.k + r) for w, r in zip(fusion.weights, rs) if r is not None), Fraction(0))
                 for pid, rs in ranks.items()}
        keys: Mapping[str, object] = exact  # exact fractions: ties are true ties
        scores = {pid: float(value) for pid, value in exact.items()}
    else:
        scores = _score_fusion(fusion, lists, ranked, ranks)
        keys = {pid: score_key(value) for pid, value in scores.items()}
    best = sorted(ranks, key=lambda pid: (-keys[pid], min(r for r in ranks[pid] if r is not None), pid))  # type: ignore[operator]
    return [Fused(pid, scores[pid], tuple(ranks[pid])) for pid in best[:limit]]


def _exact(score: float) -> float:
    """A score as the rule compares it (at SCORE_DECIMALS places), so every engine's input is the same number."""
    return score_key(score) / _SCALE


def _score_fusion(fusion: Fusion, lists: Sequence[Candidates], ranked: list[list[tuple[str, float]]],
                  ranks: Mapping[str, list[int | None]]) -> dict[str, float]:
    scores = dict.fromkeys(ranks, 0.0)
    for weight, candidates, pairs in zip(fusion.weights, lists, ranked):
        values = [_exact(s) for _, s in pairs]
        if fusion.method == "logit":
            own = dict(zip((pid for pid, _ in pairs), values))
            exhausted = len(pairs) < candidates.limit
            floor = 0.0 if exhausted or not values else values[-1]
            for pid in scores:
                value = own.get(pid)
                if value is None:
                    value = _exact(candidates.extra[pid]) if pid in candidates.extra else floor
                scores[pid] += float(weight) * value
            continue
        normalised = _dbsf(values) if fusion.method == "dbsf" else _by_best(values)
        for (pid, _), value in zip(pairs, normalised):
            scores[pid] += float(weight) * value
    return scores


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
    """Each score over the list's best (floor 0; negatives clip to 0)."""
    top = max(scores, default=0.0)
    return [max(s, 0.0) / top if top > 0 else 0.0 for s in scores]


#: The ``logit`` fusion's dense weight: a cosine in BM25's units (measured: docs/fusion.md).
DENSE_LOGIT_SCALE = Fraction(30)

#: The fusions a request may name (``SearchRequest.fusion``); the first is the default.
FusionName = Literal["logit", "rrf", "wrrf", "dbsf", "convex"]
FUSIONS: dict[str, Fusion] = {
    "logit": Fusion("logit", (DENSE_LOGIT_SCALE, Fraction(1))),
    "rrf": Fusion("rrf"),
    "wrrf": Fusion("rrf", (Fraction(2), Fraction(1))),
    "dbsf": Fusion("dbsf"),
    "convex": Fusion("convex", (Fraction(1, 2), Fraction(1, 2))),
}
DEFAULT_FUSION: FusionName = "logit"
assert tuple(FUSIONS) == FusionName.__args__ and DEFAULT_FUSION == next(iter(FUSIONS))


def fusion_named(name: str, dense_scale: float | Fraction = DENSE_LOGIT_SCALE) -> Fusion:
    """The fusion a request names, ``logit`` with the deployment's dense scale (``EMBEDSTREAM_SPARSE__DENSE_SCALE``)."""
    fusion = FUSIONS[name]
    if fusion.method != "logit":
        return fusion
    return Fusion("logit", (Fraction(dense_scale).limit_denominator(1000), *fusion.weights[1:]), fusion.k)
