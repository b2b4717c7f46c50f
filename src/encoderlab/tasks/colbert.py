"""Late interaction (ColBERT; Khattab and Zaharia 2020, "ColBERT: Efficient and Effective Passage Search via
Contextualized Late Interaction over BERT", arXiv:2004.12832; ColBERTv2, Santhanam et al. 2021, arXiv:2112.01488):
a vector per token, and a query's score for a document is MaxSim, the sum over the query's tokens of the best cosine
with any of the document's tokens (section 3.3 of the paper).

How it departs from the bi-encoder (tasks/embedding.py), each as in the paper (section 3.2):
- a linear projection, without bias, of every token's hidden state to `dim` (128) dimensions, then L2-normalised;
- a marker token after [CLS]: [unused0] for queries, [unused1] for documents (the ids Stanford's ColBERT uses);
- query expansion: every query is cut or padded to QUERY_LENGTH (32) tokens, the padding replaced by [MASK]; here
  the encoder attends to the [MASK]s (PyLate's attend_to_expansion_tokens, sentence-transformers'
  query_expansion={"attend": True}), so every query batch is a full (B, 32) block with no padding;
- a punctuation skiplist: document tokens that are punctuation (string.punctuation) are left out of MaxSim.
Training: the cross-entropy of each query's MaxSim scores over the batch's positives and hard negatives (the
paper's pairwise softmax, with in-batch negatives as in ColBERTv2 and PyLate's Contrastive loss); with a teacher
(`--teacher`, a `finetune rerank` folder), plus the KL divergence from the cross-encoder's softmax over each query's
positive and hard negative to the student's (ColBERTv2 section 3.2; PyLate's Distillation loss).

The folder is a Hugging Face encoder plus sentence-transformers' MultiVectorEncoder modules (1_Dense,
2_MultiVectorMask, 3_Normalize; the markers as its query/document prompts), so `MultiVectorEncoder(DIR)` loads it and
gives the token vectors this module gives (tests/test_colbert.py)."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer
from pydantic import Field, create_model
from torch import nn

from encoderlab.checkpoint import load_model, save_pretrained
from encoderlab.choices import split_names
from encoderlab.engine import Engine, check_texts, encode, eval_mode, pad_batch, split_windows
from encoderlab.cards import ColbertOptions
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.folder import read_task_info
from encoderlab.io import atomic_write, atomic_write_text
from encoderlab.nn.model import EncoderModel
from encoderlab.nn.output import LossTerm, ModelOutput
from encoderlab.paths import resolve_model_path
from encoderlab.tasks.base import Task, model_device
from encoderlab.tasks.readers import TextExample, read_texts
from encoderlab.tasks.rerank import Rerank
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.spec import TaskSpec
from encoderlab.tokenizer import Encoded, Tokenizer

QUERY_LENGTH = 32  # the paper's N_q: queries are padded with [MASK] (or cut) to this many tokens
MARKERS = {"query": "[unused0]", "document": "[unused1]"}  # Stanford ColBERT's [Q] and [D]: unused vocabulary ids
SKIPLIST = tuple(string.punctuation)  # document tokens left out of MaxSim (the paper's section 3.2; PyLate's default)
COLUMNS = "query,positive,negative"  # the retrieval training file's header (issue 44's shared format)
DENSE, MASK, NORMALIZE = "1_Dense", "2_MultiVectorMask", "3_Normalize"


# ---- tokens -----------------------------------------------------------------------------------------------------
def marker_id(tokenizer: Tokenizer, side: str) -> int:
    """The id of the query or document marker; ConfigError for a vocabulary without it."""
    token = MARKERS[side]
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ConfigError(f"the tokenizer has no {token} token for the ColBERT {side} marker (expected a BERT-style "
                          f"WordPiece vocabulary with [unused0] and [unused1], as minilm's)")
    return found


def marked(tokenizer: Tokenizer, texts: Sequence[str], side: str, max_length: int) -> list[list[int]]:
    """[CLS] marker tokens... [SEP] per text, at most max_length ids (the marker costs one token of the window)."""
    mark = marker_id(tokenizer, side)
    return [item.input_ids[:1] + [mark] + item.input_ids[1:]
            for item in encode(tokenizer, list(texts), None, max_length - 1, f"{side} texts")]


def marked_windows(tokenizer: Tokenizer, texts: Sequence[str], max_length: int,
                   stride: int) -> tuple[list[list[int]], list[int]]:
    """Each document whole, as marked windows of at most max_length ids sharing `stride` text tokens
    (encoderlab.engine.split_windows), and each window's document."""
    mark = marker_id(tokenizer, "document")
    pieces = [(i, window.input_ids) for i, item in enumerate(encode(tokenizer, list(texts), None, None))
              for _, window in split_windows(item, max_length - 1, stride)]
    return [ids[:1] + [mark] + ids[1:] for _, ids in pieces], [i for i, _ in pieces]


def query_ids(tokenizer: Tokenizer, texts: Sequence[str], length: int = QUERY_LENGTH) -> list[list[int]]:
    """Each query as exactly `length` ids: marked, cut, and padded with [MASK] (query expansion)."""
    return [ids + [tokenizer.mask_id] * (length - len(ids)) for ids in marked(tokenizer, texts, "query", length)]


def skip_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids of the skiplist's punctuation that the vocabulary holds as single tokens."""
    return sorted({i for mark in SKIPLIST if (i := tokenizer.token_to_id(mark)) is not None})


def scoring_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, skip: Sequence[int]) -> torch.Tensor:
    """(B, T) bool: the tokens MaxSim counts: real ones, less the skiplist (documents only: a query passes none)."""
    keep = attention_mask.bool()
    if skip:
        keep &= ~torch.isin(input_ids, torch.tensor(list(skip), device=input_ids.device))
    return keep


def maxsim(queries: torch.Tensor, query_mask: torch.Tensor, documents: torch.Tensor,
           document_mask: torch.Tensor) -> torch.Tensor:
    """queries (Q, S, D), documents (N, T, D), their masks (Q, S), (N, T) -> scores (Q, N): for each query token the
    best dot product over the document's counted tokens, summed over the query's counted tokens (paper eq. 3)."""
    sims = torch.einsum("qsd,ntd->qnst", queries, documents)  # (Q, N, S, T)
    best = sims.masked_fill(~document_mask[None, :, None, :], float("-inf")).amax(-1)  # (Q, N, S)
    return best.masked_fill(~query_mask[:, None, :], 0.0).sum(-1)


# ---- the model --------------------------------------------------------------------------------------------------
class ColbertModel(nn.Module):
    """An encoder and a bias-free projection: token ids (B, T) -> unit token vectors (B, T, dim)."""

    kind = "colbert"

    def __init__(self, backbone: EncoderModel, dim: int) -> None:
        super().__init__()
        if dim < 1:
            raise ConfigError(f"--dim {dim}: expected a positive number of dimensions")
        self.backbone = backbone
        self.projection = nn.Linear(backbone.config.hidden_size, dim, bias=False)

    config = property(lambda self: self.backbone.config, doc="The encoder's config")
    dim = property(lambda self: self.projection.out_features, doc="Dimensions of a token vector")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ModelOutput:
        hidden = self.backbone.encode(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        return ModelOutput(last_hidden_state=F.normalize(self.projection(hidden).float(), dim=-1))  # (B, T, dim)

    def save_folder(self, folder: str | Path, tokenizer: Tokenizer | None = None, info: dict | None = None) -> None:
        """The encoder's Hugging Face files, then sentence-transformers' MultiVectorEncoder modules around it."""
        folder = Path(folder)
        save_pretrained(self.backbone, folder, tokenizer, (info or {}) | {"dim": self.dim})
        weight = {"linear.weight": self.projection.weight.detach().cpu().contiguous()}
        atomic_write(folder / DENSE / "model.safetensors", lambda tmp: save_file(weight, tmp, metadata={"format": "pt"}))
        write_multivector_files(folder, self.config.hidden_size, self.dim, (info or {}).get("max_length", 180))
        if tokenizer is not None:
            register_markers(folder / "tokenizer.json")


def write_multivector_files(folder: Path, hidden_size: int, dim: int, document_length: int) -> None:
    """modules.json and the module configs sentence-transformers 6.2's MultiVectorEncoder reads (the layout its own
    save writes: Transformer, Dense, MultiVectorMask, Normalize; prompts in config_sentence_transformers.json)."""
    kinds = {"": "base.modules.transformer.Transformer", DENSE: "base.modules.dense.Dense",
             MASK: "multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
             NORMALIZE: "base.modules.normalize.Normalize"}
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.{kind}"}
               for i, (path, kind) in enumerate(kinds.items())]
    io = {"module_input_name": "token_embeddings", "module_output_name": "token_embeddings"}
    files = {
        "modules.json": modules,
        "config_sentence_transformers.json": {"model_type": "MultiVectorEncoder", "default_prompt_name": None,
                                              "similarity_fn_name": "maxsim",
                                              "prompts": {side: f"{m} " for side, m in MARKERS.items()}},
        "sentence_bert_config.json": {
            "transformer_task": "feature-extraction", "module_output_name": "token_embeddings",
            "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
            "query_length": QUERY_LENGTH, "document_length": document_length,
            "query_expansion": {"strategy": "fixed", "attend": True, "token": None, "length": QUERY_LENGTH}},
        f"{DENSE}/config.json": {"in_features": hidden_size, "out_features": dim, "bias": False,
                                 "activation_function": "torch.nn.modules.linear.Identity"} | io,
        f"{MASK}/config.json": {"skiplist_words": list(SKIPLIST), "skiplist_tasks": ["document"],
                                "keep_only_token_ids": None},
        f"{NORMALIZE}/config.json": io}
    for name, content in files.items():
        atomic_write_text(folder / name, json.dumps(content, indent=2) + "\n")


def register_markers(path: Path) -> None:
    """Mark [unused0] and [unused1] as special tokens in tokenizer.json, so that the text prompt "[unused0] " that
    sentence-transformers prepends is read as the one marker id (as our own code inserts it), not as [ unused ##0 ]."""
    backend = RustTokenizer.from_file(str(path))
    backend.add_special_tokens([AddedToken(m, normalized=False, special=True) for m in MARKERS.values()])
    atomic_write_text(path, backend.to_str(pretty=True))


def load_colbert(name: str | Path, head: ColbertOptions | None = None) -> ColbertModel:
    """A ColBERT folder (its stored projection), or any encoder checkpoint with a new projection to head.dim."""
    folder = resolve_model_path(name)
    dense = folder / DENSE / "model.safetensors"
    if not dense.is_file():
        return ColbertModel(load_model(folder, kind="base"), (head or ColbertOptions()).dim)
    weight = load_file(dense).get("linear.weight")
    if weight is None:
        raise CheckpointError(f"{dense}: expected the tensor linear.weight (the token projection)")
    model = ColbertModel(load_model(folder, kind="base"), weight.shape[0])
    model.projection.weight.data.copy_(weight)
    return model.eval()


# ---- token vectors for texts ----------------------------------------------------------------------------------
class TokenEncoder:
    """A ColBERT model run over texts: per-text token vectors, as queries or as documents."""

    def __init__(self, model: ColbertModel, tokenizer: Tokenizer, max_length: int, batch_size: int = 32,
                 precision: str = "fp32") -> None:
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.engine = Engine(tokenizer, max_length, batch_size, model_device(model), precision)
        self.skip = skip_ids(tokenizer)

    def batches(self, ids: list[list[int]], side: str):
        """(indices, vectors (B, T, dim) float32 CPU, counted (B, T) bool) per length-sorted batch."""
        items = [Encoded(row, [0] * len(row), [], []) for row in ids]
        out: list = []
        skip = self.skip if side == "document" else ()

        def forward(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            vectors = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
            return vectors.last_hidden_state.float().cpu(), scoring_mask(batch["input_ids"],
                                                                          batch["attention_mask"], skip).cpu()

        with eval_mode(self.model):
            self.engine.run(items, forward, lambda indices, result: out.append((indices, *result)))
        return out

    def encode(self, texts: Sequence[str], side: str = "document", stride: int | None = None) -> list[torch.Tensor]:
        """Each text's counted token vectors (n_i, dim), in input order: a query's QUERY_LENGTH, a document's real
        tokens less the skiplist; stride: a longer document read whole, in marked windows sharing `stride` tokens,
        its vectors every window's in order (None: truncated)."""
        if side not in MARKERS:
            raise InputError(f"side {side!r}: expected query or document")
        if side == "query":
            ids, owners = query_ids(self.tokenizer, texts), list(range(len(texts)))
        elif stride is None:
            ids, owners = marked(self.tokenizer, texts, "document", self.max_length), list(range(len(texts)))
        else:
            ids, owners = marked_windows(self.tokenizer, texts, self.max_length, stride)
        pieces: list[torch.Tensor | None] = [None] * len(ids)
        for indices, vectors, counted in self.batches(ids, side):
            for row, i in enumerate(indices):
                pieces[i] = vectors[row][counted[row]]
        out: list[list[torch.Tensor]] = [[] for _ in texts]
        for owner, piece in zip(owners, pieces):
            out[owner].append(piece)
        return [torch.cat(p) if len(p) > 1 else p[0] for p in out]


def padded(vectors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-text (n_i, D) vectors -> (N, T, D) zero-padded and their mask (N, T)."""
    longest = max(len(v) for v in vectors)
    out = torch.zeros(len(vectors), longest, vectors[0].shape[-1])
    mask = torch.zeros(len(vectors), longest, dtype=torch.bool)
    for i, v in enumerate(vectors):
        out[i, :len(v)], mask[i, :len(v)] = v, True
    return out, mask


def score_texts(encoder: TokenEncoder, queries: Sequence[str], documents: Sequence[str]) -> torch.Tensor:
    """MaxSim scores (Q, N) of every query against every document."""
    q, q_mask = padded(encoder.encode(queries, "query"))
    d, d_mask = padded(encoder.encode(documents, "document"))
    return maxsim(q, q_mask, d, d_mask)


# ---- the task ---------------------------------------------------------------------------------------------------
def hard_negative(example: TextExample) -> str | None:
    """The row's hard negative, None where its cell is absent or empty."""
    return example.texts[2] if len(example.texts) > 2 and example.texts[2].strip() else None


class ColbertTask(Task):
    """Fine-tune a ColBERT model on (query, positive[, negative]) rows."""

    name = "colbert"
    metrics = ("mrr", "recall_at_1")
    group_by_length = False  # in-batch negatives: a batch of one genre would teach nothing across genres

    def __init__(self, tokenizer: Tokenizer, max_length: int, batch_size: int = 32, precision: str = "fp32",
                 teacher: str | None = None, dim: int = 128) -> None:
        super().__init__(tokenizer, max_length, batch_size, precision)
        if dim < 1:
            raise ConfigError(f"--dim {dim}: expected a positive number of dimensions")
        marker_id(tokenizer, "query")  # a vocabulary without the markers is refused before training
        self.teacher, self.dim, self.skip = teacher, dim, skip_ids(tokenizer)

    def validate(self, examples: list[TextExample]) -> None:
        for e in examples:
            if len(e.texts) not in (2, 3) or not all(t.strip() for t in e.texts[:2]):
                raise InputError(f"{e.where}: expected a query, a positive and an optional negative, got "
                                 f"{len(e.texts)} texts")

    def features(self, examples: list[TextExample]) -> list[dict[str, Any]]:
        self.validate(examples)
        negatives = [hard_negative(e) for e in examples]
        queries = query_ids(self.tokenizer, [e.texts[0] for e in examples])
        positives = marked(self.tokenizer, [e.texts[1] for e in examples], "document", self.max_length)
        rows = [n for n in negatives if n is not None]
        negative_ids = iter(marked(self.tokenizer, rows, "document", self.max_length) if rows else [])
        teacher = iter(self.teacher_scores(examples, negatives))
        return [{"query": q, "positive": p, "negative": next(negative_ids) if n is not None else None,
                 "teacher": next(teacher) if self.teacher and n is not None else None}
                for q, p, n in zip(queries, positives, negatives)]

    def teacher_scores(self, examples: list[TextExample], negatives: list[str | None]) -> list[list[float]]:
        """The cross-encoder's logits [positive, negative] of each row with a hard negative (none without teacher)."""
        if not self.teacher:
            return []
        items = [{"query": e.texts[0], "passages": [e.texts[1], n]} for e, n in zip(examples, negatives) if n]
        ranked = Rerank.from_pretrained(self.teacher)(items, raw_scores=True) if items else []
        return [[r["score"] for r in sorted(result["ranking"], key=lambda r: r["index"])] for result in ranked]

    def feature_length(self, feature: dict[str, Any]) -> int:
        return len(feature["positive"])

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        documents = [f["positive"] for f in features] + [f["negative"] for f in features if f["negative"]]
        owners = [i for i, f in enumerate(features) if f["negative"]]  # the row of each hard negative
        batch = {"query": pad_batch([f["query"] for f in features], [[0] * len(f["query"]) for f in features],
                                    self.tokenizer.pad_id),
                 "documents": pad_batch(documents, [[0] * len(d) for d in documents], self.tokenizer.pad_id),
                 "negative_of": torch.tensor(owners, dtype=torch.long)}
        if any(f["teacher"] for f in features):
            batch["teacher"] = torch.tensor([f["teacher"] for f in features if f["teacher"]])  # (K, 2)
        return batch

    def loss(self, model: nn.Module, batch: dict[str, Any]) -> dict[str, LossTerm]:
        """Summed over the batch's queries (unit: sequences, the queries): cross-entropy over every document of the
        batch, and with a teacher the KL to its scores."""
        q, d = batch["query"], batch["documents"]
        queries = model(q["input_ids"], q["attention_mask"], q["token_type_ids"]).last_hidden_state  # (B, S, dim)
        documents = model(d["input_ids"], d["attention_mask"], d["token_type_ids"]).last_hidden_state  # (C, T, dim)
        scores = maxsim(queries, q["attention_mask"].bool(), documents,
                        scoring_mask(d["input_ids"], d["attention_mask"], self.skip))  # (B, C)
        B = len(scores)
        queries_count = torch.full((), B, device=scores.device)
        terms = {"contrastive": LossTerm(F.cross_entropy(scores, torch.arange(B, device=scores.device),
                                                         reduction="sum"), queries_count, "sequences")}
        if "teacher" in batch:
            rows = batch["negative_of"]
            student = torch.stack([scores[rows, rows], scores[rows, B + torch.arange(len(rows))]], -1)  # (K, 2)
            terms["distill"] = LossTerm(F.kl_div(student.log_softmax(-1), batch["teacher"].to(scores).softmax(-1),
                                                 reduction="sum"), queries_count, "sequences")
        return terms

    def encoder(self, model: nn.Module) -> TokenEncoder:
        """Token vectors with this task's window, batch size and precision."""
        return TokenEncoder(model, self.tokenizer, self.max_length, self.batch_size, self.precision)

    def retrieval(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        """Each query ranks every row's positive by MaxSim: recall@1 and mean reciprocal rank of its own."""
        self.validate(examples)
        scores = score_texts(self.encoder(model), [e.texts[0] for e in examples], [e.texts[1] for e in examples])
        rank = (scores > scores.diagonal()[:, None]).sum(1) + 1  # (N,) rank of the true positive
        return {"mrr": float((1.0 / rank).mean()), "recall_at_1": float((rank == 1).float().mean())}

    def evaluate(self, model: nn.Module, examples: list[TextExample]) -> dict[str, float]:
        with eval_mode(model):
            return self.retrieval(model, examples)

    def assess(self, model: nn.Module, examples: list[TextExample]) -> tuple[list | None, dict[str, float]]:
        return None, self.evaluate(model, examples)

    def predict(self, model: nn.Module, examples: list[TextExample]) -> list[float]:
        """Each row's MaxSim score of its query and positive."""
        scores = score_texts(self.encoder(model), [e.texts[0] for e in examples], [e.texts[1] for e in examples])
        return scores.diagonal().tolist()

    def score(self, examples: list[TextExample], predictions: list[float]) -> dict[str, float]:
        raise InputError("colbert is scored by retrieval among the rows' positives (evaluate), not per row")

    def info(self) -> dict[str, Any]:
        return super().info() | {"dim": self.dim, "query_length": QUERY_LENGTH}


SPEC = TaskSpec(
    "colbert", lambda path, reading, info, head: read_texts(
        path, split_names(reading.option("text_cols", info, COLUMNS)), reading.option("label_col", info),
        header=reading.header and info.get("header", True), need_label=False),
    build=lambda head, tokenizer, train, max_length, common: ColbertTask(
        tokenizer, max_length, **common, teacher=head.teacher, dim=head.dim),
    restore=lambda model, given, info, tokenizer, max_length, common: ColbertTask(
        tokenizer, max_length, **common, dim=model.dim),
    models=(ColbertModel,), model_kind="base", load=load_colbert)


# ---- the `colbert` pipeline (its card: encoderlab.cards) -----------------------------------------------------------------
class Colbert(Pipeline):
    """Texts -> each text's unit token vectors, as documents or (query=True) as queries."""

    task = "colbert"
    model_class, needs = ColbertModel, "a ColBERT folder (encoderlab finetune colbert)"
    result = create_model("ColbertResult", tokens=(int, Field(description="the vectors' count")), vectors=(
        list[list[float]], Field(description="one unit vector per token MaxSim counts, in text order")))

    @classmethod
    def load(cls, folder: Path) -> nn.Module:
        if read_task_info(folder).get("task") != "colbert":
            raise InputError(f"{folder}: colbert needs {cls.needs}; its task.json names no colbert task")
        return load_colbert(folder)

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        return {"texts": (list[text], many()), "query": (bool, Field(False, description="encode the texts as "
                                                                                     "queries (default: documents)"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        first = " ".join(f"{x:.3f}" for x in result["vectors"][0][:4])
        return f"{result['tokens']} token vectors of {len(result['vectors'][0])} dimensions; the first [{first} ...]"

    def __call__(self, texts: Sequence[str], query: bool = False) -> list[dict[str, Any]]:
        return [{"tokens": len(v), "vectors": v.tolist()} for v in self.tokens(check_texts(list(texts)), query)]

    def tokens(self, texts: Sequence[str], query: bool = False) -> list[torch.Tensor]:
        """Each text's (n_i, dim) unit token vectors, as a document or (query) as a query."""
        encoder = TokenEncoder(self.model, self.tokenizer, self.max_length, self.batch_size)
        return encoder.encode(list(texts), "query" if query else "document")
