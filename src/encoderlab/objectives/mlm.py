"""Masked language modelling, alone (BERT, RoBERTa) or with a sentence-pair task: NSP (BERT) or SOP (ALBERT).

The loss is the cross-entropy summed over masked tokens divided by the step's masked-token count, plus the
pair task's cross-entropy divided by the step's sequence count (Devlin et al. 2019, appendix A.2: the sum of
the two means). With an anchor (continued pretraining that should not wander far from a good encoder), plus
anchor_weight x the mean over the real tokens not selected for prediction of 1 - cos(ours, the anchor's) of
the last hidden states (anchor_layers "all": of every hidden state, averaged over them), the frozen anchor
reading the same corrupted batch. The selected tokens are left to the MLM loss: the anchor never learnt to
predict them, so its vectors there are no target.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from encoderlab.checkpoint import load_model, resolve_model_path
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.nn.model import IGNORE_INDEX, EncoderModel, MaskedLMModel, ModelOutput, PreTrainingModel
from encoderlab.nn.output import Counts, step_means
from encoderlab.objectives.base import ModelChoice, Objective, ObjectiveSpec, check_vocabulary
from encoderlab.tokenizer import Tokenizer


ANCHOR_LAYERS = ("last", "all")


@dataclass
class MLMOptions:
    """The mlm objectives' own options (mlm, mlm+nsp, mlm+sop): an optional frozen anchor."""

    anchor: str = ""
    """A checkpoint folder or alias (usually init_from's) whose last hidden states the model is kept near, a
    frozen copy reading the same batch: anchor_weight x (1 - cosine) over the real tokens not selected for
    prediction is added to the loss, so that adaptation does not wander far from an encoder that was already good
    (DistilBERT's cosine loss, Sanh et al. 2019, used against the starting model, as in Li & Hoiem 2016,
    "Learning without Forgetting"). Empty: plain MLM."""
    anchor_weight: float = 1.0
    """With an anchor: the weight of its cosine loss beside the MLM loss."""
    anchor_layers: str = "last"
    """With an anchor: last (the last hidden states) or all (every hidden state, the embeddings' and each layer's,
    the cosine averaged over them; the anchor must have as many layers as the model)."""

    def validate(self, config: EncoderConfig, source: str) -> None:
        """Raise ConfigError naming the first bad option."""
        if not self.anchor.strip():
            return
        if not self.anchor_weight > 0:
            raise ConfigError(f"anchor_weight must be positive, got {self.anchor_weight}")
        if self.anchor_layers not in ANCHOR_LAYERS:
            raise ConfigError(f"anchor_layers must be one of {ANCHOR_LAYERS}, got {self.anchor_layers!r}")


def mlm_correct(out: ModelOutput) -> torch.Tensor:
    """Correct argmax predictions of a masked LM's logits (N, V) at its N labelled positions."""
    return (out.logits.argmax(-1) == out.targets).sum()


def mlm_metrics(sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
    """MLM loss and accuracy per masked token."""
    masked = max(counts["masked"], 1.0)
    return {"mlm_loss": sums["mlm_loss"] / masked, "mlm_accuracy": sums["mlm_correct"] / masked}


def anchored(counts: Counts | dict[str, float]) -> torch.Tensor | float:
    """The anchored tokens of a step: real and not selected for prediction (at least 1)."""
    count = counts["tokens"] - counts["masked"]
    return count.clamp(min=1) if isinstance(count, torch.Tensor) else max(count, 1.0)


class MaskedLanguageModeling(Objective):
    """MLM (MaskedLMModel) or MLM + NSP/SOP (PreTrainingModel), one model; optionally a frozen anchor encoder."""

    frozen = ("anchor",)

    def __init__(self, model: MaskedLMModel | PreTrainingModel, anchor: EncoderModel | None = None,
                 anchor_weight: float = 1.0, anchor_layers: str = "last") -> None:
        super().__init__()
        self.model, self.anchor_weight, self.anchor_all = model, anchor_weight, anchor_layers == "all"
        self.anchor = None if anchor is None else anchor.requires_grad_(False).eval()

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels, pair_labels = batch["labels"], batch.get("next_sentence_label")
        flags = {} if pair_labels is None else {"next_sentence_label": pair_labels}
        if self.anchor is not None and self.anchor_all:
            flags["output_hidden_states"] = True
        if self.mask_budget is not None:
            flags["masked_budget"] = self.mask_budget.positions(*labels.shape)
        out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels, **flags)
        loss = sum(step_means(out.sums, counts).values())  # MLM per masked token, NSP per labelled pair
        sums = {"mlm_loss": out.sums["mlm"].total.detach(), "mlm_correct": mlm_correct(out)}
        if pair_labels is not None:
            sums["nsp_loss"] = out.sums["nsp"].total.detach()
            sums["nsp_correct"] = (out.nsp_logits.argmax(-1) == pair_labels).sum()
        if self.anchor is not None:
            with torch.no_grad():
                target = self.anchor.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                            output_hidden_states=self.anchor_all)
            pairs = (zip(out.hidden_states, target.hidden_states) if self.anchor_all else
                     [(out.last_hidden_state, target.last_hidden_state)])
            kept = batch["attention_mask"].bool() & (labels == IGNORE_INDEX)  # (B, T): weights, not an index (no sync)
            cos_sums = [((1 - F.cosine_similarity(ours.float(), theirs.float(), dim=-1)) * kept).sum()
                        for ours, theirs in pairs]
            cos_sum = sum(cos_sums) / len(cos_sums)
            loss = loss + self.anchor_weight * cos_sum / anchored(counts)
            sums["cos_loss"] = cos_sum.detach()
        return loss, sums

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        out = mlm_metrics(sums, counts)
        out["loss"] = out["mlm_loss"]
        if "nsp_loss" in sums:
            pairs = max(counts["pairs"], 1.0)
            out["nsp_loss"] = sums["nsp_loss"] / pairs
            out["nsp_accuracy"] = sums["nsp_correct"] / pairs
            out["loss"] += out["nsp_loss"]
        if "cos_loss" in sums:
            out["cos_loss"] = sums["cos_loss"] / anchored(counts)
            out["loss"] += self.anchor_weight * out["cos_loss"]
        return out


def load_anchor(options: MLMOptions, tokenizer: Tokenizer, config: EncoderConfig, data: str) -> EncoderModel:
    """The anchor as a bare encoder, checked to read the data's tokens and to be as wide as the model."""
    name = options.anchor
    try:
        anchor = load_model(resolve_model_path(name), kind="base")
    except (CheckpointError, ConfigError, InputError) as err:
        raise ConfigError(f"anchor: cannot load {name!r} as an encoder ({err})") from None
    check_vocabulary(tokenizer, data, name, "anchor")
    if anchor.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"anchor: {name} has {anchor.config.vocab_size:,} token embeddings, fewer than the "
                          f"{tokenizer.vocab_size:,} tokens of the data's tokenizer")
    if anchor.config.hidden_size != config.hidden_size:
        raise ConfigError(f"anchor: {name}'s hidden states are {anchor.config.hidden_size} wide, the model's "
                          f"{config.hidden_size}: a cosine between them means nothing")
    if options.anchor_layers == "all" and anchor.config.num_layers != config.num_layers:
        raise ConfigError(f"anchor_layers all pairs the layers one to one, but {name} has "
                          f"{anchor.config.num_layers} layers and the model {config.num_layers}")
    return anchor


def build(options: MLMOptions, model: ModelChoice, tokenizer: Tokenizer, data: str, max_length: int,
          pair_head: bool = False) -> MaskedLanguageModeling:
    """MaskedLMModel, or PreTrainingModel (its NSP head) for mlm+nsp and mlm+sop; the anchor if any."""
    config = model.sized(tokenizer, max_length)
    trained = PreTrainingModel(config) if pair_head else MaskedLMModel(config)
    anchor = load_anchor(options, tokenizer, config, data) if options.anchor.strip() else None
    return MaskedLanguageModeling(trained, anchor, options.anchor_weight, options.anchor_layers)


SPECS = (ObjectiveSpec("mlm", MLMOptions, build),  # packed sequences, RoBERTa-style
         ObjectiveSpec("mlm+nsp", MLMOptions, partial(build, pair_head=True), "nsp", pair_head=True),  # BERT
         ObjectiveSpec("mlm+sop", MLMOptions, partial(build, pair_head=True), "sop", pair_head=True))  # ALBERT
