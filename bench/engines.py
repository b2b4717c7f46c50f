"""The engines bench/inference.py sets side by side: each loader takes a Setting (a Hugging Face BertModel folder, a
scratch folder, threads) and returns an Embedder, (texts, batch size) -> (N, H) float32 mean-pooled, L2-normalised
vectors in input order, tokenization included. Test/bench dependencies only: encoderlab never imports this.

- transformers-fp32: AutoModel with eager attention, batches in file order padded to their longest, mean pooling:
  what most scripts do, and the 1.00x baseline.
- sentence-transformers[-onnx|-openvino]: SentenceTransformer.encode with its torch, onnx or openvino backend (it sorts
  by length itself). The onnx and openvino backends need `optimum`, whose install on the bench machine would replace
  the CPU torch build with a CUDA one: where it is absent they are skipped with the backend's own error.
- onnxruntime-fp32/-int8: the transformers model exported by torch.onnx.export (TorchScript, opset 17), int8 by
  onnxruntime.quantization.quantize_dynamic (int8 weights, one scale per output channel; ORT's
  "Quantize ONNX models" guide).
- ctranslate2-fp32/-int8: ctranslate2.converters.TransformersConverter on the folder, ctranslate2.Encoder with
  compute_type float32 or int8 (int8 weights, activations quantized at run time; CTranslate2's "Quantization" docs).
- openvino-fp32/-int8: openvino.convert_model of onnxruntime's ONNX export, compiled with f32 inference precision
  (OpenVINO would pick bf16 by itself on AVX512-BF16/AMX CPUs); int8 by nncf.quantize (post-training int8 of
  weights and activations, ModelType.TRANSFORMER, calibrated on `Setting.calibration`; nncf's PTQ guide).
- encoderlab-MODE[+compile]: pipeline("embed", precision=MODE, compile=...), each precision this CPU runs.
- encoderlab-ENGINE-MODE: pipeline("embed", precision=MODE, engine=ENGINE): our pipeline (tokenization, batching,
  pooling) with the encoder's forward pass in onnxruntime or CTranslate2 (encoderlab.infer.backends), its converted
  model built into the scratch folder at load; encoderlab-auto: engine and precision auto, timed at load.
- encoderlab-onnx-fp32/-int8: encoderlab's own ONNX export (encoderlab.infer.onnx) on onnxruntime.

The third-party runtimes (onnxruntime, CTranslate2, OpenVINO) get what a careful user gives them: the folder's fast
tokenizer (tokenizers), batches cut from the texts sorted by length, each padded to its longest, as
sentence-transformers and encoderlab do. A loader whose package is absent or fails raises Skipped with the reason.
"""

from __future__ import annotations

import functools
import importlib
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from encoderlab.infer.onnx import OnnxRunner, export_onnx
from encoderlab.infer.pipelines import pipeline

Embedder = Callable[[list[str], int], np.ndarray]  # texts, batch size -> (N, H)
Forward = Callable[[np.ndarray, np.ndarray], np.ndarray]  # ids, mask (B, T) int64 -> hidden (B, T, H)
MAX_LENGTH = 512
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
CALIBRATION_BATCH = 32


class Skipped(Exception):
    """An engine this machine or install cannot run; the message says why."""


@dataclass(frozen=True)
class Setting:
    """What every loader gets: the model folder, a scratch folder for converted models, and threads."""

    folder: Path
    work: Path
    threads: int
    calibration: tuple[str, ...] = field(default=(), compare=False)
    """Texts for static int8 calibration (OpenVINO): never the texts timed or scored."""
    user_cache: bool = field(default=False, compare=False)
    """encoderlab's --engine modes keep their exports and auto's choice in the user's cache (ENCODERLAB_CACHE, as the
    commands do), so a second run reuses them; False: in the scratch folder, made afresh each run."""


def require(module: str) -> ModuleType:
    """Import an optional engine's package, or Skipped naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise Skipped(f"{module} is not installed ({err}); pip install -e '.[bench]'") from None


# ---- shared by the third-party runtimes -------------------------------------------------------------------
@functools.cache
def fast_tokenizer(folder: Path) -> object:
    """The folder's tokenizer.json as a `tokenizers.Tokenizer`, truncating at MAX_LENGTH and not padding."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_LENGTH)
    return tokenizer


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean of the real tokens' vectors, L2-normalised: (B, T, H), (B, T) -> (B, H)."""
    weights = mask[..., None].astype(np.float32)
    vectors = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token id rows right-padded with 0 to the longest: ids and attention mask, (B, T) int64 each."""
    lengths = np.array([len(row) for row in rows])
    mask = (np.arange(lengths.max()) < lengths[:, None]).astype(np.int64)
    ids = np.zeros(mask.shape, dtype=np.int64)
    ids[mask.astype(bool)] = np.concatenate(rows)
    return ids, mask


def feeds(ids: np.ndarray, mask: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """A graph's inputs by name (all-zero token types); the exporter drops inputs a graph does not use."""
    given = dict(zip(INPUT_NAMES, (ids, mask, np.zeros_like(ids))))
    return {name: given[name] for name in names}


def sorted_embedder(setting: Setting, forward: Forward) -> Embedder:
    """Texts -> vectors through `forward`, in length-sorted batches each padded to its longest."""
    tokenizer = fast_tokenizer(setting.folder)

    def run(texts: list[str], batch_size: int) -> np.ndarray:
        rows = [e.ids for e in tokenizer.encode_batch(texts)]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        out = None
        for start in range(0, len(order), batch_size):
            indices = order[start:start + batch_size]
            ids, mask = padded([rows[i] for i in indices])  # (B, T) each
            vectors = mean_pooled(forward(ids, mask), mask)
            out = np.empty((len(rows), vectors.shape[1]), np.float32) if out is None else out
            out[indices] = vectors
        return out

    return run


class HiddenStates(torch.nn.Module):
    """A transformers model as three tensors in, last_hidden_state (B, T, H) out: what the exporters trace."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state


@functools.cache
def hf_model(folder: Path) -> torch.nn.Module:
    """transformers' AutoModel of the folder, eager attention, eval mode (loaded once per run)."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder, attn_implementation="eager").eval()


def example_inputs() -> tuple[torch.Tensor, ...]:
    """A (2, 8) batch whose second row is half padding, for tracing."""
    ids = torch.randint(1000, 2000, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    return ids * mask, mask, torch.zeros_like(ids)


def once(path: Path, make: Callable[[Path], None]) -> Path:
    """`path`, made by make(path) unless an earlier loader of this run made it already."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
    return path


# ---- transformers and sentence-transformers ---------------------------------------------------------------
def transformers_eager(setting: Setting) -> Embedder:
    """transformers AutoModel, eager attention, fp32, file-order batches, mean pooling."""
    from transformers import AutoTokenizer

    model, tokenizer = hf_model(setting.folder), AutoTokenizer.from_pretrained(setting.folder)

    @torch.inference_mode()
    def run(texts: list[str], batch_size: int) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch_size):
            batch = tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                              max_length=MAX_LENGTH, return_tensors="pt")
            out.append(mean_pooled(model(**batch).last_hidden_state.numpy(), batch["attention_mask"].numpy()))
        return np.concatenate(out)

    return run


def sentence_transformers(backend: str) -> Callable[[Setting], Embedder]:
    """SentenceTransformer.encode with `backend` (torch, onnx or openvino): the loader."""

    def load(setting: Setting) -> Embedder:
        from sentence_transformers import SentenceTransformer

        try:
            model = SentenceTransformer(str(setting.folder), device="cpu", backend=backend)
        except Exception as err:  # noqa: BLE001 (the backend's own errors: ImportError, OSError, ValueError...)
            raise Skipped(f"sentence-transformers backend {backend!r}: {str(err).splitlines()[0]}") from None
        return lambda texts, batch_size: model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                                          normalize_embeddings=True)

    return load


# ---- onnxruntime ----------------------------------------------------------------------------------------
def hf_onnx(setting: Setting, int8: bool) -> Path:
    """The transformers model exported to ONNX (both axes dynamic), int8 by quantize_dynamic if asked."""

    def export(path: Path) -> None:
        axes = {name: {0: "batch", 1: "sequence"} for name in (*INPUT_NAMES, "last_hidden_state")}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings and TorchScript's deprecation: the graph is checked
            torch.onnx.export(HiddenStates(hf_model(setting.folder)).eval(), example_inputs(), str(path),
                              dynamo=False, opset_version=17, input_names=list(INPUT_NAMES),
                              output_names=["last_hidden_state"], dynamic_axes=axes)

    fp32 = once(setting.work / "hf-onnx" / "model.onnx", export)
    if not int8:
        return fp32

    def quantize(path: Path) -> None:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        logging.disable(logging.WARNING)  # its pre-processing advice, on the root logger
        try:
            quantize_dynamic(fp32, path, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            logging.disable(logging.NOTSET)

    return once(setting.work / "hf-onnx" / "model-int8.onnx", quantize)


def onnxruntime(int8: bool) -> Callable[[Setting], Embedder]:
    """onnxruntime on the transformers model's ONNX export (fp32 or dynamic int8): the loader."""

    def load(setting: Setting) -> Embedder:
        ort = require("onnxruntime")
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = setting.threads, 1
        session = ort.InferenceSession(str(hf_onnx(setting, int8)), options, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return sorted_embedder(setting, lambda ids, mask: session.run(None, feeds(ids, mask, names))[0])

    return load


# ---- CTranslate2 -------------------------------------------------------------------------------------------
def ctranslate2(int8: bool) -> Callable[[Setting], Embedder]:
    """CTranslate2's Encoder on the converted folder, compute_type float32 or int8: the loader."""

    def load(setting: Setting) -> Embedder:
        ct2 = require("ctranslate2")
        converted = once(setting.work / "ct2", lambda path: ct2.converters.TransformersConverter(
            str(setting.folder)).convert(str(path)))
        encoder = ct2.Encoder(str(converted), device="cpu", compute_type="int8" if int8 else "float32",
                              intra_threads=setting.threads, inter_threads=1)

        def forward(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
            rows = [row[:n].tolist() for row, n in zip(ids, mask.sum(1))]  # it pads by itself
            return np.asarray(encoder.forward_batch(rows).last_hidden_state)

        return sorted_embedder(setting, forward)

    return load


# ---- OpenVINO ---------------------------------------------------------------------------------------------
def openvino_model(setting: Setting, int8: bool) -> object:
    """The transformers model as an OpenVINO model (dynamic axes), int8 by nncf.quantize if asked."""
    ov = require("openvino")
    path = setting.work / "openvino" / f"model{'-int8' if int8 else ''}.xml"
    if path.exists():
        return ov.Core().read_model(path)
    # From the ONNX export onnxruntime runs (the same graph as tracing the torch model, in a fraction of the time).
    model = ov.convert_model(hf_onnx(setting, int8=False))
    if int8:
        model = _nncf_int8(setting, model)
    path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, path, compress_to_fp16=False)
    return model


def _nncf_int8(setting: Setting, model: object) -> object:
    """Post-training int8 (weights and activations) of an OpenVINO model, calibrated on setting.calibration."""
    nncf = require("nncf")
    if not setting.calibration:
        raise Skipped("openvino int8: no calibration texts")
    tokenizer, texts, batches = fast_tokenizer(setting.folder), list(setting.calibration), []
    names = [i.get_any_name() for i in model.inputs]
    for start in range(0, len(texts), CALIBRATION_BATCH):
        ids, mask = padded([e.ids for e in tokenizer.encode_batch(texts[start:start + CALIBRATION_BATCH])])
        batches.append(feeds(ids, mask, names))
    logging.getLogger("nncf").setLevel(logging.WARNING)  # its progress tables
    return nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(batches))


def openvino(int8: bool) -> Callable[[Setting], Embedder]:
    """OpenVINO's CPU plugin, f32 inference precision, on the converted model (fp32 or nncf int8): the loader."""

    def load(setting: Setting) -> Embedder:
        ov = require("openvino")
        config = {"INFERENCE_NUM_THREADS": setting.threads, "INFERENCE_PRECISION_HINT": "f32",
                  "PERFORMANCE_HINT": "LATENCY"}
        compiled = ov.Core().compile_model(openvino_model(setting, int8), "CPU", config)
        request, names = compiled.create_infer_request(), [i.get_any_name() for i in compiled.inputs]
        return sorted_embedder(setting, lambda ids, mask: request.infer(feeds(ids, mask, names))[compiled.output(0)])

    return load


# ---- encoderlab -------------------------------------------------------------------------------------------
def encoderlab(mode: str, compile: bool = False, engine: str = "torch") -> Callable[[Setting], Embedder]:
    """encoderlab's embed pipeline in one precision on one engine (compiled: warmed up at load, so its compile time
    is load time; another engine: its conversion is load time too)."""

    def load(setting: Setting) -> Embedder:
        if engine not in ("torch", "auto"):
            for module in ("openvino", "nncf") if engine == "openvino" else (engine,):
                require(module)
        embedder = pipeline("embed", setting.folder, precision=mode, max_length=MAX_LENGTH, compile=compile,
                            engine=engine, engine_cache=None if setting.user_cache else setting.work / "encoderlab-engines")

        def run(texts: list[str], batch_size: int) -> np.ndarray:
            embedder.engine.batch_size = batch_size  # one compiled model for every workload's batch size
            return embedder.embed(texts)

        return run

    return load


def encoderlab_onnx(int8: bool) -> Callable[[Setting], Embedder]:
    """encoderlab's own ONNX export (fp32 or int8) on onnxruntime, through OnnxRunner.embed: the loader."""

    def load(setting: Setting) -> Embedder:
        require("onnxruntime")
        path = setting.work / "encoderlab-onnx" / f"model{'-int8' if int8 else ''}"  # an export folder
        once(path, lambda p: export_onnx(setting.folder, p, int8=int8))
        runner = OnnxRunner(path, threads=setting.threads)
        return lambda texts, batch_size: runner.embed(texts, batch_size=batch_size)

    return load


def catalog(modes: list[str], compiled: list[str]) -> dict[str, Callable[[Setting], Embedder]]:
    """Every engine by name, transformers-fp32 (the baseline) first; encoderlab in `modes`, `compiled` also compiled."""
    engines = {"transformers-fp32": transformers_eager, "sentence-transformers": sentence_transformers("torch"),
               "sentence-transformers-onnx": sentence_transformers("onnx"),
               "sentence-transformers-openvino": sentence_transformers("openvino")}
    for name, loader in (("onnxruntime", onnxruntime), ("ctranslate2", ctranslate2), ("openvino", openvino)):
        engines |= {f"{name}-fp32": loader(False), f"{name}-int8": loader(True)}
    engines |= {f"encoderlab-{mode}": encoderlab(mode) for mode in modes}
    engines |= {f"encoderlab-{mode}+compile": encoderlab(mode, True) for mode in compiled if mode in modes}
    engines |= {f"encoderlab-{name}-{mode}": encoderlab(mode, engine=name)
                for name in ("onnxruntime", "ctranslate2", "openvino") for mode in ("fp32", "int8")}
    engines["encoderlab-auto"] = encoderlab("auto", engine="auto")
    return engines | {"encoderlab-onnx-fp32": encoderlab_onnx(False), "encoderlab-onnx-int8": encoderlab_onnx(True)}
