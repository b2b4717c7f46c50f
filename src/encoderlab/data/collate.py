"""MaskingCollator: pad examples into a batch and mask it for MLM, with fresh masks on every call.

BERT's recipe (Devlin et al., 2019, section 3.1, appendix A.1): of the mlm_probability chosen tokens, 80% become
[MASK], 10% a random token, 10% stay; predict the originals. Tokens are chosen independently (as transformers'
DataCollatorForLanguageModeling). With whole_word, each word is drawn as a unit and all its tokens masked (BERT's
whole-word-masking release), the 80/10/10 choice per token; words come from prepare's word-start flags.

Pretraining masks each example with its own generator (seeded from the example's position in the data, so a batch
does not depend on which rank, micro-batch or restart built it). `seeded` builds such a batch in one pass: it draws
each example's numbers exactly as `__call__` on that example alone would (the same calls on the same generator
state), then pads and masks the whole batch with array operations; the result is bit for bit what masking the
examples one by one and padding them gives, about 10x faster (`python bench/data_pipeline.py`).

An example of L real tokens carries at most `MaskBudget.per_row(L)` predictions (1.5 x the expected count, plus 8):
the rare draw above that keeps its first ones, so a batch's predictions fit a size known from its shape alone and
the MLM head runs on a fixed number of rows, with no host synchronisation and no graph break (BERT caps its
predictions the same way, max_predictions_per_seq in google-research/bert's create_pretraining_data.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

import torch

from encoderlab.data.examples import Example
from encoderlab.engine import pad, pad_batch
from encoderlab.errors import ConfigError
from encoderlab.nn.output import IGNORE_INDEX

MASK_FRACTION, RANDOM_FRACTION = 0.8, 0.1  # of the chosen tokens; the remaining 0.1 stay unchanged
# The per-example cap on predictions is BUDGET_FACTOR x the expected count + BUDGET_SLACK: at p = 0.15 a row of 128
# tokens may hold 37 against 19.2 expected, about 4 standard deviations of token-level draws above the mean.
BUDGET_FACTOR, BUDGET_SLACK = 1.5, 8


@dataclass(frozen=True)
class MaskBudget:
    """How many predicted positions an example, and so a batch, may hold at a masking probability."""

    probability: float

    def per_row(self, lengths: torch.Tensor) -> torch.Tensor:
        """(B,) real lengths -> (B,) the most predictions each row keeps: min(L, ceil(1.5 p L) + 8)."""
        budget = torch.ceil(lengths.double() * (BUDGET_FACTOR * self.probability)).long() + BUDGET_SLACK
        return torch.minimum(budget, lengths.long())

    def positions(self, batch_size: int, length: int) -> int:
        """The predicted positions a (batch_size, length) batch may hold: a bound from its shape alone, in plain
        Python (no tensor, so nothing to synchronise); float64 as per_row, so the two agree to the token."""
        return batch_size * min(length, math.ceil(length * (BUDGET_FACTOR * self.probability)) + BUDGET_SLACK)


class MaskingCollator:
    """Examples -> {input_ids, attention_mask, token_type_ids, labels[, next_sentence_label]}, all (B, T) long
    but next_sentence_label (B,); all randomness from the generator passed in."""

    def __init__(self, vocab_size: int, mask_id: int, pad_id: int, special_ids: Iterable[int],
                 mlm_probability: float = 0.15, whole_word: bool = False, pad_to_multiple_of: int | None = 8):
        if not 0 < mlm_probability <= 1:
            raise ConfigError(f"mlm_probability={mlm_probability}: expected a probability in (0, 1]")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of={pad_to_multiple_of}: expected a positive integer or None")
        special = sorted(set(special_ids) | {mask_id, pad_id})
        if not all(0 <= i < vocab_size for i in special):
            raise ConfigError(f"special ids {special} must lie in [0, vocab_size={vocab_size})")
        self.vocab_size, self.mask_id, self.pad_id = vocab_size, mask_id, pad_id
        self.mlm_probability, self.whole_word, self.pad_to_multiple_of = mlm_probability, whole_word, pad_to_multiple_of
        self.budget = MaskBudget(mlm_probability)
        self.special_ids = torch.tensor(special, dtype=torch.long)
        ordinary = torch.ones(vocab_size, dtype=torch.bool)
        ordinary[self.special_ids] = False
        self.random_ids = ordinary.nonzero().squeeze(1)  # random replacements are never special tokens
        if not len(self.random_ids):
            raise ConfigError(f"vocab_size={vocab_size}: no ordinary token to use as a random replacement")

    def __call__(self, examples: list[Example], generator: torch.Generator) -> dict[str, torch.Tensor]:
        """A padded batch with masks drawn from `generator`."""
        batch, word_starts = self.pad(examples)
        batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"], batch["attention_mask"], word_starts,
                                                        generator)
        labels = [e.next_sentence_label for e in examples]
        if any(label >= 0 for label in labels):
            batch["next_sentence_label"] = torch.tensor([label if label >= 0 else IGNORE_INDEX for label in labels])
        return batch

    def pad(self, examples: list[Example]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Right-pad to the longest example (rounded up to pad_to_multiple_of); also (B, T) bool word starts."""
        if not examples:
            raise ConfigError("cannot collate an empty list of examples")
        batch = pad_batch([e.input_ids for e in examples], [e.token_type_ids for e in examples], self.pad_id,
                          self.pad_to_multiple_of)
        # A pad is its own word.
        return batch, pad([e.word_starts for e in examples], True, self.pad_to_multiple_of, dtype=bool)

    def seeded(self, examples: Sequence[Example], seeds: Sequence[int], length: int | None = None,
               multiple_of: int = 8) -> dict[str, torch.Tensor]:
        """A padded batch in which example i is masked as `self([examples[i]], torch.Generator().manual_seed(
        seeds[i]))` masks it alone; padded to the longest example rounded up to multiple_of, or to `length`."""
        if not examples:
            raise ConfigError("cannot collate an empty list of examples")
        lengths = np.fromiter((len(e.input_ids) for e in examples), np.int64, len(examples))
        T = -(-int(lengths.max()) // multiple_of) * multiple_of if length is None else length
        if lengths.max() > T:
            raise ConfigError(f"an example of {lengths.max()} tokens does not fit a batch of length {T}")
        real = np.arange(T) < lengths[:, None]  # (B, T)
        draws, action, replace = self._draws(lengths, seeds, real)

        def lay(values: list[np.ndarray], fill: object, dtype: type) -> torch.Tensor:
            out = np.full(real.shape, fill, dtype)
            out[real] = np.concatenate(values)
            return torch.from_numpy(out)

        batch = {"input_ids": lay([e.input_ids for e in examples], self.pad_id, np.int64),
                 "attention_mask": torch.from_numpy(real.astype(np.int64)),
                 "token_type_ids": lay([e.token_type_ids for e in examples], 0, np.int64)}
        word_starts = lay([e.word_starts for e in examples], True, bool)  # a pad is its own word
        batch["input_ids"], batch["labels"] = self.apply(batch["input_ids"], batch["attention_mask"], word_starts,
                                                         draws, action, replace)
        labels = [e.next_sentence_label for e in examples]
        if any(label >= 0 for label in labels):
            batch["next_sentence_label"] = torch.tensor([label if label >= 0 else IGNORE_INDEX for label in labels])
        return batch

    def _draws(self, lengths: np.ndarray, seeds: Sequence[int], real: np.ndarray) -> tuple[torch.Tensor, ...]:
        """Each example's (choice, action, replacement) draws from its own seed, as mask() draws them for a
        (1, L) batch (one call for both uniforms: the generator fills them in sequence), laid out (B, T)."""
        generator, uniforms, replacements = torch.Generator(), [], []
        for length, seed in zip(lengths.tolist(), seeds):
            generator.manual_seed(seed)
            uniforms.append(torch.rand((2, length), generator=generator))
            replacements.append(torch.randint(len(self.random_ids), (length,), generator=generator))
        mask = torch.from_numpy(real)
        draws, action = torch.ones(real.shape), torch.ones(real.shape)
        replace = torch.zeros(real.shape, dtype=torch.long)
        draws[mask] = torch.cat([u[0] for u in uniforms])
        action[mask] = torch.cat([u[1] for u in uniforms])
        replace[mask] = torch.cat(replacements)
        return draws, action, replace

    def mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, word_starts: torch.Tensor,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids -> (masked ids, labels): labels hold the original id where a token was chosen, else -100."""
        draws = torch.rand(input_ids.shape, generator=generator)  # (B, T): one per token, or per word slot
        action = torch.rand(input_ids.shape, generator=generator)  # (B, T)
        replace = torch.randint(len(self.random_ids), input_ids.shape, generator=generator)
        return self.apply(input_ids, attention_mask, word_starts, draws, action, replace)

    def within_budget(self, chosen: torch.Tensor, attention_mask: torch.Tensor,
                      words: torch.Tensor | None) -> torch.Tensor:
        """(B, T) chosen tokens cut to each row's first ones (whole words, given words) within its budget."""
        count = chosen.long().cumsum(1)  # (B, T) chosen so far
        if words is not None:  # a word is kept whole or dropped whole: compare the count at its last token
            count = torch.zeros_like(count).scatter_reduce(1, words, count, "amax").gather(1, words)
        return chosen & (count <= self.budget.per_row(attention_mask.sum(1))[:, None])

    def apply(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, word_starts: torch.Tensor,
              draws: torch.Tensor, action: torch.Tensor, replace: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask (B, T) ids with given uniform draws (choice, 80/10/10 action) and replacement indices (B, T)."""
        maskable = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids)  # (B, T)
        if self.whole_word:
            words = (word_starts.long().cumsum(1) - 1).clamp(min=0)  # (B, T) each token's word; a row has <= T words
            chosen = (draws < self.mlm_probability).gather(1, words) & maskable
        else:
            words, chosen = None, (draws < self.mlm_probability) & maskable
        chosen = self.within_budget(chosen, attention_mask, words)
        labels = torch.where(chosen, input_ids, IGNORE_INDEX)
        replacements = self.random_ids[replace]
        masked = torch.where(chosen & (action < MASK_FRACTION), self.mask_id, input_ids)
        randomized = chosen & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
        return torch.where(randomized, replacements, masked), labels
