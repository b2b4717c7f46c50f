"""`encoderlab compare`: the family side by side, measured on this machine.

For each preset: layers, hidden size, heads and parameters (of `EncoderModel(config)`, as `encoderlab info` counts
them), then CPU batch-1 latency and batched throughput on the same token ids, also as ratios to a reference (bert-base)
measured interleaved with the others, so load from other processes falls on all alike; the papers' claims ("40% smaller,
60% faster") beside them. Weights are random (speed does not depend on them); fine-tuned SST-2 accuracy is read from
bench results that name the preset."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from encoderlab.choices import COMPARE_QUICK as QUICK  # noqa: F401  (examples/ import it from here)
from encoderlab.choices import FAMILY_PRESETS, REFERENCE
from encoderlab.choices import CompareSettings as Settings
from encoderlab.config import EncoderConfig
from encoderlab.engine import forward, pad_batch
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer.precision import cpuinfo
from encoderlab.io import progress_bar
from encoderlab.models import PRESETS
from encoderlab.nn.model import EncoderModel

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"  # a source checkout's bench records
MISSING = "—"

# Token counts of the SST-2 dev sentences (872) under bert-base-uncased WordPiece, [CLS] and [SEP] included:
# 4 to 55, mean 25.2, median 24.5 (measured on ../shared/data/sst2/dev.tsv). The word-piece count without
# the two special tokens is close to log-normal with these parameters (mean and std of its log):
SST2_LOG_MEAN, SST2_LOG_STD = 3.02, 0.52
SST2_PIECES = (2, 53)  # clipped to the dev set's range
SPECIAL_TOKENS = 2  # [CLS] ... [SEP] (<s> ... </s> for RoBERTa)


@dataclass(frozen=True)
class Claim:
    """What a family's paper says about its size or speed against BERT."""

    text: str
    source: str
    against: str | None = None
    """A preset other than the reference that the speed claim is made against; measured beside it when present."""


# The seeds' claims, quoted or paraphrased from the papers; `claim_sentences` sets the measured figures beside them.
CLAIMS: dict[str, Claim] = {
    "distilbert-base": Claim("40% smaller than BERT-base and 60% faster at inference (CPU, batch size 1)",
                             "Sanh et al. 2019, arXiv:1910.01108, abstract and Table 3"),
    "albert-base": Claim("12M parameters against BERT-base's 108M, at the same depth and width",
                         "Lan et al. 2019, arXiv:1909.11942, Table 1"),
    "electra-small": Claim("14M parameters (BERT-base: 110M)", "Clark et al. 2020, arXiv:2003.10555, Table 1"),
    "electra-base": Claim("the size of BERT-base (110M parameters)", "Clark et al. 2020, arXiv:2003.10555, Table 1"),
    "roberta-base": Claim("BERT-base's architecture; the 50K BPE vocabulary adds about 15M parameters",
                          "Liu et al. 2019, arXiv:1907.11692, section 4.4"),
    "deberta-v3-base": Claim("86M backbone parameters plus 98M in the embedding of its 128K vocabulary",
                             "He et al. 2021, arXiv:2111.09543; model card of microsoft/deberta-v3-base"),
    "modernbert-base": Claim("GLUE 88.4 at base size, the first base encoder above DeBERTa-v3-base; about twice "
                             "DeBERTa-v3's inference speed, up to 4x on mixed-length input (RTX 4090 GPU)",
                             "Warner et al. 2024, arXiv:2412.13663, Tables 1 and 3", against="deberta-v3-base"),
}


@dataclass
class Row:
    """One preset's measured figures; `*_vs_reference` are ratios to the reference row (speeds: higher is faster)."""

    preset: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    parameters: int
    embedding_parameters: int  # of the input embedding tables and their norm (`model.encoder.embeddings`)
    latency_ms: float
    throughput: float
    size_vs_reference: float = math.nan
    speed_vs_reference: float = math.nan
    throughput_vs_reference: float = math.nan
    sst2_accuracy: float | None = None
    sst2_source: str | None = None


# ---- presets and inputs -----------------------------------------------------------------------------
def default_presets() -> list[str]:
    """The family presets that exist at run time (FAMILY_PRESETS filtered by PRESETS)."""
    return [name for name in FAMILY_PRESETS if name in PRESETS]


def check_presets(names: Iterable[str], what: str = "--presets") -> None:
    """ConfigError naming each unknown preset and listing the known ones."""
    unknown = [name for name in names if name not in PRESETS]
    if unknown:
        raise ConfigError(f"{what}: unknown preset{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(map(repr, unknown))}; known presets: {', '.join(PRESETS)}")


def sample_inputs(configs: Sequence[EncoderConfig], count: int, seed: int) -> list[list[int]]:
    """`count` token-id sequences with SST-2-like lengths, valid for every config (ids below the smallest vocab)."""
    rng = np.random.default_rng(seed)
    pieces = np.exp(rng.normal(SST2_LOG_MEAN, SST2_LOG_STD, size=count)).round().astype(int)
    lengths = np.clip(pieces, *SST2_PIECES) + SPECIAL_TOKENS
    high = min(config.vocab_size for config in configs)
    # no id reads as padding in any model; a pad id beyond the smallest vocabulary (ModernBERT's 50283) is never drawn
    low = 1 + max((config.pad_token_id for config in configs if config.pad_token_id < high), default=-1)
    if high - low < 2:
        raise ConfigError(f"vocab_size {high} leaves no token ids above pad_token_id {low - 1} to draw from")
    return [rng.integers(low, high, size=int(n)).tolist() for n in lengths]


def sorted_batches(inputs: Sequence[list[int]], batch_size: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    """Batches of input_ids and attention_mask (B, T), shortest first, padded by the inference engine."""
    rows = sorted(inputs, key=len)
    batches = [pad_batch(rows[i:i + batch_size], [[0] * len(ids) for ids in rows[i:i + batch_size]], pad_id)
               for i in range(0, len(rows), batch_size)]
    return [{"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in batches]


# ---- timing ----------------------------------------------------------------------------------------
def timed(model: EncoderModel, batch: dict[str, torch.Tensor]) -> float:
    """Seconds of one forward pass over a batch of input_ids (B, T) (and attention_mask (B, T))."""
    start = time.perf_counter()
    forward(model, batch)
    return time.perf_counter() - start


@dataclass
class _Subject:
    """A model under measurement with its inputs and the timings gathered so far."""

    preset: str
    model: EncoderModel
    batches: list[dict[str, torch.Tensor]]
    latencies: list[float]
    passes: list[float]


def _prepare(presets: Sequence[str], settings: Settings) -> tuple[list[_Subject], list[list[int]]]:
    """Each model (random weights, eval mode) with its batches of one shared set of token ids; and the ids."""
    configs = [EncoderConfig.from_preset(name) for name in presets]
    inputs = sample_inputs(configs, settings.sequences, settings.seed)
    subjects = [_Subject(name, EncoderModel(config).eval(),
                         sorted_batches(inputs, settings.batch_size, config.pad_token_id), [], [])
                for name, config in zip(presets, configs)]
    return subjects, inputs


def _measure(subjects: Sequence[_Subject], inputs: Sequence[list[int]], settings: Settings, progress: bool) -> None:
    """Warm each model up, then time every sequence and batch on each model in turn, so load hits all alike."""
    singles = [{"input_ids": torch.tensor([ids])} for ids in inputs[:settings.latency_sequences]]  # (1, T)
    steps = len(singles) + len(subjects[0].batches)
    with progress_bar(total=1 + settings.repeats * steps, desc="compare", unit="step", disable=not progress,
                      leave=False) as bar:
        for subject in subjects:  # first-call allocations and kernel choices are not timed
            for batch in singles[:2] + subject.batches[-1:]:
                timed(subject.model, batch)
        bar.update()
        for _ in range(settings.repeats):
            for single in singles:
                for subject in subjects:
                    subject.latencies.append(timed(subject.model, single))
                bar.update()
            passes = [0.0] * len(subjects)
            for index in range(len(subjects[0].batches)):
                for k, subject in enumerate(subjects):
                    passes[k] += timed(subject.model, subject.batches[index])
                bar.update()
            for subject, seconds in zip(subjects, passes):
                subject.passes.append(seconds)


def _row(subject: _Subject, sequences: int) -> Row:
    """The figures of one measured model."""
    config = subject.model.config
    return Row(subject.preset, config.model_type, config.num_layers, config.hidden_size, config.num_heads,
               subject.model.num_parameters(), sum(p.numel() for p in subject.model.encoder.embeddings.parameters()),
               latency_ms=1e3 * statistics.median(subject.latencies),
               throughput=sequences / statistics.median(subject.passes))


# ---- the comparison --------------------------------------------------------------------------------
def compare(presets: Sequence[str] | None = None, settings: Settings = Settings(), reference: str = REFERENCE,
            sst2_results: Sequence[str | Path] | None = None, progress: bool = False) -> list[Row]:
    """Measure each preset (and the reference, first); one Row each, with ratios to the reference."""
    presets = list(presets) if presets else default_presets()
    check_presets(presets)
    check_presets([reference], "--reference")
    _check_settings(settings)
    names = [reference] + [name for name in dict.fromkeys(presets) if name != reference]
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        with torch.inference_mode():
            subjects, inputs = _prepare(names, settings)
            _measure(subjects, inputs, settings, progress)
    finally:
        torch.set_num_threads(previous_threads)
    rows = [_row(subject, settings.sequences) for subject in subjects]
    accuracies = sst2_accuracies(sst2_results)
    return [replace(_relative(row, rows[0]), **accuracies.get(row.preset, {})) for row in rows]


def _check_settings(settings: Settings) -> None:
    """ConfigError naming the first setting that is out of range."""
    for name in ("threads", "sequences", "batch_size", "latency_sequences", "repeats"):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    if settings.latency_sequences > settings.sequences:
        raise ConfigError(f"latency_sequences ({settings.latency_sequences}) must not exceed "
                          f"sequences ({settings.sequences})")


def _relative(row: Row, reference: Row) -> Row:
    """The row with its size and speeds as ratios to the reference row's."""
    return replace(row, size_vs_reference=row.parameters / reference.parameters,
                   speed_vs_reference=reference.latency_ms / row.latency_ms,
                   throughput_vs_reference=row.throughput / reference.throughput)


# ---- SST-2 accuracy from bench results --------------------------------------------------------------
def sst2_accuracies(files: Sequence[str | Path] | None = None) -> dict[str, dict[str, Any]]:
    """Preset name -> {"sst2_accuracy", "sst2_source"} from bench result files (default: bench/results/*.json), their
    `sst2` or `sst2-*` records whose `preset` or `model` names it, or `encoderlab benchmark`'s OUT/results.json (named
    by its model folder); the first match wins, full runs before quick ones."""
    if files is None:
        found = sorted(RESULTS.glob("*.json")) if RESULTS.is_dir() else []
        paths = sorted(found, key=lambda path: path.stem.endswith("_quick"))
    else:
        paths = [Path(file) for file in files]
    accuracies: dict[str, dict[str, Any]] = {}
    for path in paths:
        for key, record in _sst2_records(path, explicit=files is not None):
            name = str(record.get("preset") or Path(str(record["model"])).name)
            accuracies.setdefault(name, {"sst2_accuracy": float(record["accuracy"]), "sst2_source": f"{path}:{key}"})
    return accuracies


def _sst2_records(path: Path, explicit: bool) -> list[tuple[str, dict]]:
    """(key, record) of the SST-2 results in one bench file; InputError for an explicit file that is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        if explicit:
            raise InputError(f"{path}: not a JSON bench result ({err})") from None
        return []
    if isinstance(data, dict) and data.get("suite") and isinstance(data.get("tasks"), list):
        return _harness_records(data)
    figures = data.get("figures") if isinstance(data, dict) else None
    if not isinstance(figures, dict):
        if explicit:
            raise InputError(f"{path}: expected a bench result with a 'figures' object")
        return []
    return [(key, record) for key, record in figures.items()
            if (key == "sst2" or key.startswith("sst2-")) and isinstance(record, dict)
            and isinstance(record.get("accuracy"), (int, float)) and (record.get("preset") or record.get("model"))]


def _harness_records(summary: dict) -> list[tuple[str, dict]]:
    """The SST-2 record of an `encoderlab benchmark` OUT/results.json: the median dev accuracy over its seeds."""
    records = []
    for task in summary["tasks"]:
        median = task.get("metrics", {}).get("dev", {}).get("accuracy", {}).get("median")
        if task.get("task") == "sst2" and isinstance(median, (int, float)):
            seeds = ",".join(map(str, task.get("seeds", [])))
            records.append((f"sst2 median of seeds {seeds}", {"model": summary["model"], "accuracy": median / 100}))
    return records  # the harness reports percent, compare fractions


# ---- output ----------------------------------------------------------------------------------------
def claim_sentences(rows: Sequence[Row]) -> list[str]:
    """For each row after the reference: its measured size and speed against the reference, beside any claim."""
    reference = rows[0]
    sentences = []
    for row in rows[1:]:
        sentence = (f"{row.preset}: {row.parameters / 1e6:.1f}M parameters ({row.embedding_parameters / 1e6:.1f}M "
                    f"in the embeddings), {_percent_change(row.size_vs_reference, 'fewer', 'more')} than "
                    f"{reference.preset}; {row.speed_vs_reference:.2f}x its batch-1 speed and "
                    f"{row.throughput_vs_reference:.2f}x its batch throughput.")
        if row.preset in CLAIMS:
            claim = CLAIMS[row.preset]
            sentence += f" Claimed: {claim.text} ({claim.source})." + _against(row, rows, claim.against)
        sentences.append(sentence)
    return sentences


def _against(row: Row, rows: Sequence[Row], preset: str | None) -> str:
    """' Measured against X: ...' with the row's speeds as ratios to preset X's row, or '' where X was not run."""
    other = next((r for r in rows if r.preset == preset), None)
    if other is None:
        return ""
    return (f" Measured against {preset}: {row.throughput / other.throughput:.2f}x its batch throughput and "
            f"{other.latency_ms / row.latency_ms:.2f}x its batch-1 speed.")


def _percent_change(ratio: float, less: str, more: str) -> str:
    """'39% fewer' for 0.61, '14% more' for 1.14."""
    change = round(100 * (1 - ratio))
    return f"{change}% {less}" if change >= 0 else f"{-change}% {more}"


TABLE_COLUMNS = ("preset", "family", "layers", "hidden", "heads", "parameters", "size vs ref",
                 "latency ms (batch 1)", "speed vs ref", "throughput seq/s", "throughput vs ref", "SST-2 acc")


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows as a markdown table (ratios are to the first row)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    for row in rows:
        accuracy = MISSING if row.sst2_accuracy is None else f"{row.sst2_accuracy:.3f}"
        cells = (row.preset, row.model_type, row.num_layers, row.hidden_size, row.num_heads, f"{row.parameters:,}",
                 f"{row.size_vs_reference:.2f}x", f"{row.latency_ms:.1f}", f"{row.speed_vs_reference:.2f}x",
                 f"{row.throughput:.1f}", f"{row.throughput_vs_reference:.2f}x", accuracy)
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def describe(settings: Settings) -> str:
    """One paragraph saying what was measured, on what, and how."""
    return (f"CPU inference, fp32, random weights, {settings.threads} torch thread(s), torch {torch.__version__}, "
            f"{cpu_name()}. Inputs: the same {settings.sequences} token-id sequences for every model (seed "
            f"{settings.seed}; SST-2-like lengths, {SST2_PIECES[0] + SPECIAL_TOKENS}-"
            f"{SST2_PIECES[1] + SPECIAL_TOKENS} tokens). Latency: median over {settings.repeats} repeat(s) of the "
            f"first {settings.latency_sequences} sequences run one at a time. Throughput: sequences per second over "
            f"length-sorted batches of {settings.batch_size}, median of {settings.repeats} pass(es). Each sequence "
            f"and batch runs on every model in turn, so load from other processes falls on all alike. Ratios are "
            f"to the first row (speed: higher is faster). Load average when written: {_load()}.{_busy_warning()}")


def _load() -> str:
    """The 1-minute load average against the core count ('2.1 on 2 cores'): timings on a busy machine read slow."""
    try:
        return f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def _busy_warning() -> str:
    """A caveat when more processes want a core than there are cores, else ''."""
    try:
        busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return ""
    return (" The machine was busy: absolute times are inflated, and batch-1 ratios, where waiting for a core "
            "costs most, are the least reliable; rerun on a quiet machine for figures to quote.") if busy else ""


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    return cpuinfo("model name") or platform.processor() or platform.machine() or "CPU"


def render_markdown(rows: Sequence[Row], settings: Settings) -> str:
    """The whole report: what was measured, the table, and the measured claims."""
    claims = "\n".join(f"- {sentence}" for sentence in claim_sentences(rows))
    return (f"# The BERT family, measured\n\n{describe(settings)}\n\n{markdown_table(rows)}\n\n"
            f"## The papers' claims against the measurements\n\n{claims or '(no rows besides the reference)'}\n")


def render_json(rows: Sequence[Row], settings: Settings) -> str:
    """Settings, rows and measured claims as JSON."""
    return json.dumps({"settings": asdict(settings), "torch": torch.__version__, "cpu": cpu_name(), "load": _load(),
                       "reference": rows[0].preset, "rows": [asdict(row) for row in rows],
                       "claims": claim_sentences(rows)}, indent=2)
