"""Learned sparse retrieval (SPLADE): a text becomes one weight per vocabulary token, the masked-LM head's logits
through log(1 + ReLU(.)), max-pooled over the text's tokens (SPLADE v2, Formal et al. 2021, arXiv:2109.10086,
eq. 1 with max pooling; SPLADE v1, arXiv:2107.05720, summed them). Most weights are 0, so a corpus fits an inverted
index (encoderlab.retrieval.sparse) and a query scores a document by the dot product of their weights; the weights
name tokens a person can read, the text's own words and the ones the model expands it to (`embed --sparse`).

`finetune splade` trains any masked-LM checkpoint (the MLM head is the SPLADE head: nothing new is initialised) on
(query, positive[, negative]) rows: the contrastive loss of each query against every document of the batch (its
positive, the other rows' positives and every hard negative), plus the FLOPS regulariser (Paria et al. 2020,
arXiv:2004.05665, sec. 3.2) of the queries and of the documents, each with its own weight: the sum over the
vocabulary of the squared mean weight of a token over the batch, which pushes the frequent tokens towards 0 and so
the posting lists short. Its weight rises from 0 as (step / warm-up)^2 (SPLADE v1, sec. 4: "we found it beneficial
to increase lambda quadratically ... until a given step") and stays at its peak after.

The folder is an MLM checkpoint (XForMaskedLM) plus sentence-transformers' SparseEncoder layout (modules.json: the
fill-mask Transformer at the root, then 1_SpladePooling with max pooling and ReLU), so `SparseEncoder(DIR)` gives
the same vectors (tests/test_splade.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F
from pydantic import Field, create_model
from torch import nn

from encoderlab.checkpoint import read_config, stored_kind
from encoderlab.choices import DOCUMENT_FLOPS, QUERY_FLOPS, SHOWN_TERMS, split_names
from encoderlab.engine import Pipeline, encode, eval_mode, forward
from encoderlab.errors import InputError
from encoderlab.io import atomic_write_text
from encoderlab.nn.model import MaskedLMModel
from encoderlab.paths import resolve_model_path
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.spec import TaskSpec, register_task
from encoderlab.tokenizer import Tokenizer

COLUMNS = ["query", "positive", "negative"]  # the retrieval training data's header (issue 44's shared format)
WARMUP_FRACTION = 1 / 3  # of the first epoch's steps (sentence-transformers' SpladeRegularizerWeightSchedulerCallback
# warms up over 1/3 of the run; a task does not know the run's epochs, so a third of one epoch)


# ---- the SPLADE head and its losses ---------------------------------------------------------------------------
def sparse_weights(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), attention_mask (B, T) -> (B, V): max over real tokens of log(1 + ReLU(logit))."""
    weights = torch.log1p(torch.relu(logits.float()))  # (B, T, V), >= 0
    return (weights * attention_mask[:, :, None].to(weights.dtype)).amax(dim=1)  # padding scores 0: never the max


def flops(weights: torch.Tensor) -> torch.Tensor:
    """weights (B, V) -> the FLOPS regulariser: sum over the vocabulary of (mean over the batch of w_j)^2."""
    return weights.mean(dim=0).square().sum()


def flops_weight(step: float, warmup: float, peak: float) -> float:
    """The FLOPS weight at `step`: peak * (step / warmup)^2 during the warm-up, then peak."""
    return peak if warmup <= 0 or step >= warmup else peak * (step / warmup) ** 2


def contrastive_sum(queries: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """queries (B, V), documents (C, V) with query i's positive at row i: cross-entropy of each query's dot products
    against every document, summed over the queries."""
    scores = queries @ documents.T  # (B, C)
    return F.cross_entropy(scores, torch.arange(len(queries), device=queries.device), reduction="sum")


def model_weights(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, V) sparse weights of a padded batch."""
    return sparse_weights(forward(model, batch).logits, batch["attention_mask"])


def require_mlm_head(name: str) -> None:
    """InputError, naming the folder and what was expected, for a checkpoint without a masked-LM head."""
    folder = resolve_model_path(name)
    kind = stored_kind(folder, read_config(folder))
    if kind not in ("mlm", "pretraining"):
        raise InputError(f"--model {name}: splade needs a masked-LM checkpoint (config.json architectures "
                         f"XForMaskedLM, e.g. encoderlab-fill-mask): its MLM head gives the token weights; this "
                         f"one is {'a model of kind ' + kind if kind else 'of an unknown kind'}, without one")


# ---- the task -------------------------------------------------------------------------------------------------
class SpladeTask(Task):
    """Train a masked-LM model's token weights for retrieval: contrastive over dot products plus FLOPS."""

    name = "splade"
    metrics = ("mrr", "recall_at_1")
    group_by_length = False  # in-batch negatives: batches of one length would be of one kind of text

    def __init__(self, tokenizer: Tokenizer, max_length: int, batch_size: int = 32, precision: str = "fp32",
                 query_flops: float = QUERY_FLOPS, document_flops: float = DOCUMENT_FLOPS,
                 flops_warmup: int | None = None) -> None:
        """flops_warmup: steps of the quadratic warm-up (None: a third of the first epoch's)."""
        super().__init__(tokenizer, max_length, batch_size, precision)
        self.query_flops, self.document_flops, self.flops_warmup = query_flops, document_flops, flops_warmup
        self.seen = 0  # training rows through loss(): the warm-up's clock (grad-accumulation pieces add up)

    def validate(self, examples: list[TextExample]) -> None:
        for e in examples:
            if len(e.texts) not in (2, 3):
                raise InputError(f"{e.where}: expected a query, a positive and an optional negative, got "
                                 f"{len(e.texts)} texts")

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        self.validate(examples)
        if self.flops_warmup is None:
            self.flops_warmup = max(1, round(len(examples) / self.batch_size * WARMUP_FRACTION))
        out = []
        for example in examples:
            rows = encode(self.tokenizer, example.texts, None, self.max_length, "texts")
            out.append({f"{c}.{key}": getattr(row, key) for c, row in enumerate(rows)
                        for key in ("input_ids", "token_type_ids")})
        return out

    def feature_length(self, feature: dict[str, Any]) -> int:
        return len(feature["0.input_ids"])

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        """{"0": queries, "1": positives, "2": the hard negatives of the rows that have one (absent if none)}."""
        batch = {c: pad_features(features, self.tokenizer.pad_id, prefix=f"{c}.") for c in ("0", "1")}
        negatives = [f for f in features if "2.input_ids" in f]
        if negatives:
            batch["2"] = pad_features(negatives, self.tokenizer.pad_id, prefix="2.")
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """Summed over the batch's queries (the loop divides by the step's): the contrastive loss, plus each FLOPS
        term (a batch-level quantity, counted once per query so that the division leaves it whole)."""
        queries = model_weights(model, batch["0"])  # (B, V)
        documents = torch.cat([model_weights(model, batch[c]) for c in ("1", "2") if c in batch])  # (C, V)
        B = len(queries)
        if model.training:
            self.seen += B
        step = self.seen / self.batch_size
        regulariser = (flops_weight(step, self.flops_warmup or 0, self.query_flops) * flops(queries)
                       + flops_weight(step, self.flops_warmup or 0, self.document_flops) * flops(documents))
        return contrastive_sum(queries, documents) + regulariser * B

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[float]:
        """The dot product of each query with its positive."""
        queries, positives = self.pair_weights(model, examples)
        return (queries * positives).sum(-1).tolist()

    def pair_weights(self, model: nn.Module, examples: list[TextExample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, V) weights of the queries and of their positives."""
        self.validate(examples)
        engine = self.engine(model)
        rows = [engine.rows(engine.encode([e.texts[c] for e in examples]),
                            lambda batch: model_weights(model, batch)) for c in (0, 1)]
        return rows[0], rows[1]

    def evaluate(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        with eval_mode(model):
            return self.retrieval(model, examples)

    def assess(self, model: nn.Module, examples: list[TextExample]) -> tuple[list | None, dict[str, float]]:
        return None, self.retrieval(model, examples)

    def retrieval(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        """Each query ranks every positive of the file: recall@1 and mean reciprocal rank of its own."""
        queries, positives = self.pair_weights(model, examples)
        scores = queries @ positives.T  # (N, N)
        rank = (scores > scores.diagonal()[:, None]).sum(1) + 1  # (N,)
        return {"mrr": float((1.0 / rank).mean()), "recall_at_1": float((rank == 1).float().mean())}

    def score(self, examples: list[TextExample], predictions: list[float]) -> dict[str, float]:
        raise InputError("splade is scored by retrieval among the file's positives (evaluate splade)")

    def info(self) -> dict[str, Any]:
        return super().info() | {"query_flops": self.query_flops, "document_flops": self.document_flops,
                                 "flops_warmup": self.flops_warmup, "sparse": True}


def read_triplets(path: str, reading, info: dict, head) -> list[TextExample]:
    """The retrieval training TSV (query, positive[, negative]); its header names the columns."""
    columns = split_names(reading.option("text_cols", info)) or COLUMNS
    return read_texts(path, columns, None, regression=True, header=reading.header and info.get("header", True),
                      need_label=False)


# ---- sentence-transformers' SparseEncoder layout ----------------------------------------------------------------
def write_sparse_encoder(folder: str | Path, max_length: int) -> None:
    """modules.json and the module configs that make `SparseEncoder(folder)` read this MLM checkpoint as SPLADE (the
    layout sentence-transformers 6.2 saves: a fill-mask Transformer at the root, then SpladePooling)."""
    folder = Path(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
               {"idx": 1, "name": "1", "path": "1_SpladePooling",
                "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}]
    transformer = {"transformer_task": "fill-mask", "max_seq_length": max_length,
                   "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                   "module_output_name": "token_embeddings"}
    pooling = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None}
    encoder = {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
               "similarity_fn_name": "dot"}
    for name, content in (("modules.json", modules), ("sentence_bert_config.json", transformer),
                          ("1_SpladePooling/config.json", pooling), ("config_sentence_transformers.json", encoder)):
        atomic_write_text(folder / name, json.dumps(content, indent=2) + "\n")


register_task(TaskSpec(
    "splade", read_triplets,
    build=lambda head, tokenizer, train, max_length, common: SpladeTask(
        tokenizer, max_length, **common, **{k: v for k in ("query_flops", "document_flops", "flops_warmup")
                                            if (v := getattr(head, k)) is not None}),
    restore=lambda model, given, info, tokenizer, max_length, common: SpladeTask(tokenizer, max_length, **common),
    models=(MaskedLMModel,), model_kind="mlm", evaluate_kind="mlm",
    check_model=require_mlm_head, after_save=lambda folder, task: write_sparse_encoder(folder, task.max_length)))


# ---- the `splade` pipeline (registered in encoderlab.infer.pipelines.PIPELINES) -----------------------------------
class Splade(Pipeline):
    """Texts -> sparse vectors: the vocabulary ids with a non-zero weight and their weights (and tokens), heaviest
    first. top_k keeps the heaviest K."""

    task, model_kind = "splade", "mlm"
    model_class, needs = MaskedLMModel, "a masked-LM model (encoderlab finetune splade)"
    result = create_model("SpladeResult", indices=(list[int], Field(description="vocabulary ids, heaviest first")),
                          values=(list[float], Field(description="their weights")),
                          tokens=(list[str], Field(description="their tokens")))

    @classmethod
    def request(cls, text: Any, many: Any, model: Any) -> dict[str, Any]:
        return {"texts": (list[text], many()),
                "top_k": (int | None, Field(None, ge=1, description="the heaviest K terms (default: all)"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        terms = [f"{token} {value:.2f}" for token, value in zip(result["tokens"], result["values"])][:SHOWN_TERMS]
        more = len(result["values"]) - len(terms)
        return "  ".join(terms) + (f"  (+{more} more)" if more > 0 else "") if terms else "(no terms)"

    inference_free = False  # queries through the model too (the same weights as documents)

    def vectors(self, texts: Sequence[str], query: bool = False) -> scipy.sparse.csr_matrix:
        """(N, V) float32 CSR matrix of the texts' weights, in order (a batch at a time: (B, V) dense at most);
        query: the texts are queries (the same weights for a model that reads both alike)."""
        items = self.engine.encode(list(texts))
        rows: list[scipy.sparse.csr_matrix | None] = [None] * len(items)

        def collect(indices: list[int], weights: torch.Tensor) -> None:
            block = scipy.sparse.csr_matrix(weights.float().cpu().numpy())
            for n, i in enumerate(indices):
                rows[i] = block[n]

        self.engine.run(items, lambda batch: model_weights(self.model, batch), collect)
        width = self.model.config.vocab_size
        return scipy.sparse.vstack(rows, format="csr", dtype=np.float32) if rows else \
            scipy.sparse.csr_matrix((0, width), dtype=np.float32)

    def __call__(self, texts: Sequence[str], top_k: int | None = None) -> list[dict[str, Any]]:
        matrix = self.vectors(texts)
        out = []
        for n in range(matrix.shape[0]):
            row = matrix.getrow(n)
            order = np.argsort(-row.data, kind="stable")[:top_k]
            indices = row.indices[order].tolist()
            out.append({"indices": indices, "values": [round(float(v), 6) for v in row.data[order]],
                        "tokens": [self.tokenizer.id_to_token(i) or f"[{i}]" for i in indices]})
        return out
