"""Weight averaging of checkpoints of one architecture: `encoderlab merge A B ... --out DIR`.

Models fine-tuned or pretrained further from one starting checkpoint usually sit in one basin of the loss, so a
weighted average of their weights is itself a good model: averaging a run's last checkpoints (Vaswani et al. 2017,
section 6.1), a "model soup" of several fine-tunes (Wortsman et al. 2022, arXiv:2203.05482), or an interpolation
between an adapted model and the one it started from that trades a little of the new skill for the old one back
(WiSE-FT, Wortsman et al. 2022, arXiv:2109.01903). Models that did not share a start average into noise: the
cosine between each model's weight matrices and the first's, recorded for each, tells them apart.

The first model decides everything but the weights: its class (and so its head), config.json, tokenizer files and
task.json. Every one of its tensors is averaged over the models that hold it, the weights renormalised over those;
a tensor only the first model holds (an MLM head merged with minilm, which has none) is kept as it is, and tensors
the first model lacks (minilm's pooler in an MLM model) are left out. merge.json records which were which.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from encoderlab.checkpoint import hf_sources, load_model, normalize_hf_state, read_config, read_weights, save_pretrained
from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.folder import read_task_info
from encoderlab.io import atomic_write_text, check_out_folder, clear_folder
from encoderlab.models import FAMILIES
from encoderlab.paths import resolve_model_path
from encoderlab.tokenizer import Tokenizer

MERGE_FILE = "merge.json"
# Below this cosine between two models' weight matrices, they did not start from one checkpoint: relatives score
# above 0.9 (the shipped fill-mask model against minilm, where it started: 0.93), unrelated initialisations about 0.
RELATED = 0.5
# Config fields that change training, not the function a model computes: merging models that differ in them is fine.
TRAINING_ONLY = ("hidden_dropout", "attention_dropout", "initializer_range", "initializer_cutoff_factor", "pooler")


@dataclass
class MergeReport:
    """What `merge` did: the models and their weights, and the tensors not every model held."""

    models: list[str]
    folders: list[str]
    weights: list[float]
    sha256: list[dict[str, str]] = field(default_factory=list)  # each model's weight files, as they were merged
    cosines: list[float] = field(default_factory=list)  # each model's weight matrices against the first's
    tensors: int = 0
    partial: dict[str, list[int]] = field(default_factory=dict)  # our tensor name -> indices of the models holding it
    left_out: dict[int, list[str]] = field(default_factory=dict)  # model index -> its tensors the first model lacks
    unchecked_tokenizers: list[int] = field(default_factory=list)  # models with no tokenizer files to compare

    def unrelated(self) -> list[int]:
        """The models whose weights look unrelated to the first's (cosine under RELATED): their average is noise."""
        return [i for i, cosine in enumerate(self.cosines) if cosine < RELATED]

    def to_json(self) -> dict[str, Any]:
        """The report as merge.json holds it."""
        return asdict(self)


def merge(names: list[str | os.PathLike], weights: list[float] | None = None) -> tuple[nn.Module, MergeReport]:
    """The weighted average of the models `names` (folders or aliases), in the first one's class; weights default
    to equal and are normalised to sum to 1."""
    if len(names) < 2:
        raise InputError(f"merge needs at least two models, got {len(names)}")
    shares = _shares(weights, len(names))
    folders = [resolve_model_path(n) for n in names]
    base = load_model(folders[0])
    if base.kind == "bilstm":
        raise ConfigError(f"{folders[0]}: merge averages encoders; a BiLSTM baseline has no family weight map")
    _check_configs(folders)
    report = MergeReport([str(n) for n in names], [str(f) for f in folders], shares,
                         [weights_sha256(f) for f in folders])
    _check_tokenizers(folders, report)
    spec = FAMILIES[base.config.model_type]
    states = [None] + [normalize_hf_state(spec, read_weights(f)) for f in folders[1:]]
    sources, averaged, used = hf_sources(base), {}, [set() for _ in folders]
    products = torch.zeros(len(folders), 3, dtype=torch.float64)  # per model: <own, its>, |own|^2, |its|^2
    for key, own in base.state_dict().items():
        held = [(0, own)] + [(i, t) for i in range(1, len(folders))
                             if (t := _tensor(states[i], sources[key], own, folders[i], key)) is not None]
        for i, tensor in held[1:]:
            used[i].update(sources[key])
            if own.dim() > 1:  # matrices only: biases and LayerNorm scales near 1 would make any two models alike
                products[i] += torch.stack([(own.double() * tensor.double()).sum(), own.double().square().sum(),
                                            tensor.double().square().sum()])
        if len(held) < len(folders):
            report.partial[key] = [i for i, _ in held]
        averaged[key] = _average(held, shares, own)
    report.cosines = [1.0] + [_cosine(*products[i].tolist()) for i in range(1, len(folders))]
    report.tensors = len(averaged)
    report.left_out = {i: sorted(set(states[i]) - used[i]) for i in range(1, len(folders)) if set(states[i]) - used[i]}
    base.load_state_dict(averaged)
    return base, report


def _shares(weights: list[float] | None, count: int) -> list[float]:
    """The weights normalised to sum to 1 (equal when None); InputError for a wrong count or a negative weight."""
    weights = [1.0] * count if weights is None else [float(w) for w in weights]
    if len(weights) != count:
        raise InputError(f"--weights: {len(weights)} weight(s) for {count} models; give one per model")
    if any(not w >= 0 for w in weights) or sum(weights) <= 0:
        raise InputError(f"--weights: {weights}: each must be >= 0 and their sum > 0 (they are normalised to sum to 1)")
    return [w / sum(weights) for w in weights]


def _check_configs(folders: list[Path]) -> None:
    """Refuse models whose configs describe another computation (family, shape, activation, positions, labels)."""
    first = asdict(EncoderConfig.from_hf_dict(read_config(folders[0]), str(folders[0] / "config.json")))
    for folder in folders[1:]:
        other = asdict(EncoderConfig.from_hf_dict(read_config(folder), str(folder / "config.json")))
        differ = [k for k in first if k not in TRAINING_ONLY and first[k] != other[k]]
        if differ:
            shown = "; ".join(f"{k}: {other[k]!r} vs {first[k]!r}" for k in differ)
            raise ConfigError(f"{folder}: its config differs from {folders[0]}'s ({shown}): only models of one "
                              f"architecture can be averaged")


def _check_tokenizers(folders: list[Path], report: MergeReport) -> None:
    """Refuse a model whose tokenizer maps a token to another id than the first model's (its embedding rows would
    average other tokens' vectors). A folder with no tokenizer files (a training checkpoint) cannot be checked."""
    tokenizers = [_tokenizer(f) for f in folders]
    for i, tokenizer in enumerate(tokenizers[1:], start=1):
        if tokenizer is None or tokenizers[0] is None:
            report.unchecked_tokenizers.append(i)
            continue
        difference = tokenizers[0].difference(tokenizer)
        if difference is not None:
            raise ConfigError(f"{folders[i]}: its tokenizer differs from {folders[0]}'s ({difference}): the "
                              f"embedding rows would average different tokens")


def _tokenizer(folder: Path) -> Tokenizer | None:
    """The folder's tokenizer, or None where it has no tokenizer files."""
    if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
        return None
    return Tokenizer.from_pretrained(folder)


def _tensor(state: dict[str, torch.Tensor], names: tuple[str, ...], own: torch.Tensor, folder: Path,
            key: str) -> torch.Tensor | None:
    """One of our tensors from another model's normalised HF state (fused from several where we fuse), or None when
    that model does not hold it; CheckpointError on a shape the first model's tensor does not have."""
    if not all(n in state for n in names):
        return None
    tensor = torch.cat([state[n] for n in names]) if len(names) > 1 else state[names[0]]
    if tensor.shape != own.shape:
        raise CheckpointError(f"{folder}: {', '.join(names)} has shape {tuple(tensor.shape)}, the first model's "
                              f"{key} {tuple(own.shape)}")
    return tensor.float()


def _cosine(dot: float, own_sq: float, other_sq: float) -> float:
    """The cosine between two models' weight matrices, all taken as one vector, from their summed products."""
    return round(dot / (own_sq * other_sq) ** 0.5, 4) if own_sq and other_sq else 0.0


def _average(held: list[tuple[int, torch.Tensor]], shares: list[float], own: torch.Tensor) -> torch.Tensor:
    """The weighted mean of one tensor over the models that hold it (weights renormalised over them); an integer
    tensor (a buffer of ids) is the first model's."""
    if not own.is_floating_point():
        return own
    total = sum(shares[i] for i, _ in held)
    if total == 0:  # every model holding it has weight 0: the first model's own value stands
        return own
    return sum((shares[i] / total) * tensor for i, tensor in held).to(own.dtype)


def weights_sha256(folder: Path) -> dict[str, str]:
    """The SHA-256 of each weight file of a checkpoint folder: which weights a merge read, should a folder change."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in files}


def stored_dtype(folder: Path) -> torch.dtype:
    """The dtype a checkpoint's floating-point weights are stored in (bf16 for a shipped model)."""
    dtypes = {t.dtype for t in read_weights(folder).values() if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


def merge_to_folder(names: list[str | os.PathLike], out: str | os.PathLike,
                    weights: list[float] | None = None, overwrite: bool = False) -> MergeReport:
    """Merge `names` and write the result to `out`: weights in the first model's stored dtype, its config, tokenizer
    and task.json, and merge.json. Refuses a folder holding one of the inputs, or other files unless `overwrite`
    (then emptied just before the merge is written)."""
    out = Path(out)
    check_out_folder(out, overwrite, inputs=names)
    model, report = merge(names, weights)
    first = resolve_model_path(names[0])
    if overwrite:
        clear_folder(out)
    tokenizer = _tokenizer(first)
    info = read_task_info(first) or None
    save_pretrained(model.to(stored_dtype(first)), out, tokenizer, info)
    atomic_write_text(out / MERGE_FILE, json.dumps(report.to_json(), indent=2) + "\n")
    return report
