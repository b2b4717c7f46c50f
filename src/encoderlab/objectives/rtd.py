"""Replaced-token detection (ELECTRA, Clark et al. 2020, arXiv:2003.10555), with DeBERTa-v3's
gradient-disentangled embedding sharing (He et al. 2021, arXiv:2111.09543, section 3).

A small generator (a MaskedLMModel sized by RTDOptions.generator_size and generator_layers, whose docstrings
cite the sizes) learns MLM on the masked positions. Its samples replace the masked tokens, and the discriminator
(ReplacedTokenDetector) learns, for every real token, whether it was replaced. Loss = MLM + rtd_weight x
discriminator BCE (section 2). There is no gradient through the sampling, and a sample equal to the original counts
as original (section 2).

Embedding sharing (section 3.2): `shared`: both models hold the same `encoder.embeddings` module (tables and
LayerNorm), each its own `encoder.project`, so the widths may differ; `gdes`: the discriminator's token table is
E_D = sg(E_G) + E_delta, E_delta starting at zero, so its gradient never reaches the generator's table (DeBERTa-v3,
section 3); its other embedding tables are its own.

A family without a replaced-token-detection class in transformers (DeBERTa-v2/v3) saves its discriminator as
the family's base model (XModel) plus the head (`rtd.dense`, `rtd.prediction`) in HEAD_FILE beside it; the
final export drops the head, which serves only pretraining (the released DeBERTa-v3 checkpoints hold the
encoder alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from encoderlab.checkpoint import init_from, load_weights, save_pretrained
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError
from encoderlab.io import atomic_write
from encoderlab.models import FAMILIES
from encoderlab.nn.model import IGNORE_INDEX, EncoderModel, MaskedLMModel, ReplacedTokenDetector
from encoderlab.nn.output import Counts, step_means
from encoderlab.objectives.base import ModelChoice, Objective, ObjectiveSpec
from encoderlab.objectives.mlm import mlm_correct, mlm_metrics
from encoderlab.tokenizer import Tokenizer

DELTA_FILE = "gdes_delta.safetensors"  # E_delta in a checkpoint: the folded table alone would not resume exactly
HEAD_FILE = "rtd_head.safetensors"  # the discriminator's head, for a family with no HF class that holds it
GENERATOR_FOLDER = "generator"
EMBEDDING_SHARING = ("shared", "gdes")


@dataclass
class RTDOptions:
    """rtd's own options (ELECTRA, Clark et al. 2020; DeBERTa-v3, He et al. 2021): the generator and the weighting."""

    generator_size: float = 0.25
    """The generator's width, heads and feed-forward as a fraction of the discriminator's (ELECTRA, section 3.2
    and appendix: 1/4 to 1/2 of the discriminator works best). A generator narrower than the shared embeddings
    projects them to its width, which the family's config.json must hold (ELECTRA's embedding_size; DeBERTa's
    config.json has none, so its generator keeps the full width)."""
    generator_layers: float = 1.0
    """The generator's depth as a fraction of the discriminator's (ELECTRA: 1.0, the same depth; DeBERTa-v3: 0.5 at
    full width, as in the released RTD configs of microsoft/DeBERTa, experiments/language_model)."""
    rtd_weight: float = 50.0
    """Weight of the discriminator's loss beside the generator's MLM loss (ELECTRA, section 2: lambda = 50)."""
    embedding_sharing: str = "shared"
    """shared (one embeddings module, ELECTRA) or gdes (E_D = sg(E_G) + E_delta, DeBERTa-v3 section 3)."""

    def validate(self, config: EncoderConfig, source: str) -> None:
        """Raise ConfigError naming the first bad option, or a generator the family's config.json cannot hold."""
        for name in ("generator_size", "generator_layers"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.rtd_weight <= 0:
            raise ConfigError(f"rtd_weight must be positive, got {self.rtd_weight}")
        if self.embedding_sharing not in EMBEDDING_SHARING:
            raise ConfigError(f"embedding_sharing must be one of {EMBEDDING_SHARING}, got {self.embedding_sharing!r}")
        generator = generator_config(config, self.generator_size, self.generator_layers)
        if generator.embedding_size is not None and "embedding_size" not in FAMILIES[config.model_type].hf_names:
            raise ConfigError(f"generator_size {self.generator_size} makes the generator {generator.hidden_size} wide "
                              f"beside {config.embedding_width}-wide embeddings, a projection that the config.json "
                              f"of {source} ({config.model_type}) cannot hold (no embedding_size): use "
                              f"generator_size: 1.0 and a shallower generator (generator_layers: 0.5, as "
                              f"DeBERTa-v3), or an electra-* preset")


def generator_config(config: EncoderConfig, fraction: float, depth: float = 1.0) -> EncoderConfig:
    """The generator: the discriminator's config with width, heads and feed-forward scaled by `fraction`
    (heads keep their width), layers by `depth`, and the discriminator's embedding width, so the two can share
    tables; embedding_size stays None when that width is the generator's own (no projection to save)."""
    heads = max(1, round(config.num_heads * fraction))
    hidden = heads * config.head_dim
    return config.replace(hidden_size=hidden, num_heads=heads, num_layers=max(1, round(config.num_layers * depth)),
                          intermediate_size=max(1, round(config.intermediate_size * fraction)),
                          embedding_size=None if config.embedding_width == hidden else config.embedding_width)


def has_rtd_class(config: EncoderConfig) -> bool:
    """Whether the family's transformers classes include a replaced-token detector (ElectraForPreTraining)."""
    return "rtd" in FAMILIES[config.model_type].architectures


def _backbone(discriminator: ReplacedTokenDetector) -> EncoderModel:
    """The family's base model (no pooler) around the discriminator's own encoder: saved and loaded in place."""
    with torch.device("meta"):  # its fresh encoder is replaced at once: no time spent initialising it
        backbone = EncoderModel(discriminator.config, pooler=False)
    backbone.encoder = discriminator.encoder
    return backbone


def save_discriminator(discriminator: ReplacedTokenDetector, folder: Path) -> None:
    """The discriminator as its family's RTD class, or as the base model with the head in HEAD_FILE."""
    if has_rtd_class(discriminator.config):
        save_pretrained(discriminator, folder)
        return
    save_pretrained(_backbone(discriminator), folder)
    head = {f"rtd.{k}": v.detach().cpu().contiguous() for k, v in discriminator.rtd.state_dict().items()}
    atomic_write(folder / HEAD_FILE, lambda tmp: save_file(head, tmp))


def load_discriminator(discriminator: ReplacedTokenDetector, folder: Path) -> None:
    """Load what save_discriminator wrote, in place."""
    if has_rtd_class(discriminator.config):
        load_weights(discriminator, folder)
        return
    load_weights(_backbone(discriminator), folder)
    if not (folder / HEAD_FILE).is_file():
        raise CheckpointError(f"{folder}: no {HEAD_FILE} (the discriminator's head); not an rtd checkpoint?")
    head = load_file(folder / HEAD_FILE)
    discriminator.rtd.load_state_dict({k.removeprefix("rtd."): v for k, v in head.items()})


class DisentangledWordEmbedding(nn.Module):
    """The discriminator's token table under GDES: ids (B, T) -> sg(E_G)[ids] + E_delta[ids], (B, T, E).

    It reads the generator's nn.Embedding without owning it (the generator saves and trains it). Its state
    dict holds the folded table `weight` = E_G + E_delta, so a discriminator saves as a plain model.
    """

    def __init__(self, generator_table: nn.Embedding) -> None:
        super().__init__()
        self._generator_table = (generator_table,)  # a tuple: not registered as a submodule of the discriminator
        self.delta = nn.Parameter(torch.zeros_like(generator_table.weight))
        self.padding_idx = generator_table.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        """E_D = sg(E_G) + E_delta, (V, E)."""
        return self._generator_table[0].weight.detach() + self.delta

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight, self.padding_idx)

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        destination[prefix + "weight"] = self.weight if keep_vars else self.weight.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        key = prefix + "weight"
        if key in state_dict:  # a folded table: E_delta = E_D - E_G (exact values come from DELTA_FILE)
            with torch.no_grad():
                self.delta.copy_(state_dict[key].to(self.delta) - self._generator_table[0].weight)
        elif strict:
            missing_keys.append(key)


class ReplacedTokenDetection(Objective):
    """ELECTRA's generator and discriminator, trained together; the discriminator is the model kept."""

    def __init__(self, discriminator: ReplacedTokenDetector, generator: MaskedLMModel, rtd_weight: float = 50.0,
                 embedding_sharing: str = "shared") -> None:
        super().__init__()
        self.discriminator, self.generator = discriminator, generator
        self.rtd_weight, self.embedding_sharing = rtd_weight, embedding_sharing
        if embedding_sharing == "shared":
            generator.encoder.embeddings = discriminator.encoder.embeddings
        else:
            discriminator.encoder.embeddings.word = DisentangledWordEmbedding(generator.encoder.embeddings.word)

    def forward(self, batch: dict[str, torch.Tensor], counts: Counts) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        input_ids, attention_mask, token_type_ids, labels = (batch[k] for k in ("input_ids", "attention_mask",
                                                                                "token_type_ids", "labels"))
        generated = self.generator(input_ids, attention_mask, token_type_ids, labels)  # logits (N, V)
        corrupted, replaced = _replace(input_ids, labels, generated.logits)
        real = attention_mask.bool()
        detected = self.discriminator(corrupted, attention_mask, token_type_ids,
                                      replaced.long().masked_fill(~real, IGNORE_INDEX))  # logits (B, T)
        terms = {"mlm": generated.sums["mlm"], "rtd": detected.sums["rtd"]}  # per masked token, per real token
        means = step_means(terms, counts)
        loss = means["mlm"] + self.rtd_weight * means["rtd"]
        sums = {"mlm_loss": terms["mlm"].total.detach(), "mlm_correct": mlm_correct(generated),
                "rtd_loss": terms["rtd"].total.detach(), "rtd_correct": (((detected.logits > 0) == replaced) & real).sum(),
                "replaced": replaced.sum()}
        return loss, sums

    def metrics(self, sums: dict[str, float], counts: dict[str, float]) -> dict[str, float]:
        """Generator MLM loss/accuracy per masked token; discriminator loss/accuracy per real token;
        replaced_fraction: the share of masked tokens whose sample differs from the original."""
        out = mlm_metrics(sums, counts)
        tokens = max(counts["tokens"], 1.0)
        out.update(rtd_loss=sums["rtd_loss"] / tokens, rtd_accuracy=sums["rtd_correct"] / tokens,
                   replaced_fraction=sums["replaced"] / max(counts["masked"], 1.0))
        out["loss"] = out["mlm_loss"] + self.rtd_weight * out["rtd_loss"]
        return out

    def start_from(self, name: str) -> list[str]:
        """The discriminator from the checkpoint (its head fresh where the checkpoint has none); the generator
        starts fresh, apart from the embeddings it shares with the discriminator."""
        if has_rtd_class(self.discriminator.config):
            new = init_from(self.discriminator, name)
        else:
            new = init_from(_backbone(self.discriminator), name) + [f"rtd.{k}" for k in self.discriminator.rtd.state_dict()]
        shared = "encoder.embeddings." if self.embedding_sharing == "shared" else "-"
        return [f"discriminator.{k}" for k in new] + [f"generator.{k}" for k in self.generator.state_dict()
                                                       if not k.startswith(shared)]

    def save(self, folder: Path) -> None:
        save_pretrained(self.generator, folder / GENERATOR_FOLDER)
        save_discriminator(self.discriminator, folder)
        if self.embedding_sharing == "gdes":
            delta = {"delta": self.discriminator.encoder.embeddings.word.delta.detach().cpu().contiguous()}
            atomic_write(folder / DELTA_FILE, lambda tmp: save_file(delta, tmp))

    def load(self, folder: Path) -> None:
        load_weights(self.generator, folder / GENERATOR_FOLDER)  # first: the gdes table folds in E_G
        load_discriminator(self.discriminator, folder)
        if self.embedding_sharing == "gdes":
            with torch.no_grad():
                word = self.discriminator.encoder.embeddings.word
                word.delta.copy_(load_file(folder / DELTA_FILE)["delta"])

    def export(self, folder: Path, tokenizer: Tokenizer) -> None:
        """The discriminator (E_D folded in under gdes; without its head where the family has no RTD class) in
        `folder`, the generator in folder/generator."""
        self.save(folder)
        for training_only in (DELTA_FILE, HEAD_FILE):
            (folder / training_only).unlink(missing_ok=True)
        for where in (folder, folder / GENERATOR_FOLDER):
            tokenizer.save(where)


@torch.no_grad()
def _replace(input_ids: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids with the masked positions replaced by samples from the generator's softmax over logits (N, V),
    and the (B, T) bool of positions whose token now differs from the original."""
    masked = labels != IGNORE_INDEX
    original = torch.where(masked, labels, input_ids)
    corrupted = original.clone()
    if logits.shape[0]:
        corrupted[masked] = torch.multinomial(F.softmax(logits.float(), dim=-1), 1).squeeze(1)  # global RNG: resumable
    return corrupted, corrupted != original


def build(options: RTDOptions, model: ModelChoice, tokenizer: Tokenizer, data: str,
          max_length: int) -> ReplacedTokenDetection:
    """The discriminator of the chosen model and its generator (generator_config)."""
    config = model.sized(tokenizer, max_length)
    generator = MaskedLMModel(generator_config(config, options.generator_size, options.generator_layers))
    return ReplacedTokenDetection(ReplacedTokenDetector(config), generator, options.rtd_weight,
                                  options.embedding_sharing)


SPEC = ObjectiveSpec("rtd", RTDOptions, build)  # packed sequences, as ELECTRA trains on
