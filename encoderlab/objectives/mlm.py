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

import torch
import torch.nn.functional as F

from encoderlab.checkpoint import load_model, resolve_model_path
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.nn.model import IGNORE_INDEX, EncoderModel, MaskedLMModel, ModelOutput, PreTrainingModel
from encoderlab.objectives.base import Counts, Objective, check_vocabulary
from encoderlab.tokenizer import Tokenizer


def model_config(cfg, tokenizer: Tokenizer) -> EncoderConfig:
    """The recipe's preset sized to the tokenizer's vocabulary, rounded up to pad_vocab_multiple (or init_from's
    architecture), with the recipe's overrides."""
    rows = -(-tokenizer.vocab_size // cfg.pad_vocab_multiple) * cfg.pad_vocab_multiple
    config = cfg.encoder_config(vocab_size=rows, pad_token_id=tokenizer.pad_id)
    source = f"init_from {cfg.init_from!r}" if cfg.init_from else f"preset {cfg.preset!r}"
    if cfg.init_from and tokenizer.pad_id != config.pad_token_id:
        raise ConfigError(f"the data's tokenizer pads with id {tokenizer.pad_id}, {source} with "
                          f"{config.pad_token_id}: prepare the data with `encoderlab prepare --tokenizer {cfg.init_from}`")
    if tokenizer.vocab_size > config.vocab_size:
        raise ConfigError(f"the data's tokenizer has {tokenizer.vocab_size:,} tokens, more than the "
                          f"{config.vocab_size:,} of {source}")
    if cfg.max_length > config.max_tokens:
        raise ConfigError(f"max_length {cfg.max_length} exceeds the positions of {source} "
                          f"(max_position_embeddings {config.max_position_embeddings})")
    return config


def mlm_correct(out: ModelOutput) -> torch.Tensor:
    """Correct argmax predictions of a masked LM's logits (N, V) at its N labelled positions."""
    return (out.logits.argmax(-1) == out.targets).sum()


def mlm_metrics(sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
    """MLM loss and accuracy per masked token."""
    masked = max(counts["masked"], 1.0)
    return {"mlm_loss": sums["mlm_loss"] / masked, "mlm_accuracy": sums["mlm_correct"] / masked}


class MaskedLanguageModeling(Objective):
    """MLM (MaskedLMModel) or MLM + NSP/SOP (PreTrainingModel), one model; optionally a frozen anchor encoder."""

    def __init__(self, model: MaskedLMModel | PreTrainingModel, anchor: EncoderModel | None = None,
                 anchor_weight: float = 1.0, anchor_layers: str = "last") -> None:
        super().__init__()
        self.model, self.anchor_weight, self.anchor_all = model, anchor_weight, anchor_layers == "all"
        self.anchor = None if anchor is None else anchor.requires_grad_(False).eval()

    def train(self, mode: bool = True) -> "MaskedLanguageModeling":
        super().train(mode)
        if self.anchor is not None:
            self.anchor.eval()  # its dropout stays off: the target must not be noisy
        return self

    def counts(self, batch: dict[str, torch.Tensor]) -> Counts:
        out = super().counts(batch)
        if self.anchor is not None:  # the anchored tokens: real and not selected for prediction
            out["anchored"] = out["tokens"] - out["masked"]
        return out

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        labels, pair_labels = batch["labels"], batch.get("next_sentence_label")
        flags = {} if pair_labels is None else {"next_sentence_label": pair_labels}
        if self.anchor is not None and self.anchor_all:
            flags["output_hidden_states"] = True
        out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels, **flags)
        mlm_sum = out.sums["mlm"][0]
        loss = mlm_sum / counts["masked"]
        sums = {"mlm_loss": mlm_sum.detach(), "mlm_correct": mlm_correct(out)}
        if pair_labels is not None:
            nsp_sum = out.sums["nsp"][0]  # per sequence: the step's sequences, unlabelled pairs included
            loss = loss + nsp_sum / counts["sequences"]
            sums["nsp_loss"] = nsp_sum.detach()
            sums["nsp_correct"] = (out.nsp_logits.argmax(-1) == pair_labels).sum()
        if self.anchor is not None:
            with torch.no_grad():
                target = self.anchor.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                                            output_hidden_states=self.anchor_all)
            pairs = (zip(out.hidden_states, target.hidden_states) if self.anchor_all else
                     [(out.last_hidden_state, target.last_hidden_state)])
            kept = batch["attention_mask"].bool() & (labels == IGNORE_INDEX)
            cos_sums = [(1 - F.cosine_similarity(ours[kept].float(), theirs[kept].float(), dim=-1)).sum()
                        for ours, theirs in pairs]
            cos_sum = sum(cos_sums) / len(cos_sums)
            loss = loss + self.anchor_weight * cos_sum / counts["anchored"]
            sums["cos_loss"] = cos_sum.detach()
        return loss, sums

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        out = mlm_metrics(sums, counts)
        out["loss"] = out["mlm_loss"]
        if "nsp_loss" in sums:
            out["nsp_loss"] = sums["nsp_loss"] / counts["sequences"]
            out["nsp_accuracy"] = sums["nsp_correct"] / counts["sequences"]
            out["loss"] += out["nsp_loss"]
        if "cos_loss" in sums:
            out["cos_loss"] = sums["cos_loss"] / max(counts["anchored"], 1.0)
            out["loss"] += self.anchor_weight * out["cos_loss"]
        return out


def load_anchor(cfg, tokenizer: Tokenizer, config: EncoderConfig) -> EncoderModel:
    """The recipe's anchor as a bare encoder, checked to read the data's tokens and to be as wide as the model."""
    try:
        anchor = load_model(resolve_model_path(cfg.anchor), kind="base")
    except (CheckpointError, ConfigError, InputError) as err:
        raise ConfigError(f"anchor: cannot load {cfg.anchor!r} as an encoder ({err})") from None
    check_vocabulary(tokenizer, cfg.data, cfg.anchor, "anchor")
    if anchor.config.vocab_size < tokenizer.vocab_size:
        raise ConfigError(f"anchor: {cfg.anchor} has {anchor.config.vocab_size:,} token embeddings, fewer than the "
                          f"{tokenizer.vocab_size:,} tokens of the data's tokenizer")
    if anchor.config.hidden_size != config.hidden_size:
        raise ConfigError(f"anchor: {cfg.anchor}'s hidden states are {anchor.config.hidden_size} wide, the model's "
                          f"{config.hidden_size}: a cosine between them means nothing")
    if cfg.anchor_layers == "all" and anchor.config.num_layers != config.num_layers:
        raise ConfigError(f"anchor_layers all pairs the layers one to one, but {cfg.anchor} has "
                          f"{anchor.config.num_layers} layers and the model {config.num_layers}")
    return anchor


def build(cfg, tokenizer: Tokenizer) -> MaskedLanguageModeling:
    """MaskedLMModel for objective mlm; PreTrainingModel (its NSP head) for mlm+nsp and mlm+sop; the anchor if any."""
    config = model_config(cfg, tokenizer)
    model = MaskedLMModel(config) if cfg.objective == "mlm" else PreTrainingModel(config)
    anchor = load_anchor(cfg, tokenizer, config) if cfg.anchor.strip() else None
    return MaskedLanguageModeling(model, anchor, cfg.anchor_weight, cfg.anchor_layers)
