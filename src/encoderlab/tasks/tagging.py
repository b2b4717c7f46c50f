"""Token classification (NER): one tag per word, learned on each word's first sub-token (BERT paper, section 5.3).

Words are joined with spaces and tokenized once; each token belongs to the word its offset falls in. A word's first
token carries its tag, the others -100 (no loss); predictions are read at the same tokens. A word left without
tokens (cut by max_length, or only characters the tokenizer drops) is predicted "O" and counted in a warning.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from typing import Any

import torch
from pydantic import Field, create_model
from torch import nn

from encoderlab.errors import InputError
from encoderlab.nn.model import IGNORE_INDEX, TokenClassifier
from encoderlab.engine import Encoded, check_texts, encode, forward, pad, split_windows
from encoderlab.tasks.base import Task, pad_features
from encoderlab.tasks.metrics import entity_metrics
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.readers import TaggedSentence, read_conll
from encoderlab.tasks.spec import TaskSpec, numbered_labels
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


SPEC = TaskSpec(
    "ner", lambda path, reading, info, head: read_conll(path, tag_col=reading.option("tag_col", info, -1),
                                                        token_col=reading.option("token_col", info, 0)),
    build=lambda head, tokenizer, train, max_length, common: TagTask(tokenizer, max_length, tag_set(train), **common),
    restore=lambda model, given, info, tokenizer, max_length, common: TagTask(
        tokenizer, max_length, model.labels or numbered_labels(model), **common),
    models=(TokenClassifier,), model_kind="ner", keeps_labels=True,
    model_options=lambda task, head: {"num_labels": len(task.labels)})


# ---- the `ner` pipeline ------------------------------------------------------------------------------------------
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
