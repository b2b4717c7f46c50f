"""Pretraining examples from token shards, deterministic in (seed, epoch, index) so a run resumes exactly.

Three objectives share one layout, `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` (the tokenizer's own special tokens and
pair middle: RoBERTa's is `<s> A </s></s> B </s>`, all type 0), and never cross a document:
- "mlm": whole sentences of one document packed up to max_length, a long sentence cut into pieces; no B. This is
  RoBERTa's DOC-SENTENCES input (Liu et al., 2019, section 4.2). The packing is the same every epoch; only the order
  changes.
- "nsp": BERT's segment pairs, after create_instances_from_document in google-research/bert create_pretraining_data.py:
  sentences are gathered up to a target length (max_length - 3, or with probability short_seq_prob a uniform length in
  [2, max_length - 3]); A is a random prefix of them; B is the rest (label 0) or, half the time and always when there is
  a single sentence, a span from a random other document (label 1), whose unused sentences go back to the pool; the
  longer of A and B is then trimmed one token at a time from a random end. One departure: the short target is drawn for
  every example rather than once per document, so short_seq_prob is the rate per example. Pairs are redrawn each epoch,
  as BERT's dupe_factor copies are.
- "sop": ALBERT's sentence-order prediction (Lan et al., 2019, section 3.1): the same chunks, B always the true
  continuation, A and B swapped half the time (label 1 = swapped). A single-sentence chunk is cut at a random token so
  it still makes a pair.
"""

from __future__ import annotations

import random
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from encoderlab.data.shards import TokenShards
from encoderlab.errors import ConfigError

OBJECTIVES = ("mlm", "nsp", "sop")
# One row per example: A and B as (shard, start, length) spans of tokens, and the pair label.
PLAN_DTYPE = np.dtype([("a_shard", np.int32), ("a_start", np.int64), ("a_len", np.int32),
                       ("b_shard", np.int32), ("b_start", np.int64), ("b_len", np.int32), ("label", np.int8)])
_CACHED_EPOCHS = 2  # the current epoch and the next, for a loader that looks ahead


@dataclass
class Example:
    """One sequence, `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, unpadded."""

    input_ids: np.ndarray  # (T,) int64
    token_type_ids: np.ndarray  # (T,) int64: 0 for [CLS] A [SEP], the tokenizer's B type (1; RoBERTa 0) for B [SEP]
    word_starts: np.ndarray  # (T,) bool: the token begins a word (special tokens and segment starts do)
    next_sentence_label: int = -1  # nsp: 0 B follows A, 1 B is random; sop: 0 in order, 1 swapped; -1 n/a


class PretrainingExamples:
    """The examples of one split for an objective ("mlm" | "nsp" | "sop"), shuffled anew every epoch. The plan of an
    epoch (example spans and labels, ~33 bytes per example) is built on first use and the last two epochs' plans are
    cached; build it before forking DataLoader workers so they share it."""

    def __init__(self, shards: TokenShards, objective: str, max_length: int, seed: int, short_seq_prob: float = 0.1):
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective {objective!r}: expected one of {OBJECTIVES}")
        # room for the specials and one token (one per segment for pairs)
        minimum = 3 if objective == "mlm" else 4 + len(shards.pair_middle_ids)
        if max_length < minimum:
            raise ConfigError(f"max_length={max_length}: {objective} needs at least {minimum}")
        if not 0 <= short_seq_prob <= 1:
            raise ConfigError(f"short_seq_prob={short_seq_prob}: expected a probability in [0, 1]")
        if seed < 0:
            raise ConfigError(f"seed={seed}: expected a non-negative integer")
        if objective == "nsp" and shards.num_documents < 2:
            raise ConfigError(f"{shards.folder} ({shards.split}): nsp draws random segments from other "
                              f"documents and needs at least 2, found {shards.num_documents}")
        self.shards, self.objective, self.max_length = shards, objective, max_length
        self.seed, self.short_seq_prob = seed, short_seq_prob
        self._epochs: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._packed: np.ndarray | None = None

    def num_examples(self, epoch: int) -> int:
        """How many examples epoch `epoch` has (constant for "mlm"; varies a little for pairs)."""
        return len(self._epoch(epoch)[1])

    def get(self, epoch: int, index: int) -> Example:
        """Example `index` of epoch `epoch`'s shuffled order."""
        plan, order = self._epoch(epoch)
        if not 0 <= index < len(order):
            raise IndexError(f"example {index} out of range: epoch {epoch} has {len(order)}")
        return self._build(plan[order[index]])

    # ---- plans -----------------------------------------------------------------------------------------
    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(plan, order) of an epoch, from the cache or built now."""
        if epoch < 0:
            raise IndexError(f"epoch {epoch}: expected >= 0")
        if epoch not in self._epochs:
            if self.objective == "mlm":
                self._packed = self._packed if self._packed is not None else packed_plan(self.shards, self.max_length)
                plan = self._packed
            else:
                rng = random.Random(f"encoderlab-pairs/{self.seed}/{epoch}")
                plan = pair_plan(self.shards, self.objective, self.max_length, self.short_seq_prob, rng)
            order = np.random.default_rng([self.seed, epoch]).permutation(len(plan))
            self._epochs[epoch] = (plan, order)
            while len(self._epochs) > _CACHED_EPOCHS:
                self._epochs.popitem(last=False)
        self._epochs.move_to_end(epoch)
        return self._epochs[epoch]

    def _build(self, row: np.void) -> Example:
        """The token arrays of one planned example."""
        a_len, b_len = int(row["a_len"]), int(row["b_len"])
        middle = self.shards.pair_middle_ids if b_len else [self.shards.sep_id]
        b_at = 1 + a_len + len(middle)
        length = b_at + (b_len + 1 if b_len else 0)
        input_ids = np.empty(length, np.int64)
        word_starts = np.ones(length, bool)
        token_type_ids = np.zeros(length, np.int64)
        input_ids[0], input_ids[1 + a_len:b_at], input_ids[-1] = self.shards.cls_id, middle, self.shards.sep_id
        self._fill(input_ids, word_starts, 1, int(row["a_shard"]), int(row["a_start"]), a_len)
        if b_len:
            self._fill(input_ids, word_starts, b_at, int(row["b_shard"]), int(row["b_start"]), b_len)
            token_type_ids[b_at:] = self.shards.pair_b_type_id
        return Example(input_ids, token_type_ids, word_starts, int(row["label"]))

    def _fill(self, input_ids: np.ndarray, word_starts: np.ndarray, at: int, shard: int, start: int,
              length: int) -> None:
        """Copy a span of tokens and word starts; its first token starts a word, so no word spans two segments."""
        source = self.shards.shards[shard]
        input_ids[at:at + length] = source.tokens[start:start + length]
        word_starts[at:at + length] = source.word_starts[start:start + length]
        word_starts[at] = True


class _Columns:
    """A growing plan: one flat typed array of 7 values per example (not a list of tuples, not 7 appends)."""

    def __init__(self):
        self.values = array("q")

    def add(self, a_shard: int, a_start: int, a_len: int, b_shard: int = 0, b_start: int = 0, b_len: int = 0,
            label: int = -1) -> None:
        self.values.extend((a_shard, a_start, a_len, b_shard, b_start, b_len, label))

    def to_plan(self) -> np.ndarray:
        table = np.frombuffer(self.values, np.int64).reshape(-1, len(PLAN_DTYPE.names))  # (n, 7)
        plan = np.empty(len(table), PLAN_DTYPE)
        for column, name in enumerate(PLAN_DTYPE.names):
            plan[name] = table[:, column]
        return plan


def _document_sentences(shards: TokenShards) -> Iterator[tuple[int, int, list[int]]]:
    """(shard index, split-wide document index, sentence token offsets as a list) for every document."""
    for shard_index, shard in enumerate(shards.shards):
        bounds, offsets = shard.document_offsets.tolist(), shard.sentence_offsets
        first = int(shards.document_starts[shard_index])
        for local in range(shard.num_documents):
            yield shard_index, first + local, offsets[bounds[local]:bounds[local + 1] + 1].tolist()


def packed_plan(shards: TokenShards, max_length: int) -> np.ndarray:
    """Whole sentences of each document packed greedily up to max_length - 2 tokens (RoBERTa DOC-SENTENCES)."""
    budget, out = max_length - 2, _Columns()
    for shard, _, ends in _document_sentences(shards):
        start = end = ends[0]  # the open chunk is tokens[start:end]
        for boundary in ends[1:]:
            if boundary - start <= budget:
                end = boundary
                continue
            if end > start:
                out.add(shard, start, end - start)
                start = end
            while boundary - start > budget:  # a sentence longer than a sequence: cut it into full pieces
                out.add(shard, start, budget)
                start += budget
            end = boundary
        if end > start:
            out.add(shard, start, end - start)
    return out.to_plan()


def pair_plan(shards: TokenShards, objective: str, max_length: int, short_seq_prob: float,
              rng: random.Random) -> np.ndarray:
    """Segment pairs of every document for "nsp" or "sop" (see the module docstring)."""
    out = _Columns()
    pairs = _PairMaker(shards, objective, max_length - 2 - len(shards.pair_middle_ids), short_seq_prob, rng, out)
    for shard, document, ends in _document_sentences(shards):
        pairs.document(shard, document, ends)
    return out.to_plan()


class _PairMaker:
    """create_instances_from_document, over sentence offsets instead of token lists."""

    def __init__(self, shards: TokenShards, objective: str, max_tokens: int, short_seq_prob: float,
                 rng: random.Random, out: _Columns):
        self.shards, self.objective, self.max_tokens = shards, objective, max_tokens
        self.short_seq_prob, self.rng, self.out = short_seq_prob, rng, out
        # Per split-wide document: its shard and sentence range, as lists (a random B is drawn ~once an example)
        self.document_shard = np.repeat(np.arange(len(shards.shards)), np.diff(shards.document_starts)).tolist()
        self.sentence_bounds = [s.document_offsets.tolist() for s in shards.shards]
        self.document_local = (np.arange(shards.num_documents) - shards.document_starts[self.document_shard]).tolist()

    def target_length(self) -> int:
        """max_tokens, or with probability short_seq_prob a uniform length in [2, max_tokens]: pretraining
        on some short sequences narrows the gap to short fine-tuning inputs (BERT's comment on this)."""
        return self.rng.randint(2, self.max_tokens) if self.rng.random() < self.short_seq_prob else self.max_tokens

    def document(self, shard: int, document: int, ends: list[int]) -> None:
        """Add the pairs of one document; `ends` are its k+1 sentence token offsets."""
        count, rng = len(ends) - 1, self.rng
        target, first, i = self.target_length(), 0, 0
        while i < count:
            if i == count - 1 or ends[i + 1] - ends[first] >= target:
                segments = i - first + 1
                a_end = first + (rng.randint(1, segments - 1) if segments >= 2 else 1)
                a = (shard, ends[first], ends[a_end])
                if self.objective == "nsp" and (segments == 1 or rng.random() < 0.5):
                    b, label = self.random_span(document, target - (a[2] - a[1])), 1
                    i = a_end - 1  # the unused sentences go back: the next chunk starts at a_end
                elif segments == 1:  # sop with one sentence: cut it at a random token
                    a, b = self.cut(a)
                    label = 0
                else:
                    b, label = (shard, ends[a_end], ends[i + 1]), 0
                if self.objective == "sop" and b[2] > b[1] and rng.random() < 0.5:
                    a, b, label = b, a, 1
                self.add(a, b, label if b[2] > b[1] else -1)
                first, target = i + 1, self.target_length()
            i += 1

    def random_span(self, document: int, target_b: int) -> tuple[int, int, int]:
        """Sentences of a random other document from a random one on, up to target_b tokens (one at least)."""
        other = self.rng.randrange(self.shards.num_documents - 1)
        other += other >= document  # uniform over the other documents, no retry loop
        shard = self.document_shard[other]
        bounds, local = self.sentence_bounds[shard], self.document_local[other]
        low, high = bounds[local], bounds[local + 1]  # the document's sentences
        first = self.rng.randrange(low, high)
        offsets = self.shards.shards[shard].sentence_offsets
        start = int(offsets[first])
        last = min(max(int(offsets.searchsorted(start + target_b)), first + 1), high)
        return shard, start, int(offsets[last])

    def cut(self, span: tuple[int, int, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """A span split at a random inner token into two non-empty halves (unchanged if one token long)."""
        shard, start, end = span
        if end - start < 2:
            return span, (shard, end, end)
        middle = self.rng.randint(start + 1, end - 1)
        return (shard, start, middle), (shard, middle, end)

    def add(self, a: tuple[int, int, int], b: tuple[int, int, int], label: int) -> None:
        """Trim the pair to max_tokens as truncate_seq_pair does, then add it."""
        (a_shard, a_start, a_end), (b_shard, b_start, b_end) = a, b
        cut_a, cut_b = trim_lengths(a_end - a_start, b_end - b_start, self.max_tokens)
        # truncate_seq_pair drops each token from the front or the back with probability 1/2: the number
        # from the front is Binomial(cut, 1/2), the popcount of `cut` random bits.
        front_a, front_b = self.rng.getrandbits(cut_a).bit_count(), self.rng.getrandbits(cut_b).bit_count()
        self.out.add(a_shard, a_start + front_a, a_end - a_start - cut_a,
                     b_shard, b_start + front_b, b_end - b_start - cut_b, label)


def trim_lengths(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Tokens to drop from A and B to fit max_tokens, longer first (B on a tie): truncate_seq_pair in closed form."""
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return 0, 0
    first = min(excess, abs(len_a - len_b))  # until the two are equal, only the longer one shrinks
    rest = excess - first  # then they alternate, B first
    return (first if len_a > len_b else 0) + rest // 2, (first if len_a <= len_b else 0) + rest - rest // 2
