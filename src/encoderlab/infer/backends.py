"""Other runtimes under our pipelines (`--engine`): the encoder's forward pass in ONNX Runtime, CTranslate2 or OpenVINO,
while tokenization, batching, windows, pooling and the task heads stay ours. On a 2-core AVX2 EPYC without VNNI
(issue 18) CTranslate2 int8 ran MiniLM sentences about 1.2x faster than our best torch mode, ONNX Runtime int8
256-token passages about 1.1x; on a 2-core AVX-512 VNNI Ice Lake OpenVINO's static int8 ran sentences 1.2x faster
than our compiled torch int8 and 1.7x the ONNX Runtime int8 (bench/results/icelake-avx512-vnni/inference.json), so
`auto` measures rather than guesses.
- onnxruntime: the Encoder exported once (infer.onnx.export_encoder; int8: ORT's dynamic quantization) into a cache
  keyed by a hash of the weights, run by OnnxRunner.
- ctranslate2: a TransformerEncoderSpec filled from our state dict and saved once (ctranslate2's own converter
  imports transformers, which encoderlab never does); int8 is its compute_type, weights quantized at load.
- openvino: the same ONNX export read by OpenVINO's CPU plugin at f32 inference precision (left alone it would pick
  bf16 on AVX512-BF16/AMX CPUs); int8 by nncf's post-training quantization (weights and activations, its
  TRANSFORMER preset), activation ranges calibrated once on CALIBRATION, 72 English texts of our own, from two words
  to passages (static ranges need sample text; dynamic quantization of weight-compressed models ran at half the
  speed). Without the 12 of two or three words, the shortest SST-2 dev sentences ("bad .") came out at cosine 0.93
  to fp32; with them, the least was 0.975 and the mean 0.9958 -> 0.9964 (all 872 sentences, Ice Lake, 2026-11-25).
- auto: each candidate timed on two small batches and kept only where its mean-pooled vectors stay within cosine
  MIN_COSINE of torch fp32; the close ones timed again in interleaved rounds; the choice is cached per weights,
  CPU, threads and request."""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from encoderlab.choices import ENGINES
from encoderlab.config import EncoderConfig
from encoderlab.engine import encode, pad_batch, sentence_vectors, window
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer import precision as precisions
from encoderlab.infer.onnx import OnnxRunner, export_encoder
from encoderlab.io import atomic_write_text, read_json_file
from encoderlab.nn.output import ModelOutput
from encoderlab.tokenizer import Tokenizer

log = logging.getLogger(__name__)
RUNTIMES = ENGINES[1:4]
RUNTIME_PRECISIONS = ("fp32", "int8")  # what the runtimes run; torch: precision.PRECISIONS
EXTRA = "pip install 'encoderlab[engines]'"
CALIBRATION = Path(__file__).with_name("calibration") / "en.txt"  # OpenVINO int8's activation ranges
IMPORT_NAMES = {"openvino": ("openvino", "nncf")}  # an engine's modules, where it needs more than its own
MIN_COSINE = 0.99  # auto keeps a candidate whose mean-pooled vectors have a mean cosine >= this to torch fp32
# auto's second pass: up to FINALISTS candidates within CLOSE x the fastest first-pass time, timed in ROUNDS
# interleaved rounds. Timed one after another, 2 runs each, OpenVINO int8 took 156, 231 and 220 ms in three loads at
# 1 thread on a shared Ice Lake, and torch int8 (205 ms) won the second: it then ran SST-2 at 0.75x OpenVINO int8.
FINALISTS, CLOSE, ROUNDS = 3, 1.3, 5
CT2_ACTIVATIONS = {"gelu": "GELU", "gelu_new": "GELUTanh", "gelu_pytorch_tanh": "GELUTanh", "relu": "RELU",
                   "silu": "SWISH"}  # config.json hidden_act -> ctranslate2.specs.common_spec.Activation
SAMPLE = ("The film was a delight from start to finish.", "Where does Anna live?", "Paris is the capital of France.",
          "It rained all day, so the match was put off until the following week, much to everyone's dismay.",
          "A remarkably dull plot.", "Researchers measured the speed of sound in water at several temperatures.")


class RuntimeEncoder(nn.Module):
    """An Encoder's forward pass run by another runtime: ids, mask, segments (B, T) -> ModelOutput (B, T, H)."""

    def __init__(self, encoder: nn.Module, run: Callable[..., np.ndarray], engine: str) -> None:
        super().__init__()
        self.config, self.run, self.engine = encoder.config, run, engine
        self.embeddings = encoder.embeddings  # the MLM head is tied to the word embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **flags: bool) -> ModelOutput:
        if any(flags.values()):
            raise InputError(f"--engine {self.engine} gives the last hidden states only; attention maps and every "
                             f"layer's states need --engine torch")
        ids = input_ids.cpu().numpy()
        mask = np.ones_like(ids) if attention_mask is None else attention_mask.cpu().numpy().astype(np.int64)
        types = np.zeros_like(ids) if token_type_ids is None else token_type_ids.cpu().numpy()
        return ModelOutput(last_hidden_state=torch.from_numpy(np.ascontiguousarray(self.run(ids, mask, types))))


def _import(engine: str) -> Any:
    """The runtime's Python module; ConfigError naming the extra to install when it (or a module it needs) is
    missing."""
    try:
        modules = [importlib.import_module(name) for name in IMPORT_NAMES.get(engine, (engine,))]
    except ImportError as err:
        raise ConfigError(f"--engine {engine} needs the {err.name} package: {EXTRA}") from None
    return modules[0]


def cache_dir(encoder: nn.Module, root: str | os.PathLike | None = None) -> Path:
    """Where the runtimes' files for these weights live: root (default $ENCODERLAB_CACHE, else ~/.cache/encoderlab,
    then engines/) / a hash of the config and weights, so a changed checkpoint never reuses a stale export."""
    digest = hashlib.blake2b(repr(encoder.config).encode(), digest_size=8)
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy())
    default = Path(os.environ.get("ENCODERLAB_CACHE", Path.home() / ".cache" / "encoderlab")) / "engines"
    return (Path(root) if root else default) / digest.hexdigest()


# ---- the runtimes ----------------------------------------------------------------------------------------------
def _exported(encoder: nn.Module, cache: Path, precision: str, for_openvino: bool = False) -> Path:
    """The encoder's ONNX file in the cache (int8: ONNX Runtime's dynamic quantization), exported on first use;
    for_openvino: the layout OpenVINO converts (export_encoder)."""
    path = cache / f"encoder-{precision}{'-openvino' if for_openvino else ''}.onnx"
    if not path.is_file():
        log.info("exporting the encoder to %s (once)", path)
        export_encoder(encoder, path, int8=precision == "int8", for_openvino=for_openvino)
    return path


def _onnx_run(encoder: nn.Module, precision: str, cache: Path, threads: int,
              tokenizer: Tokenizer | None = None) -> Callable[..., np.ndarray]:
    _import("onnxruntime")
    runner = OnnxRunner(_exported(encoder, cache, precision), threads)
    return lambda ids, mask, types: runner.run(ids, mask, types)["last_hidden_state"]


def _ct2_run(encoder: nn.Module, precision: str, cache: Path, threads: int,
             tokenizer: Tokenizer | None = None) -> Callable[..., np.ndarray]:
    ct2 = _import("ctranslate2")
    folder = cache / "ctranslate2"
    if not (folder / "model.bin").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache, prefix=".ctranslate2.") as scratch:
            os.mkdir(f"{scratch}/model")
            ct2_spec(encoder.config, encoder.state_dict()).save(f"{scratch}/model")
            try:
                os.replace(f"{scratch}/model", folder)  # whole or not at all
            except OSError:
                if not (folder / "model.bin").is_file():  # else another process saved it first
                    raise
    model = ct2.Encoder(str(folder), "cpu", compute_type="int8" if precision == "int8" else "float32",
                        intra_threads=threads)
    segments = bool(encoder.config.type_vocab_size)

    def run(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        # CTranslate2 takes lengths, not a mask: the engine's batches are right-padded.
        lengths = ct2.StorageView.from_array(mask.sum(1).astype(np.int32))
        out = model.forward_batch(ct2.StorageView.from_array(ids.astype(np.int32)), lengths,
                                  types.tolist() if segments else None)
        return np.asarray(out.last_hidden_state)

    return run


def ov_layout() -> bool:
    """Whether OpenVINO gets the export laid out for its CPU plugin's attention fusion (export_encoder's
    for_openvino): where the CPU has an int8 dot-product instruction (VNNI, AMX). There the plugin fuses the
    written-out attention, quantized or not, into one op, and int8 MiniLM ran 1.06-1.10x faster than from the
    standard export (the Ice Lake, 2026-11-25). Without VNNI the plugin leaves a quantized attention chain unfused
    (its MHA tokenization asks for AVX512-VNNI, AMX or AVX2-VNNI-2 in int8: openvinotoolkit/openvino#28276), so
    those CPUs keep the standard export, whose converted ScaledDotProductAttention op has a kernel of its own."""
    return bool(precisions.cpu_flags() & precisions.VNNI_FLAGS)


def _ov_run(encoder: nn.Module, precision: str, cache: Path, threads: int,
            tokenizer: Tokenizer | None = None) -> Callable[..., np.ndarray]:
    ov = _import("openvino")
    # 2: converted by convert_model (files read_model made stay unused); 3: from the export laid out for OpenVINO
    # (ov_layout); int8 also names its calibration text, so a changed CALIBRATION quantizes afresh.
    laid_out = ov_layout()
    stem = f"openvino{3 if laid_out else 2}"
    path = cache / (f"{stem}-int8-{_digest(CALIBRATION)}.xml" if precision == "int8" else f"{stem}-{precision}.xml")
    if not path.is_file():
        if precision == "int8" and tokenizer is None:
            raise ConfigError("--engine openvino --precision int8 calibrates on text: it needs the model's tokenizer")
        # convert_model, not Core.read_model: from the standard export only the converter's passes fuse each
        # attention into one ScaledDotProductAttention op; read as it was, our int8 graph ran 8-10% slower than the
        # same model converted (the Ice Lake, 2026-11-25: 364 against 401 sentences/s at 1 thread, same batches).
        # The layout for OpenVINO (ov_layout) is fused later, by the CPU plugin when it compiles.
        model = ov.convert_model(str(_exported(encoder, cache, "fp32", for_openvino=laid_out)))
        if precision == "int8":
            log.info("quantizing for OpenVINO int8, calibrated on %s (once)", CALIBRATION.name)
            model = _ov_int8(model, tokenizer, encoder.config)
        _save_ov(ov, model, path)
    config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request, names = compiled.create_infer_request(), [i.get_any_name() for i in compiled.inputs]

    def run(ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        # The exporter drops inputs a graph does not use (segments, for a model without them).
        return request.infer({n: given[n].astype(np.int64) for n in names})[compiled.output(0)]

    return run


def _digest(path: Path) -> str:
    """8 hex digits of a file's content."""
    return hashlib.blake2b(path.read_bytes(), digest_size=4).hexdigest()


def _ov_int8(model: Any, tokenizer: Tokenizer, config: EncoderConfig) -> Any:
    """nncf's post-training int8 of an OpenVINO model, activation ranges from CALIBRATION in batches of 8, each text
    cut to at most 128 tokens (and the model's positions)."""
    nncf = importlib.import_module("nncf")  # _import("openvino") checked it is there
    limit = window(config, tokenizer, 128)
    items = encode(tokenizer, CALIBRATION.read_text(encoding="utf-8").splitlines())
    ids, types = [e.input_ids[:limit] for e in items], [e.token_type_ids[:limit] for e in items]
    names = {i.get_any_name() for i in model.inputs}
    batches = [{k: v.numpy() for k, v in pad_batch(ids[i:i + 8], types[i:i + 8], tokenizer.pad_id).items()
                if k in names} for i in range(0, len(items), 8)]
    logging.getLogger("nncf").setLevel(logging.WARNING)  # its progress tables
    return nncf.quantize(model, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                         subset_size=len(batches))


def _save_ov(ov: Any, model: Any, path: Path) -> None:
    """model.xml and model.bin written whole or not at all: the .bin first, the .xml (what is looked for) last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".openvino.") as scratch:
        ov.save_model(model, f"{scratch}/{path.name}", compress_to_fp16=False)
        os.replace(f"{scratch}/{path.stem}.bin", path.with_suffix(".bin"))
        os.replace(f"{scratch}/{path.name}", path)


def ct2_unsupported(config: EncoderConfig) -> list[str]:
    """What of this architecture CTranslate2's encoder spec (post-norm BERT) cannot hold; empty if nothing."""
    checks = {"pre-norm layers": config.pre_norm, "relative attention": config.relative_attention,
              "rotary positions": config.rope_theta, "local attention": config.local_attention,
              "shared layers": config.shared_layers, "a gated feed-forward": config.gated_ffn,
              "a projected embedding": config.embedding_width != config.hidden_size or config.always_project,
              "bias-free layers": not config.bias, "learned absolute positions": not config.absolute_positions,
              f"the {config.hidden_act} activation": config.hidden_act not in CT2_ACTIVATIONS}
    return [name for name, unsupported in checks.items() if unsupported]


def ct2_spec(config: EncoderConfig, state: dict[str, torch.Tensor]) -> Any:
    """CTranslate2's TransformerEncoderModelSpec of our encoder (names: nn/encoder.py), as its BertLoader fills it
    (ctranslate2/converters/transformers.py); our fused q, k, v rows are the layout its fuse_linear makes."""
    from ctranslate2.specs import common_spec, transformer_spec

    w = {name: tensor.detach().float().cpu().numpy() for name, tensor in state.items()}
    spec = transformer_spec.TransformerEncoderModelSpec(transformer_spec.TransformerEncoderSpec(
        config.num_layers, config.num_heads, pre_norm=False, layernorm_embedding=True,
        activation=getattr(common_spec.Activation, CT2_ACTIVATIONS[config.hidden_act]),
        num_source_embeddings=1 + bool(config.type_vocab_size), embeddings_merge=common_spec.EmbeddingsMerge.ADD))
    encoder = spec.encoder
    encoder.scale_embeddings = False
    encoder.embeddings[0].weight = w["embeddings.word.weight"]
    if config.type_vocab_size:
        encoder.embeddings[1].weight = w["embeddings.segment.weight"]
    encoder.position_encodings.encodings = w["embeddings.position.weight"][config.position_offset:]
    norms = [(encoder.layernorm_embedding, "embeddings.norm")]
    for i, layer in enumerate(encoder.layer):
        for linear, name in ((layer.self_attention.linear[0], "attn.qkv"), (layer.self_attention.linear[1], "attn.out"),
                             (layer.ffn.linear_0, "mlp.up"), (layer.ffn.linear_1, "mlp.down")):
            linear.weight, linear.bias = w[f"layers.{i}.{name}.weight"], w[f"layers.{i}.{name}.bias"]
        norms += [(layer.self_attention.layer_norm, f"layers.{i}.attn_norm"),
                  (layer.ffn.layer_norm, f"layers.{i}.mlp_norm")]
    for norm, name in norms:
        norm.gamma, norm.beta = w[f"{name}.weight"], w[f"{name}.bias"]
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.register_vocabulary([f"<{i}>" for i in range(config.vocab_size)])  # ids go in, never tokens
    spec.validate()
    return spec


RUNNERS = {"onnxruntime": _onnx_run, "ctranslate2": _ct2_run, "openvino": _ov_run}


def runtime_model(model: nn.Module, engine: str, precision: str, cache: Path, threads: int,
                  tokenizer: Tokenizer | None = None) -> nn.Module:
    """A shallow copy of the model whose encoder runs in `engine` at `precision`; heads and pooler stay torch's
    (the tokenizer: OpenVINO int8's calibration text)."""
    run = RUNNERS[engine](model.encoder, precision, cache, threads, tokenizer)
    out = copy.copy(model)
    out._modules = dict(model._modules)  # the copy's own module table: the caller's model keeps its encoder
    out.encoder = RuntimeEncoder(model.encoder, run, engine)
    return out


# ---- choosing -------------------------------------------------------------------------------------------------
def candidates(config: EncoderConfig, engine: str, precision: str, what: str) -> list[tuple[str, str]]:
    """The (engine, precision) pairs a request covers; ConfigError for one that cannot run, naming why."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if engine not in ("auto", "torch"):
        if precision not in ("auto", *RUNTIME_PRECISIONS):
            raise ConfigError(f"--engine {engine} runs fp32 or int8 (or auto), not {precision}; bf16: --engine torch")
        _import(engine)
        missing = ct2_unsupported(config) if engine == "ctranslate2" else []
        if missing:
            raise ConfigError(f"--engine ctranslate2 cannot run {what} on this {config.model_type} model: "
                              f"CTranslate2's encoder has no {', '.join(missing)}; use --engine torch or onnxruntime")
    engines = ["torch", *(e for e in RUNTIMES if _available(e, config))] if engine == "auto" else [engine]
    pairs = [(e, mode) for e in engines for mode in (precisions.supported() if e == "torch" else RUNTIME_PRECISIONS)
             if precision in ("auto", mode)]
    if not pairs:
        raise ConfigError(f"--engine {engine} --precision {precision}: no engine runs that on this machine")
    return pairs


def _available(engine: str, config: EncoderConfig) -> bool:
    """Whether `engine` is installed and holds this architecture (for auto, which skips it otherwise)."""
    try:
        _import(engine)
    except ConfigError:
        return False
    return not (engine == "ctranslate2" and ct2_unsupported(config))


def _sample(tokenizer: Tokenizer, max_length: int) -> list[dict[str, torch.Tensor]]:
    """auto's two batches: 32 short sentences (a default batch) and 4 passages of up to 256 tokens (SAMPLE
    repeated), so that each kind of text weighs alike. Smaller ones (16 sentences, 2 x 128 tokens) misled it at 1
    thread on an Ice Lake: it picked CTranslate2 int8, fastest on small batches, which ran 256-token passages at
    0.54x our best mode (a full `bench/inference.py` run, docs/inference.md)."""
    short = encode(tokenizer, [SAMPLE[i % len(SAMPLE)] for i in range(32)])
    long = encode(tokenizer, [" ".join(SAMPLE[i:] + SAMPLE * 8) for i in range(4)])  # cut below, without a warning
    return [pad_batch([e.input_ids[:limit] for e in items], [e.token_type_ids[:limit] for e in items],
                      tokenizer.pad_id) for items, limit in ((short, max_length), (long, min(256, max_length)))]


@torch.inference_mode()
def _vectors(encoder: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean-pooled, normalised last hidden states (B, H): what auto compares to torch fp32."""
    out = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return sentence_vectors(out, batch["attention_mask"], "mean", normalize=True)


def _build(model: nn.Module, engine: str, precision: str, cache: Path, threads: int, tokenizer: Tokenizer) -> nn.Module:
    if engine == "torch":
        return precisions.convert(model, precision)
    return runtime_model(model, engine, precision, cache, threads, tokenizer)


def _fastest(model: nn.Module, pairs: list[tuple[str, str]], batches: list[dict], cache: Path,
             threads: int, tokenizer: Tokenizer) -> tuple[nn.Module, str, str]:
    """The fastest candidate whose vectors stay within MIN_COSINE of torch fp32's: (model, precision, engine).
    A first pass times each candidate alone and keeps at most FINALISTS of those within CLOSE of the fastest; they
    are then timed again in interleaved rounds, so that a burst of the host's noise falls on all of them alike."""
    reference = [_vectors(model.encoder, batch) for batch in batches]
    kept, report = [], []
    for engine, precision in pairs:
        built, got = _build(model, engine, precision, cache, threads, tokenizer), {}
        seconds = sum(precisions.best_time(lambda i=i: got.__setitem__(i, _vectors(built.encoder, batches[i])),
                                           repeats=2) for i in range(len(batches)))
        cosine = min(float((got[i] * r).sum(-1).mean()) for i, r in enumerate(reference))
        report.append(f"{engine} {precision} {seconds * 1e3:.0f} ms cosine {cosine:.4f}")
        if cosine >= MIN_COSINE:  # only the finalists stay in memory
            kept = sorted([*kept, (seconds, built, precision, engine)], key=lambda c: c[0])[:FINALISTS]
    log.info("engine auto: %s", "; ".join(report))
    if not kept:
        raise ConfigError(f"no candidate stays within cosine {MIN_COSINE} of torch fp32: {'; '.join(report)}")
    finalists = [c for c in kept if c[0] <= CLOSE * kept[0][0]]
    if len(finalists) > 1:
        best = [[float("inf")] * len(batches) for _ in finalists]  # per finalist, per batch
        for _ in range(ROUNDS):
            for times, (_, built, _, _) in zip(best, finalists):
                for i, batch in enumerate(batches):
                    start = time.perf_counter()
                    _vectors(built.encoder, batch)
                    times[i] = min(times[i], time.perf_counter() - start)
        finalists = sorted(((sum(times), *c[1:]) for times, c in zip(best, finalists)), key=lambda c: c[0])
        log.info("engine auto: finalists, best of %d interleaved rounds: %s", ROUNDS,
                 "; ".join(f"{engine} {precision} {seconds * 1e3:.0f} ms"
                           for seconds, _, precision, engine in finalists))
    return finalists[0][1:]


def resolve(model: nn.Module, engine: str, precision: str, probe: Callable[[nn.Module], object],
            device: torch.device, tokenizer: Tokenizer, max_length: int, what: str,
            cache: str | os.PathLike | None = None) -> tuple[nn.Module, str, str]:
    """The model to run, its precision and its engine: as asked, or the fastest candidate within tolerance."""
    if engine == "torch" or (engine == "auto" and device.type != "cpu"):  # the runtimes here run on the CPU
        return (*precisions.resolve(model, precision, probe, device), "torch")
    pairs = candidates(model.config, engine, precision, what)
    if device.type != "cpu":
        raise ConfigError(f"--engine {engine} runs on the CPU; on {device.type} use --engine torch")
    folder, threads = cache_dir(model.encoder, cache), torch.get_num_threads()
    if len(pairs) == 1:
        return _build(model, *pairs[0], folder, threads, tokenizer), pairs[0][1], pairs[0][0]
    choices = folder / "auto.json"
    batches = _sample(tokenizer, max_length)
    sample = " + ".join("x".join(map(str, b["input_ids"].shape)) for b in batches)  # a new sample measures anew
    key = (f"{precisions.cpuinfo('model name')} | {threads} threads | {engine} {precision} | "
           f"{','.join(map(str, pairs))} | sample {sample}")
    known = read_json_file(choices) if choices.is_file() else {}
    if key in known:
        chosen, mode = known[key]
        log.info("engine auto: %s %s, as measured before on this machine (%s)", chosen, mode, choices)
        return _build(model, chosen, mode, folder, threads, tokenizer), mode, chosen
    folder.mkdir(parents=True, exist_ok=True)
    built, mode, chosen = _fastest(model, pairs, batches, folder, threads, tokenizer)
    atomic_write_text(choices, json.dumps(known | {key: [chosen, mode]}, indent=1) + "\n")
    return built, mode, chosen
