"""Learned sparse retrieval (SPLADE): a text becomes one weight per vocabulary token, the masked-LM head's logits
through log(1 + ReLU(.)), max-pooled over the text's tokens (SPLADE v2, Formal et al. 2021, arXiv:2109.10086,
eq. 1 with max pooling; SPLADE v1, arXiv:2107.05720, summed them). Most weights are 0, so a corpus fits an inverted
index (encoderlab.retrieval.sparse) and a query scores a document by the dot product of their weights; the weights
name tokens a person can read, the text's own words and the ones the model expands it to (`embed --sparse`).

`finetune splade` trains any masked-LM checkpoint (the MLM head is the SPLADE head: nothing new is initialised, but
its bias is first lowered by one constant, which the masked LM's softmax does not see, until a token has about
--start-terms logits above 0: shift_to_sparse_start) on (query, positive[, negative]) rows: the contrastive loss of
each query against every document of the batch (its positive, the other rows' positives and every hard negative),
plus the FLOPS regulariser (Paria et al. 2020, arXiv:2004.05665, sec. 3.2) of the queries and of the documents, each
with its own weight: the sum over the vocabulary of the squared mean weight of a token over the batch, which pushes
the frequent tokens towards 0 and so the posting lists short. Its weight rises from 0 as (step / warm-up)^2 (SPLADE
v1, sec. 4: "we found it beneficial to increase lambda quadratically ... until a given step") and stays at its peak
after.

The inference-free variant (--inference-free; SPLADE-doc, Formal et al. 2021, arXiv:2109.10086 sec. 3.2, and
sentence-transformers' inference-free SparseEncoder with a SparseStaticEmbedding query module) runs only documents
through the model; a query is a lookup: each of its tokens (no special tokens) weighs what a learned table of one
weight per vocabulary token says. The table starts at the training documents' BM25 IDF (Robertson and Zaragoza
2009, "The Probabilistic Relevance Framework", eq. 3.3: log(1 + (N - df + 0.5) / (df + 0.5))) and trains with the
model; the queries take no FLOPS term (their cost is the lookup).

The folder is an MLM checkpoint (XForMaskedLM) plus sentence-transformers' SparseEncoder layout (modules.json: the
fill-mask Transformer at the root, then 1_SpladePooling with max pooling and ReLU; inference-free: a Router whose
query route is query_0_SparseStaticEmbedding/ and whose document route is the root's Transformer, module id "."),
so `SparseEncoder(DIR)` gives the same vectors (tests/test_splade.py)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse
import torch
import torch.nn.functional as F
from pydantic import Field, create_model
from safetensors.torch import load_file, save_file
from torch import nn

from encoderlab.checkpoint import read_config, stored_kind
from encoderlab.choices import (DF_STEEPNESS, DOCUMENT_FLOPS, QUERY_FLOPS, SHOWN_TERMS, START_SAMPLE, START_TERMS,
                                split_names)
from encoderlab.engine import encode, eval_mode, forward
from encoderlab.errors import InputError
from encoderlab.folder import read_task_info
from encoderlab.io import atomic_write, atomic_write_text
from encoderlab.nn.model import MaskedLMModel
from encoderlab.nn.output import LossTerm
from encoderlab.paths import resolve_model_path
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.spec import TaskSpec
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)
QUERY_MODULE = "query_0_SparseStaticEmbedding"  # the inference-free query table's folder (sentence-transformers')
COLUMNS = ["query", "positive", "negative"]  # the retrieval training data's header (issue 44's shared format)
# SpladeOptions' that the task takes as given
TASK_OPTIONS = ("query_flops", "document_flops", "flops_warmup", "df_flops", "start_terms")
GATHER_ROWS = 1 << 16  # (row, term) pairs SparseHead's backward gathers at once: 2 x 64K x E floats
WARMUP_FRACTION = 1 / 3  # of the first epoch's steps (sentence-transformers' SpladeRegularizerWeightSchedulerCallback
# warms up over 1/3 of the run; a task does not know the run's epochs, so a third of one epoch)


# ---- the SPLADE head and its losses ---------------------------------------------------------------------------
def sparse_weights(logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """logits (B, T, V), attention_mask (B, T) -> (B, V): max over real tokens of log(1 + ReLU(logit))."""
    return SparseMaxPool.apply(logits, attention_mask)


def pool_max(logits: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, T, V) float32, overwritten (the caller's own copy) -> the (B, V) max over real tokens of
    log(1 + ReLU(logit)) and the token that gave each."""
    weights = logits.relu_().log1p_()
    weights.masked_fill_(~attention_mask.bool()[:, :, None], 0.0)  # padding scores 0: never the max
    return weights.max(dim=1)


def pooled_gradient(pooled: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """(B, V) the gradient at each weight's winning logit: d log(1 + x) / dx = 1 / (1 + x) = exp(-w) for x > 0, and 0
    where no logit was above 0."""
    return torch.where(pooled > 0, grad * torch.exp(-pooled), 0.0)


class SparseMaxPool(torch.autograd.Function):
    """sparse_weights with a backward pass that keeps only each weight's winning token. Written as the operations
    it is, autograd keeps two (B, T, V) tensors of a batch until the backward pass (ReLU's output and the masked
    weights the max reads): 1 GB each for the 64 documents of a 32-row batch at 128 tokens over BERT's 30,522
    tokens. A max passes its gradient to the one token that won (pooled_gradient), so the winners' indices (B, V)
    and the weights are all it needs."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pooled, winners = pool_max(logits.to(torch.float32, copy=True), attention_mask)  # a copy: they are the caller's
        ctx.save_for_backward(pooled, winners)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        pooled, winners = ctx.saved_tensors
        local = pooled_gradient(pooled, grad)
        out = torch.zeros(ctx.shape, dtype=local.dtype, device=local.device)
        out.scatter_(1, winners[:, None, :], local[:, None, :])
        return out.to(ctx.dtype), None


def flops(weights: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """weights (B, V) -> the FLOPS regulariser: sum over the vocabulary of (mean over the batch of w_j)^2, each term
    times scale[j] where a scale (V,) is given (DF-FLOPS)."""
    terms = weights.mean(dim=0).square()
    return (terms if scale is None else terms * scale).sum()


def df_scale(documents: torch.Tensor, cutoff: float, steepness: float = DF_STEEPNESS) -> torch.Tensor:
    """documents (C, V) -> (V,) DF-FLOPS's weight per token (Porco et al. 2025, arXiv:2505.15070, sec. 2: a
    generalised logistic of the token's document frequency x, 1 / (1 + (x^(log_cutoff 2) - 1)^steepness)): 1/2 at
    x = cutoff, towards 1 for the tokens in every document and towards 0 for rare ones, so the FLOPS term presses on
    the tokens that would make long posting lists (the punctuation and stopwords every text shares) and spares the
    rare ones. x is the share of the batch's documents where the token weighs anything (the paper estimates it from
    the model's vectors every 100 steps; a batch's sample needs no state to resume). No gradient flows through it."""
    x = (documents.detach() > 0).float().mean(dim=0).clamp(min=1e-6)  # (V,)
    return 1.0 / (1.0 + (x ** (math.log(2) / math.log(cutoff)) - 1.0) ** steepness)


def flops_weight(step: float, warmup: float, peak: float) -> float:
    """The FLOPS weight at `step`: peak * (step / warmup)^2 during the warm-up, then peak."""
    return peak if warmup <= 0 or step >= warmup else peak * (step / warmup) ** 2


def contrastive_sum(queries: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """queries (B, V), documents (C, V) with query i's positive at row i: cross-entropy of each query's dot products
    against every document, summed over the queries."""
    scores = queries @ documents.T  # (B, C)
    return F.cross_entropy(scores, torch.arange(len(queries), device=queries.device), reduction="sum")


class SparseHead(torch.autograd.Function):
    """The MLM head's decoder and SparseMaxPool in one: features (B, T, E) (the head's transform of the hidden
    states), the decoder's weight (V, E) and bias (V,) -> (B, V) pooled weights. Each weight's gradient reaches one
    token's logit, so the decoder's backward pass needs only the (row, term) pairs that weigh something: a gather
    and an add of E numbers each, where autograd multiplies a (B, T, V) gradient that is almost all zeros by the
    (V, E) matrix, twice (for the features and for the weight): 2 x V x E multiply-adds a token, 23 million for
    BERT's vocabulary at E = 384, a third of a token's whole step (the encoder's forward pass of a 6-layer model
    of width 384 is about 11 million, its backward pass twice that, and the decoder's forward pass 12 million)."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        pooled, winners = pool_max(F.linear(features, weight, bias).float(), attention_mask)  # our own logits
        ctx.save_for_backward(features, weight, pooled, winners)
        ctx.bias_dtype = bias.dtype
        return pooled

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        features, weight, pooled, winners = ctx.saved_tensors
        local = pooled_gradient(pooled, grad)
        rows, terms = local.nonzero(as_tuple=True)
        tokens, scale = winners[rows, terms], local[rows, terms][:, None]  # (N,), (N, 1)
        grad_features = torch.zeros_like(features, dtype=torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        for at in range(0, len(rows), GATHER_ROWS):  # a bounded gather: the first vectors may weigh many terms
            part = slice(at, at + GATHER_ROWS)
            grad_features.index_put_((rows[part], tokens[part]), scale[part] * weight[terms[part]].float(),
                                     accumulate=True)
            grad_weight.index_add_(0, terms[part], scale[part] * features[rows[part], tokens[part]].float())
        return grad_features.to(features.dtype), grad_weight.to(weight.dtype), local.sum(0).to(ctx.bias_dtype), None


def model_weights(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, V) sparse weights of a padded batch: our masked LM's through SparseHead, another module's (a compiled
    or distributed wrapper) through its logits and SparseMaxPool."""
    if not isinstance(model, MaskedLMModel):
        return sparse_weights(forward(model, batch).logits, batch["attention_mask"])
    hidden = model.encode(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
    head = model.mlm
    features = head.norm(head.act(head.transform(hidden.last_hidden_state)))
    return SparseHead.apply(features, model.encoder.embeddings.word.weight, head.bias, batch["attention_mask"])


def static_weights(input_ids: torch.Tensor, keep: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """input_ids (B, T), keep (B, T) the real non-special tokens, table (V,) -> (B, V): table[j] where token j occurs
    (once or more), 0 elsewhere (sentence-transformers' SparseStaticEmbedding)."""
    presence = torch.zeros(len(input_ids), len(table), device=table.device)
    presence.scatter_reduce_(1, input_ids, keep.to(presence.dtype), reduce="amax")
    return presence * table


def real_tokens(batch: dict[str, torch.Tensor], tokenizer: Tokenizer) -> torch.Tensor:
    """(B, T) True at a batch's tokens that are neither padding nor what encoding added ([CLS], [SEP]): the tokens
    of the text itself, as encoding without special tokens gives them."""
    special = torch.tensor([tokenizer.cls_id, tokenizer.sep_id], device=batch["input_ids"].device)
    return batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], special)


def idf_table(texts: Sequence[str], tokenizer: Tokenizer, size: int) -> torch.Tensor:
    """(size,) BM25 IDF of each vocabulary id over the texts (as documents): log(1 + (N - df + 0.5) / (df + 0.5))."""
    df = torch.zeros(size)
    for text in texts:
        df[sorted(set(tokenizer.encode(text, max_length=None, truncation=False, add_special_tokens=False)))] += 1
    return torch.log1p((len(texts) - df + 0.5) / (df + 0.5))


def drop_query_table(module: nn.Module, state: dict, prefix: str, local: dict) -> None:
    """A state-dict hook: the model's checkpoint without its query table (saved apart)."""
    state.pop(prefix + "query_table", None)


def attach_query_table(model: nn.Module, task: SpladeTask) -> None:
    """Inference-free: give the model a trainable query table (IDF of the training documents) that the optimizer
    trains; kept out of the model's state dict, so its checkpoint stays a plain XForMaskedLM (the table is saved in
    its own folder, write_sparse_encoder)."""
    if not task.inference_free:
        return
    model.register_parameter("query_table", nn.Parameter(idf_table(task.documents, task.tokenizer,
                                                                   model.config.vocab_size)))
    model._register_state_dict_hook(drop_query_table)
    task.documents = []  # read once


def start_shift(model: nn.Module, task: SpladeTask, texts: Sequence[str], terms: int) -> float:
    """How far the MLM head's bias must fall for the median real token of `texts` to have its `terms` largest
    logits above 0 (0 when it has no more than that already): the model's K-th largest logit of each token, the
    median over the tokens. A masked LM's softmax is blind to a constant added to every logit, so nothing in its
    training sets where its logits sit against 0; log(1 + ReLU(.)) is not blind to it."""
    kth: list[torch.Tensor] = []

    def forward_kth(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = forward(model, batch).logits  # (B, T, V)
        return logits.float().topk(terms, dim=-1).values[..., -1][batch["attention_mask"].bool()]  # real tokens

    # cut to the window silently: the training's own reading of these documents warns of it
    items, _ = task.tokenizer.encode_rows(list(texts), None, max_length=task.max_length, truncation=True)
    with torch.no_grad(), eval_mode(model):
        task.engine(model).run(items, forward_kth, lambda _, values: kth.append(values))
    return max(0.0, float(torch.cat(kth).median())) if kth else 0.0


def spread(items: Sequence[str], count: int) -> list[str]:
    """`count` of the items evenly spaced from the first to near the last (all of them if no more): a sample of a
    training file that its first rows alone do not decide, and that needs no seed to be the same on every run."""
    return [items[i * len(items) // count] for i in range(count)] if len(items) > count else list(items)


def shift_to_sparse_start(model: nn.Module, task: SpladeTask) -> None:
    """Lower the MLM head's bias by start_shift over START_SAMPLE training documents spread through the file, so
    that the first vectors are sparse (the shift is in the weights saved, so a --resume restores it with them)."""
    if not task.start_terms or not task.start_sample:
        return
    task.logit_shift = start_shift(model, task, task.start_sample, task.start_terms)
    with torch.no_grad():
        model.mlm.bias -= task.logit_shift
    log.info("splade: the masked-LM head's bias lowered by %.3f, so that a token starts with about %d positive "
             "logits (--start-terms)", task.logit_shift, task.start_terms)


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
                 flops_warmup: int | None = None, df_flops: float | None = None, inference_free: bool = False,
                 start_terms: int = START_TERMS, documents: Sequence[str] = ()) -> None:
        """flops_warmup: steps of the quadratic warm-up (None: a third of the first epoch's); df_flops: DF-FLOPS's
        cutoff (df_scale), None for plain FLOPS; inference_free: queries through a table of token weights,
        initialised to the IDF of `documents` (the training file's); start_terms: before training, lower the MLM
        head's bias until a token has about that many positive logits (shift_to_sparse_start; 0: leave it)."""
        if df_flops is not None and not 0 < df_flops < 1:
            raise InputError(f"--df-flops {df_flops}: expected the share of documents (between 0 and 1, e.g. 0.1) "
                             f"at which a token's FLOPS weight is one half")
        if start_terms < 0:
            raise InputError(f"--start-terms {start_terms}: expected a number of terms a token (0 leaves the "
                             f"masked-LM head's bias as it is)")
        super().__init__(tokenizer, max_length, batch_size, precision)
        self.query_flops, self.document_flops, self.flops_warmup = query_flops, document_flops, flops_warmup
        self.df_flops = df_flops
        self.inference_free, self.documents = inference_free, list(documents)
        self.start_terms, self.logit_shift = start_terms, 0.0  # the shift made: shift_to_sparse_start
        self.start_sample = spread(self.documents, START_SAMPLE)  # its documents (kept: the inference-free table
        # takes self.documents once)
        self.table: torch.Tensor | None = None  # inference-free: the model's query table once attached

    def validate(self, examples: list[TextExample]) -> None:
        for e in examples:
            if len(e.texts) not in (2, 3):
                raise InputError(f"{e.where}: expected a query, a positive and an optional negative, got "
                                 f"{len(e.texts)} texts")

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        self.validate(examples)
        if self.flops_warmup is None:
            self.flops_warmup = max(1, round(len(examples) / self.batch_size * WARMUP_FRACTION))
        out: list[dict[str, Any]] = [{} for _ in examples]
        for c, what in enumerate(("queries", "positives", "hard negatives")):  # a column at a time: one warning each
            rows = [i for i, e in enumerate(examples) if len(e.texts) > c]
            for i, row in zip(rows, encode(self.tokenizer, [examples[i].texts[c] for i in rows], None,
                                           self.max_length, what)):
                out[i] |= {f"{c}.input_ids": row.input_ids, f"{c}.token_type_ids": row.token_type_ids}
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

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, LossTerm]:
        """Summed over the batch's queries (unit: sequences; the loop divides by the step's count): the contrastive
        loss, and the FLOPS terms (a batch-level quantity, counted once per query so that the division leaves it
        whole)."""
        queries = self.query_weights(model, batch["0"])  # (B, V)
        documents = torch.cat([model_weights(model, batch[c]) for c in ("1", "2") if c in batch])  # (C, V)
        B = len(queries)
        step = math.inf if self.step is None else self.step  # outside training: the whole objective
        scale = None if self.df_flops is None else df_scale(documents, self.df_flops)  # the queries' too: their
        # costly terms are the ones with long posting lists in the documents
        regulariser = flops_weight(step, self.flops_warmup or 0, self.document_flops) * flops(documents, scale)
        if not self.inference_free:
            regulariser = regulariser + flops_weight(step, self.flops_warmup or 0, self.query_flops) * flops(queries,
                                                                                                          scale)
        count = torch.full((), B, device=queries.device)
        return {"contrastive": LossTerm(contrastive_sum(queries, documents), count, "sequences"),
                "flops": LossTerm(regulariser * B, count, "sequences")}

    def query_weights(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, V) query weights: the model's, or (inference-free) its query table's."""
        if not self.inference_free:
            return model_weights(model, batch)
        return static_weights(batch["input_ids"], real_tokens(batch, self.tokenizer), model.query_table)

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[float]:
        """The dot product of each query with its positive."""
        queries, positives = self.pair_weights(model, examples)
        return (queries * positives).sum(-1).tolist()

    def pair_weights(self, model: nn.Module, examples: list[TextExample]) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, V) weights of the queries and of their positives."""
        self.validate(examples)
        engine = self.engine(model)
        queries = engine.rows(engine.encode([e.texts[0] for e in examples]),
                              lambda batch: self.query_weights(model, batch))
        positives = engine.rows(engine.encode([e.texts[1] for e in examples]), lambda batch: model_weights(model, batch))
        return queries, positives

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
                                 "flops_warmup": self.flops_warmup, "df_flops": self.df_flops,
                                 "inference_free": self.inference_free, "start_terms": self.start_terms,
                                 "logit_shift": round(self.logit_shift, 4)}


def read_triplets(path: str, reading, info: dict, head) -> list[TextExample]:
    """The retrieval training TSV (query, positive[, negative]); its header names the columns."""
    columns = split_names(reading.option("text_cols", info)) or COLUMNS
    return read_texts(path, columns, None, regression=True, header=reading.header and info.get("header", True),
                      need_label=False)


# ---- sentence-transformers' SparseEncoder layout ----------------------------------------------------------------
TRANSFORMER = "sentence_transformers.base.modules.transformer.Transformer"
SPLADE_POOLING = "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"
STATIC = "sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding"
ROUTER = "sentence_transformers.base.modules.router.Router"


def write_sparse_encoder(folder: str | Path, task: SpladeTask) -> None:
    """The files that make `SparseEncoder(folder)` read this MLM checkpoint as SPLADE, in the layout
    sentence-transformers 6.2 saves: a fill-mask Transformer at the root, then SpladePooling; inference-free, a
    Router sending queries to the SparseStaticEmbedding table in its own folder and documents to the root's
    Transformer (module id ".": the weights stay where encoderlab and transformers read them)."""
    folder = Path(folder)
    if task.table is not None:
        write_router(folder, task.table, task.tokenizer)
        pooling_path = "document_1_SpladePooling"
    else:
        modules = [{"idx": 0, "name": "0", "path": "", "type": TRANSFORMER},
                   {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": SPLADE_POOLING}]
        atomic_write_text(folder / "modules.json", json.dumps(modules, indent=2) + "\n")
        pooling_path = "1_SpladePooling"
    transformer = {"transformer_task": "fill-mask",
                   "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                   "module_output_name": "token_embeddings"}
    pooling = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None}
    encoder = {"model_type": "SparseEncoder", "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
               "similarity_fn_name": "dot"}
    for name, content in (("sentence_bert_config.json", transformer), (f"{pooling_path}/config.json", pooling),
                          ("config_sentence_transformers.json", encoder)):
        atomic_write_text(folder / name, json.dumps(content, indent=2) + "\n")


def write_router(folder: Path, table: torch.Tensor, tokenizer: Tokenizer) -> None:
    """The inference-free layout: modules.json naming one Router, its router_config.json, and the query table's
    folder (weights under the key "weight", its config and the tokenizer it reads queries with)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": ROUTER}]
    router = {"types": {QUERY_MODULE: STATIC, ".": TRANSFORMER, "document_1_SpladePooling": SPLADE_POOLING},
              "structure": {"query": [QUERY_MODULE], "document": [".", "document_1_SpladePooling"]},
              "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}}
    weights = {"weight": table.detach().float().cpu().contiguous()}
    atomic_write(folder / QUERY_MODULE / "model.safetensors", lambda tmp: save_file(weights, tmp))
    tokenizer.save(folder / QUERY_MODULE)
    for name, content in (("modules.json", modules), ("router_config.json", router),
                          (f"{QUERY_MODULE}/config.json", {"frozen": False})):
        atomic_write_text(folder / name, json.dumps(content, indent=2) + "\n")


def read_query_table(folder: Path) -> torch.Tensor | None:
    """An inference-free folder's query table (V,), or None for a model that reads queries itself."""
    path = folder / QUERY_MODULE / "model.safetensors"
    return load_file(path)["weight"].float() if path.is_file() else None


def prepare_model(model: nn.Module, task: SpladeTask) -> None:
    """The MLM head's bias lowered to a sparse start; inference-free: the model's query table, which the task reads
    and saves."""
    shift_to_sparse_start(model, task)
    attach_query_table(model, task)
    task.table = getattr(model, "query_table", None)


def refuse_resuming_inference_free(job: Any) -> None:
    """--resume of an --inference-free run: its training state does not hold the query table."""
    if job.head.inference_free and job.resume:
        raise InputError("--resume: the training state of an --inference-free run does not hold its query table "
                         "(saved beside each best checkpoint only): start the run again")


SPEC = TaskSpec(
    "splade", read_triplets,
    build=lambda head, tokenizer, train, max_length, common: SpladeTask(
        tokenizer, max_length, **common, **{k: v for k in TASK_OPTIONS if (v := getattr(head, k)) is not None},
        inference_free=head.inference_free, documents=[t for e in train for t in e.texts[1:]]),
    restore=lambda model, given, info, tokenizer, max_length, common: restored(model, info, tokenizer, max_length,
                                                                             common),
    models=(MaskedLMModel,), model_kind="mlm", evaluate_kind="mlm",
    check_model=require_mlm_head, check_job=refuse_resuming_inference_free, after_save=write_sparse_encoder,
    prepare=prepare_model)


def restored(model: nn.Module, info: dict, tokenizer: Tokenizer, max_length: int, common: dict) -> SpladeTask:
    """The task that scores a saved SPLADE folder (evaluate splade); an inference-free one is scored by its index."""
    if info.get("inference_free"):
        raise InputError("evaluate splade reads queries through the model; an inference-free folder's queries are "
                         "a table lookup: index a corpus with it and run `encoderlab evaluate retrieval --index DIR`")
    return SpladeTask(tokenizer, max_length, **common)


# ---- the `splade` pipeline (its card: encoderlab.cards) ------------------------------------------------------------------
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
        listed = "  ".join(terms) + (f"  (+{more} more)" if more > 0 else "")
        return f"{len(result['values'])} terms: {listed}" if terms else "0 terms"

    query_table: torch.Tensor | None = None  # inference-free: queries are a lookup of this (V,) table
    _decoder: tuple[np.ndarray, torch.Tensor, torch.Tensor] | None = None  # weigher's: a vocabulary, its rows

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, stride: int | None = None, **options: Any) -> None:
        """stride: read a text longer than the window whole, in windows sharing `stride` tokens, its weights the
        max over the windows' (max pooling over every window's tokens, each read in a window the model was trained
        on); None follows the folder's settings, else truncates."""
        super().__init__(model, tokenizer, **options)
        self._windowing(stride, None)

    @classmethod
    def from_pretrained(cls, name: str | Path, **options: Any) -> Splade:
        """The model, its tokenizer and settings, and an inference-free folder's query table; InputError for a folder
        that `finetune splade` did not make (a plain masked LM's weights are not trained to be sparse)."""
        folder = resolve_model_path(name)
        if read_task_info(folder).get("task") != "splade":
            raise InputError(f"splade needs {cls.needs}; {name} has no task.json saying \"task\": \"splade\"")
        pipe = super().from_pretrained(name, **options)
        pipe.query_table = read_query_table(folder)
        return pipe

    @property
    def inference_free(self) -> bool:
        """Queries are a table lookup; documents go through the model."""
        return self.query_table is not None

    def vectors(self, texts: Sequence[str], query: bool = False,
                vocabulary: np.ndarray | None = None) -> scipy.sparse.csr_matrix:
        """(N, V) float32 CSR matrix of the texts' weights, in order (a batch at a time: (B, V) dense at most);
        query: the texts are queries (a lookup of the query table where the model has one); vocabulary: sorted
        vocabulary ids, the only ones weighed (the others come out 0): an index's terms, since a query's term that no
        document holds scores nothing there. The decoder then computes those ids' logits alone (restricted)."""
        if query and self.query_table is not None:
            return self.lookup(texts)
        items, owners = (self.engine.encode(list(texts)), None) if self.stride is None else \
            self.engine.windows(list(texts), self.stride)
        rows: list[scipy.sparse.csr_matrix | None] = [None] * len(items)
        width = self.model.config.vocab_size
        weigh, columns = self.weigher(vocabulary)

        def collect(indices: list[int], weights: torch.Tensor) -> None:
            block = scipy.sparse.csr_matrix(weights.float().cpu().numpy())
            if columns is not None:  # the restricted decoder's columns back to vocabulary ids
                block = scipy.sparse.csr_matrix((block.data, columns[block.indices], block.indptr),
                                                shape=(block.shape[0], width))
            for n, i in enumerate(indices):
                rows[i] = block[n]

        self.engine.run(items, weigh, collect)
        matrix = scipy.sparse.vstack(rows, format="csr", dtype=np.float32) if rows else \
            scipy.sparse.csr_matrix((0, width), dtype=np.float32)
        return matrix if owners is None else max_by_owner(matrix, owners, len(texts))

    def weigher(self, vocabulary: np.ndarray | None) -> tuple[Any, np.ndarray | None]:
        """(batch -> (B, C) weights, the vocabulary id of each of the C columns or None for all V): the decoder on
        `vocabulary`'s rows alone where the model is ours (its MLM head's rows gathered once per vocabulary)."""
        if vocabulary is None or not isinstance(self.model, MaskedLMModel):
            return (lambda batch: model_weights(self.model, batch)), None
        if self._decoder is None or self._decoder[0] is not vocabulary:
            rows = torch.as_tensor(vocabulary, dtype=torch.long, device=self.model.mlm.bias.device)
            self._decoder = (vocabulary, rows, self.model.encoder.embeddings.word.weight.detach()[rows])
        _, rows, embeddings = self._decoder

        def weigh(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            hidden = self.model.encode(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"))
            return sparse_weights(self.model.mlm(hidden.last_hidden_state, embeddings, rows), batch["attention_mask"])
        return weigh, vocabulary

    def lookup(self, texts: Sequence[str]) -> scipy.sparse.csr_matrix:
        """(N, V) inference-free query weights: each text's tokens (whole: a query is short; without [CLS] and [SEP],
        as sentence-transformers' SparseStaticEmbedding reads it) weighed by the query table."""
        table = self.query_table.numpy()
        rows = []
        for text in texts:
            ids = self.tokenizer.encode(text, max_length=None, truncation=False, add_special_tokens=False)
            present = np.array(sorted(set(ids)), dtype=np.int64)
            rows.append(scipy.sparse.csr_matrix((table[present], (np.zeros(len(present), dtype=np.int64), present)),
                                                shape=(1, len(table))))
        return scipy.sparse.vstack(rows, format="csr", dtype=np.float32)

    def __call__(self, texts: Sequence[str], top_k: int | None = None, query: bool = False) -> list[dict[str, Any]]:
        """query: the texts are queries (an inference-free model looks them up in its table)."""
        matrix = self.vectors(texts, query)
        out = []
        for n in range(matrix.shape[0]):
            row = matrix.getrow(n)
            order = np.argsort(-row.data, kind="stable")[:top_k]
            indices = row.indices[order].tolist()
            out.append({"indices": indices, "values": [round(float(v), 6) for v in row.data[order]],
                        "tokens": [self.tokenizer.id_to_token(i) or f"[{i}]" for i in indices]})
        return out


def max_by_owner(rows: scipy.sparse.csr_matrix, owners: Sequence[int], count: int) -> scipy.sparse.csr_matrix:
    """(count, V): each owner's elementwise max over its rows (W, V), the windows of one text (weights are >= 0, so
    a term absent from a window weighs 0 there)."""
    coo = rows.tocoo()
    width = rows.shape[1]
    keys = np.asarray(owners, dtype=np.int64)[coo.row] * width + coo.col
    order = np.argsort(keys, kind="stable")
    keys, data = keys[order], coo.data[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
    values = np.maximum.reduceat(data, starts)
    kept = keys[starts]
    return scipy.sparse.csr_matrix((values, (kept // width, kept % width)), shape=(count, width), dtype=np.float32)
