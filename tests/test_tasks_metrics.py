"""Metrics against hand-computed small cases and the reference libraries."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from encoderlab.tasks.metrics import (classification_metrics, correlation_metrics, entity_metrics, exact_match,
                                      normalize_answer, squad_metrics, token_f1)


def test_classification_by_hand():
    gold, predicted = [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1]
    # tp 2, fn 1, fp 1, tn 2: accuracy 4/6; F1 of class 1 = 2*2 / (2*2 + 1 + 1); MCC = (2*2 - 1*1) / 3^2
    metrics = classification_metrics(gold, predicted, 2)
    assert metrics["accuracy"] == pytest.approx(4 / 6)
    assert metrics["f1"] == pytest.approx(4 / 6)
    assert metrics["mcc"] == pytest.approx(3 / 9)


def test_multiclass_f1_is_macro():
    from sklearn.metrics import f1_score

    gold, predicted = [0, 1, 2, 2, 1, 0, 2], [0, 2, 2, 2, 1, 1, 0]
    assert classification_metrics(gold, predicted, 3)["f1"] == pytest.approx(f1_score(gold, predicted, average="macro"))


@pytest.mark.filterwarnings("ignore:A single label was found")  # sklearn on its one-class corner cases
@pytest.mark.parametrize("num_labels", [2, 3, 5])
def test_classification_equals_scikit_learn_on_random_and_degenerate_labels(num_labels):
    """encoderlab counts its own confusion matrix (no sklearn import at run time); scikit-learn is the oracle, on
    random labels and on the corners: one class only, the positive class absent, every prediction wrong."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    rng = np.random.default_rng(num_labels)
    cases = [(rng.integers(0, num_labels, n).tolist(), rng.integers(0, num_labels, n).tolist()) for n in (1, 7, 50)]
    cases += [([0, 0, 0], [0, 0, 0]), ([0, 0, 1], [0, 0, 0]), ([1, 1, 0], [0, 0, 1]), ([0, 1, 0, 1], [0, 1, 0, 1])]
    average = "binary" if num_labels == 2 else "macro"
    for gold, predicted in cases:
        got = classification_metrics(gold, predicted, num_labels)
        assert got["accuracy"] == pytest.approx(accuracy_score(gold, predicted)), (gold, predicted)
        assert got["f1"] == pytest.approx(f1_score(gold, predicted, average=average, zero_division=0)), (gold, predicted)
        assert got["mcc"] == pytest.approx(matthews_corrcoef(gold, predicted)), (gold, predicted)


def test_correlations():
    gold, predicted = [0.0, 1.0, 2.0, 3.0, 5.0], [0.1, 0.3, 0.2, 0.9, 2.0]
    metrics = correlation_metrics(gold, predicted)
    assert metrics["pearson"] == pytest.approx(pearsonr(gold, predicted)[0])
    # ranks (1,2,3,4,5) vs (1,3,2,4,5): d^2 sum = 2, rho = 1 - 6*2 / (5*24)
    assert metrics["spearman"] == pytest.approx(1 - 12 / 120)
    assert metrics["spearman"] == pytest.approx(spearmanr(gold, predicted)[0])
    assert correlation_metrics([1.0, 2.0], [3.0, 3.0]) == {"pearson": 0.0, "spearman": 0.0}


def test_entity_f1_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER(0-1), LOC(3), ORG; predicted: PER(0-1), ORG(3), ORG -> 2 correct of 3 and 3
    metrics = entity_metrics(gold, predicted)
    assert metrics["precision"] == pytest.approx(2 / 3) and metrics["recall"] == pytest.approx(2 / 3)
    assert metrics["f1"] == pytest.approx(2 / 3)
    assert metrics["accuracy"] == pytest.approx(5 / 6)


def test_entity_boundaries_must_match_exactly():
    # A predicted entity one token short is wrong: entity-level, not token-level, scoring.
    metrics = entity_metrics([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "O"]])
    assert metrics["f1"] == 0.0


@pytest.mark.parametrize("text, normal", [
    ("The Cat!", "cat"), ("  an   apple, a pear ", "apple pear"), ("Theatre", "theatre"), ("A.D. 1066", "ad 1066"),
])
def test_squad_normalization(text, normal):
    assert normalize_answer(text) == normal


def test_squad_em_f1_by_hand():
    assert exact_match("the Eiffel Tower.", "Eiffel tower") == 1.0
    # prediction "eiffel tower in paris" vs "eiffel tower": 2 shared, precision 2/4, recall 1 -> F1 2/3
    assert token_f1("the Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    assert token_f1("Paris", "London") == 0.0
    metrics = squad_metrics({"a": "Eiffel Tower in Paris", "b": "1889"},
                            {"a": ["Paris", "the Eiffel Tower"], "b": ["in 1889", "1889"], "c": ["x"]})
    # a: EM 0, best F1 max(2*(1/4*1)/(1/4+1)=0.4, 2/3); b: EM 1, F1 1; c: unanswered 0
    assert metrics["exact_match"] == pytest.approx(100 / 3)
    assert metrics["f1"] == pytest.approx(100 * (2 / 3 + 1) / 3)


def test_squad_v2_empty_answers():
    assert squad_metrics({"q": ""}, {"q": []}) == {"exact_match": 100.0, "f1": 100.0}
    assert squad_metrics({"q": "something"}, {"q": [""]})["f1"] == 0.0


def test_squad_f1_counts_repeated_tokens_once_each():
    # Counter intersection: "a b b" vs "b b c" share two b's (not one, not three).
    precision, recall = 2 / 3, 2 / 3
    assert token_f1("x y y", "y y z") == pytest.approx(2 * precision * recall / (precision + recall))
    assert not math.isnan(np.float64(token_f1("", "a")))
