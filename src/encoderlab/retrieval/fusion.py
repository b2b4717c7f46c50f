"""Fusing the rankings of several retrievers (dense and BM25) into one, torch-free.

- Reciprocal rank fusion (Cormack, Clarke and Buettcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and
  individual Rank Learning Methods", SIGIR): score(d) = sum over rankings r of 1 / (k + rank_r(d)), ranks from 1,
  k = 60 as in the paper; a document absent from a ranking gets nothing from it.
- Weighted: each ranking's scores normalised over its own candidates (min-max onto [0, 1], or z-score: minus their
  mean, over their standard deviation), then alpha * first + (1 - alpha) * second (a document absent from a ranking
  gets that ranking's lowest normalised score, or 0 if lower: 0 under min-max), the convex combination Bruch, Gai
  and Ingber 2023 ("An Analysis of Fusion Functions for Hybrid Retrieval", TOIS) study, with the two normalisations
  they compare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from encoderlab.choices import DEFAULT_ALPHA, DEFAULT_FUSION, DEFAULT_NORMALISATION, RRF_K


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


def z_score(scores: dict[str, float]) -> dict[str, float]:
    """Scores minus their mean, over their (population) standard deviation (all 0 when they are equal)."""
    values = list(scores.values())
    mean = math.fsum(values) / len(values) if values else 0.0
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)) if values else 0.0
    return {ident: (s - mean) / spread if spread > 0 else 0.0 for ident, s in scores.items()}


# encoderlab.choices.NORMALISATIONS names these for the command line (pinned equal by tests/test_cards.py)
NORMALISATIONS: dict[str, Callable[[dict[str, float]], dict[str, float]]] = {"min-max": min_max, "z-score": z_score}


def weighted(first: dict[str, float], second: dict[str, float], alpha: float,
             normalisation: str = "min-max") -> list[tuple[str, float]]:
    """alpha * norm(first) + (1 - alpha) * norm(second): (id, fused score), best first."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha {alpha}: expected a weight from 0 to 1")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation {normalisation!r}: expected one of {', '.join(NORMALISATIONS)}")
    a, b = NORMALISATIONS[normalisation](first), NORMALISATIONS[normalisation](second)
    floor_a, floor_b = min([*a.values(), 0.0]), min([*b.values(), 0.0])  # min-max: 0, as before
    fused = {ident: alpha * a.get(ident, floor_a) + (1 - alpha) * b.get(ident, floor_b) for ident in {**a, **b}}
    order = {ident: i for i, ident in enumerate({**a, **b})}  # ties: first-seen order, deterministic
    return sorted(fused.items(), key=lambda item: (-item[1], order[item[0]]))


def fuse(first: Sequence[tuple[str, float]], second: Sequence[tuple[str, float]], fusion: str = DEFAULT_FUSION,
         alpha: float = DEFAULT_ALPHA, rrf_k: int = RRF_K,
         normalisation: str = DEFAULT_NORMALISATION) -> list[tuple[str, float]]:
    """Two rankings of (id, score), best first, fused by `fusion` (rrf or weighted): (id, fused score), best first."""
    if fusion == "rrf":
        return rrf([[i for i, _ in first], [i for i, _ in second]], rrf_k)
    if fusion == "weighted":
        return weighted(dict(first), dict(second), alpha, normalisation)
    raise ValueError(f"fusion {fusion!r}: expected rrf or weighted")
