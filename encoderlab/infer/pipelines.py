"""Inference pipelines: fill-mask, embed, classify, ner and qa, over one batching engine.

    from encoderlab.infer.pipelines import pipeline
    fill = pipeline("fill-mask", "runs/bert-mini/model")
    fill(["Paris is the [MASK] of France."])[0]["masks"][0]["predictions"][0]["token"]

Every pipeline takes a list of inputs and returns one plain dict (JSON-ready) per input, in input order.
The engine sorts inputs by token count and cuts batches from that order, so a batch holds texts of
similar length and almost no compute goes to padding (on SST-2 dev, file-order batches of 32 are 1.9x
padding; sorted ones 1.04x). Texts longer than the model's window are truncated with one warning per call
(fill-mask, embed, classify, ner) or split into overlapping windows (qa); they never crash.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from encoderlab.errors import InputError
from encoderlab.infer import precision as precisions
from encoderlab.nn.model import IGNORE_INDEX
from encoderlab.tokenizer import Batch, Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Encoded:
    """One tokenized input, unpadded."""

    input_ids: list[int]
    token_type_ids: list[int]
    offsets: list[tuple[int, int]]
    sequence_ids: list[int | None]


def as_list(values: Any, what: str) -> list:
    """A non-empty list of inputs; InputError for one string, a mapping, an empty list, or no list at all."""
    if isinstance(values, str):
        raise InputError(f"expected a list of {what}s, got one string (wrap it in a list)")
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise InputError(f"expected a list of {what}s, got a {type(values).__name__}")
    values = list(values)
    if not values:
        raise InputError(f"no {what}s given")
    return values


def check_texts(texts: Sequence[str], what: str = "text") -> list[str]:
    """The texts as a list; InputError naming the first empty, whitespace-only or non-string one."""
    texts = as_list(texts, what)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"{what} {i} is a {type(text).__name__}, expected a string")
        if not text.strip():
            raise InputError(f"{what} {i} is empty or whitespace only")
    return texts


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Index batches cut from the inputs sorted by length, longest first (so memory peaks at once)."""
    if batch_size < 1:
        raise InputError(f"batch_size {batch_size}: expected a positive number")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def pad_batch(items: Sequence[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids (B, T), right-padded to the longest item."""
    # Filled in numpy and handed to torch once: a torch op per row costs more than the row's data here.
    lengths = np.fromiter((len(item.input_ids) for item in items), dtype=np.int64, count=len(items))
    mask = np.arange(int(lengths.max())) < lengths[:, None]  # (B, T)
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    types = np.zeros(mask.shape, dtype=np.int64)
    ids[mask] = list(itertools.chain.from_iterable(item.input_ids for item in items))
    types[mask] = list(itertools.chain.from_iterable(item.token_type_ids for item in items))
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask.astype(np.int64)),
            "token_type_ids": torch.from_numpy(types)}


class Pipeline:
    """A model, its tokenizer and the batching engine; subclasses turn inputs into results."""

    task: ClassVar[str]
    model_kind: ClassVar[str | None] = None  # the kind load_model is asked for; None: what the folder holds

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, precision: str = "fp32", batch_size: int = 32,
                 max_length: int | None = None, device: str | torch.device = "cpu", compile: bool = False) -> None:
        """compile: torch.compile the encoder (in place) and warm it up here; see encoderlab.infer.compiled."""
        self.device = torch.device(device)
        self.tokenizer, self.batch_size = tokenizer, batch_size
        limit = model.config.max_position_embeddings
        self.max_length = min(max_length or limit, limit, tokenizer.model_max_length)
        model = model.eval().to(self.device)
        self.model, self.precision = precisions.resolve(model, precision, self._probe, self.device)
        self.compiled = compile
        if compile:
            from encoderlab.infer.compiled import compile_encoders

            compile_encoders(self.model, self._probe)

    @classmethod
    def from_pretrained(cls, name: str | Path, precision: str = "fp32", **options: Any) -> Pipeline:
        """Load the model and tokenizer of a checkpoint folder or alias for this task."""
        from encoderlab.checkpoint import resolve_model_path

        folder = resolve_model_path(name)
        model = cls.load(folder)
        return cls(model, Tokenizer.from_pretrained(folder), precision, **cls.folder_options(folder) | options)

    @classmethod
    def load(cls, folder: Path) -> nn.Module:
        """The model of a checkpoint folder, as the kind this pipeline runs."""
        from encoderlab.checkpoint import load_model

        return load_model(folder, kind=cls.model_kind)

    @classmethod
    def folder_options(cls, folder: Path) -> dict[str, Any]:
        """Options a checkpoint folder sets (task.json's max_length, sentence-transformers settings)."""
        from encoderlab.checkpoint import read_task_info

        info = read_task_info(folder)
        return {"max_length": info["max_length"]} if info.get("max_length") else {}

    # ---- the engine --------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[Encoded]:
        """Tokenize (pairs too), truncated to the window; warns once how many were cut."""
        batch: Batch = self.tokenizer.encode_batch(list(texts), list(pairs) if pairs is not None else None,
                                                   max_length=self.max_length)
        lengths = batch.attention_mask.sum(1).tolist()
        out = [Encoded(batch.input_ids[row, :n].tolist(), batch.token_type_ids[row, :n].tolist(),
                       batch.offsets[row][:n], batch.sequence_ids[row][:n]) for row, n in enumerate(lengths)]
        if batch.num_truncated:
            log.warning("%d of %d inputs were longer than %d tokens and were truncated",
                        batch.num_truncated, len(out), self.max_length)
        return out

    @torch.inference_mode()
    def run(self, items: Sequence[Encoded], forward: Callable[[dict[str, torch.Tensor]], Any],
            collect: Callable[[list[int], Any], None]) -> None:
        """Forward the items in length-sorted batches; collect(indices, outputs) places each batch's results."""
        for indices in sorted_batches([len(item.input_ids) for item in items], self.batch_size):
            batch = {k: v.to(self.device) for k, v in pad_batch([items[i] for i in indices],
                                                                  self.tokenizer.pad_id).items()}
            collect(indices, forward(batch))

    def _probe(self, model: nn.Module) -> object:
        """One representative forward pass (32 x 64 tokens), for timing the precision modes."""
        T = min(64, self.max_length)
        ids = torch.full((32, T), self.tokenizer.cls_id, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            return self.forward_model(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                              "token_type_ids": torch.zeros_like(ids)})

    def forward_model(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
        """The model's logits on a padded batch."""
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits

    def __call__(self, inputs: Sequence[Any], **options: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """What this pipeline runs: task, precision, whether compiled, window, batch size."""
        return {"task": self.task, "precision": self.precision, "compiled": self.compiled,
                "max_length": self.max_length, "batch_size": self.batch_size, "device": str(self.device)}


# ---- fill-mask ---------------------------------------------------------------------------------------
class FillMask(Pipeline):
    """Texts with one or more mask tokens -> the top-k tokens for each mask, with probabilities."""

    task = "fill-mask"
    model_kind = "mlm"
    MASK_SPELLINGS = ("[MASK]", "<mask>")  # accepted in input whatever the tokenizer's own spelling

    def __call__(self, texts: Sequence[str], top_k: int = 5) -> list[dict[str, Any]]:
        texts = [self._normalize(t) for t in check_texts(texts)]
        if top_k < 1:
            raise InputError(f"top_k {top_k}: expected a positive number")
        items = self.encode(texts)
        for i, item in enumerate(items):
            if self.tokenizer.mask_id not in item.input_ids:
                raise InputError(f"text {i} has no {self.tokenizer.mask_token} token within the first "
                                 f"{self.max_length} tokens: {texts[i][:200]!r}")
        results: list[dict[str, Any]] = [{} for _ in texts]

        def collect(indices: list[int], out: tuple[torch.Tensor, torch.Tensor]) -> None:
            probs, where = out  # (N, V) over the masks of the batch, (N, 2) = (row, position)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            masks: dict[int, list] = {}
            for n, (row, position) in enumerate(where.tolist()):
                predictions = [{"token": self.tokenizer.id_to_token(int(token)), "id": int(token),
                                "score": round(float(score), 6)}
                               for score, token in zip(top.values[n].tolist(), top.indices[n].tolist())]
                masks.setdefault(row, []).append({"position": position, "predictions": predictions})
            for row, i in enumerate(indices):
                results[i] = {"text": texts[i], "masks": masks[row],
                              "filled": self._fill(items[i], masks[row])}

        self.run(items, self._masked_probs, collect)
        return results

    def _normalize(self, text: str) -> str:
        """Any accepted mask spelling rewritten as the tokenizer's own."""
        for spelling in self.MASK_SPELLINGS:
            text = text.replace(spelling, self.tokenizer.mask_token)
        return text

    def _masked_probs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the vocabulary at the mask positions only: (N, V), and their (row, position)."""
        ids = batch["input_ids"]
        masks = ids == self.tokenizer.mask_id  # (B, T)
        # Labels on the masks: the decoder runs on those positions only, in row-major order as nonzero() lists them.
        logits = self.forward_model(self.model, batch, ids.masked_fill(~masks, IGNORE_INDEX))  # (N, V)
        return logits.float().softmax(-1), masks.nonzero()

    def forward_model(self, model: nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor | None = None) -> Any:
        """MLM logits at the labelled positions (by default the first two of each row, for timing)."""
        if labels is None:
            labels = batch["input_ids"].clone()
            labels[:, 2:] = IGNORE_INDEX
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels=labels).logits

    def _fill(self, item: Encoded, masks: list[dict[str, Any]]) -> str:
        """The text with each mask replaced by its top token."""
        ids = list(item.input_ids)
        for mask in masks:
            ids[mask["position"]] = mask["predictions"][0]["id"]
        return self.tokenizer.decode(ids)


# ---- embed -------------------------------------------------------------------------------------------
class Embed(Pipeline):
    """Texts -> sentence vectors (mean or [CLS] pooling; L2-normalized when the model says so)."""

    task = "embed"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, precision: str = "fp32", pooling: str | None = None,
                 normalize: bool = False, **options: Any) -> None:
        from encoderlab.nn.model import SentenceEmbedder

        if not isinstance(model, SentenceEmbedder):
            raise InputError(f"embed needs a sentence embedder (load_model(folder, kind='embed')), "
                             f"not a {type(model).__name__}")
        model.pooling = pooling or model.pooling
        super().__init__(model, tokenizer, precision, **options)
        self.pooling = model.pooling
        self.normalize = normalize

    @classmethod
    def load(cls, folder: Path) -> nn.Module:
        """The encoder of a bare, sentence-embedding or pretraining checkpoint (its MLM/NSP heads left out)."""
        from encoderlab.checkpoint import load_model, read_config, stored_kind
        from encoderlab.nn.model import MODEL_CLASSES

        stored = stored_kind(folder, read_config(folder))
        if stored in ("classify", "ner", "qa"):
            raise InputError(f"embed needs a sentence-embedding or plain encoder checkpoint, "
                             f"not a {MODEL_CLASSES[stored].__name__}")
        return load_model(folder, kind="embed")

    @classmethod
    def folder_options(cls, folder: Path) -> dict[str, Any]:
        """sentence-transformers settings: max_seq_length, and normalization when the folder has a Normalize module."""
        from encoderlab.checkpoint import read_json_file

        options = super().folder_options(folder)
        settings = folder / "sentence_bert_config.json"
        if settings.is_file() and "max_length" not in options:
            options["max_length"] = read_json_file(settings).get("max_seq_length")
        modules = folder / "modules.json"
        if modules.is_file():
            kinds = [str(m.get("type", "")) for m in read_json_file(modules, list) if isinstance(m, dict)]
            options["normalize"] = any(kind.endswith("Normalize") for kind in kinds)
        return options

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(N, H) float32 vectors in input order."""
        texts = check_texts(texts)
        items = self.encode(texts)
        out = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)

        def forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            vectors = self.forward_model(self.model, batch)  # (B, H)
            return F.normalize(vectors, dim=-1) if self.normalize else vectors

        def collect(indices: list[int], vectors: torch.Tensor) -> None:
            out[indices] = vectors.cpu().numpy()

        self.run(items, forward, collect)
        return out

    def forward_model(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> Any:
        return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).embedding

    def __call__(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        return [{"embedding": vector.tolist()} for vector in self.embed(texts)]

    def info(self) -> dict[str, Any]:
        return super().info() | {"pooling": self.pooling, "normalize": self.normalize}


# ---- classify ----------------------------------------------------------------------------------------
class Classify(Pipeline):
    """Texts (or [text, pair] items) -> label and class probabilities; a regression model gives a score."""

    task = "classify"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, precision: str = "fp32", **options: Any) -> None:
        from encoderlab.nn.model import SequenceClassifier

        if not isinstance(model, SequenceClassifier):
            raise InputError(f"classify needs a sequence-classification checkpoint "
                             f"(encoderlab finetune classify), not a {type(model).__name__}")
        super().__init__(model, tokenizer, precision, **options)
        self.regression = model.regression
        num_labels = model.config.labels or []
        self.labels = list(num_labels)

    def __call__(self, inputs: Sequence[str | Sequence[str]]) -> list[dict[str, Any]]:
        texts, pairs = split_pairs(inputs)
        items = self.encode(texts, pairs)
        results: list[dict[str, Any]] = [{} for _ in items]

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            logits = logits.float().cpu()
            for row, i in enumerate(indices):
                results[i] = self._result(logits[row])

        self.run(items, lambda batch: self.forward_model(self.model, batch), collect)
        return results

    def _result(self, logits: torch.Tensor) -> dict[str, Any]:
        """{"score": value} for regression; else the top label, its probability and every class's."""
        if self.regression:
            return {"score": round(float(logits[0]), 6)}
        probs = logits.softmax(-1).tolist()
        names = self.labels if len(self.labels) == len(probs) else [str(i) for i in range(len(probs))]
        best = max(range(len(probs)), key=probs.__getitem__)
        return {"label": names[best], "score": round(probs[best], 6),
                "scores": {name: round(p, 6) for name, p in zip(names, probs)}}


def split_pairs(inputs: Sequence[str | Sequence[str]]) -> tuple[list[str], list[str] | None]:
    """Single texts, or [text, pair] items (all one kind): (texts, pairs or None)."""
    inputs = as_list(inputs, "text")
    if all(isinstance(item, str) for item in inputs):
        return check_texts(inputs), None
    for i, item in enumerate(inputs):
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise InputError(f"input {i}: expected every input to be a text, or every input a [text, pair] "
                             f"of two texts")
    return check_texts([a for a, _ in inputs]), check_texts([b for _, b in inputs], "pair text")


# ---- ner ---------------------------------------------------------------------------------------------
class NER(Pipeline):
    """Texts -> entities (type, text, character start/end, score), whole words aggregated across sub-words.

    The model was trained with each word's tag on its first sub-token (encoderlab.tasks.tagging); so each
    word takes the tag predicted at its first token, and consecutive words of one entity (B-X then I-X,
    or BIOES) are merged. The score is the mean probability of the entity's word tags. A text longer than
    the window is read in windows that overlap by a quarter; each token keeps the prediction of the window
    where it sits furthest from an edge.
    """

    task = "ner"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, precision: str = "fp32", **options: Any) -> None:
        from encoderlab.nn.model import TokenClassifier

        if not isinstance(model, TokenClassifier):
            raise InputError(f"ner needs a token-classification checkpoint (encoderlab finetune ner), "
                             f"not a {type(model).__name__}")
        super().__init__(model, tokenizer, precision, **options)
        self.labels = list(model.config.labels or [])

    def __call__(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        texts = check_texts(texts)
        whole = self.encode_whole(texts)
        windows = [(i, start, window) for i, item in enumerate(whole) for start, window in self.windows(item)]
        probs = [torch.zeros(len(item.input_ids), len(self.labels) or 1) for item in whole]
        weight = [torch.zeros(len(item.input_ids), 1) for item in whole]

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            batch_probs = logits.float().softmax(-1).cpu()  # (B, T, L)
            for row, w in enumerate(indices):
                i, start, window = windows[w]
                n = len(window.input_ids) - 2  # the window's content tokens, after its [CLS]
                # Each token keeps the prediction of the window where it sits most centrally (most context).
                centrality = torch.minimum(torch.arange(1, n + 1), torch.arange(n, 0, -1)).float()[:, None]
                better = centrality > weight[i][start:start + n]
                probs[i][start:start + n] = torch.where(better, batch_probs[row, 1:n + 1], probs[i][start:start + n])
                weight[i][start:start + n] = torch.maximum(centrality, weight[i][start:start + n])

        self.run([w for _, _, w in windows], lambda batch: self.forward_model(self.model, batch), collect)
        return [{"text": text, "entities": entities(word_tags(item, p, self.labels), text)}
                for text, item, p in zip(texts, whole, probs)]

    def encode_whole(self, texts: list[str]) -> list[Encoded]:
        """Each text's content tokens (no special tokens, no truncation)."""
        batch = self.tokenizer.encode_batch(texts, max_length=None, truncation=False)
        out = []
        for row, n in enumerate(batch.attention_mask.sum(1).tolist()):
            keep = [t for t in range(n) if batch.sequence_ids[row][t] is not None]
            out.append(Encoded([int(batch.input_ids[row, t]) for t in keep], [0] * len(keep),
                               [batch.offsets[row][t] for t in keep], [0] * len(keep)))
        return out

    def windows(self, item: Encoded) -> list[tuple[int, Encoded]]:
        """(first content token, window) pairs covering the text; a quarter of each window overlaps the next."""
        room = self.max_length - 2
        step = max(1, room - room // 4)
        out, start = [], 0
        while True:
            ids = item.input_ids[start:start + room]
            out.append((start, Encoded([self.tokenizer.cls_id, *ids, self.tokenizer.sep_id], [0] * (len(ids) + 2),
                                       [], [])))
            if start + room >= len(item.input_ids):
                return out
            start += step


def word_tags(item: Encoded, probs: torch.Tensor, labels: list[str]) -> list[tuple[int, int, str, float]]:
    """(char start, char end, tag, probability) of each word: tag from its first token, span over all its tokens.

    probs (T, L) has one row per token of the item. A token starts a new word unless it begins where the previous
    token ended (a "##" piece) or before (a SentencePiece "▁" alone shares its character with the piece after it).
    """
    words: list[list] = []
    previous_end = -1
    for position, (seq, (start, end)) in enumerate(zip(item.sequence_ids, item.offsets)):
        if seq is None or end <= start:
            continue
        if start <= previous_end and words:
            words[-1][1] = end
        else:
            best = int(probs[position].argmax())
            words.append([start, end, labels[best] if best < len(labels) else str(best),
                          float(probs[position, best])])
        previous_end = end
    return [tuple(word) for word in words]


def entities(words: list[tuple[int, int, str, float]], text: str) -> list[dict[str, Any]]:
    """Merge word tags (IOB1/IOB2/BIOES, as predicted) into entities."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for start, end, tag, prob in words:
        prefix, kind = (tag.split("-", 1) + [""])[:2] if "-" in tag else (tag, "")
        continues = current is not None and kind == current["entity"] and prefix in ("I", "E")
        if tag == "O" or not kind:
            current = None
            continue
        if continues:
            current["end"], current["_probs"] = end, current["_probs"] + [prob]
        else:
            current = {"entity": kind, "start": start, "end": end, "_probs": [prob]}
            out.append(current)
        if prefix in ("E", "S"):
            current = None
    for entity in out:
        probs = entity.pop("_probs")
        entity["text"] = text[entity["start"]:entity["end"]]
        entity["score"] = round(sum(probs) / len(probs), 6)
    return out


# ---- qa ----------------------------------------------------------------------------------------------
class QA(Pipeline):
    """{"question", "context"} items -> answer text, character span and score; long contexts are windowed."""

    task = "qa"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, precision: str = "fp32", doc_stride: int = 128,
                 max_answer_length: int = 30, **options: Any) -> None:
        from encoderlab.nn.model import SpanExtractor

        if not isinstance(model, SpanExtractor):
            raise InputError(f"qa needs a question-answering checkpoint (encoderlab finetune qa), "
                             f"not a {type(model).__name__}")
        super().__init__(model, tokenizer, precision, **options)
        self.doc_stride = min(doc_stride, self.max_length // 2)
        self.max_answer_length = max_answer_length

    @classmethod
    def folder_options(cls, folder: Path) -> dict[str, Any]:
        """task.json's max_length, doc_stride and max_answer_length."""
        from encoderlab.checkpoint import read_task_info

        info = read_task_info(folder)
        return {k: info[k] for k in ("max_length", "doc_stride", "max_answer_length") if info.get(k)}

    def __call__(self, inputs: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
        from encoderlab.tasks.qa import QATask
        from encoderlab.tasks.readers import QAExample

        examples = [QAExample(id=str(i), title="", context=c, question=q)
                    for i, (q, c) in enumerate(qa_inputs(inputs))]
        task = QATask(self.tokenizer, self.max_length, self.doc_stride, max_query_length=min(64, self.max_length // 4),
                      max_answer_length=self.max_answer_length, batch_size=self.batch_size)
        windows = task.windows(examples)
        items = [Encoded(w.input_ids, w.token_type_ids, [], []) for w in windows]
        best: list[tuple[float, int, int] | None] = [None] * len(examples)
        norm = [-math.inf] * len(examples)  # log of the sum of exp(start + end) over windows, for a probability

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            start, end = logits.float().cpu().unbind(-1)  # (B, T) each
            for row, i in enumerate(indices):
                window = windows[i]
                n = len(window.input_ids)
                found = task.best_span(start[row, :n], end[row, :n], window.spans)
                e = window.example
                norm[e] = float(np.logaddexp(norm[e], float(torch.logsumexp(start[row, :n], 0)
                                                            + torch.logsumexp(end[row, :n], 0))))
                if found is not None and (best[e] is None or found[0] > best[e][0]):
                    best[e] = found

        self.run(items, lambda batch: self.forward_model(self.model, batch), collect)
        return [self._answer(example, found, norm[i]) for i, (example, found) in enumerate(zip(examples, best))]

    @staticmethod
    def _answer(example, found: tuple[float, int, int] | None, log_norm: float) -> dict[str, Any]:
        """The answer dict; score = exp(start + end logit) over all (start, end) pairs of all windows."""
        if found is None:
            return {"answer": "", "start": 0, "end": 0, "score": 0.0}
        score, start, end = found
        return {"answer": example.context[start:end], "start": start, "end": end,
                "score": round(math.exp(score - log_norm), 6)}


def qa_inputs(inputs: Sequence[dict[str, str]]) -> list[tuple[str, str]]:
    """(question, context) pairs from dicts; InputError naming the first bad item."""
    inputs = as_list([inputs] if isinstance(inputs, dict) else inputs, "question")
    out = []
    for i, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) \
                or not isinstance(item.get("context"), str):
            raise InputError(f"input {i}: expected an object with string fields 'question' and 'context'")
        for field in ("question", "context"):
            if not item[field].strip():
                raise InputError(f"input {i}: the {field} is empty or whitespace only")
        out.append((item["question"], item["context"]))
    return out


PIPELINES: dict[str, type[Pipeline]] = {cls.task: cls for cls in (FillMask, Embed, Classify, NER, QA)}


def pipeline(task: str, model: str | Path, precision: str = "fp32", **options: Any) -> Pipeline:
    """A ready pipeline for `task` (one of PIPELINES) on a checkpoint folder or alias."""
    if task not in PIPELINES:
        raise InputError(f"unknown pipeline {task!r}; expected one of {', '.join(PIPELINES)}")
    return PIPELINES[task].from_pretrained(model, precision, **options)
