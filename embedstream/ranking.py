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
* ``logit``: ``sum scale_i * score_i / unit_i``: each retriever's score in log-odds-like units (a BM25 score
  is a sum of Robertson-Sparck Jones log-odds weights, a SPLADE score the dot product its loss took as the
  logit, a bi-encoder's logit its cosine times its loss's scale), the sparse one over the query's maximum
  attainable score (:attr:`Candidates.unit`, so that a 2-term and a 20-term query weigh the cosine the same).

**Score fusions score every candidate in every list** (``logit``, ``convex``): a point's own score, else the
exact score the caller computed for it (:attr:`Candidates.extra`: the cosine of a sparse-only point, the BM25
score of a dense-only one), else the list's :attr:`Candidates.absent` (0 for a sparse list whose missing points
were all scored: they hold none of the query's terms). Never a guess from where the list was cut, so a point's
fused score is the same at any depth; a point with no score in a list is an error. ``rrf`` and ``dbsf`` are
defined on the lists themselves (ranks; a list's mean and spread) and so depend on their depth by design.

**Cuts** (:func:`with_ties`): a list cut at ``limit`` keeps every point tied with its last one, so which of
tied points a store returned first never decides what is kept.

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


def with_ties(items: Sequence[T], limit: int, score: Callable[[T], float] = lambda h: h.score) -> list[T]:
    """The first ``limit`` of ``items`` (in the rule's order) and every later one tied with the last of them."""
    if limit <= 0:
        return []
    if len(items) <= limit:
        return list(items)
    boundary = score_key(score(items[limit - 1]))
    end = limit
    while end < len(items) and score_key(score(items[end])) == boundary:
        end += 1
    return list(items[:end])


def complete_at(items: Sequence[T], limit: int, asked: int, score: Callable[[T], float] = lambda h: h.score) -> bool:
    """Whether ``items`` (a store's best ``asked``, in the rule's order) hold every point tied at a cut at ``limit``:
    the store had no more, or the last one it returned scores below the cut."""
    if len(items) < asked or len(items) <= limit:
        return True
    return score_key(score(items[-1])) != score_key(score(items[limit - 1]))


Method = Literal["rrf", "dbsf", "convex", "logit"]
#: the fusions that score every candidate in every list (the caller gives the scores a list left out)
SCORE_FUSIONS = frozenset({"logit", "convex"})


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
            return f"logit, {float(w[0]):g} x cosine + {float(w[1]):g} x sparse / its unit"
        return "DBSF"


@dataclass(frozen=True)
class Candidates:
    """One input list: ``(id, score)`` pairs as a store returned them, ``extra``: exact scores the caller has for
    points not in it, ``absent``: the score of a point in neither (None: unknown, an error for a score fusion),
    and ``unit``: what a score is divided by before ``logit`` weighs it (a sparse list: the query's maximum
    attainable score; 1: the scores as they are)."""

    pairs: Sequence[tuple[str, float]]
    extra: Mapping[str, float] = field(default_factory=dict)
    absent: float | None = None
    unit: float = 1.0


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
    for n, (weight, candidates, pairs) in enumerate(zip(fusion.weights, lists, ranked)):
        if fusion.method == "dbsf":
            for (pid, _), value in zip(pairs, _dbsf([_exact(s) for _, s in pairs])):
                scores[pid] += float(weight) * value
            continue
        own = _every_score(candidates, pairs, scores, n)
        if fusion.method == "logit":
            unit = _exact(candidates.unit)
            if unit <= 0:
                raise ValueError(f"list {n}: unit {candidates.unit!r} is not positive")
            for pid, value in own.items():
                scores[pid] += float(weight) * (value / unit)
        else:  # convex: over the list's best (its first: the same at any depth)
            top = max((_exact(s) for _, s in pairs), default=0.0)
            for pid, value in own.items():
                scores[pid] += float(weight) * (max(value, 0.0) / top if top > 0 else 0.0)
    return scores


def _every_score(candidates: Candidates, pairs: list[tuple[str, float]], points: Mapping[str, float],
                 n: int) -> dict[str, float]:
    """Every point's score in this list (at the compared places): its own, the caller's exact one, else ``absent``."""
    own = {pid: _exact(score) for pid, score in pairs}
    for pid in points:
        if pid in own:
            continue
        value = candidates.extra.get(pid, candidates.absent)
        if value is None:
            raise ValueError(f"list {n} has no score for point {pid}: give it in Candidates.extra (a score fusion "
                             "scores every candidate in every list) or set Candidates.absent")
        own[pid] = _exact(value)
    return own


def _dbsf(scores: list[float]) -> list[float]:
    """Qdrant's DBSF normalisation: mean -+ 3 sample standard deviations mapped to 0..1."""
    if len(scores) < 2:
        return [0.5] * len(scores)
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1))
    if sd == 0:
        return [0.5] * len(scores)
    return [(s - (mean - 3 * sd)) / (6 * sd) for s in scores]


#: The ``logit`` fusion's dense weight against the sparse score over its unit (the query's sum of IDF weights for
#: BM25): chosen by `bench fusion` on the api corpus, reported on two others (docs/fusion.md).
DENSE_LOGIT_SCALE = Fraction(5, 2)

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
