"""Hugging Face checkpoint folders in both directions: config.json + model.safetensors (or a
pytorch_model.bin read with weights_only=True), converted through each family's declarative weight map.

Every mismatch is reported by tensor name: missing, unexpected, or of the wrong shape. This module sits below
nn/: the model kinds it builds register themselves in MODEL_CLASSES (nn/model.py), so a model can save itself.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError
from encoderlab.io import atomic_write
from encoderlab.models import FAMILIES, FamilySpec
from encoderlab.paths import resolve_model_path

MODEL_CLASSES: dict[str, type[nn.Module]] = {}
"""Model kind ("base", "mlm", "pretraining", "rtd") -> class, filled by nn/model.py; each has `kind` and `config`."""


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder under their stored (Hugging Face) names."""
    single, index, pickle_file = folder / "model.safetensors", folder / "model.safetensors.index.json", folder / "pytorch_model.bin"
    if single.is_file():
        return _read_safetensors(single)
    if index.is_file():
        return {k: v for shard in _index_shards(index) for k, v in _read_safetensors(folder / shard).items()}
    if pickle_file.is_file():
        return _read_torch_bin(pickle_file)
    raise CheckpointError(f"{folder}: no weights found (expected model.safetensors or pytorch_model.bin)")


def _index_shards(index: Path) -> list[str]:
    """The shard file names a model.safetensors.index.json lists (plain names inside its folder)."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{index}: not a valid safetensors index (expected a 'weight_map' object "
                              f"of tensor name -> shard file; {type(err).__name__}: {err})") from None
    for shard in shards:
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise CheckpointError(f"{index}: shard {shard!r} is not a file name in the checkpoint folder")
    return shards


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weight file")
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path}: corrupted or truncated safetensors file ({err})") from None


def _read_torch_bin(path: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin, unpickled with weights_only=True: a file holding code is refused."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError or EOFError depending on the damage
        raise CheckpointError(f"{path}: refused or unreadable (only plain tensors are loaded, "
                              f"weights_only=True): {str(err).splitlines()[0]}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors")
    return state


# ---- name conversion ------------------------------------------------------------------------------
def _rule_regex(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix).replace(r"\{i\}", r"(\d+)"))


def _sources(spec: FamilySpec, our_key: str) -> tuple[str, ...]:
    """The Hugging Face names (unprefixed) that make up one of our tensors."""
    for ours, theirs in spec.weight_map:
        match = _rule_regex(ours).match(our_key)
        if match:
            rest = our_key[match.end():]
            layer = match.groups()[0] if match.groups() else None
            return tuple(t.replace("{i}", layer or "") + rest for t in theirs)
    raise KeyError(f"no weight-map rule for {our_key!r} in family {spec.model_type!r}")


def _head_hf_name(spec: FamilySpec, hf_key: str) -> bool:
    """Whether this (unprefixed) Hugging Face name belongs to a head (pooler, MLM, NSP) a model may leave unused."""
    return any(_rule_regex(t).match(hf_key) for ours, theirs in spec.weight_map
               if not ours.startswith("encoder.") for t in theirs)


def normalize_hf_state(spec: FamilySpec, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip the backbone prefix, rename old names (gamma/beta, aliases), drop buffers and tied copies."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        key = key.removeprefix(spec.base_prefix)
        key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
        if key in spec.ignored:
            continue
        if key in spec.aliases:
            out.setdefault(spec.aliases[key], tensor)
            continue
        out[key] = tensor
    for copy, original in spec.tied:
        if copy in out and original in out:
            if not torch.equal(out[copy], out[original]):
                raise CheckpointError(f"{copy} differs from {original}: untied output embeddings are not supported")
            del out[copy]
    return out


def hf_to_ours(spec: FamilySpec, hf_state: dict[str, torch.Tensor], model: nn.Module, source: str) -> dict[str, torch.Tensor]:
    """Convert normalized HF tensors into `model`'s state dict; raise CheckpointError naming every problem."""
    expected = model.state_dict()
    converted, missing, mismatched = {}, [], []
    for key, target in expected.items():
        names = _sources(spec, key)
        absent = [n for n in names if n not in hf_state]
        if absent:
            missing.extend(absent)
            continue
        tensor = torch.cat([hf_state[n] for n in names]) if len(names) > 1 else hf_state[names[0]]
        if tensor.shape != target.shape:
            shapes = ", ".join(f"{n} {tuple(hf_state[n].shape)}" for n in names)
            mismatched.append(f"{shapes} (expected {tuple(target.shape)} in total)")
            continue
        converted[key] = tensor
    # Every backbone tensor must be used: a layer the config does not have is an error, not silently dropped.
    used = {name for key in expected for name in _sources(spec, key)}
    unexpected = [k for k in hf_state if k not in used and not _head_hf_name(spec, k)]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch: {'; '.join(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: does not fit {type(model).__name__} "
                              f"({spec.architectures[model.kind]}): " + " | ".join(problems))
    return converted


def has_pooler(spec: FamilySpec, hf_state: dict[str, torch.Tensor]) -> bool:
    """Whether a checkpoint holds the family's pooler (an MLM-only BERT checkpoint has none)."""
    return spec.pooler and all(name in hf_state for name in _sources(spec, "pooler.dense.weight"))


def ours_to_hf(spec: FamilySpec, model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s tensors under Hugging Face names, split where we fused several into one."""
    prefix = "" if model.kind == "base" else spec.base_prefix
    out = {}
    for key, tensor in model.state_dict().items():
        names = _sources(spec, key)
        backbone = key.startswith(("encoder.", "pooler."))
        for name, part in zip(names, tensor.chunk(len(names))):
            out[(prefix if backbone else "") + name] = part.detach().clone().contiguous()
    return out


# ---- public API --------------------------------------------------------------------------------------
def load_config(folder: str | os.PathLike) -> tuple[EncoderConfig, str | None]:
    """The EncoderConfig of a checkpoint folder and the first architecture it names (if any)."""
    path = resolve_model_path(folder) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path.parent}: no config.json (not a checkpoint folder?)")
    config = EncoderConfig.from_json(path)
    try:
        architectures = json.loads(path.read_text(encoding="utf-8")).get("architectures") or [None]
    except ValueError:
        architectures = [None]
    return config, architectures[0]


def load_model(name: str | os.PathLike, kind: str | None = None, dtype: torch.dtype | None = None,
               **config_overrides) -> nn.Module:
    """Load a checkpoint folder or alias as `kind` ("base", "mlm", "pretraining", "rtd"; default: what it holds), in fp32
    unless `dtype` is given."""
    folder = resolve_model_path(name)
    config, architecture = load_config(folder)
    if config_overrides:
        config = config.replace(**config_overrides)
    spec = FAMILIES[config.model_type]
    if kind is None:
        kind = {v: k for k, v in spec.architectures.items()}.get(architecture, "base")
    if kind not in MODEL_CLASSES:
        raise ConfigError(f"unknown model kind {kind!r}; expected one of {sorted(MODEL_CLASSES)}")
    hf_state = normalize_hf_state(spec, read_weights(folder))
    with torch.device("meta"):  # no time spent on a random init that is overwritten at once
        if kind == "base":
            model = MODEL_CLASSES[kind](config, pooler=config.pooler and has_pooler(spec, hf_state))
        else:
            model = MODEL_CLASSES[kind](config)
    state = hf_to_ours(spec, hf_state, model, str(folder))
    model.load_state_dict(state, assign=True)
    model.eval()
    # Weights stored in bf16 or fp16 (models/encoderlab-mini) compute in fp32 unless `dtype` asks otherwise:
    # precision is the pipelines' choice, not the file's.
    return model.to(dtype if dtype is not None else torch.float32)


def save_pretrained(model: nn.Module, folder: str | os.PathLike) -> None:
    """Write config.json and model.safetensors that transformers loads as the matching class."""
    folder = Path(folder)
    spec = FAMILIES[model.config.model_type]
    tensors = ours_to_hf(spec, model)
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    model.config.save_json(folder / "config.json", spec.architectures[model.kind])


def load_weights(model: nn.Module, name: str | os.PathLike) -> None:
    """Load a checkpoint folder's weights into an existing model in place (shapes must fit)."""
    folder = resolve_model_path(name)
    spec = FAMILIES[model.config.model_type]
    model.load_state_dict(hf_to_ours(spec, normalize_hf_state(spec, read_weights(folder)), model, str(folder)))
