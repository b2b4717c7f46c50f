"""Hugging Face checkpoint folders both ways: config.json + model.safetensors (or a pytorch_model.bin read with
weights_only=True), converted through each family's declarative weight map.

One loader for every model: config.json's `architectures` picks the class; task.json (task, columns, max_length,
pooling, labels) is read beside it (encoderlab.folder). Every mismatch is named by tensor: missing, unexpected or
misshapen. This module sits above nn/ and models/: it names nn's classes (MODEL_CLASSES) in each family's terms, so
the model code never reads the family registry."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.overrides import TorchFunctionMode

from encoderlab.config import EncoderConfig
from encoderlab.errors import CheckpointError, ConfigError
from encoderlab.folder import TASK_FILE, is_embedder, read_task_info, settings, write_sentence_transformers
from encoderlab.io import atomic_write, atomic_write_text, read_json_file
from encoderlab.models import FAMILIES, FamilySpec
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.nn.model import MODEL_CLASSES, Model, Stored
from encoderlab.paths import resolve_model_path


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
Rules = tuple[tuple[str, tuple[str, ...]], ...]


def _rule_regex(prefix: str) -> re.Pattern:
    return re.compile(re.escape(prefix).replace(r"\{i\}", r"(\d+)"))


def task_rows(spec: FamilySpec, kind: str | None) -> Rules:
    """The weight-map rows of kind's task head (classify, ner, qa): a checkpoint without them starts it fresh."""
    return tuple(row for row in spec.weight_map if kind and row[0].startswith(MODEL_CLASSES[kind].task_head))


def _sources(rules: Rules, our_key: str) -> tuple[str, ...]:
    """The Hugging Face names (unprefixed) that make up one of our tensors."""
    for ours, theirs in rules:
        match = _rule_regex(ours).match(our_key)
        if match:
            rest = our_key[match.end():]
            layer = match.groups()[0] if match.groups() else None
            return tuple(t.replace("{i}", layer or "") + rest for t in theirs)
    raise KeyError(f"no weight-map rule for {our_key!r}")


def hf_sources(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each of `model`'s tensors (our names) -> the normalized Hugging Face names it is made of (several where we
    fuse, as ALBERT's shared layer or DeBERTa's attention do)."""
    rules = FAMILIES[model.config.model_type].weight_map
    return {key: _sources(rules, key) for key in model.state_dict()}


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


def hf_to_ours(spec: FamilySpec, hf_state: dict[str, torch.Tensor], model: nn.Module, source: str,
               fresh: bool = False) -> dict[str, torch.Tensor]:
    """Convert normalized HF tensors into `model`'s state dict; raise CheckpointError naming every problem. fresh: the
    checkpoint holds no weights for this model's head (a new task head): its tensors are drawn anew."""
    rules, expected = spec.weight_map, model.state_dict()
    converted, missing, mismatched = {}, [], []
    for key, target in expected.items():
        names = _sources(rules, key)
        absent = [n for n in names if n not in hf_state]
        if absent and fresh and not key.startswith("encoder."):
            converted[key] = _fresh_tensor(key, target, model.config.initializer_range)
            continue
        if absent:
            missing.extend(absent)
            continue
        tensor = torch.cat([hf_state[n] for n in names]) if len(names) > 1 else hf_state[names[0]]
        if tensor.shape != target.shape:
            shapes = ", ".join(f"{n} {tuple(hf_state[n].shape)}" for n in names)
            mismatched.append(f"{shapes} (expected {tuple(target.shape)} in total)")
            continue
        converted[key] = tensor
    # Every backbone tensor must be used: a layer the config does not have is an error, not silently dropped;
    # a pretraining head's (pooler, MLM, NSP) may be left unused, a task head's is removed before (_without_head).
    used = {name for key in expected for name in _sources(rules, key)}
    kept = ("encoder.", *(prefix for cls in MODEL_CLASSES.values() for prefix in cls.task_head))
    heads = [_rule_regex(t) for ours, theirs in spec.weight_map if not ours.startswith(kept) for t in theirs]
    unexpected = [k for k in hf_state if k not in used and not any(head.match(k) for head in heads)]
    problems = [f"{what}: {sep.join(names)}" for what, sep, names in (
        ("missing tensors", ", ", missing), ("unexpected tensors", ", ", unexpected),
        ("shape mismatch", "; ", mismatched)) if names]
    if problems:
        raise CheckpointError(f"{source}: does not fit {type(model).__name__} ({architecture(model)}): "
                              + " | ".join(problems))
    return converted


def _fresh_tensor(key: str, target: torch.Tensor, std: float) -> torch.Tensor:
    """A new head tensor as BERT initialises one (N(0, std) weights, zero biases); a user's module keeps its own."""
    if target.device.type != "meta":
        return target
    tensor = torch.empty(target.shape, dtype=torch.float32)
    return nn.init.normal_(tensor, std=std) if key.endswith("weight") else nn.init.zeros_(tensor)


def ours_to_hf(spec: FamilySpec, model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s tensors under Hugging Face names, split where we fused several into one."""
    prefix = "" if model.bare else spec.base_prefix
    rules, out = spec.weight_map, {}
    for key, tensor in model.state_dict().items():
        names = _sources(rules, key)
        backbone = key.startswith(("encoder.", "pooler."))
        for name, part in zip(names, tensor.chunk(len(names))):
            out[(prefix if backbone else "") + name] = part.detach().cpu().clone().contiguous()
    return out


# ---- architectures ---------------------------------------------------------------------------------
def architecture_name(spec: FamilySpec, cls: type[nn.Module]) -> str:
    """transformers' class name for one of our classes in a family: "RobertaForTokenClassification"."""
    kind = cls.hf_kind or cls.kind
    if cls.hf_suffix is not None:
        return spec.architectures["base"].removesuffix("Model") + cls.hf_suffix
    if kind not in spec.architectures:
        raise ConfigError(f"{spec.model_type} has no {kind} model in transformers "
                          f"(it has {', '.join(spec.architectures.values())} and the task heads)")
    return spec.architectures[kind]


def architecture(model: nn.Module) -> str:
    """transformers' class name of one of our models, in its family."""
    return architecture_name(FAMILIES[model.config.model_type], type(model))


def architectures() -> dict[str, type[nn.Module]]:
    """Every transformers class we mirror, of every family -> our class (an XModel loads as EncoderModel, not as a
    class that saves as another kind's)."""
    return {architecture_name(spec, cls): cls for spec in FAMILIES.values() for cls in MODEL_CLASSES.values()
            if cls.hf_kind is None and (cls.hf_suffix is not None or cls.kind in spec.architectures)}


# ---- folder files -------------------------------------------------------------------------------------
def read_config(folder: Path) -> dict:
    """config.json of a checkpoint folder, as a dict (the one place that reads it)."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a checkpoint folder?)")
    return read_json_file(path)


def model_config(name: str | os.PathLike) -> EncoderConfig | None:
    """The config of a checkpoint folder or alias, read without its weights; None for the BiLSTM baseline."""
    folder = resolve_model_path(name)
    raw = read_config(folder)
    if (raw.get("architectures") or [None])[0] == BiLSTMClassifier.architecture:
        return None
    return EncoderConfig.from_hf_dict(raw, str(folder / "config.json"))


def stored_kind(folder: Path, raw: dict) -> str | None:
    """Our kind for config.json's `architectures` (None: not mirrored; none named: base, or embed for an embedder)."""
    architecture, known = (raw.get("architectures") or [None])[0], architectures()
    if architecture is not None and architecture not in known:
        return None
    kind = "base" if architecture is None else known[architecture].kind
    return "embed" if kind == "base" and is_embedder(folder) else kind


def _unknown_architecture(folder: Path, raw: dict) -> CheckpointError:
    """The error for a config.json naming a class we do not mirror, listing those of its family we do."""
    spec = FAMILIES.get(raw.get("model_type"))
    stem = spec.architectures["base"].removesuffix("Model") if spec else ""
    known = [name for name in architectures() if name.startswith(stem) and not name[len(stem)].islower()]
    return CheckpointError(f"{folder / 'config.json'}: architecture {raw['architectures'][0]!r} is not one encoderlab "
                           f"mirrors (known: {', '.join(known)}); pass kind= to load its encoder")


# ---- public API --------------------------------------------------------------------------------------
class SkipMetaInit(TorchFunctionMode):
    """Initialisers (torch.nn.init.*, Tensor.normal_ and its kind) on meta tensors return the tensor untouched.
    A meta tensor holds no values, so nothing is lost; but torch runs normal_ on meta through its Python references,
    whose first call imports torch._dynamo: 2.4 s of a 6 s one-sentence fill-mask on 2 cores (issue 37)."""

    RANDOM = frozenset({"normal_", "uniform_", "trunc_normal_", "bernoulli_", "exponential_"})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else kwargs.get("tensor")
        if isinstance(first, torch.Tensor) and first.is_meta and (
                getattr(func, "__module__", None) == "torch.nn.init" or getattr(func, "__name__", "") in self.RANDOM):
            return first
        return func(*args, **kwargs)


def load_model(name: str | os.PathLike, kind: str | None = None, dtype: torch.dtype | None = None,
               **options: Any) -> nn.Module:
    """Load a checkpoint folder or alias, in eval mode and fp32 unless `dtype` is given. The class is the one
    config.json's `architectures` names, or `kind` (see encoderlab.nn.model): another kind's head is left out, and a
    task head the checkpoint lacks starts fresh (fine-tuning from a pretrained encoder). options go to the class's
    from_stored: num_labels, problem_type, multilabel, head (a SequenceClassifier's own output module), pooling."""
    folder = resolve_model_path(name)
    raw = read_config(folder)
    if (raw.get("architectures") or [None])[0] == BiLSTMClassifier.architecture:
        return BiLSTMClassifier.from_hf(raw, read_weights(folder), folder).eval()
    stored = stored_kind(folder, raw)
    if stored is None and kind is None:
        raise _unknown_architecture(folder, raw)
    stored, kind = stored or kind, kind or stored
    if kind not in MODEL_CLASSES:
        raise ConfigError(f"unknown model kind {kind!r}; expected one of {sorted(MODEL_CLASSES)}")
    config = EncoderConfig.from_hf_dict(raw, str(folder / "config.json"))
    spec, cls = FAMILIES[config.model_type], MODEL_CLASSES[kind]
    new_head = task_rows(spec, cls.kind) != task_rows(spec, stored)
    hf_state = _without_head(spec, normalize_hf_state(spec, read_weights(folder)), stored if new_head else None)
    fixed = _stored(cls, spec, hf_state, folder, new_head, options)
    with torch.device("meta"), SkipMetaInit():  # no time spent on a random init that is overwritten at once
        model = cls.from_stored(config, fixed, **{k: v for k, v in options.items() if v is not None})
    fresh = new_head and bool(task_rows(spec, cls.kind))  # a new task head; an MLM, NSP or RTD head must be there
    model.load_state_dict(hf_to_ours(spec, hf_state, model, str(folder), fresh), assign=True)
    # Weights stored in bf16 or fp16 (models/encoderlab-mini) compute in fp32 unless `dtype` asks otherwise:
    # precision is the pipelines' choice, not the file's.
    return model.eval().to(dtype if dtype is not None else torch.float32)


def _without_head(spec: FamilySpec, hf_state: dict[str, torch.Tensor], stored: str | None) -> dict[str, torch.Tensor]:
    """hf_state less the stored task head (classifier.*, qa_outputs.*) of kind `stored` (None: keep all)."""
    theirs = tuple(t for _, names in task_rows(spec, stored) for t in names)
    return {k: v for k, v in hf_state.items() if not (theirs and k.startswith(theirs))}


def init_from(model: nn.Module, name: str | os.PathLike) -> list[str]:
    """Load a checkpoint's weights into a freshly initialised model of the same family and shape (continued
    pretraining); a head the checkpoint lacks (minilm has no MLM head) keeps its fresh initialisation.
    Returns the names of those new tensors (ours); a missing or misshapen encoder tensor is an error."""
    folder = resolve_model_path(name)
    raw = read_config(folder)
    spec = FAMILIES[model.config.model_type]
    if raw.get("model_type") != model.config.model_type:
        raise CheckpointError(f"{folder}: a {raw.get('model_type')} checkpoint cannot start a "
                              f"{model.config.model_type} model")
    stored = stored_kind(folder, raw)
    hf_state = _without_head(spec, normalize_hf_state(spec, read_weights(folder)), stored)
    new = [key for key in model.state_dict() if not key.startswith("encoder.")
           and any(n not in hf_state for n in _sources(spec.weight_map, key))]
    model.load_state_dict(hf_to_ours(spec, hf_state, model, str(folder), fresh=True))
    return new


def _stored(cls: type[Model], spec: FamilySpec, hf_state: dict[str, torch.Tensor], folder: Path, new_head: bool,
            options: dict[str, Any]) -> Stored:
    """What the folder fixes of a `cls` model: its pooler, its output layer's rows (the stored head's labels)."""
    pooler = spec.pooler and all(n in hf_state for n in _sources(spec.weight_map, "pooler.dense.weight"))
    outputs = None
    if cls.output_layer is not None and not new_head:
        out = _sources(spec.weight_map, cls.output_layer)[0]
        if out not in hf_state and options.get("head") is None:
            raise CheckpointError(f"{folder}: head does not fit a linear output layer (expected {out}; tensors "
                                  f"{', '.join(sorted(k for k in hf_state if k.startswith(out[:-6]))) or 'none'}): "
                                  f"pass head= the module it was saved with")
        outputs = hf_state[out].shape[0] if out in hf_state else None
    return Stored(new_head, pooler, outputs, lambda: settings(folder), lambda: read_task_info(folder))


def save_pretrained(model: nn.Module, folder: str | os.PathLike, tokenizer=None, info: dict | None = None) -> None:
    """Write config.json and model.safetensors that transformers loads as the matching class, the tokenizer and
    task.json when given, each atomically (a crash between epochs leaves the previous best whole)."""
    folder = Path(folder)
    if hasattr(model, "save_folder"):  # a composite model (ColBERT: an encoder and a projection) writes its own
        return model.save_folder(folder, tokenizer, info)
    if model.kind == "bilstm":
        tensors, config = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, model.hf_config()
    else:
        tensors, config = ours_to_hf(FAMILIES[model.config.model_type], model), model.hf_config(architecture(model))
    atomic_write(folder / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    atomic_write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(folder)
    if info is not None:
        atomic_write_text(folder / TASK_FILE, json.dumps(info, indent=2) + "\n")
    if model.kind == "embed":
        write_sentence_transformers(folder, model.config.hidden_size, model.pooling,
                                    (info or {}).get("max_length", 256), model.normalize)


def load_weights(model: nn.Module, name: str | os.PathLike) -> None:
    """Load a checkpoint folder's weights into an existing model in place (shapes must fit)."""
    folder = resolve_model_path(name)
    spec = FAMILIES[model.config.model_type]
    model.load_state_dict(hf_to_ours(spec, normalize_hf_state(spec, read_weights(folder)), model, str(folder)))
