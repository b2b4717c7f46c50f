"""A model folder's files beside config.json and the weights: task.json (what fine-tuning recorded), the inference
Settings every command reads from it, and sentence-transformers' files (modules.json, sentence_bert_config.json,
1_Pooling/config.json), written so that sentence-transformers loads an embedder and read back for its settings."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from encoderlab.cards import CARDS
from encoderlab.io import atomic_write_text, read_json_file
from encoderlab.paths import resolve_model_path

TASK_FILE = "task.json"  # what encoderlab needs beyond config.json: task, columns, max_length, pooling


def read_task_info(name: str | os.PathLike) -> dict:
    """task.json of a fine-tuned folder, or {} for a plain checkpoint."""
    return read_json_file(resolve_model_path(name) / TASK_FILE, optional=True)


def is_embedder(folder: Path) -> bool:
    """Whether a folder holds a sentence embedder: sentence-transformers' modules.json, or task.json's task."""
    return (folder / "modules.json").is_file() or read_task_info(folder).get("task") == "embed"


@dataclass(frozen=True)
class Settings:
    """What a model folder says about running it; every command, the server and the pipelines read these."""

    max_length: int | None = None
    """task.json's max_length, else sentence_bert_config.json's max_seq_length; None: the model's limit."""
    pooling: str = "mean"
    """task.json's pooling, else 1_Pooling/config.json's mode (cls or mean), else mean."""
    normalize: bool = False
    """L2-normalise sentence vectors: modules.json lists a Normalize module (sentence-transformers' layout)."""
    doc_stride: int = 128
    """QA: tokens shared by consecutive windows of a long context."""
    max_query_length: int = 64
    """QA: questions are cut to this many tokens."""
    max_answer_length: int = 30
    """QA: longest answer considered, in tokens."""
    n_best: int = 20
    """QA: start and end candidates per window in decoding."""
    allow_null: bool = False
    """QA: answer "" when the [CLS] score beats the best span (the model learned unanswerable questions)."""
    stride: int | None = None
    """classify, embed: read a text longer than the window whole, in windows sharing this many tokens (None:
    truncate it)."""
    combine: str = "logits"
    """classify: the windows' mean of logits, or of probabilities ("probs"); embed always averages the vectors."""


def settings(folder: str | Path) -> Settings:
    """The settings of a checkpoint folder or alias: task.json first, then the sentence-transformers files."""
    folder = resolve_model_path(folder)
    info = read_task_info(folder)
    bert = read_json_file(folder / "sentence_bert_config.json", optional=True)
    pooling_file = read_json_file(folder / "1_Pooling" / "config.json", optional=True)
    modules = read_json_file(folder / "modules.json", list, optional=True)
    options = {k: info[k] for k in ("doc_stride", "max_query_length", "max_answer_length", "n_best", "allow_null",
                                    "stride", "combine") if info.get(k) is not None}
    return Settings(max_length=info.get("max_length") or bert.get("max_seq_length"),
                    pooling=info.get("pooling") or ("cls" if pooling_file.get("pooling_mode_cls_token") else "mean"),
                    normalize=any(str(m.get("type", "")).endswith("Normalize") for m in modules if isinstance(m, dict)),
                    **options)


def write_sentence_transformers(folder: Path, hidden_size: int, pooling: str, max_length: int,
                                normalize: bool = False) -> None:
    """modules.json, sentence_bert_config.json and 1_Pooling/config.json: sentence-transformers loads the folder;
    normalize: modules.json ends in Normalize (2_Normalize/), as minilm's does, so both give unit vectors."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(parents=True, exist_ok=True)
    pooling_file = {"word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
                    "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
                    "pooling_mode_mean_sqrt_len_tokens": False}
    atomic_write_text(folder / "modules.json", json.dumps(modules, indent=2) + "\n")
    atomic_write_text(folder / "sentence_bert_config.json",
                      json.dumps({"max_seq_length": max_length, "do_lower_case": False}, indent=2) + "\n")
    atomic_write_text(folder / "1_Pooling" / "config.json", json.dumps(pooling_file, indent=2) + "\n")


# ---- the model card `encoderlab push` writes --------------------------------------------------------------------
TRAINING_FILE = "training.json"  # what `encoderlab finetune` recorded: base model, data, options, best evaluation


def model_card(folder: Path, repo_id: str) -> str:
    """A README.md for the Hub from a folder's config.json, task.json and training.json: YAML metadata, a summary
    table, and how to load it."""
    config, info = read_json_file(folder / "config.json"), read_task_info(folder)
    task, training = info.get("task"), read_json_file(folder / TRAINING_FILE, optional=True)
    masked_lm = any("MaskedLM" in str(a) for a in config.get("architectures") or [])
    tag = CARDS[task].hub_tag if task in CARDS else "fill-mask" if masked_lm else "feature-extraction"
    table = "\n".join(f"| {key} | {value} |" for key, value in _card_rows(config, info, training))
    use = task or ("fill-mask" if masked_lm else "embed")
    return (f"---\nlibrary_name: encoderlab\npipeline_tag: {tag}\ntags:\n- encoderlab\n- {config.get('model_type', 'bert')}"
            f"\n---\n\n# {repo_id.split('/')[-1]}\n\nA {config.get('model_type', 'BERT-family')} encoder made with "
            f"encoderlab{f' (fine-tuned for {task})' if task else ''}.\n\n| | |\n|---|---|\n{table}\n\n"
            f"Use it with `encoderlab {use} --model {repo_id} ...`, or in Python `pipeline(\"{use}\", "
            f"\"{repo_id}\")` (`from encoderlab.infer.pipelines import pipeline`).\n")


def _card_rows(config: dict, info: dict, training: dict) -> list[tuple[str, str]]:
    """The card's table: architecture, then what task.json and training.json record where they exist."""
    rows = [("architecture", f"{config.get('model_type', '?')}, {config.get('num_hidden_layers', '?')} layers, "
                             f"hidden {config.get('hidden_size', '?')}, {config.get('num_attention_heads', '?')} heads")]
    if info.get("labels"):
        rows.append(("labels", ", ".join(map(str, info["labels"]))))
    if info.get("max_length"):
        rows.append(("max length", f"{info['max_length']} tokens"))
    for key, label in (("model", "fine-tuned from"), ("train", "training data"), ("eval", "evaluation data")):
        if training.get(key):
            rows.append((label, f"`{training[key]}`"))
    best = training.get("best") or {}
    metrics = {k: v for k, v in best.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if metrics:
        rows.append((f"best evaluation (by {training.get('metric') or 'the first metric'})",
                     ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())))
    return rows
