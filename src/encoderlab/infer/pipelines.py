"""Inference pipelines: embed, classify, fill-mask, ner, qa and rerank (encoderlab.tasks.rerank), over the one
inference engine (encoderlab.engine), registered in PIPELINES for pipeline(), `serve` and the command line.

    from encoderlab.infer.pipelines import pipeline
    fill = pipeline("fill-mask")  # the shipped encoderlab-fill-mask; or pipeline("fill-mask", "runs/my-mlm")
    fill(["Paris is the [MASK] of France."])[0]["masks"][0]["predictions"][0]["token"]

Every pipeline takes a list of inputs and returns one plain dict (JSON-ready) per input, in input order.
A pipeline loaded from a folder runs as the folder says (encoderlab.folder.settings: window, pooling,
normalisation, QA decoding); keyword options override it. Texts longer than the model's window are truncated
with one warning per call (fill-mask, embed, classify, ner) or split into overlapping windows (qa); they never
crash.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, create_model
from torch import nn

from encoderlab.checkpoint import load_model, read_config, resolve_model_path, stored_kind
from encoderlab.engine import (Encoded, Pipeline, as_list, check_texts, encode, forward, sentence_vectors,
                               split_windows)
from encoderlab.errors import CheckpointError, ConfigError, InputError, MissingHeadError
from encoderlab.io import qa_inputs
from encoderlab.infer import backends
from encoderlab.infer.compiled import compile_encoders
from encoderlab.nn.model import IGNORE_INDEX, MODEL_CLASSES, ModelOutput, SentenceEmbedder, SequenceClassifier, SpanExtractor, TokenClassifier
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL
from encoderlab.tasks.colbert import Colbert
from encoderlab.tasks.qa import Decoded, QATask, fit_to_window
from encoderlab.tasks.readers import QAExample
from encoderlab.tasks.rerank import Rerank
from encoderlab.tasks.splade import Splade
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def prepare(pipe: Pipeline, precision: str = "fp32", engine: str = "torch", engine_cache: str | Path | None = None,
            compile: bool = False) -> Pipeline:
    """The pipeline on its runtime: its model converted to `precision` and run by `engine` (encoderlab.infer.backends;
    exports go to engine_cache), or torch.compile'd in place and warmed up (encoderlab.infer.compiled)."""
    if compile and engine != "torch":
        raise ConfigError(f"--compile compiles torch's encoder; --engine {engine} runs another runtime")
    pipe.model, pipe.precision, pipe.engine_name = backends.resolve(
        pipe.model, engine, precision, pipe.probe, pipe.device, pipe.tokenizer, pipe.max_length, pipe.task,
        engine_cache)
    pipe.compiled = compile
    if compile:
        compile_encoders(pipe.model, pipe.probe)
    return pipe


# ---- fill-mask ---------------------------------------------------------------------------------------
class FillMask(Pipeline):
    """Texts with one or more mask tokens -> the top-k tokens for each mask, with probabilities."""

    task = "fill-mask"
    model_kind = "mlm"
    default_model = DEFAULT_FILL_MASK_MODEL
    MASK_SPELLINGS = ("[MASK]", "<mask>")  # accepted in input whatever the tokenizer's own spelling
    MLM_KINDS = ("mlm", "pretraining")  # stored kinds that hold a masked-LM head
    result = create_model("FillMaskResult", text=str, masks=(list[create_model(
        "MaskResult", position=(int, Field(description="token position of the mask")), predictions=list[create_model(
            "Prediction", token=str, id=int, score=(float, Field(description="probability")))])], Field(
        description="one entry per mask, in text order")), filled=(str, Field(
        description="the text with each mask replaced by its top token")))

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        return {"texts": (list[text], many("texts with one or more [MASK] (or <mask>) tokens")),
                "top_k": (int, Field(5, ge=1, le=100, description="predictions per mask"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return "\n".join([result["text"], *(f"  [MASK] {n}: " + "  ".join(f"{p['token']} {p['score']:.3f}" for p in
                                                                        mask["predictions"])
                                            for n, mask in enumerate(result["masks"], 1))])

    @classmethod
    def from_pretrained(cls, name: str | Path = DEFAULT_FILL_MASK_MODEL, **options: Any) -> Pipeline:
        """As Pipeline's, on the shipped model by default; MissingHeadError, naming that model, for a checkpoint
        with no masked-LM head (minilm: an encoder trained for sentence embeddings)."""
        folder = resolve_model_path(name)  # a missing folder, or a missing default, is reported as such
        try:
            return super().from_pretrained(name, **options)
        except CheckpointError as err:
            raw = read_config(folder)
            if stored_kind(folder, raw) in cls.MLM_KINDS:  # it should hold the head: damaged, reported as it is
                raise
            architecture = (raw.get("architectures") or ["no architecture"])[0]
            raise MissingHeadError(f"{name} has no masked-LM head (its config.json names {architecture}), and "
                                   f"fill-mask needs one: use --model {DEFAULT_FILL_MASK_MODEL} (the default), "
                                   f"or another masked-LM checkpoint") from err

    def __call__(self, texts: Sequence[str], top_k: int = 5) -> list[dict[str, Any]]:
        texts = [self._normalize(t) for t in check_texts(texts)]
        if top_k < 1:
            raise InputError(f"top_k {top_k}: expected a positive number")
        items = self.engine.encode(texts)
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
                results[i] = {"text": texts[i], "masks": masks[row], "filled": self._fill(items[i], masks[row])}

        self.engine.run(items, self._masked_probs, collect)
        return results

    def _normalize(self, text: str) -> str:
        """Any accepted mask spelling rewritten as the tokenizer's own."""
        for spelling in self.MASK_SPELLINGS:
            text = text.replace(spelling, self.tokenizer.mask_token)
        return text

    def _masked_probs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the vocabulary at the mask positions only: (N, V), and their (row, position)."""
        where = (batch["input_ids"] == self.tokenizer.mask_id).nonzero()  # (N, 2), in the order the model selects
        return self.logits(batch).float().softmax(-1), where

    def _forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """Logits (N, V) at the N mask positions only: the masks as labels, so the vocabulary matmul skips the rest."""
        ids = batch["input_ids"]
        return forward(model, batch, labels=ids.masked_fill(ids != self.tokenizer.mask_id, IGNORE_INDEX))

    def _fill(self, item: Encoded, masks: list[dict[str, Any]]) -> str:
        """The text with each mask replaced by its top token."""
        ids = list(item.input_ids)
        for mask in masks:
            ids[mask["position"]] = mask["predictions"][0]["id"]
        return self.tokenizer.decode(ids)


# ---- embed -------------------------------------------------------------------------------------------
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


# ---- classify ----------------------------------------------------------------------------------------
class Classify(Pipeline):
    """Texts (or [text, pair] items) -> label and class probabilities; a regression model gives a score, a
    multilabel one every class whose probability passes 0.5."""

    task = "classify"
    model_class, needs = SequenceClassifier, "a sequence-classification checkpoint (encoderlab finetune classify)"
    result = create_model(
        "ClassifyResult", label=(str | None, Field(None, description="the most probable class (absent for regression "
                                                                     "and multilabel)")),
        labels=(list[str] | None, Field(None, description="multilabel: every class whose probability passes 0.5")),
        score=(float | None, Field(None, description="its probability, or the regression value")),
        scores=(dict[str, float] | None, Field(None, description="every class's probability")))

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        pair = Annotated[list[text], Field(min_length=2, max_length=2)]
        return {"texts": (list[text | pair], many("texts, or [text, pair] items (all of one kind)"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        if "labels" in result:  # multilabel: every class that passes a half, else the closest ones
            top = sorted(result["scores"].items(), key=lambda item: -item[1])[:3]
            return ",".join(result["labels"]) or "no class above 0.5; top: " + ", ".join(
                f"{name} {score:.4f}" for name, score in top)
        return f"{result['score']:.4f}" if "label" not in result else f"{result['label']}\t{result['score']:.4f}"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, stride: int | None = None, combine: str | None = None,
                 **options: Any) -> None:
        """stride, combine: how a text longer than the window is read (None follows the folder): in windows sharing
        `stride` tokens whose logits (or probabilities, combine="probs") are averaged. Pairs are truncated."""
        super().__init__(model, tokenizer, **options)
        self.regression, self.multilabel = model.regression, getattr(model, "multilabel", False)
        self._windowing(stride, combine)

    def __call__(self, inputs: Sequence[str | Sequence[str]]) -> list[dict[str, Any]]:
        texts, pairs = split_pairs(inputs)
        if self.stride is not None and pairs is None:
            logits = self._window_rows(texts, lambda batch: self.logits(batch).float(),
                                       probs=self.combine == "probs" and not self.regression)
        else:
            logits = self.engine.rows(self.engine.encode(texts, pairs), lambda batch: self.logits(batch).float())
        return [self._result(row) for row in logits]

    def info(self) -> dict[str, Any]:
        return super().info() | {"stride": self.stride, "combine": self.combine}

    def _result(self, logits: torch.Tensor) -> dict[str, Any]:
        """{"score": value} for regression; else the top label, its probability and every class's."""
        if self.regression:
            return {"score": round(float(logits[0]), 6)}
        probs = (logits.sigmoid() if self.multilabel else logits.softmax(-1)).tolist()
        names = self.labels if len(self.labels) == len(probs) else [str(i) for i in range(len(probs))]
        scores = {name: round(p, 6) for name, p in zip(names, probs)}
        if self.multilabel:  # each class on its own: every one whose probability passes a half
            return {"labels": [name for name, p in zip(names, probs) if p >= 0.5], "scores": scores}
        best = max(range(len(probs)), key=probs.__getitem__)
        return {"label": names[best], "score": round(probs[best], 6), "scores": scores}


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
    model_class, needs = TokenClassifier, "a token-classification checkpoint (encoderlab finetune ner)"
    result = create_model("NERResult", text=str, entities=list[create_model(
        "Entity", entity=(str, Field(description="entity type, e.g. PER")),
        start=(int, Field(description="character offset in the text")), end=int, text=str,
        score=(float, Field(description="mean probability of the entity's word tags")))])

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return "\n".join([result["text"], *(f"  {e['entity']:<6} {e['text']!r} [{e['start']}:{e['end']}] "
                                            f"{e['score']:.3f}" for e in result["entities"])])

    def __call__(self, texts: Sequence[str]) -> list[dict[str, Any]]:
        texts = check_texts(texts)
        whole = encode(self.tokenizer, texts)  # not truncated: a long text is read in windows
        overlap = (self.max_length - self.tokenizer.num_special_tokens()) // 4
        windows = [(i, start, window) for i, item in enumerate(whole)
                   for start, window in split_windows(item, self.max_length, overlap)]
        probs = [torch.zeros(len(item.input_ids), len(self.labels) or 1) for item in whole]
        weight = [torch.zeros(len(item.input_ids), 1) for item in whole]

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            batch_probs = logits.float().softmax(-1).cpu()  # (B, T, L)
            for row, w in enumerate(indices):
                i, start, window = windows[w]
                content = [t for t, seq in enumerate(window.sequence_ids) if seq is not None]
                if not content:
                    continue
                first, n = content[0], len(content)
                at = slice(first + start, first + start + n)  # the window's content, in the whole text
                # Each token keeps the prediction of the window where it sits most centrally (most context).
                centrality = torch.minimum(torch.arange(1, n + 1), torch.arange(n, 0, -1)).float()[:, None]
                better = centrality > weight[i][at]
                probs[i][at] = torch.where(better, batch_probs[row, first:first + n], probs[i][at])
                weight[i][at] = torch.maximum(centrality, weight[i][at])

        self.engine.run([w for _, _, w in windows], self.logits, collect)
        return [{"text": text, "entities": entities(word_tags(item, p, self.labels), text)}
                for text, item, p in zip(texts, whole, probs)]


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
            words.append([start, end, labels[best] if best < len(labels) else str(best), float(probs[position, best])])
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
    """{"question", "context"} items -> answer text, character span and score; long contexts are windowed.

    Windows and decoding are QATask's (encoderlab.tasks.qa), with the folder's options (doc_stride, n_best,
    max_answer_length, allow_null), so `qa` answers what `evaluate qa` scores.
    """

    task = "qa"
    model_class, needs = SpanExtractor, "a question-answering checkpoint (encoderlab finetune qa)"
    result = create_model("QAResult", answer=(str, Field(description="the answer span ('' when none was found)")),
                          start=(int, Field(description="character offset in the context")), end=int, score=float)

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        item = model("QAItem", question=(text, Field(description="the question")), context=(text, Field(
            description="the passage to answer from; long ones are read in windows")))
        return {"items": (list[item], many("question and context pairs"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return f"{result['answer']!r} [{result['start']}:{result['end']}] {result['score']:.3f}"

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, doc_stride: int | None = None,
                 max_answer_length: int | None = None, **options: Any) -> None:
        """doc_stride, max_answer_length: None follows the folder's settings."""
        super().__init__(model, tokenizer, **options)
        given = self.settings
        self.reader = QATask(tokenizer, self.max_length,
                             *fit_to_window(self.max_length, doc_stride or given.doc_stride, given.max_query_length),
                             max_answer_length or given.max_answer_length, given.n_best, given.allow_null)
        self.doc_stride = self.reader.doc_stride

    def __call__(self, inputs: Sequence[dict[str, str]]) -> list[dict[str, Any]]:
        examples = [QAExample(id=str(i), title="", context=c, question=q) for i, (q, c) in enumerate(qa_inputs(inputs))]
        decoded = self.reader.decode(self.engine, self.logits, examples)
        return [self._answer(example, d) for example, d in zip(examples, decoded)]

    def _answer(self, example: QAExample, decoded: Decoded) -> dict[str, Any]:
        """The answer dict; score = exp(start + end logit) over all (start, end) pairs of all windows."""
        if decoded.is_null(self.reader.allow_null):
            score = 0.0 if decoded.score == -math.inf else math.exp(decoded.null - decoded.log_norm)
            return {"answer": "", "start": 0, "end": 0, "score": round(score, 6)}
        return {"answer": example.context[decoded.start:decoded.end], "start": decoded.start, "end": decoded.end,
                "score": round(math.exp(decoded.score - decoded.log_norm), 6)}

    def info(self) -> dict[str, Any]:
        reader = self.reader
        return super().info() | {"doc_stride": self.doc_stride, "n_best": reader.n_best,
                                 "max_answer_length": reader.max_answer_length, "allow_null": reader.allow_null}


# Every pipeline by task, in the order the server offers them: a capability registers its pipeline here, in one line
# (rerank's is declared with its task, in encoderlab.tasks.rerank).
PIPELINES: dict[str, type[Pipeline]] = {cls.task: cls for cls in (Embed, Classify, FillMask, NER, QA, Rerank, Colbert,
                                                                         Splade)}


def pipeline(task: str, model: str | Path | None = None, precision: str = "fp32", *, engine: str = "torch",
             engine_cache: str | Path | None = None, compile: bool = False, **options: Any) -> Pipeline:
    """A ready pipeline for `task` (one of PIPELINES) on a checkpoint folder or alias, on its runtime (prepare);
    model None: the task's default (fill-mask: the shipped encoderlab-fill-mask; the other tasks have none)."""
    if task not in PIPELINES:
        raise InputError(f"unknown pipeline {task!r}; expected one of {', '.join(PIPELINES)}")
    model = model if model is not None else PIPELINES[task].default_model
    if model is None:
        raise InputError(f"pipeline {task!r} has no default model: pass a checkpoint folder or alias")
    return prepare(PIPELINES[task].from_pretrained(model, **options), precision, engine, engine_cache, compile)
