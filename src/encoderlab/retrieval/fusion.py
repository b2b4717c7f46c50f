"""Fusing the rankings of several retrievers (dense and BM25) into one, torch-free.

- Reciprocal rank fusion (Cormack, Clarke and Buettcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and
  individual Rank Learning Methods", SIGIR): score(d) = sum over rankings r of 1 / (k + rank_r(d)), ranks from 1,
  k = 60 as in the paper; a document absent from a ranking gets nothing from it.
- Weighted: each ranking's scores min-max normalised to [0, 1] over its own candidates, then
  alpha * first + (1 - alpha) * second (a document absent from a ranking gets 0 from it), the convex combination
  Bruch, Gai and Ingber 2023 ("An Analysis of Fusion Functions for Hybrid Retrieval", TOIS) study.
"""

from __future__ import annotations

from collections.abc import Sequence

RRF_K = 60  # Cormack et al. 2009, section 2: k = 60 was fixed during a pilot investigation and not tuned


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal rank fusion of ranked id lists (best first): (id, fused score), best first; ties keep the order
    in which the ids were first seen."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, ident in enumerate(ranking, 1):
            scores[ident] = scores.get(ident, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def min_max(scores: dict[str, float]) -> dict[str, float]:
    """Scores mapped linearly onto [0, 1] (all 1 when they are equal)."""
    low, high = min(scores.values(), default=0.0), max(scores.values(), default=0.0)
    return {ident: (s - low) / (high - low) if high > low else 1.0 for ident, s in scores.items()}


def weighted(first: dict[str, float], second: dict[str, float], alpha: float) -> list[tuple[str, float]]:
    """alpha * min-max(first) + (1 - alpha) * min-max(second): (id, fused score), best first."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha}: expected a weight from 0 to 1")
    a, b = min_max(first), min_max(second)
    fused = {ident: alpha * a.get(ident, 0.0) + (1 - alpha) * b.get(ident, 0.0) for ident in {**a, **b}}
    order = {ident: i for i, ident in enumerate({**a, **b})}  # ties: first-seen order, deterministic
    return sorted(fused.items(), key=lambda item: (-item[1], order[item[0]]))
