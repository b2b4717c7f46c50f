"""Extractive question answering (SQuAD v1.1 / v2.0): start and end logits over the context tokens.

Each question is paired with windows of its context as the tokenizer lays out a pair (`[CLS] question [SEP] window
[SEP]`), max_length tokens overlapping by doc_stride (transformers' `stride`), so an answer near an edge is whole in a
neighbour. A training window without the whole answer (and every window of an unanswerable question) points at the
first token, as in the BERT paper (section 4.3). Decoding (BERT's run_squad.py): per window the n_best start and end
logits over context tokens, pairs with start <= end and at most max_answer_length tokens, scored start + end; the best
over all windows is mapped back to characters through the offsets. A model that learned unanswerable questions
answers "" when the [CLS] score (its lowest over the windows) beats the best span.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import torch
from pydantic import Field, create_model
from torch import nn

from encoderlab.errors import ConfigError
from encoderlab.io import qa_inputs
from encoderlab.engine import Encoded, Engine, encode, forward
from encoderlab.nn.model import SpanExtractor
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import squad_metrics
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.readers import QAExample, read_squad
from encoderlab.tasks.spec import TaskSpec
from encoderlab.tokenizer import Tokenizer


@dataclass
class Window:
    """One (question, context window) input: ids, and the character span of each context token."""

    example: int  # index of the QAExample
    input_ids: list[int]
    token_type_ids: list[int]
    spans: list[tuple[int, int] | None]  # per token: (start, end) in the context, None outside the context
    start_position: int = 0  # training target: answer's first token, 0 ([CLS]) when not in this window
    end_position: int = 0


@dataclass
class Decoded:
    """The best answer to one question over all its windows, and what its probability and the null answer need."""

    score: float = -math.inf  # start + end logit of the best span
    start: int = 0  # its characters in the context: [start, end)
    end: int = 0
    null: float = math.inf  # the [CLS] start + end logit, its lowest over the windows
    log_norm: float = -math.inf  # log of the sum of exp(start + end) over every pair of every window

    def is_null(self, allow_null: bool) -> bool:
        """Whether the answer is "": no valid span, or (allow_null) the [CLS] score beats the best span."""
        return self.score == -math.inf or (allow_null and self.null > self.score)


def _content(encoded: Encoded) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids and offsets of the real tokens (special tokens dropped)."""
    keep = [i for i, seq in enumerate(encoded.sequence_ids) if seq is not None]
    return [encoded.input_ids[i] for i in keep], [encoded.offsets[i] for i in keep]


def answer_tokens(spans: list[tuple[int, int] | None], char_start: int, char_end: int) -> tuple[int, int] | None:
    """The first and last token covering characters [char_start, char_end), or None if not wholly inside."""
    inside = [i for i, span in enumerate(spans) if span is not None]
    if not inside or spans[inside[0]][0] > char_start or spans[inside[-1]][1] < char_end:
        return None
    start = next(i for i in inside if spans[i][1] > char_start)
    end = next(i for i in reversed(inside) if spans[i][0] < char_end)
    return (start, end) if start <= end else None


def fit_to_window(max_length: int, doc_stride: int, max_query_length: int) -> tuple[int, int]:
    """doc_stride and max_query_length cut to a short window (a tiny model's): at most a half and a quarter of it,
    so that a question, the stride and some context fit; from 256 tokens the defaults (128, 64) stand unchanged."""
    return min(doc_stride, max_length // 2), min(max_query_length, max_length // 4)


class QATask(Task):
    """Span extraction over (question, context) windows."""

    name = "qa"
    metrics = ("f1", "exact_match")

    def prediction_file(self, examples: list[QAExample], predictions: list) -> str:
        """SQuAD's {id: answer} JSON, what its official scorer reads."""
        return json.dumps({e.id: p for e, p in zip(examples, predictions)}, indent=2) + "\n"

    def __init__(self, tokenizer: Tokenizer, max_length: int = 384, doc_stride: int = 128, max_query_length: int = 64,
                 max_answer_length: int = 30, n_best: int = 20, allow_null: bool = False, batch_size: int = 32,
                 precision: str = "fp32") -> None:
        super().__init__(tokenizer, max_length, batch_size, precision)
        self.doc_stride, self.max_query_length = doc_stride, max_query_length
        self.max_answer_length, self.n_best, self.allow_null = max_answer_length, n_best, allow_null
        self.middle, self.context_type = tokenizer.pair_layout()  # ids between question and context, its type id
        specials = tokenizer.num_special_tokens(pair=True)
        if max_length - max_query_length - specials <= doc_stride:
            raise ConfigError(f"--doc-stride {doc_stride} must be smaller than the context room of a window "
                              f"(max_length {max_length} - max_query_length {max_query_length} - {specials} "
                              f"special tokens)")

    def windows(self, examples: list[QAExample]) -> list[Window]:
        """Every window of every example, with training targets from each example's first answer."""
        questions = encode(self.tokenizer, [e.question for e in examples], None, None, "questions")
        contexts = encode(self.tokenizer, [e.context for e in examples], None, None, "contexts")
        out = []
        for index, (example, question, context) in enumerate(zip(examples, questions, contexts)):
            q_ids = _content(question)[0][: self.max_query_length]
            c_ids, c_offsets = _content(context)
            room = self.max_length - len(q_ids) - 2 - len(self.middle)
            start = 0
            while True:
                stop = min(start + room, len(c_ids))
                out.append(self._window(index, example, q_ids, c_ids[start:stop], c_offsets[start:stop]))
                if stop >= len(c_ids):
                    break
                start = stop - self.doc_stride
        return out

    def _window(self, index: int, example: QAExample, q_ids: list[int], c_ids: list[int],
                c_offsets: list[tuple[int, int]]) -> Window:
        ids = [self.tokenizer.cls_id, *q_ids, *self.middle, *c_ids, self.tokenizer.sep_id]
        before = 1 + len(q_ids) + len(self.middle)  # tokens ahead of the context
        types = [0] * before + [self.context_type] * (len(c_ids) + 1)
        spans: list[tuple[int, int] | None] = [None] * before + list(c_offsets) + [None]
        window = Window(index, ids, types, spans)
        if example.answers and not example.is_impossible:
            answer = example.answers[0]
            found = answer_tokens(spans, answer.start, answer.start + len(answer.text))
            if found is not None:
                window.start_position, window.end_position = found
        return window

    def features(self, examples: list[QAExample]) -> list[dict[str, Any]]:
        return [{"input_ids": w.input_ids, "token_type_ids": w.token_type_ids,
                 "start": w.start_position, "end": w.end_position} for w in self.windows(examples)]

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad_features(features, self.tokenizer.pad_id)
        if "start" in features[0]:
            batch["labels"] = torch.tensor([[f["start"], f["end"]] for f in features])  # (B, 2)
        return batch

    def predict(self, model: nn.Module, examples: list[QAExample]) -> list[str]:
        """The answer text of each question ("" for no answer when null answers were learned)."""
        decoded = self.decode(self.engine(model), lambda batch: forward(model, batch).logits, examples)
        return ["" if d.is_null(self.allow_null) else e.context[d.start:d.end].strip()
                for e, d in zip(examples, decoded)]

    def decode(self, engine: Engine, span_logits: Callable[[dict[str, torch.Tensor]], torch.Tensor],
               examples: list[QAExample]) -> list[Decoded]:
        """The best span of each question over its windows; span_logits maps a padded batch to (B, T, 2)."""
        windows = self.windows(examples)
        out = [Decoded() for _ in examples]

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            logits = logits.float().cpu()
            for row, i in enumerate(indices):
                start, end = logits[row, :len(windows[i].input_ids)].unbind(-1)  # (n,) each
                self._update(out[windows[i].example], start, end, windows[i].spans)

        engine.run([Encoded(w.input_ids, w.token_type_ids, [], []) for w in windows], span_logits, collect)
        return out

    def _update(self, decoded: Decoded, start: torch.Tensor, end: torch.Tensor,
                spans: list[tuple[int, int] | None]) -> None:
        """Fold one window's start and end logits (n,) into its question's Decoded."""
        decoded.null = min(decoded.null, float(start[0] + end[0]))
        decoded.log_norm = float(np.logaddexp(decoded.log_norm, float(start.logsumexp(0) + end.logsumexp(0))))
        found = self.best_span(start, end, spans)
        if found is not None and found[0] > decoded.score:
            decoded.score, decoded.start, decoded.end = found

    def best_span(self, start: torch.Tensor, end: torch.Tensor,
                  spans: list[tuple[int, int] | None]) -> tuple[float, int, int] | None:
        """(score, char start, char end) of the best valid span of one window, or None."""
        is_context = torch.tensor([s is not None for s in spans] + [False] * (len(start) - len(spans)))
        start = start.masked_fill(~is_context, float("-inf"))
        end = end.masked_fill(~is_context, float("-inf"))
        k = min(self.n_best, int(is_context.sum()))
        if k == 0:
            return None
        top_start, top_end = start.topk(k).indices.tolist(), end.topk(k).indices.tolist()
        found = None
        for s in top_start:
            for e in top_end:
                if s <= e < s + self.max_answer_length:
                    score = float(start[s] + end[e])
                    if found is None or score > found[0]:
                        found = (score, spans[s][0], spans[e][1])
        return found

    def score(self, examples: list[QAExample], predictions: list[str]) -> dict[str, float]:
        gold = {e.id: [a.text for a in e.answers] if not e.is_impossible else [""] for e in examples}
        return squad_metrics({e.id: p for e, p in zip(examples, predictions)}, gold)

    def info(self) -> dict[str, Any]:
        return super().info() | {"doc_stride": self.doc_stride, "max_query_length": self.max_query_length,
                                 "max_answer_length": self.max_answer_length, "n_best": self.n_best,
                                 "allow_null": self.allow_null}


SPEC = TaskSpec(
    "qa", lambda path, reading, info, head: read_squad(path),
    build=lambda head, tokenizer, train, max_length, common: QATask(
        tokenizer, max_length, *fit_to_window(max_length, head.doc_stride, head.max_query_length),
        head.max_answer_length, head.n_best, allow_null=any(e.is_impossible for e in train), **common),
    restore=lambda model, given, info, tokenizer, max_length, common: QATask(
        tokenizer, max_length, *fit_to_window(max_length, given.doc_stride, given.max_query_length),
        given.max_answer_length, given.n_best, given.allow_null, **common),
    models=(SpanExtractor,), model_kind="qa")


# ---- the `qa` pipeline -------------------------------------------------------------------------------------------
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
