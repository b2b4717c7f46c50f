"""ONNX export of encoders and fine-tuned task models, int8 dynamic quantization, and an onnxruntime runner.

An exported file takes input_ids, attention_mask, token_type_ids (int64 (B, T), both axes dynamic) and gives: a
checkpoint's last_hidden_state (B, T, H) and pooled (B, H) with a pooler (with kind="mlm", logits (B, T, V)); a
fine-tuned folder's logits: classify (B, L), ner (B, T, L), qa start_logits and end_logits (B, T); an embed folder's as
a checkpoint. An export is one self-contained folder: DIR/model.onnx, DIR/model.onnx.json (task, labels, output names,
max_length, pooling, normalize, task.json), the source's config.json and its tokenizer files, so it runs on its own
(`OnnxRunner(DIR)`) and a second export never writes beside the first model's files.

Exporter: TorchScript (`dynamo=False`). On torch 2.13 both give a correct graph with dynamic axes (MiniLM 32 x 40 with
padding: max |diff| 3e-6, dynamo 4e-6), but dynamo needs onnxscript, took 8 s against 3 s and its graph ran ~15% slower
in onnxruntime. TorchScript export is deprecated since torch 2.9; moving means `dynamo=True` and `dynamic_shapes` with
`Dim("sequence", max=config.max_tokens)`. SDPA with our boolean mask exports as it is (opset >= 14: Where(mask, 0,
-inf) + Softmax), so the model code needs no export-only path."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

import torch
from torch import nn

from encoderlab.checkpoint import load_model, resolve_model_path
from encoderlab.choices import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from encoderlab.choices import ONNX_KINDS as KINDS
from encoderlab.config import EncoderConfig
from encoderlab.engine import Engine, check_texts, sentence_vectors, window
from encoderlab.errors import CheckpointError, ConfigError, InputError
from encoderlab.folder import read_task_info, settings
from encoderlab.io import ONNX_FILE as MODEL_FILE
from encoderlab.io import atomic_write, atomic_write_text, check_export_folder, clear_folder, read_json_file
from encoderlab.nn import model as kinds
from encoderlab.nn.attention import SelfAttention
from encoderlab.nn.bilstm import BiLSTMClassifier
from encoderlab.nn.output import ModelOutput
from encoderlab.tokenizer import Tokenizer

# onnxruntime (and its quantizer) is imported where used: only exporting and running need it.

log = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
SIDECAR_FORMAT = "encoderlab-onnx/1"


def sidecar_path(onnx_path: str | os.PathLike) -> Path:
    """Where the JSON sidecar of an ONNX file lives: FILE.onnx -> FILE.onnx.json."""
    return Path(f"{onnx_path}.json")


# ---- export -------------------------------------------------------------------------------------------
def _graph_module(model: nn.Module) -> nn.Module:
    """Wrap a model so it takes three tensors and returns a tuple of tensors (ONNX has no dataclasses)."""
    class Exported(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    token_type_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out = self.model(input_ids, attention_mask, token_type_ids)
            if out.logits is None:  # the bare encoder or a sentence embedder: token vectors, pooling is the runner's
                return (out.last_hidden_state,) + ((out.pooled,) if out.pooled is not None else ())
            return (out.start_logits, out.end_logits) if isinstance(self.model, kinds.SpanExtractor) else (out.logits,)

    # Eval mode on the wrapper itself: after tracing, the exporter sets the whole tree back to the wrapper's mode,
    # and a fresh module is in train mode: dropout would be on in the torch model the export is checked against.
    return Exported().eval()


def _load_for_export(name: str | os.PathLike, kind: str,
                     tokenizer: Tokenizer | None) -> tuple[Path, nn.Module, dict]:
    """The checkpoint folder, the model to export (eval mode) and its sidecar fields (task, outputs, max_length: the
    window the pipelines use, engine.window)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown export kind {kind!r}; expected one of {', '.join(KINDS)}")
    folder = resolve_model_path(name)
    task_info = read_task_info(folder)
    if kind == "mlm":
        if task_info:
            raise ConfigError(f"{folder}: a fine-tuned {task_info.get('task', '')} folder has no MLM head; "
                              f"export it with kind 'base'")
        model = load_model(folder, kind="mlm")
        fields = {"task": "fill-mask", "outputs": ["logits"]}
    else:
        model = load_model(folder)
        if isinstance(model, BiLSTMClassifier):
            raise ConfigError(f"{folder}: the BiLSTM baseline is not exported to ONNX (encoders only)")
        if isinstance(model, (kinds.MaskedLMModel, kinds.ReplacedTokenDetector)):
            model = load_model(folder, kind="embed")  # the encoder under a pretraining head
        fields = _task_fields(model)
    given = settings(folder)
    limit = window(model.config, tokenizer, given.max_length)
    fields |= {"max_length": limit, "normalize": given.normalize, "task_info": task_info}
    return folder, model.eval(), fields


def _task_fields(model: nn.Module) -> dict:
    """Sidecar fields that depend on the kind of task model."""
    if isinstance(model, kinds.SequenceClassifier):
        return {"task": "classify", "outputs": ["logits"], "labels": model.config.labels,
                "regression": model.regression}
    if isinstance(model, kinds.TokenClassifier):
        return {"task": "ner", "outputs": ["logits"], "labels": model.config.labels}
    if isinstance(model, kinds.SpanExtractor):
        return {"task": "qa", "outputs": ["start_logits", "end_logits"]}
    outputs = ["last_hidden_state"] + (["pooled"] if model.pooler is not None else [])
    return {"task": "embed", "outputs": outputs, "pooling": getattr(model, "pooling", "mean")}


def _example_inputs(vocab_size: int, batch: int, length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random ids (B, T) with the last row half padding, its mask, and segment 1 on the second half."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (batch, length), generator=gen)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, length // 2:] = 0
    segments = (torch.arange(length) >= length // 2).long().expand(batch, length).contiguous()
    return ids * mask, mask, segments * mask


def _write_graph(module: nn.Module, fields: dict, vocab_size: int, path: Path, opset: int) -> None:
    """Trace the wrapped model into an ONNX file at `path` (fp32)."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES + tuple(fields["outputs"])}
    for name in fields["outputs"]:  # pooled vectors and classify logits have no sequence axis
        if name == "pooled" or fields["task"] == "classify":
            axes[name] = {0: "batch"}
    with warnings.catch_warnings(), torch.no_grad():
        # TracerWarnings: Embeddings' length check and the q, k, v unpacking are fixed at trace time, which is
        # right here (the runner truncates to max_length); the DeprecationWarning is the one discussed above.
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, _example_inputs(vocab_size, 2, 8), str(path), dynamo=False,
                          opset_version=opset, input_names=list(INPUT_NAMES), output_names=fields["outputs"],
                          dynamic_axes=axes)


def _drop_nan_guards(path: Path) -> None:
    """Remove the exporter's Where(IsNaN(p), 0, p) after each attention softmax (torch.onnx's opset-14 SDPA symbolic,
    for rows whose keys are all masked), in place. Under a key-padding mask no row of a text is all masked; and on
    256-token passages those two passes over (B, heads, T, T) took a fifth of int8 MiniLM's time in onnxruntime."""
    import onnx

    model = onnx.load(str(path))
    guarded = {node.output[0] for node in model.graph.node if node.op_type == "IsNaN"}
    guards = [n for n in model.graph.node if n.op_type == "IsNaN" or (n.op_type == "Where" and n.input[0] in guarded)]
    bypass = {n.output[0]: n.input[2] for n in guards if n.op_type == "Where"}  # the guard's output -> softmax's
    for node in guards:
        model.graph.node.remove(node)
    for node in model.graph.node:
        node.input[:] = [bypass.get(name, name) for name in node.input]
    used = {name for node in model.graph.node for name in node.input}
    for node in [n for n in model.graph.node if n.op_type == "Constant" and n.output[0] not in used]:
        model.graph.node.remove(node)  # the guards' zeros (onnxruntime warns of each unused one at load)
    onnx.save(model, str(path))


def _quantize(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization: MatMul weights and the embedding tables (Gather) to int8, activations at run time.
    Per-channel weight scales: on MiniLM and 64 SST-2 dev sentences, one scale per tensor gave a mean embedding cosine
    of 0.957 to fp32, one per output channel 0.992. ORT's shape-inference pre-processing is skipped: it fails on this
    graph ("Incomplete symbolic shape inference") and dynamic quantization does not need it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    disabled = logging.root.manager.disable
    logging.disable(logging.WARNING)  # quantize_dynamic logs its pre-processing advice on the root logger
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True)
    finally:
        logging.disable(disabled)


def _max_abs_diff(module: nn.Module, fields: dict, vocab_size: int, path: Path) -> float:
    """Largest |torch - onnxruntime| of the first output on a (3, 11) batch: a shape the export did not see."""
    ids, mask, segments = _example_inputs(vocab_size, 3, 11, seed=1)
    with torch.no_grad():
        expected = module(ids, mask, segments)[0].numpy()
    runner = OnnxRunner(path, threads=1)
    got = runner.run(ids.numpy(), mask.numpy(), segments.numpy())[fields["outputs"][0]]
    return float(np.abs(got - expected).max())


def _folder_tokenizer(folder: Path) -> Tokenizer | None:
    """The checkpoint's tokenizer; None, with a warning, when it has none."""
    try:
        return Tokenizer.from_pretrained(folder)
    except InputError as err:  # the graph runs on token ids without it; texts need it
        log.warning("no tokenizer copied (%s): OnnxRunner.run works, embed does not", err)
        return None


def _copy_tokenizer(tokenizer: Tokenizer | None, folder: Path, dest: Path) -> bool:
    """Save the checkpoint's tokenizer files into dest; False when it has none."""
    if tokenizer is not None:
        tokenizer.save(dest)
    return tokenizer is not None


def _write(module: nn.Module, fields: dict, config: EncoderConfig, out: Path, int8: bool, opset: int) -> int:
    """The graph written to `out` atomically, int8 if asked; the size of its fp32 form in bytes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as scratch:
        fp32 = Path(scratch) / "fp32.onnx"
        _write_graph(module, fields, config.vocab_size, fp32, opset)
        if not (config.relative_attention or config.local_attention):  # their masks can hide a whole row
            _drop_nan_guards(fp32)
        fp32_bytes = fp32.stat().st_size
        atomic_write(out, (lambda tmp: _quantize(fp32, tmp)) if int8 else (lambda tmp: os.replace(fp32, tmp)))
    return fp32_bytes


def export_encoder(encoder: nn.Module, out: Path, int8: bool = False, opset: int = DEFAULT_OPSET,
                   for_openvino: bool = False) -> None:
    """An Encoder alone as an ONNX file (ids, mask, segments -> last_hidden_state (B, T, H)), int8 if asked: the
    forward pass that `--engine onnxruntime` and `openvino` delegate (encoderlab.infer.backends); no sidecar, no
    tokenizer. for_openvino: q, k and v as three projections and attention written out, the graph OpenVINO fuses
    best (SelfAttention._openvino_graph); ONNX Runtime's int8 would quantize the input three times over, so it
    keeps the one fused projection."""
    with torch.device("meta"):  # a shell for the encoder, so _graph_module sees the model interface
        shell = kinds.EncoderModel(encoder.config, pooler=False)
    shell.encoder = encoder
    attentions = [m for m in encoder.modules() if isinstance(m, SelfAttention)]
    for attention in attentions:
        attention.export_for_openvino = for_openvino
    try:
        _write(_graph_module(shell), {"task": "embed", "outputs": ["last_hidden_state"]}, encoder.config, out, int8,
               opset)
    finally:
        for attention in attentions:
            attention.export_for_openvino = False


def export_onnx(model_name_or_path: str | os.PathLike, out_dir: str | os.PathLike, int8: bool = False,
                kind: str = "base", opset: int = DEFAULT_OPSET, overwrite: bool = False) -> dict:
    """Export a checkpoint, alias or fine-tuned folder to ONNX (int8 if asked) into the folder `out_dir`: model.onnx,
    its sidecar, config.json and the tokenizer, each file atomically (overwrite: the folder emptied first, once the
    model has loaded); what was written: paths, sizes, outputs and (fp32) the largest |torch - onnxruntime| difference."""
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ConfigError(f"opset {opset}: expected {MIN_OPSET} to {MAX_OPSET}")
    check_export_folder(out_dir, overwrite, model_name_or_path)
    folder = resolve_model_path(model_name_or_path)
    tokenizer = _folder_tokenizer(folder)
    folder, model, fields = _load_for_export(folder, kind, tokenizer)
    module, vocab_size = _graph_module(model), model.config.vocab_size
    if overwrite:
        clear_folder(out_dir)
    out = Path(out_dir) / MODEL_FILE
    fp32_bytes = _write(module, fields, model.config, out, int8, opset)
    copied = _copy_tokenizer(tokenizer, folder, out.parent)
    atomic_write(out.parent / "config.json", lambda tmp: shutil.copyfile(folder / "config.json", tmp))
    sidecar = {"format": SIDECAR_FORMAT, "source": str(folder), "kind": kind, "inputs": list(INPUT_NAMES),
               "hidden_size": model.config.hidden_size, "opset": opset, "int8": int8, "tokenizer": copied} | fields
    atomic_write_text(sidecar_path(out), json.dumps(sidecar, indent=2) + "\n")
    # int8 is not checked on random ids, far from real text; the tests measure it on real sentences.
    check = None if int8 else _max_abs_diff(module, fields, vocab_size, out)
    return sidecar | {"path": str(out), "sidecar": str(sidecar_path(out)), "bytes": out.stat().st_size,
                      "fp32_bytes": fp32_bytes, "max_abs_diff": check}


# ---- running -------------------------------------------------------------------------------------------
class OnnxRunner:
    """An exported model in onnxruntime on CPU: numpy in, numpy out; `embed` turns texts into vectors."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        """path: an export folder (export_onnx), or an ONNX file (the engines' cache: no sidecar, no tokenizer)."""
        import onnxruntime as ort

        self.path = Path(path) / MODEL_FILE if Path(path).is_dir() else Path(path)
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such ONNX file")
        sidecar = sidecar_path(self.path)
        self.info = read_json_file(sidecar) if sidecar.is_file() else {}  # {}: exported elsewhere
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001 (onnxruntime's own classes: InvalidProtobuf, Fail, ...)
            raise CheckpointError(f"{self.path}: onnxruntime cannot load it ({str(err).splitlines()[0]})") from None
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._tokenizer = None

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the export folder (loaded on first use)."""
        if self._tokenizer is None:
            self._tokenizer = Tokenizer.from_pretrained(self.path.parent)
        return self._tokenizer

    @property
    def max_length(self) -> int:
        """Longest input in tokens: the sidecar's max_length, else BERT's 512."""
        return int(self.info.get("max_length") or 512)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
            token_type_ids: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """(B, T) integer arrays (or CPU tensors) -> every output by name; a missing mask or segments mean none."""
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.ndim != 2:
            raise InputError(f"input_ids: expected a (batch, sequence) array, got shape {ids.shape}")
        given = {"input_ids": ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        defaults = {"attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        # The TorchScript exporter drops inputs a graph does not use (segments, for a model without them).
        feeds = {name: np.asarray(given[name] if given[name] is not None else defaults[name], dtype=np.int64)
                 for name in self.input_names}
        return dict(zip(self.output_names, self.session.run(None, feeds)))

    def embed(self, texts: list[str], pooling: str | None = None, normalize: bool | None = None,
              batch_size: int = 32) -> np.ndarray:
        """Texts -> float32 (N, H) in input order; pooling and normalisation default to the exported folder's."""
        if "last_hidden_state" not in self.output_names:
            raise ConfigError(f"{self.path}: outputs {', '.join(self.output_names)}; embed needs an encoder export")
        pooling = pooling or self.info.get("pooling") or "mean"
        normalize = bool(self.info.get("normalize")) if normalize is None else normalize
        engine = Engine(self.tokenizer, self.max_length, batch_size)
        return engine.rows(engine.encode(check_texts(texts)), lambda batch: sentence_vectors(
            self.forward(batch), batch["attention_mask"], pooling, normalize)).numpy()

    def forward(self, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """A padded batch of CPU tensors through the session, as the engine reads a forward pass."""
        out = self.run(batch["input_ids"].numpy(), batch["attention_mask"].numpy(), batch["token_type_ids"].numpy())
        return ModelOutput(last_hidden_state=torch.from_numpy(out["last_hidden_state"]))
