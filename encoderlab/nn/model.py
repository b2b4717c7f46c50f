"""Whole models, one per Hugging Face architecture kind: the bare encoder, masked LM, MLM+NSP (or SOP)
pretraining, and replaced-token detection (ELECTRA's discriminator).

They are shared by every family: a family changes the config and the weight-name map, not these classes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from encoderlab import checkpoint
from encoderlab.config import EncoderConfig
from encoderlab.nn.encoder import Encoder, EncoderOutput, init_weights
from encoderlab.nn.heads import MLMHead, NSPHead, Pooler, RTDHead

IGNORE_INDEX = -100  # label value of positions that carry no loss (as in torch's cross_entropy)


class Model(nn.Module):
    """Base of all models: holds the config, counts parameters, loads and saves Hugging Face folders."""

    kind: ClassVar[str]  # "base" | "mlm" | "pretraining" | "rtd": which Hugging Face class this mirrors

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """Fresh random weights, as for pretraining from scratch."""
        init_weights(self, self.config.initializer_range)

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write config.json + model.safetensors in Hugging Face's layout (atomically)."""
        checkpoint.save_pretrained(self, folder)

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **config_overrides) -> "Model":
        """Load a Hugging Face checkpoint folder (or an alias such as `minilm`) into this class."""
        return checkpoint.load_model(folder, kind=cls.kind, **config_overrides)


class EncoderModel(Model):
    """The bare encoder (HF `BertModel`): token ids -> hidden states, plus the [CLS] pooler if present."""

    kind = "base"

    def __init__(self, config: EncoderConfig, pooler: bool | None = None) -> None:
        """pooler: whether to build the [CLS] pooler (a checkpoint may lack it); by default, config.pooler."""
        super().__init__(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config.hidden_size) if (config.pooler if pooler is None else pooler) else None
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> EncoderOutput:
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        if self.pooler is not None:
            out.pooled = self.pooler(out.last_hidden_state)
        return out


@dataclass
class MLMOutput:
    """logits: (B, T, V) without labels; (N, V) over the N labelled positions with labels.

    The loss is computed when first read: a training loop that takes its own loss from the logits
    (a sum normalised over the whole step) does not pay for a second cross-entropy over (N, V).
    """

    logits: torch.Tensor
    hidden: EncoderOutput | None = None
    targets: torch.Tensor | None = None  # (N,) labels of the labelled positions, when labels were given

    @cached_property
    def loss(self) -> torch.Tensor | None:
        """Mean cross-entropy over the labelled positions, or None without labels."""
        return None if self.targets is None else F.cross_entropy(self.logits.float(), self.targets)


class MaskedLMModel(Model):
    """Encoder + MLM head (HF `BertForMaskedLM`).

    Given labels, the vocabulary decoder runs only on the labelled (masked) positions: with 15% masking
    that skips 85% of the largest matmul in the model.
    """

    kind = "mlm"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.mlm = MLMHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> MLMOutput:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        logits, targets = _mlm_logits(self.mlm, self.encoder, hidden.last_hidden_state, labels)
        return MLMOutput(logits, hidden, targets)


@dataclass
class PreTrainingOutput:
    """MLM logits as in MLMOutput, NSP logits (B, 2), and the losses (computed when first read) of the labels given."""

    mlm_logits: torch.Tensor
    nsp_logits: torch.Tensor
    mlm_targets: torch.Tensor | None = None  # (N,) as MLMOutput.targets
    nsp_labels: torch.Tensor | None = None  # (B,)

    @cached_property
    def mlm_loss(self) -> torch.Tensor | None:
        """Mean cross-entropy over the masked positions, or None without MLM labels."""
        return None if self.mlm_targets is None else F.cross_entropy(self.mlm_logits.float(), self.mlm_targets)

    @cached_property
    def nsp_loss(self) -> torch.Tensor | None:
        """Mean cross-entropy of next-sentence prediction, or None without its labels."""
        return None if self.nsp_labels is None else F.cross_entropy(self.nsp_logits, self.nsp_labels)

    @property
    def loss(self) -> torch.Tensor | None:
        """MLM + NSP loss over the labels given, or None without any."""
        losses = [loss for loss in (self.mlm_loss, self.nsp_loss) if loss is not None]
        return sum(losses) if losses else None


class PreTrainingModel(Model):
    """Encoder + pooler + MLM head + NSP head (HF `BertForPreTraining`); loss = MLM + NSP."""

    kind = "pretraining"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config.hidden_size)
        self.mlm = MLMHead(config)
        self.nsp = NSPHead(config.hidden_size)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None) -> PreTrainingOutput:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state
        mlm_logits, mlm_targets = _mlm_logits(self.mlm, self.encoder, hidden, labels)
        nsp_logits = self.nsp(self.pooler(hidden))
        return PreTrainingOutput(mlm_logits, nsp_logits, mlm_targets, next_sentence_label)


@dataclass
class RTDOutput:
    """Replaced-token logits (B, T) and, with labels, the mean binary cross-entropy over the real tokens."""

    logits: torch.Tensor
    labels: torch.Tensor | None = None  # (B, T): 1 replaced, 0 original, IGNORE_INDEX on padding
    hidden: EncoderOutput | None = None

    @cached_property
    def loss(self) -> torch.Tensor | None:
        """Mean binary cross-entropy over the labelled tokens, or None without labels."""
        if self.labels is None:
            return None
        real = self.labels != IGNORE_INDEX
        return F.binary_cross_entropy_with_logits(self.logits[real].float(), self.labels[real].float())


class ReplacedTokenDetector(Model):
    """Encoder + ELECTRA's discriminator head (HF `ElectraForPreTraining`): is each token the original?"""

    kind = "rtd"

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.rtd = RTDHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> RTDOutput:
        hidden = self.encoder(input_ids, attention_mask, token_type_ids)
        return RTDOutput(self.rtd(hidden.last_hidden_state), labels, hidden)


def _mlm_logits(head: MLMHead, encoder: Encoder, hidden: torch.Tensor,
                labels: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full logits (B, T, V) without labels; with labels, logits (N, V) and targets (N,) of the labelled positions."""
    word_embeddings = encoder.embeddings.word.weight
    if labels is None:
        return head(hidden, word_embeddings), None
    selected = labels != IGNORE_INDEX  # (B, T)
    return head(hidden[selected], word_embeddings), labels[selected]


# checkpoint.load_model builds these kinds by name; they are registered there (checkpoint sits below nn).
MODEL_CLASSES = checkpoint.MODEL_CLASSES
MODEL_CLASSES.update({cls.kind: cls for cls in (EncoderModel, MaskedLMModel, PreTrainingModel, ReplacedTokenDetector)})
