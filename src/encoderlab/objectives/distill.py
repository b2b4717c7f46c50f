"""Distillation (DistilBERT, Sanh et al. 2019, arXiv:1910.01108): a student with half the teacher's layers
learns from a frozen teacher's soft predictions.

Loss (section 2), each term normalised by the step's count of the tokens it covers:
  alpha_ce  x T^2 x KL(teacher_T || student_T) over the masked positions, softmaxes at temperature T
            (the T^2 keeps the gradient's scale independent of T; Hinton et al. 2015, section 2);
+ alpha_mlm x the student's MLM cross-entropy over the masked positions;
+ alpha_cos x (1 - cos(student, teacher)) of the last hidden states over the real tokens.
KL differs from the soft cross-entropy only by the teacher's entropy, a constant: the gradients are equal.
Defaults T = 2, alpha_ce 5, alpha_mlm 2, alpha_cos 1 are those of transformers' distillation example
(examples/research_projects/distillation: README training command; train.py's --temperature default).

The student (section 3) is a `distilbert` model with the teacher's widths and half its layers, without token
types or pooler, initialised by "taking one layer out of two" from the teacher (layers 0, 2, 4, ...), and the
teacher's embeddings (minus token types) and MLM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from encoderlab.checkpoint import load_model, resolve_model_path
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.nn.model import MaskedLMModel
from encoderlab.nn.output import Counts, LossTerm, step_means
from encoderlab.objectives.base import ModelChoice, Objective, ObjectiveSpec, check_vocabulary
from encoderlab.objectives.mlm import mlm_correct, mlm_metrics
from encoderlab.tokenizer import Tokenizer

# Teacher fields a DistilBERT student copies; the teacher's other switches must be BERT's (checked in student_config).
_COPIED = ("vocab_size", "hidden_size", "num_heads", "intermediate_size", "hidden_act", "max_position_embeddings",
           "pad_token_id", "layer_norm_eps")


@dataclass
class DistillOptions:
    """distill's own options (DistilBERT, Sanh et al. 2019): the teacher and the weights of the three terms."""

    teacher: str = ""
    """Checkpoint folder or alias of the teacher, a BERT-like masked LM over the data's vocabulary."""
    temperature: float = 2.0
    """Softmax temperature of the soft targets (transformers' distillation example)."""
    alpha_ce: float = 5.0
    """Weight of T^2 x KL(teacher || student) over the masked tokens."""
    alpha_mlm: float = 2.0
    """Weight of the student's MLM loss."""
    alpha_cos: float = 1.0
    """Weight of the cosine loss between the last hidden states."""

    def validate(self, config: EncoderConfig, source: str) -> None:
        """Raise ConfigError naming the first bad option, or a student that is not a distilbert model."""
        if not self.teacher.strip():
            raise ConfigError("teacher is required for objective distill: a checkpoint folder or alias of a "
                              "BERT-like masked LM (e.g. a run's model/ folder)")
        if config.model_type != "distilbert":
            raise ConfigError(f"objective distill trains a distilbert student; {source} is {config.model_type}: "
                              f"use a distilbert-* preset")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be positive, got {self.temperature}")
        weights = {"alpha_ce": self.alpha_ce, "alpha_mlm": self.alpha_mlm, "alpha_cos": self.alpha_cos}
        if any(w < 0 for w in weights.values()) or not any(weights.values()):
            raise ConfigError(f"alpha_ce, alpha_mlm and alpha_cos must be >= 0, not all 0; got {weights}")


class Distillation(Objective):
    """A student MaskedLMModel and a frozen teacher MaskedLMModel (kept in eval mode, never given gradients)."""

    frozen = ("teacher",)

    def __init__(self, student: MaskedLMModel, teacher: MaskedLMModel, temperature: float = 2.0,
                 alpha_ce: float = 5.0, alpha_mlm: float = 2.0, alpha_cos: float = 1.0) -> None:
        super().__init__()
        self.student, self.teacher = student, teacher.requires_grad_(False).eval()
        self.temperature, self.alpha_ce, self.alpha_mlm, self.alpha_cos = temperature, alpha_ce, alpha_mlm, alpha_cos

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        input_ids, attention_mask, token_type_ids, labels = (batch[k] for k in ("input_ids", "attention_mask",
                                                                                "token_type_ids", "labels"))
        student = self.student(input_ids, attention_mask, None, labels)  # logits (N, V)
        with torch.no_grad():
            teacher = self.teacher(input_ids, attention_mask, token_type_ids, labels)
        T = self.temperature
        ce_sum = F.kl_div(F.log_softmax(student.logits.float() / T, dim=-1),
                          F.log_softmax(teacher.logits.float() / T, dim=-1), log_target=True, reduction="sum") * T * T
        mlm = student.sums["mlm"]
        real = attention_mask.bool()
        cosine = F.cosine_similarity(student.last_hidden_state[real].float(),
                                     teacher.last_hidden_state[real].float(), dim=-1)  # (R,)
        terms = {"ce": LossTerm(ce_sum, mlm.count, "masked"), "mlm": mlm,  # per masked token
                 "cos": LossTerm((1 - cosine).sum(), real.sum(), "tokens")}  # per real token
        means = step_means(terms, counts)
        loss = self.alpha_ce * means["ce"] + self.alpha_mlm * means["mlm"] + self.alpha_cos * means["cos"]
        return loss, {"ce_loss": ce_sum.detach(), "mlm_loss": mlm.total.detach(), "mlm_correct": mlm_correct(student),
                      "cos_loss": terms["cos"].total.detach()}

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        """ce_loss (T^2 KL) and MLM per masked token, cos_loss per real token; loss: their weighted sum."""
        out = mlm_metrics(sums, counts)
        out.update(ce_loss=sums["ce_loss"] / max(counts["masked"], 1.0),
                   cos_loss=sums["cos_loss"] / max(counts["tokens"], 1.0))
        out["loss"] = self.alpha_ce * out["ce_loss"] + self.alpha_mlm * out["mlm_loss"] + self.alpha_cos * out["cos_loss"]
        return out

    @property
    def model(self) -> MaskedLMModel:
        """The model saved, loaded and exported: the student (the teacher is read again from its folder on resume)."""
        return self.student


def student_config(teacher: EncoderConfig, base: EncoderConfig, num_layers: int | None, source: str) -> EncoderConfig:
    """A distilbert config (`base`: preset and recipe overrides) with the teacher's widths and num_layers layers
    (default: half the teacher's)."""
    bert_like = {"embedding_size": (None, teacher.hidden_size), "shared_layers": (False,),
                 "positions_after_pad": (False,), "absolute_positions": (True,), "relative_attention": (False,),
                 "layer_norm_eps": (base.layer_norm_eps,)}  # DistilBERT's config.json has no key for another epsilon
    for name, allowed in bert_like.items():
        if getattr(teacher, name) not in allowed:
            raise ConfigError(f"teacher: {source} ({teacher.model_type}) has {name}={getattr(teacher, name)!r}; "
                              f"a DistilBERT student needs a BERT-like teacher (expected {allowed[0]!r})")
    try:
        return base.replace(**{k: getattr(teacher, k) for k in _COPIED},
                            num_layers=num_layers or max(1, teacher.num_layers // 2))
    except ConfigError as err:
        raise ConfigError(f"teacher: {source}: a DistilBERT student cannot copy its config ({err})") from None


def init_from_teacher(student: MaskedLMModel, teacher: MaskedLMModel) -> list[int]:
    """Copy the teacher's embeddings (no token types), MLM head and evenly spaced layers into the student
    (0, 2, 4, ... at half depth: Sanh et al. 2019, section 3); returns the teacher layers taken."""
    taken = [i * teacher.config.num_layers // student.config.num_layers for i in range(student.config.num_layers)]
    with torch.no_grad():
        for name in ("word", "position", "norm"):
            getattr(student.encoder.embeddings, name).load_state_dict(getattr(teacher.encoder.embeddings, name).state_dict())
        for mine, theirs in zip(student.encoder.layers, taken):
            mine.load_state_dict(teacher.encoder.layers[theirs].state_dict())
        student.mlm.load_state_dict(teacher.mlm.state_dict())
    return taken


def load_teacher(name: str, tokenizer: Tokenizer, data: str = "the data") -> MaskedLMModel:
    """The teacher's masked LM, checked to speak the data's vocabulary."""
    try:
        teacher = load_model(resolve_model_path(name), kind="mlm")
    except (CheckpointError, ConfigError, InputError) as err:
        raise ConfigError(f"teacher: cannot load {name!r} as a masked LM ({err})") from None
    if teacher.config.vocab_size != tokenizer.vocab_size:
        raise ConfigError(f"teacher: {name} has a vocabulary of {teacher.config.vocab_size} tokens, the data's "
                          f"tokenizer {tokenizer.vocab_size}; distillation needs the same vocabulary")
    check_vocabulary(tokenizer, data, name, "teacher")
    return teacher


def build(options: DistillOptions, model: ModelChoice, tokenizer: Tokenizer, data: str,
          max_length: int) -> Distillation:
    """The teacher, and a student of half its depth initialised from it."""
    teacher = load_teacher(options.teacher, tokenizer, data)
    if model.init_from:  # continued distillation: the student is the checkpoint's (start_from loads it)
        config = model.encoder_config()
    else:
        overrides = {k: v for k, v in model.overrides.items() if k != "num_layers"}
        base = EncoderConfig.from_preset(model.preset, **overrides)
        config = student_config(teacher.config, base, model.overrides.get("num_layers"), options.teacher)
    if config.vocab_size != teacher.config.vocab_size:
        raise ConfigError(f"init_from {model.init_from}: {config.vocab_size:,} tokens, the teacher "
                          f"{teacher.config.vocab_size:,}; distillation needs the same vocabulary")
    if max_length > config.max_tokens:  # RoBERTa's 514 positions hold 512 tokens
        raise ConfigError(f"max_length {max_length} exceeds the {config.max_tokens} tokens the teacher takes "
                          f"(max_position_embeddings {config.max_position_embeddings})")
    student = MaskedLMModel(config)
    init_from_teacher(student, teacher)
    return Distillation(student, teacher, options.temperature, options.alpha_ce, options.alpha_mlm,
                        options.alpha_cos)


SPEC = ObjectiveSpec("distill", DistillOptions, build)  # packed sequences, as DistilBERT trains on
