"""Evaluation metrics: classification (counts, scikit-learn's definitions), correlation (scipy), entities (seqeval),
SQuAD EM/F1.

Classification counts its own confusion matrix: importing sklearn.metrics costs 3.4 CPU s (2-core EPYC), more than
a tiny fine-tuning run's training, in every `encoderlab finetune` process. The definitions are scikit-learn's
(https://scikit-learn.org/stable/modules/model_evaluation.html): F1 = 2 TP / (2 TP + FP + FN), 0 where nothing is
predicted or gold (zero_division=0); macro F1 averages over the classes in gold or predicted; MCC is Gorodkin's
multiclass R_K (2004) from the confusion matrix, 0 where either side holds one class only.

SQuAD EM and F1 follow the official evaluate-v1.1.py (https://rajpurkar.github.io/SQuAD-explorer/): answers are
lowercased, stripped of punctuation and the articles a/an/the, and whitespace-collapsed; F1 counts shared tokens;
the best over the gold answers counts; totals are percentages. Unanswerable questions have gold "" (v2.0).
"""

from __future__ import annotations

import collections
import re
import string

import numpy as np


# ---- classification and regression -----------------------------------------------------------------------
def confusion_matrix(gold: list[int], predicted: list[int]) -> np.ndarray:
    """(K, K) counts, rows gold and columns predicted, over the K classes found in either, in sorted order."""
    classes, codes = np.unique(np.concatenate([np.asarray(gold), np.asarray(predicted)]), return_inverse=True)
    k, n = len(classes), len(gold)
    return np.bincount(codes[:n] * k + codes[n:], minlength=k * k).reshape(k, k)


def f1_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """F1 = 2 TP / (2 TP + FP + FN) elementwise, 0 where the denominator is 0 (zero_division=0)."""
    denominator = 2 * tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros(np.shape(tp), dtype=np.float64), where=denominator > 0)


def matthews(confusion: np.ndarray) -> float:
    """Matthews correlation of a (K, K) confusion matrix: Gorodkin's R_K, 0 where a side has one class only."""
    n, correct = confusion.sum(), np.trace(confusion)
    true, pred = confusion.sum(axis=1).astype(np.float64), confusion.sum(axis=0).astype(np.float64)
    covariance = correct * n - true @ pred
    spread = (n * n - pred @ pred) * (n * n - true @ true)
    return float(covariance / np.sqrt(spread)) if spread > 0 else 0.0


def classification_metrics(gold: list[int], predicted: list[int], num_labels: int) -> dict[str, float]:
    """accuracy, F1 (binary on class 1 with two classes, else macro) and Matthews correlation."""
    gold_arr, pred_arr = np.asarray(gold), np.asarray(predicted)
    if num_labels == 2:  # binary: class 1 is the positive one, present or not
        tp, fp, fn = ((pred_arr == 1) & (gold_arr == 1)).sum(), ((pred_arr == 1) & (gold_arr != 1)).sum(), \
            ((pred_arr != 1) & (gold_arr == 1)).sum()
        f1 = float(f1_from_counts(tp, fp, fn))
    else:
        confusion = confusion_matrix(gold, predicted)
        tp = np.diag(confusion)
        f1 = float(f1_from_counts(tp, confusion.sum(axis=0) - tp, confusion.sum(axis=1) - tp).mean())
    return {"accuracy": float((gold_arr == pred_arr).mean()), "f1": f1,
            "mcc": matthews(confusion_matrix(gold, predicted))}


def correlation_metrics(gold: list[float], predicted: list[float]) -> dict[str, float]:
    """Pearson and Spearman correlation (0 where either side is constant)."""
    from scipy.stats import pearsonr, spearmanr

    gold_arr, pred_arr = np.asarray(gold, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if len(gold_arr) < 2 or gold_arr.std() == 0 or pred_arr.std() == 0:
        return {"pearson": 0.0, "spearman": 0.0}
    return {"pearson": float(pearsonr(gold_arr, pred_arr)[0]), "spearman": float(spearmanr(gold_arr, pred_arr)[0])}


# ---- entities ----------------------------------------------------------------------------------------------
def entity_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Entity-level precision, recall and F1 (seqeval's default, conlleval semantics) and token accuracy."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    return {"f1": float(f1_score(gold, predicted, zero_division=0)),
            "precision": float(precision_score(gold, predicted, zero_division=0)),
            "recall": float(recall_score(gold, predicted, zero_division=0)),
            "accuracy": float(accuracy_score(gold, predicted))}


# ---- SQuAD -----------------------------------------------------------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (evaluate-v1.1.py normalize_answer)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    """1.0 when the normalized strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    """F1 over the bag of normalized tokens (evaluate-v1.1.py f1_score; two empty answers score 1 as in v2.0)."""
    pred_tokens, truth_tokens = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred_tokens or not truth_tokens:
        return float(pred_tokens == truth_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(truth_tokens)
    shared = sum(common.values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(pred_tokens), shared / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, float]:
    """exact_match and f1 in percent over the gold questions, each the best over its answers (no prediction: 0)."""
    em = f1 = 0.0
    for qid, truths in gold.items():
        truths = truths or [""]
        prediction = predictions.get(qid)
        if prediction is None:
            continue
        em += max(exact_match(prediction, t) for t in truths)
        f1 += max(token_f1(prediction, t) for t in truths)
    total = max(len(gold), 1)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}
