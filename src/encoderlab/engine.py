"""The one inference engine: encode once, cut length-sorted index batches, pad each batch once, forward, and put
the results back in input order. Every pipeline, task, `embed`, `serve`, the ONNX runner and `compare` run
through it and read a folder's settings from `folder.settings`, so all give the same answer for an input. It keeps
encode, window, sort, pad and forward (data/ and train/ pad and autocast with it); Pipeline, the base of every
capability's inference side, is encoderlab.tasks.pipeline's, beside Task.

    engine = Engine(tokenizer, max_length=256, batch_size=32)
    vectors = engine.rows(engine.encode(texts), lambda batch: sentence_vectors(
        forward(model, batch), batch["attention_mask"], "mean", normalize=True))

Sorting by length keeps padding small (SST-2 dev, batches of 32: 1.9x the real tokens in file order, 1.04x
sorted). A batch is filled in numpy and handed to torch once: a torch op per row costs more than its data.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from encoderlab.choices import COMBINE  # noqa: F401  (tasks and pipelines import it from here)
from encoderlab.config import EncoderConfig
from encoderlab.errors import ConfigError, InputError
from encoderlab.io import as_list, check_texts  # noqa: F401  (pipelines import them from here too)
from encoderlab.nn.output import ModelOutput
from encoderlab.nn.pooling import pool
from encoderlab.tokenizer import Encoded, Tokenizer

log = logging.getLogger(__name__)
ENCODE_CHUNK = 1024  # texts per call into the Rust tokenizer: fast, without padding a whole data set at once
Result = TypeVar("Result")


# ---- inputs, encode, batch, pad --------------------------------------------------------------------------------------
def encode(tokenizer: Tokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None,
           max_length: int | None = None, what: str = "texts") -> list[Encoded]:
    """Tokenize texts (and pairs) in chunks, truncated to max_length (None: not); warns how many were cut."""
    out: list[Encoded] = []
    truncated = 0
    for start in range(0, len(texts), ENCODE_CHUNK):
        chunk_pairs = list(pairs[start:start + ENCODE_CHUNK]) if pairs is not None else None
        rows, cut = tokenizer.encode_rows(list(texts[start:start + ENCODE_CHUNK]), chunk_pairs, max_length=max_length,
                                          truncation=max_length is not None)
        out += rows
        truncated += cut
    if truncated:
        log.warning("%d of %d %s were longer than %d tokens and were truncated (--max-length T reads more, up to "
                    "the model's limit; classify, embed and index read a long text whole with --stride N)", truncated,
                    len(texts), what, max_length)
    return out




def window(config: EncoderConfig | None, tokenizer: Tokenizer | None, *wishes: int | None) -> int:
    """The window: the most tokens one input of a run holds; longer texts are truncated (or read in windows) to it.
    The first of `wishes` given (a flag, then the folder's setting, then a task's default), else all the model
    takes; never past the model's usable positions (config.max_tokens: RoBERTa's 514 hold 512 tokens, as positions
    start at pad_token_id + 1) or the tokenizer's model_max_length. Every entry point asks here
    (docs/inference.md#the-window---max-length)."""
    limits = [config.max_tokens] if config is not None else []  # a BiLSTM has no position table
    limits += [tokenizer.model_max_length] if tokenizer is not None else []
    if not limits:
        raise ConfigError("a window needs the model's config or its tokenizer")
    limit, wish = min(limits), next((w for w in wishes if w), None)
    if wish is not None and wish > limit:
        log.warning("max length %d: the model takes %d tokens at most; using %d", wish, limit, limit)
    return min(wish or limit, limit)


def check_stride(stride: int | None, window: int, specials: int) -> None:
    """InputError unless `stride` (None: no windows) leaves a window of `window` ids, `specials` of them added by
    encoding, room for text tokens beyond the shared ones (split_windows asks for each text; `index` once, before
    its model reads a document)."""
    room = window - specials
    if stride is not None and not 0 <= stride < room:
        raise InputError(f"--stride {stride}: expected 0 to {room - 1}, fewer than the {room} text tokens a window "
                         f"of {window} holds")


def split_windows(item: Encoded, max_length: int, stride: int) -> list[tuple[int, Encoded]]:
    """A text longer than max_length as (first content token, window) pairs: each window keeps the text's special
    tokens and up to max_length of them in all, and shares `stride` content tokens with the next (cf. transformers'
    `return_overflowing_tokens` with `stride`); a text that fits is one window."""
    content = [t for t, sequence in enumerate(item.sequence_ids) if sequence is not None]
    if len(item.input_ids) <= max_length or not content:
        return [(0, item)]
    first, last = content[0], content[-1] + 1
    room = max_length - (len(item.input_ids) - (last - first))  # content tokens per window
    check_stride(stride, max_length, max_length - room)
    out = []
    for start in range(first, last, room - stride):
        keep = [*range(first), *range(start, min(start + room, last)), *range(last, len(item.input_ids))]
        out.append((start - first, Encoded(*([field[i] for i in keep] for field in (
            item.input_ids, item.token_type_ids, item.offsets, item.sequence_ids)))))
        if start + room >= last:
            return out
    return out


def mean_by_owner(rows: torch.Tensor, owners: Sequence[int], count: int) -> torch.Tensor:
    """The mean of the rows (W, ...) that belong to each of `count` owners: (count, ...)."""
    index = torch.tensor(owners, dtype=torch.long)
    sums = torch.zeros((count, *rows.shape[1:]), dtype=rows.dtype).index_add_(0, index, rows)
    return sums / torch.bincount(index, minlength=count).to(rows.dtype).view(-1, *[1] * (rows.dim() - 1))


# A batch also closes early, before it holds batch_size inputs, where the next (shorter) input would take its padded
# positions above MAX_PADDING of all its positions, once it holds MIN_BATCH_TOKENS real tokens (below that a batch
# is cheap whatever its padding, and cutting it only adds batches). Padding costs every layer on the runtime engines
# and attention's core on ours (the rest runs unpadded, nn/packing.py). A mix of SST-2 dev sentences and 256-token
# passages in batches of 32 went from 49% padded positions to 4%, SST-2 dev from 9% to 4% (bench/inference.py).
MAX_PADDING = 0.04
MIN_BATCH_TOKENS = 128


def sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Index batches of at most batch_size inputs, cut from the inputs sorted by length, longest first (so memory
    peaks at once), a batch closing early where the next input would pad it beyond MAX_PADDING."""
    if batch_size < 1:
        raise InputError(f"batch_size {batch_size}: expected a positive number")
    out: list[list[int]] = []
    batch: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batch:
            positions = (len(batch) + 1) * lengths[batch[0]]  # the first input is the batch's longest
            padded = positions - real - lengths[i]
            if len(batch) == batch_size or (real >= MIN_BATCH_TOKENS and padded > MAX_PADDING * positions):
                out.append(batch)
                batch, real = [], 0
        batch.append(i)
        real += lengths[i]
    return out + ([batch] if batch else [])


def pad(rows: Sequence[Sequence[Any]], value: Any, multiple_of: int | None = None,
        dtype: type = np.int64) -> torch.Tensor:
    """Rows right-padded with `value` to the longest (rounded up to multiple_of): (B, T). The one padding code."""
    return _fill(rows, value, _real(rows, multiple_of), dtype)


def pad_batch(input_ids: Sequence[Sequence[int]], token_type_ids: Sequence[Sequence[int]], pad_id: int,
              multiple_of: int | None = None) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, token_type_ids (B, T), right-padded to the longest row."""
    real = _real(input_ids, multiple_of)
    return {"input_ids": _fill(input_ids, pad_id, real), "attention_mask": torch.from_numpy(real.astype(np.int64)),
            "token_type_ids": _fill(token_type_ids, 0, real)}


def _real(rows: Sequence[Sequence[Any]], multiple_of: int | None) -> np.ndarray:
    """(B, T) bool: where each row has a value, T its longest length rounded up to multiple_of."""
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    length = int(lengths.max())
    if multiple_of:
        length = -(-length // multiple_of) * multiple_of
    return np.arange(length) < lengths[:, None]


def _fill(rows: Sequence[Sequence[Any]], value: Any, real: np.ndarray, dtype: type = np.int64) -> torch.Tensor:
    """The rows laid into a (B, T) array of `value` at the `real` positions, handed to torch once."""
    # Filled in numpy: a torch op per row costs more than the row's data at these sizes.
    out = np.full(real.shape, value, dtype=dtype)
    out[real] = np.concatenate(rows) if isinstance(rows[0], np.ndarray) else list(itertools.chain.from_iterable(rows))
    return torch.from_numpy(out)


# ---- calling a model -------------------------------------------------------------------------------------------
def forward(model: nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor | None = None) -> ModelOutput:
    """The one place a torch model is called at inference. labels (B, T), for a masked-LM model: logits (N, V) at
    the N labelled positions only (-100 elsewhere)."""
    extra = {} if labels is None else {"labels": labels}
    return model(batch["input_ids"], batch.get("attention_mask"), batch.get("token_type_ids"), **extra)


def sentence_vectors(output: ModelOutput, attention_mask: torch.Tensor, pooling: str, normalize: bool) -> torch.Tensor:
    """(B, H) float32 sentence vectors, pooled (an embedder pools its own) and L2-normalised if asked."""
    vectors = output.embedding
    if vectors is None:
        vectors = pool(output.last_hidden_state.float(), attention_mask, pooling)
    return F.normalize(vectors.float(), dim=-1) if normalize else vectors.float()


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of a (N, H) with each row of b (M, H): (N, M)."""
    a = a / np.linalg.norm(a, axis=-1, keepdims=True).clip(min=1e-12)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True).clip(min=1e-12)
    return a @ b.T


def resolve_device(name: str | None) -> torch.device:
    """--device: CUDA when there is one (None), else the CPU; ConfigError for a name torch refuses or a CUDA device
    this machine lacks. Every command that runs a model resolves its device here (fine-tuning through
    tasks.finetune.resolve_device, which adds torchrun's ranks)."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"--device {name!r}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine (use --device cpu)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                          f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def autocast(precision: str, device: torch.device | str = "cpu") -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU or CUDA when asked for, else nothing (training and inference both use this one)."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """The model in eval mode (dropout off) inside the block, then back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


# ---- the engine ------------------------------------------------------------------------------------------------
@dataclass
class Engine:
    """A tokenizer, a window, a batch size and a device: inputs in, results out in input order."""

    tokenizer: Tokenizer
    max_length: int | None = None
    batch_size: int = 32
    device: torch.device = torch.device("cpu")
    precision: str = "fp32"
    """bf16: run forward passes under bf16 autocast (evaluation while fine-tuning, which trains under it);
    `evaluate` and the pipelines convert the model's weights instead."""
    progress: str = ""
    """A label: show a progress bar with it on stderr over runs of more than one batch (the commands set it on a
    terminal, unless --no-progress); empty: no bar (the server, Python calls)."""

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None, what: str = "texts") -> list[Encoded]:
        """Tokenize, truncated to the window."""
        return encode(self.tokenizer, texts, pairs, self.max_length, what)

    def windows(self, texts: Sequence[str], stride: int) -> tuple[list[Encoded], list[int]]:
        """Each text whole, in windows of the engine's length sharing `stride` tokens; and each window's text."""
        pieces = [(i, window) for i, item in enumerate(encode(self.tokenizer, texts))
                  for _, window in split_windows(item, self.max_length, stride)]
        return [window for _, window in pieces], [i for i, _ in pieces]

    @torch.inference_mode()
    def run(self, items: Sequence[Encoded], forward: Callable[[dict[str, torch.Tensor]], Result],
            collect: Callable[[list[int], Result], None]) -> None:
        """Forward the items in length-sorted batches; collect(indices, output) places each batch's results."""
        batches = sorted_batches([len(item.input_ids) for item in items], self.batch_size)
        with tqdm(total=len(items), desc=self.progress, unit="input", file=sys.stderr, leave=False,
                  disable=not self.progress or len(batches) < 2) as bar:
            for indices in batches:
                batch = pad_batch([items[i].input_ids for i in indices], [items[i].token_type_ids for i in indices],
                                  self.tokenizer.pad_id)
                with autocast(self.precision, self.device):
                    output = forward({k: v.to(self.device) for k, v in batch.items()})
                collect(indices, output)
                bar.update(len(indices))

    def rows(self, items: Sequence[Encoded],
             forward: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> torch.Tensor:
        """Stack per-input outputs of one shape ((B, ...) per batch) into (N, ...) on the CPU, in input order."""
        out: list[torch.Tensor | None] = [None]

        def collect(indices: list[int], values: torch.Tensor) -> None:
            if out[0] is None:
                out[0] = torch.empty((len(items), *values.shape[1:]), dtype=values.dtype)
            out[0][indices] = values.cpu()

        self.run(items, forward, collect)
        return out[0]
