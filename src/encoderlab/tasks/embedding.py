"""Sentence embeddings: a bi-encoder trained on pairs, scored by cosine similarity. Losses (sentence-transformers'):
- mnrl: MultipleNegativesRanking (Henderson et al. 2017, arXiv:1705.00652): each anchor of (anchor, positive[,
  negative]) rows must pick its positive among every text of the batch; cross-entropy over cosines times `scale`.
- cosent: for pairs with a gold score (Su 2022, "CoSENT"): log(1 + sum over score_i > score_j of exp(scale *
  (cos_j - cos_i))); only the order of the scores matters.
- cosine: mean squared error between the cosine and the score divided by the training data's largest score.
Matryoshka (Kusupati et al. 2022, "Matryoshka Representation Learning", arXiv:2205.13147; sentence-transformers'
MatryoshkaLoss): with --matryoshka 384,256,128,64 the chosen loss is summed, with equal weights, over the vectors cut
to their first d dimensions for each d, so that a prefix of a vector is a usable vector of its own.
Evaluation: with gold scores, Pearson and Spearman of the cosines (the STS benchmark protocol); without, retrieval
of each pair's second text among all second texts (recall@1 and MRR).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, create_model
from torch import nn

from encoderlab.checkpoint import load_model, read_config, stored_kind

from encoderlab.choices import split_names
from encoderlab.config import EncoderConfig
from encoderlab.errors import ConfigError, InputError
from encoderlab.engine import check_texts, encode, eval_mode, forward, sentence_vectors
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import correlation_metrics
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.nn.model import MODEL_CLASSES, SentenceEmbedder
from encoderlab.nn.output import LossTerm
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.spec import TaskSpec
from encoderlab.tokenizer import Tokenizer

LOSSES = ("mnrl", "cosent", "cosine")


def mnrl_loss(anchors: torch.Tensor, candidates: torch.Tensor, scale: float) -> torch.Tensor:
    """anchors (B, H), candidates (C, H) with C >= B, row i's positive at i: in-batch negatives cross-entropy."""
    scores = F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T * scale  # (B, C)
    return F.cross_entropy(scores, torch.arange(len(anchors), device=anchors.device))


def cosent_loss(cosines: torch.Tensor, scores: torch.Tensor, scale: float) -> torch.Tensor:
    """cosines (B,), gold scores (B,): penalise every pair ordered against the gold order."""
    diff = scale * (cosines[None, :] - cosines[:, None])  # (B, B): entry (i, j) = scale * (cos_j - cos_i)
    diff = diff.masked_fill(scores[:, None] <= scores[None, :], float("-inf"))  # keep only score_i > score_j
    return torch.logsumexp(torch.cat([diff.new_zeros(1), diff.flatten()]), dim=0)


def matryoshka_dims(dims: Sequence[int] | None, hidden_size: int | None = None) -> tuple[int, ...] | None:
    """The prefix widths of --matryoshka, checked: positive, each once, none above `hidden_size` (where known)."""
    if not dims:
        return None
    dims = tuple(int(d) for d in dims)
    if any(d < 1 for d in dims) or len(set(dims)) < len(dims):
        raise ConfigError(f"--matryoshka {','.join(map(str, dims))}: expected distinct positive dimensions")
    if hidden_size is not None and max(dims) > hidden_size:
        raise ConfigError(f"--matryoshka {max(dims)}: above the model's hidden size {hidden_size}; expected "
                          f"dimensions from 1 to {hidden_size}")
    return dims


def embedding_loss(name: str, vectors: list[torch.Tensor], labels: torch.Tensor, scale: float,
                   score_max: float | None, dims: Sequence[int] | None = None) -> torch.Tensor:
    """The batch's loss times its pairs (the loop divides by the step's pairs): vectors (B, H) per text column, labels
    (B,) gold scores. mnrl and cosent compare the batch's pairs with each other: their unit is the batch. dims
    (Matryoshka): the sum of the loss over the vectors' first d dimensions, for each d (cosines re-normalise them)."""
    vectors = [v.float() for v in vectors]
    if dims:
        matryoshka_dims(dims, vectors[0].shape[-1])
        return sum(embedding_loss(name, [v[:, :d] for v in vectors], labels, scale, score_max) for d in dims)
    if name == "mnrl":
        return mnrl_loss(vectors[0], torch.cat(vectors[1:]), scale) * len(labels)
    cosines = F.cosine_similarity(vectors[0], vectors[1], dim=-1)
    if name == "cosent":
        return cosent_loss(cosines, labels, scale) * len(labels)
    return F.mse_loss(cosines, labels / score_max, reduction="sum")


class EmbedTask(Task):
    """Fine-tune a sentence embedder on pairs (optionally scored) or triplets."""

    name = "embed"
    metrics = ("spearman", "pearson")  # with scored eval pairs
    other_metrics = ("recall_at_1", "mrr")  # without
    # Both losses compare the pairs of a batch with each other: batches of one length would be of one genre
    # (STS-B's captions are short, its news long), and the model would never learn to rank across them.
    group_by_length = False

    def assess(self, model: nn.Module, examples: list[TextExample]) -> tuple[list | None, dict[str, float]]:
        """Scored pairs: correlation of cosines with the scores; unscored pairs: retrieval among them."""
        if all(isinstance(e.label, float) for e in examples):
            return super().assess(model, examples)
        return None, self.retrieval(model, examples)

    def __init__(self, tokenizer: Tokenizer, max_length: int, loss: str = "cosent", scale: float = 20.0,
                 score_max: float | None = None, batch_size: int = 32, precision: str = "fp32",
                 matryoshka: Sequence[int] | None = None) -> None:
        """matryoshka: the widths whose prefixes of the vectors are trained too (checked against the model's width
        at the first step, when the model is known)."""
        super().__init__(tokenizer, max_length, batch_size, precision)
        if loss not in LOSSES:
            raise ConfigError(f"--loss {loss!r}: expected one of {', '.join(LOSSES)}")
        self.loss_name, self.scale, self.score_max = loss, scale, score_max
        self.matryoshka = matryoshka_dims(matryoshka)

    def check(self, examples: list[TextExample], training: bool) -> None:
        """Pairs (or, for mnrl training, triplets); scores where the loss needs them."""
        for e in examples:
            widths = (2, 3) if training and self.loss_name == "mnrl" else (2,)
            if len(e.texts) not in widths:
                raise InputError(f"{e.where}: expected {' or '.join(map(str, widths))} texts, got {len(e.texts)}")
            if training and self.loss_name != "mnrl" and not isinstance(e.label, float):
                raise InputError(f"{e.where}: the {self.loss_name} loss needs a numeric score on every pair")

    def validate(self, examples: list[TextExample]) -> None:
        self.check(examples, training=False)

    def check_config(self, config: EncoderConfig) -> None:
        matryoshka_dims(self.matryoshka, config.hidden_size)  # --matryoshka 512 on a 384-wide model

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        self.check(examples, training=True)
        if self.loss_name == "cosine" and self.score_max is None:
            self.score_max = max(abs(float(e.label)) for e in examples) or 1.0
        columns = [encode(self.tokenizer, [e.texts[c] for e in examples], None, self.max_length, "texts")
                   for c in range(len(examples[0].texts))]
        out = []
        for row, example in enumerate(examples):
            feature: dict[str, Any] = {"label": example.label if isinstance(example.label, float) else 0.0}
            for c, column in enumerate(columns):
                feature[f"{c}.input_ids"] = column[row].input_ids
                feature[f"{c}.token_type_ids"] = column[row].token_type_ids
            out.append(feature)
        return out

    def feature_length(self, feature: dict[str, Any]) -> int:
        return len(feature["0.input_ids"])

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        columns = sorted({key.split(".")[0] for key in features[0] if key.endswith(".input_ids")})
        batch: dict[str, Any] = {c: pad_features(features, self.tokenizer.pad_id, prefix=f"{c}.") for c in columns}
        batch["labels"] = torch.tensor([f["label"] for f in features], dtype=torch.float32)
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, LossTerm]:
        """The batch's loss times its rows, per row (sequences): see embedding_loss."""
        vectors = [model(b["input_ids"], b["attention_mask"], b["token_type_ids"]).embedding
                   for key, b in sorted(batch.items()) if key != "labels"]  # (B, H) per text column
        labels = batch["labels"]
        total = embedding_loss(self.loss_name, vectors, labels, self.scale, self.score_max, self.matryoshka)
        return {self.loss_name: LossTerm(total, torch.full((), labels.shape[0], device=labels.device), "sequences")}

    def vectors(self, model: nn.Module, texts: list[str]) -> torch.Tensor:
        """(N, H) unit vectors, in order."""
        engine = self.engine(model)
        return engine.rows(engine.encode(texts), lambda batch: sentence_vectors(
            forward(model, batch), batch["attention_mask"], model.pooling, normalize=True))

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[float]:
        """The cosine similarity of each pair."""
        self.check(examples, training=False)
        first = self.vectors(model, [e.texts[0] for e in examples])
        second = self.vectors(model, [e.texts[1] for e in examples])
        return (first * second).sum(-1).tolist()

    def evaluate(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        if all(isinstance(e.label, float) for e in examples):
            return super().evaluate(model, examples)
        with eval_mode(model):
            return self.retrieval(model, examples)

    def retrieval(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        """Each first text ranks all second texts: recall@1 and mean reciprocal rank of its own."""
        self.check(examples, training=False)
        first = self.vectors(model, [e.texts[0] for e in examples])
        second = self.vectors(model, [e.texts[1] for e in examples])
        scores = first @ second.T  # (N, N)
        rank = (scores > scores.diagonal()[:, None]).sum(1) + 1  # (N,) rank of the true partner
        return {"recall_at_1": float((rank == 1).float().mean()), "mrr": float((1.0 / rank).mean())}

    def score(self, examples: list[TextExample], predictions: list[float]) -> dict[str, float]:
        missing = [e.where for e in examples if not isinstance(e.label, float)]
        if missing:
            raise InputError(f"{missing[0]}: no numeric score to compare the cosine with")
        return correlation_metrics([e.label for e in examples], predictions)

    def info(self) -> dict[str, Any]:
        return super().info() | {"loss": self.loss_name, "scale": self.scale, "score_max": self.score_max} | (
            {"matryoshka": list(self.matryoshka)} if self.matryoshka else {})


def default_loss(train: list[TextExample]) -> str:
    """cosent when every training pair has a score, else mnrl (in-batch negatives)."""
    return "cosent" if all(isinstance(e.label, float) for e in train) else "mnrl"


SPEC = TaskSpec(
    "embed", lambda path, reading, info, head: read_texts(
        path, split_names(reading.option("text_cols", info)), reading.option("label_col", info), regression=True,
        header=reading.header and info.get("header", True), need_label=False),
    build=lambda head, tokenizer, train, max_length, common: EmbedTask(
        tokenizer, max_length, head.loss or default_loss(train), head.scale, matryoshka=head.matryoshka, **common),
    restore=lambda model, given, info, tokenizer, max_length, common: EmbedTask(
        tokenizer, max_length, info.get("loss") or "cosent", **common),
    models=(SentenceEmbedder,), model_kind="embed", evaluate_kind="embed",
    model_options=lambda task, head: {"pooling": head.pooling}, info=lambda task, head: {"pooling": head.pooling})


# ---- the `embed` pipeline ----------------------------------------------------------------------------------------
class Embed(Pipeline):
    """Texts -> sentence vectors: pooled as the folder says, L2-normalised when it says so (or as asked)."""

    task = "embed"
    model_class, needs = SentenceEmbedder, "a sentence embedder (load_model(folder, kind='embed'))"
    result = create_model("EmbedResult", embedding=(list[float], Field(
        description="the sentence vector (L2-normalized when the model says so)")))

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        return {"texts": (list[text], many()), "dimensions": (int | None, Field(None, ge=1, description=(
            "keep each vector's first N dimensions, normalised again where the model normalises (a model trained "
            "with finetune embed --matryoshka); default: all")))}

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, pooling: str | None = None,
                 normalize: bool | None = None, stride: int | None = None, dimensions: int | None = None,
                 **options: Any) -> None:
        """pooling, normalize, stride: None follows the folder's settings; with a stride, a long text's vector is the
        mean of its windows' (pooled) vectors, then normalised. dimensions: keep each vector's first N values (a
        Matryoshka model's prefix, `finetune embed --matryoshka`), then normalise; None keeps them all."""
        if pooling and isinstance(model, SentenceEmbedder):
            model.pooling = pooling  # before the model is converted or copied: the embedder pools as asked
        if isinstance(model, SentenceEmbedder) and model.pooler is not None:
            # Vectors pool token states: the [CLS] pooler (dense + tanh) goes unused; without it, and with encode no
            # longer padding then unpadding, our time around OpenVINO's passes on 320 SST-2 sentences fell from 36-47
            # ms to 20-31 ms (Ice Lake, 2026-11-25). A copy runs without it; the caller's model keeps its pooler.
            model = copy.copy(model)
            model._modules = dict(model._modules)
            model.pooler = None
        super().__init__(model, tokenizer, **options)
        self.pooling = self.model.pooling
        self.normalize = self.settings.normalize if normalize is None else normalize
        self._windowing(stride, None)
        self.hidden_size = model.config.hidden_size
        self.dimensions = self._width(dimensions)

    @classmethod
    def load(cls, folder: Path) -> nn.Module:
        """The encoder of a bare, sentence-embedding or pretraining checkpoint (its MLM/NSP heads left out)."""
        stored = stored_kind(folder, read_config(folder))
        if stored in ("classify", "ner", "qa"):
            raise InputError(f"embed needs a sentence-embedding or plain encoder checkpoint, "
                             f"not a {MODEL_CLASSES[stored].__name__}")
        return load_model(folder, kind="embed")

    def embed(self, texts: Sequence[str], dimensions: int | None = None, normalize: bool | None = None) -> np.ndarray:
        """(N, D) float32 vectors in input order: D = dimensions, else the pipeline's, else the hidden size;
        normalize: L2-normalised or not (None: as the pipeline does; TEI's /embed asks for either)."""
        width = self._width(dimensions) if dimensions is not None else self.dimensions
        texts = check_texts(texts)
        if self.stride is None:
            vectors = self.engine.rows(self.engine.encode(texts), self._vectors)
        else:
            vectors = self._window_rows(texts, self._vectors)
        vectors = vectors[:, :width]  # normalised after the cut: a prefix's own unit vector, as it was trained
        normalize = self.normalize if normalize is None else normalize
        return (F.normalize(vectors, dim=-1) if normalize else vectors).numpy()

    def _vectors(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return sentence_vectors(self._forward(self.model, batch), batch["attention_mask"], self.pooling, False)

    def _width(self, dimensions: int | None) -> int:
        """The vector width asked for (None: the hidden size); InputError outside 1 to the hidden size."""
        if dimensions is None:
            return self.hidden_size
        if not isinstance(dimensions, int) or not 1 <= dimensions <= self.hidden_size:
            raise InputError(f"dimensions {dimensions!r}: expected a whole number from 1 to {self.hidden_size}, "
                             f"the model's vector size")
        return dimensions

    def __call__(self, texts: Sequence[str], dimensions: int | None = None,
                 normalize: bool | None = None) -> list[dict[str, Any]]:
        return [{"embedding": vector.tolist()} for vector in self.embed(texts, dimensions, normalize)]

    def info(self) -> dict[str, Any]:
        return super().info() | {"pooling": self.pooling, "normalize": self.normalize, "stride": self.stride,
                                 "dimensions": self.dimensions}
