"""A cross-encoder reranker: `finetune rerank` on (query, passage, label or score) rows, then `rerank` orders the
passages of a query by one score per pair read together by the encoder (Nogueira and Cho 2019, "Passage
Re-ranking with BERT", arXiv:1901.04085): slower than comparing sentence vectors, and more exact, so it reorders the
few passages a bi-encoder (`similarity`) or a keyword search brought up.

The model is a SequenceClassifier with one logit; its sigmoid is the relevance score. transformers loads the folder
as XForSequenceClassification (num_labels 1, problem_type multi_label_classification: a sigmoid of the one logit).
How it trains depends on the file:
- listwise, when every query has a relevant passage (label >= 0.5) and at least one other: the passages of a query
  form one group, and the loss is the cross-entropy of the softmax over the group's logits against its relevance
  (the localized contrastive estimation of Gao, Dai and Callan 2021, "Rethink Training of BERT Rerankers in
  Multi-Stage Retrieval Pipeline", arXiv:2101.08751, where it beats the pointwise loss with a retriever's hard
  negatives). --batch-size then counts queries, each with all its passages;
- pointwise otherwise: the model's own binary cross-entropy on each row's label 0/1 or score in [0, 1], as
  sentence-transformers' CrossEncoder trains one label.

Scoring groups the rows of an evaluation file by query (the passages of one query, relevant ones labelled 1) and
reports MRR@10, nDCG@10 and hit@1 (Manning et al., Introduction to Information Retrieval, sections 8.4 and 8.5)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from pydantic import Field, create_model
from torch import nn

from encoderlab.choices import split_names
from encoderlab.engine import encode, forward
from encoderlab.errors import InputError
from encoderlab.nn.model import SequenceClassifier
from encoderlab.nn.output import LossTerm
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.spec import TaskSpec
from encoderlab.tokenizer import Tokenizer

CUTOFF = 10  # MRR@10 and nDCG@10: what a reader of a result list looks at (MS MARCO's passage ranking measure)


def relevance(example: TextExample) -> float:
    """The row's label: 1/0, or a graded score in [0, 1] (InputError naming the line otherwise)."""
    if not isinstance(example.label, float) or not 0.0 <= example.label <= 1.0:
        raise InputError(f"{example.where}: expected a relevance label of 0 or 1 (or a score in [0, 1]), got "
                         f"{example.label!r}")
    return example.label


def by_query(examples: list[TextExample]) -> dict[str, list[int]]:
    """The rows of each query, in file order."""
    groups: dict[str, list[int]] = {}
    for i, example in enumerate(examples):
        groups.setdefault(example.texts[0], []).append(i)
    return groups


def ranking_metrics(gains: list[list[float]]) -> dict[str, float]:
    """MRR@10, nDCG@10 and hit@1 over queries, each given its passages' relevance in ranked order (a passage is
    relevant from 0.5 up; nDCG uses the graded relevance)."""
    mrr = ndcg = hits = 0.0
    for ranked in gains:
        first = next((r for r, gain in enumerate(ranked[:CUTOFF], 1) if gain >= 0.5), None)
        mrr += 1.0 / first if first else 0.0
        hits += bool(ranked) and ranked[0] >= 0.5
        dcg = sum(gain / math.log2(r + 1) for r, gain in enumerate(ranked[:CUTOFF], 1))
        ideal = sum(gain / math.log2(r + 1) for r, gain in enumerate(sorted(ranked, reverse=True)[:CUTOFF], 1))
        ndcg += dcg / ideal if ideal else 0.0
    n = max(len(gains), 1)
    return {"mrr_at_10": mrr / n, "ndcg_at_10": ndcg / n, "hit_at_1": hits / n}


def listwise(examples: list[TextExample]) -> bool:
    """Whether every query has a relevant passage and another one: a file of groups to train listwise."""
    groups = by_query(examples).values()
    return bool(groups) and all(len(rows) > 1 and any(relevance(examples[i]) >= 0.5 for i in rows)
                                for rows in groups)


class RerankTask(Task):
    """Score (query, passage) pairs; rank the passages of each query by their scores."""

    name = "rerank"
    metrics = ("mrr_at_10", "ndcg_at_10", "hit_at_1")

    def __init__(self, *args: Any, listwise: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listwise = listwise

    def validate(self, examples: list[TextExample]) -> None:
        for example in examples:
            if len(example.texts) != 2:
                raise InputError(f"{example.where}: expected a query and a passage, got {len(example.texts)} texts")
            relevance(example)

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        self.validate(examples)
        items = self.encode(examples)
        rows = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "label": relevance(x)}
                for e, x in zip(items, examples)]
        if not self.listwise:
            return rows
        return [{"group": [rows[i] for i in group]} for group in by_query(examples).values()]

    def feature_length(self, feature: dict[str, Any]) -> int:
        return max(len(row["input_ids"]) for row in feature["group"]) if "group" in feature else \
            len(feature["input_ids"])

    def encode(self, examples: list[TextExample]) -> list:
        """The token ids of each (query, passage) pair, cut to the window."""
        return encode(self.tokenizer, [e.texts[0] for e in examples], [e.texts[1] for e in examples],
                      self.max_length, "query-passage pairs")

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        if "group" not in features[0]:
            batch = pad_features(features, self.tokenizer.pad_id)
            if "label" in features[0]:
                batch["labels"] = torch.tensor([[f["label"]] for f in features], dtype=torch.float32)  # (B, 1)
            return batch
        # listwise: every passage of the batch's queries, in order; each query's relevance on one row of `targets`
        batch = pad_features([row for f in features for row in f["group"]], self.tokenizer.pad_id)
        size = max(len(f["group"]) for f in features)
        targets = torch.zeros(len(features), size)  # (Q, G) zero where a query has fewer passages
        groups = torch.zeros(len(features), size, dtype=torch.bool)  # (Q, G) the rows each query holds
        for q, f in enumerate(features):
            targets[q, :len(f["group"])] = torch.tensor([row["label"] for row in f["group"]])
            groups[q, :len(f["group"])] = True
        batch["targets"], batch["groups"] = targets / targets.sum(-1, keepdim=True), groups
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, LossTerm]:
        """Pointwise, the model's own; listwise, the cross-entropy of each query's passages, per query."""
        if "targets" not in batch:
            return super().loss(model, batch)
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0].float()
        groups = batch["groups"]
        grid = logits.new_full(groups.shape, float("-inf")).masked_scatter(groups, logits)  # (Q, G)
        total = -(batch["targets"] * grid.log_softmax(-1).masked_fill(~groups, 0.0)).sum()
        return {"listwise": LossTerm(total, torch.full((), groups.shape[0], device=groups.device), "groups")}

    def info(self) -> dict[str, Any]:
        return super().info() | {"loss": "listwise" if self.listwise else "pointwise"}

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[float]:
        """Each pair's relevance score (the sigmoid of its logit)."""
        rows = self.engine(model).rows(self.encode(examples), lambda batch: forward(model, batch).logits.float())
        return rows[:, 0].sigmoid().tolist()

    def score(self, examples: list[TextExample], predictions: list[float]) -> dict[str, float | int]:
        gains = [[relevance(examples[i]) for i in sorted(rows, key=lambda i: -predictions[i])]
                 for rows in by_query(examples).values()]
        return ranking_metrics(gains) | {"queries": len(gains)}  # a count: printed whole (encoderlab.io.number_text)


def read_pairs(path: str, reading, info: dict, head) -> list[TextExample]:
    """A table (or JSONL) of query, passage and a relevance label or score."""
    return read_texts(path, split_names(reading.option("text_cols", info)), reading.option("label_col", info),
                      regression=True, header=reading.header and info.get("header", True))


SPEC = TaskSpec(
    "rerank", read_pairs,
    build=lambda head, tokenizer, train, max_length, common: RerankTask(tokenizer, max_length, **common,
                                                                       listwise=listwise(train)),
    restore=lambda model, given, info, tokenizer, max_length, common: RerankTask(tokenizer, max_length, **common),
    models=(SequenceClassifier,), model_kind="classify",
    model_options=lambda task, head: {"num_labels": 1, "multilabel": True})


# ---- the `rerank` pipeline (named by its card, encoderlab.cards) ----------------------------------------------------
class Rerank(Pipeline):
    """{"query", "passages"} items -> the passages ordered by a cross-encoder's relevance score, best first.

    Each (query, passage) pair is read together, truncated to the window."""

    task = "rerank"
    model_class, needs = SequenceClassifier, "a one-score cross-encoder (encoderlab finetune rerank)"
    result = create_model("RerankResult", ranking=(list[create_model(
        "Ranked", index=(int, Field(description="the passage's position in the request")),
        score=(float, Field(description="its relevance (the sigmoid of the cross-encoder's logit)")),
        passage=str)], Field(description="best first")))

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, **options: Any) -> None:
        super().__init__(model, tokenizer, **options)
        if model.num_outputs != 1:
            raise InputError(f"rerank needs {self.needs}; this classifier has {model.num_outputs} classes")
        self.regression = model.regression  # a score as it is (an STS cross-encoder); else a sigmoid's relevance

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        item = model("RerankItem", query=(text, Field(description="what the passages are ranked for")),
                     passages=(list[text], many("1 to {} passages")))
        return {"items": (list[item], many("queries, each with its passages")),
                "top_k": (int | None, Field(None, ge=1, description="the best K passages of each query (default: "
                                                                    "all)"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return "\n".join(f"{row['score']:.4f}  [{row['index']}] {row['passage']}" for row in result["ranking"])

    def __call__(self, inputs: Sequence[dict[str, Any]], top_k: int | None = None,
                 raw_scores: bool = False) -> list[dict[str, Any]]:
        """raw_scores: each pair's logit rather than its sigmoid (TEI's /rerank option)."""
        queries, passages = rerank_inputs(inputs)
        pairs = [(q, p) for q, ps in zip(queries, passages) for p in ps]
        items = self.engine.encode([q for q, _ in pairs], [p for _, p in pairs])
        logits = self.engine.rows(items, lambda batch: self.logits(batch).float())[:, 0] if pairs else torch.zeros(0)
        scores = (logits if self.regression or raw_scores else logits.sigmoid()).tolist()
        results, start = [], 0
        for ps in passages:
            own = scores[start:start + len(ps)]
            start += len(ps)
            order = sorted(range(len(ps)), key=lambda i: -own[i])[:top_k]
            results.append({"ranking": [{"index": i, "score": round(own[i], 6), "passage": ps[i]} for i in order]})
        return results


def rerank_inputs(inputs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The queries and each one's passages; InputError naming the item at fault."""
    queries, passages = [], []
    for i, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("query"), str) or not item["query"].strip():
            raise InputError(f"input {i}: expected {{\"query\": text, \"passages\": [text, ...]}} with a non-empty query")
        given = item.get("passages")
        if not isinstance(given, list) or not given or not all(isinstance(p, str) and p.strip() for p in given):
            raise InputError(f"input {i}: \"passages\" must be a non-empty list of non-empty texts")
        queries.append(item["query"])
        passages.append(given)
    return queries, passages
