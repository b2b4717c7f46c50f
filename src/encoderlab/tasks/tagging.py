"""Token classification (NER): one tag per word, learned on each word's first sub-token (BERT paper, section 5.3).

Words are joined with spaces and tokenized once; each token belongs to the word its offset falls in. A word's first
token carries its tag, the others -100 (no loss); predictions are read at the same tokens. A word left without
tokens (cut by max_length, or only characters the tokenizer drops) is predicted "O" and counted in a warning.
"""

from __future__ import annotations

import bisect
import logging
from typing import Any

import torch
from torch import nn

from encoderlab.errors import InputError
from encoderlab.nn.model import IGNORE_INDEX, TokenClassifier
from encoderlab.engine import Encoded, encode, forward, pad
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import entity_metrics
from encoderlab.tasks.readers import TaggedSentence, read_conll
from encoderlab.tasks.spec import TaskSpec, numbered_labels, register_task
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def tag_set(sentences: list[TaggedSentence]) -> list[str]:
    """The tags of the training data: "O" first, then by entity type, B- before I-."""
    tags = {tag for s in sentences for tag in s.tags} - {"O"}
    return ["O"] + sorted(tags, key=lambda t: (t[2:], t[:1]))


def first_token_of_words(words: list[str], offsets: list[tuple[int, int]],
                         sequence_ids: list[int | None]) -> list[int | None]:
    """For each word, the index of its first token in the encoded text (None when it has no token); the text is
    `" ".join(words)`, so word i starts at character sum(len(w) + 1 for w in words[:i])."""
    starts, position = [], 0
    for word in words:
        starts.append(position)
        position += len(word) + 1
    first: list[int | None] = [None] * len(words)
    for token, ((char_start, char_end), seq) in enumerate(zip(offsets, sequence_ids)):
        if seq is None or char_end <= char_start:
            continue
        word = bisect.bisect_right(starts, char_start) - 1
        if first[word] is None:
            first[word] = token
    return first


class TagTask(Task):
    """Token classification with word-level tags (IOB2)."""

    name = "ner"
    metrics = ("f1", "precision", "recall", "accuracy")

    def __init__(self, tokenizer: Tokenizer, max_length: int, labels: list[str], batch_size: int = 32,
                 precision: str = "fp32") -> None:
        super().__init__(tokenizer, max_length, batch_size, precision)
        self.labels = labels
        self.index = {label: i for i, label in enumerate(labels)}

    def encode(self, sentences: list[TaggedSentence]) -> tuple[list[Encoded], list[list[int | None]]]:
        """Token ids of each sentence, and the first token of each word."""
        encoded = encode(self.tokenizer, [" ".join(s.words) for s in sentences], None, self.max_length, "sentences")
        return encoded, [first_token_of_words(s.words, e.offsets, e.sequence_ids) for s, e in zip(sentences, encoded)]

    def features(self, sentences: list[TaggedSentence]) -> list[dict[str, Any]]:
        out = []
        for sentence, item, first in zip(sentences, *self.encode(sentences)):
            labels = [IGNORE_INDEX] * len(item.input_ids)
            for tag, token in zip(sentence.tags, first):
                if tag not in self.index:
                    raise InputError(f"{sentence.where}: tag {tag!r} is not one of the model's tags "
                                     f"({', '.join(self.labels)})")
                if token is not None:
                    labels[token] = self.index[tag]
            out.append({"input_ids": item.input_ids, "token_type_ids": item.token_type_ids, "first": first,
                        "labels": labels})
        return out

    def validate(self, sentences: list[TaggedSentence]) -> None:
        for sentence in sentences:
            unknown = sorted(set(sentence.tags) - set(self.index))
            if unknown:
                raise InputError(f"{sentence.where}: tag {unknown[0]!r} is not one of the model's tags "
                                 f"({', '.join(self.labels)})")

    def collate(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = pad_features(features, self.tokenizer.pad_id)
        if "labels" in features[0]:
            batch["labels"] = pad([f["labels"] for f in features], IGNORE_INDEX)
        return batch

    def predict(self, model: nn.Module, sentences: list[TaggedSentence]) -> list[list[str]]:
        """One tag per word of each sentence."""
        encoded, firsts = self.encode(sentences)
        out: list[list[str]] = [[] for _ in sentences]

        def collect(indices: list[int], logits: torch.Tensor) -> None:
            best = logits.argmax(-1).cpu()  # (B, T)
            for row, i in enumerate(indices):
                out[i] = [self.labels[int(best[row, t])] if t is not None else "O" for t in firsts[i]]

        self.engine(model).run(encoded, lambda batch: forward(model, batch).logits, collect)
        untagged = sum(token is None for first in firsts for token in first)
        if untagged:
            log.warning("%d words had no token within max_length %d and were tagged O", untagged, self.max_length)
        return out

    def score(self, sentences: list[TaggedSentence], predictions: list[list[str]]) -> dict[str, float]:
        return entity_metrics([s.tags for s in sentences], predictions)

    def info(self) -> dict[str, Any]:
        return super().info() | {"labels": self.labels}


register_task(TaskSpec(
    "ner", lambda path, reading, info, head: read_conll(path, tag_col=reading.option("tag_col", info, -1),
                                                        token_col=reading.option("token_col", info, 0)),
    build=lambda head, tokenizer, train, max_length, common: TagTask(tokenizer, max_length, tag_set(train), **common),
    restore=lambda model, given, info, tokenizer, max_length, common: TagTask(
        tokenizer, max_length, model.labels or numbered_labels(model), **common),
    models=(TokenClassifier,), model_kind="ner", keeps_labels=True,
    model_options=lambda task, head: {"num_labels": len(task.labels)}))
