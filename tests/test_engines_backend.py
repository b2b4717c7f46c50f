"""`--engine onnxruntime|ctranslate2|openvino|auto` (encoderlab.infer.backends): the encoder's forward pass in another
runtime gives what the torch path gives, within the precision's tolerance, for every pipeline and family; auto says
what it picked; missing runtimes, unsupported architectures and options are refused by name."""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification, BertModel)

from encoderlab.checkpoint import load_model
from encoderlab.cli import main
from encoderlab.config import EncoderConfig
from encoderlab.engine import pad_batch
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer import backends
from encoderlab.infer import precision as precisions
from encoderlab.infer.backends import cache_dir, candidates, ct2_unsupported, resolve, runtime_model
from encoderlab.infer.pipelines import pipeline, prepare
from encoderlab.tasks.embedding import Embed
from encoderlab.infer.server import load_pipelines
from encoderlab.nn.model import SentenceEmbedder
from encoderlab.tokenizer import Tokenizer
from test_family import HF_CONFIGS, family_batch, save_tiny_hf
from test_pipelines import TAGS, TEXTS, hf_folder

pytestmark = pytest.mark.usefixtures("one_thread", "int8_compiled")  # see conftest.py
RUNTIMES = ("onnxruntime", "ctranslate2", "openvino")
# int8 cosine to torch fp32 on SST-2 sentences, mean and minimum: dynamic int8 (ORT: per-channel weights, per-tensor
# activations; CTranslate2) against torch int8's bar of 0.99 and 0.97; OpenVINO's static ranges, calibrated on text
# other than these, give up more on the odd sentence (0.93 at worst of 320 SST-2 dev sentences on MiniLM).
INT8_COSINE = {"onnxruntime": (0.985, 0.96), "ctranslate2": (0.985, 0.96), "openvino": (0.985, 0.9)}
FP32 = {"atol": 1e-4, "rtol": 1e-4}
HF_CLASSES = {"embed": (BertModel, {}), "fill-mask": (BertForMaskedLM, {}), "qa": (BertForQuestionAnswering, {}),
              "classify": (BertForSequenceClassification, {"id2label": {0: "neg", 1: "pos"}}),
              "ner": (BertForTokenClassification, {"id2label": dict(enumerate(TAGS))})}


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One export cache for the module: each model is exported once."""
    return tmp_path_factory.mktemp("engines")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A random tiny transformers BERT per task, with a tiny WordPiece tokenizer."""
    tokenizer_folder = tmp_path_factory.mktemp("tok")
    words = sorted({w for text in TEXTS for w in text.split()}) + ["[MASK]"]
    Tokenizer.train_from_iterator("wordpiece", [" ".join(words)] * 3, vocab_size=120, min_frequency=1).save(
        tokenizer_folder)
    return {task: hf_folder(tmp_path_factory, tokenizer_folder, cls, task.replace("-", ""), **config)
            for task, (cls, config) in HF_CLASSES.items()}


@pytest.fixture(scope="module")
def built(folders, tmp_path_factory) -> Path:
    """An engine cache holding every candidate auto builds for the embed folder (the ONNX exports, CTranslate2's and
    OpenVINO's conversions, OpenVINO's int8 calibration) but no choice: each auto test times the candidates afresh
    in a copy, without exporting and calibrating them again (about 12 CPU s a test on the 2-core EPYC)."""
    cache = tmp_path_factory.mktemp("auto-built")
    pipeline("embed", folders["embed"], "auto", engine="auto", engine_cache=cache)
    for choice in cache.rglob("auto.json"):
        choice.unlink()
    return cache


@pytest.fixture
def no_choice(built, tmp_path) -> Path:
    """A copy of `built`: every candidate exported, nothing measured."""
    return shutil.copytree(built, tmp_path / "engines")


def batch_of(pipe, texts: list[str]) -> dict[str, torch.Tensor]:
    items = pipe.engine.encode(texts)
    return pad_batch([i.input_ids for i in items], [i.token_type_ids for i in items], pipe.tokenizer.pad_id)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# ---- equal to torch ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", RUNTIMES)
@pytest.mark.parametrize("task", ["fill-mask", "classify", "ner", "qa"])
@pytest.mark.slow
def test_every_pipeline_gives_the_torch_logits_in_fp32(folders, cache, task, engine):
    reference = pipeline(task, folders[task])
    other = pipeline(task, folders[task], engine=engine, engine_cache=cache)
    assert other.engine_name == engine and other.info()["engine"] == engine and other.precision == "fp32"
    texts = [t.replace("the", "[MASK]", 1) if task == "fill-mask" else t for t in TEXTS if "the" in t or
             task != "fill-mask"]
    batch = batch_of(reference, texts)
    real = batch["attention_mask"].bool()
    expected, got = reference._forward(reference.model, batch).logits, other._forward(other.model, batch).logits
    if task in ("ner", "qa"):  # padding positions carry no result; runtimes need not agree there
        expected, got = expected[real], got[real]
    assert_close(got, expected, **FP32)


@pytest.mark.parametrize("engine", RUNTIMES)
@pytest.mark.slow
def test_embed_vectors_equal_torch_in_fp32_with_windows(folders, cache, engine):
    texts = TEXTS + [" ".join(TEXTS * 3)]  # the last is read in windows with --stride
    for options in ({}, {"stride": 4, "max_length": 16, "pooling": "cls"}):
        reference = pipeline("embed", folders["embed"], **options).embed(texts)
        got = pipeline("embed", folders["embed"], engine=engine, engine_cache=cache, **options).embed(texts)
        assert_close(torch.from_numpy(got), torch.from_numpy(reference), **FP32)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("engine", RUNTIMES)
@pytest.mark.slow
def test_minilm_embeddings_stay_within_the_precisions_tolerance(minilm_path, sst2_dev_sentences, cache, engine,
                                                                precision):
    texts = sst2_dev_sentences[:48]
    reference = pipeline("embed", minilm_path).embed(texts)
    got = pipeline("embed", minilm_path, precision, engine=engine, engine_cache=cache).embed(texts)
    if precision == "fp32":
        assert_close(torch.from_numpy(got), torch.from_numpy(reference), atol=1e-5, rtol=1e-4)
    else:
        cosine, (mean, least) = cosines(got, reference), INT8_COSINE[engine]
        assert cosine.mean() >= mean and cosine.min() >= least, (cosine.mean(), cosine.min())
        assert cosine.mean() < 1 - 1e-6  # it did run in int8


# ---- auto -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_auto_measures_every_combination_picks_one_within_tolerance_and_caches_it(folders, no_choice, caplog):
    folder = folders["embed"]
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        auto = pipeline("embed", folder, "auto", engine="auto", engine_cache=no_choice)
    report = " ".join(r.message for r in caplog.records if "engine auto" in r.message)
    for engine in ("torch", *RUNTIMES):
        assert f"{engine} fp32" in report and (f"{engine} int8" in report or engine == "torch")
    assert auto.engine_name in ("torch", *RUNTIMES) and auto.info()["engine"] == auto.engine_name
    reference = pipeline("embed", folder).embed(TEXTS)
    assert cosines(auto.embed(TEXTS), reference).mean() >= 0.99
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        again = pipeline("embed", folder, "auto", engine="auto", engine_cache=no_choice)
    assert (again.engine_name, again.precision) == (auto.engine_name, auto.precision)
    assert not any("cosine" in r.message for r in caplog.records)  # the cached choice, not measured again


@pytest.mark.slow
def test_auto_times_the_close_candidates_again_in_rounds_and_takes_the_fastest_of_those(folders, no_choice, caplog,
                                                                                         monkeypatch):
    monkeypatch.setattr(backends, "CLOSE", float("inf"))  # every candidate within tolerance is close enough
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        auto = pipeline("embed", folders["embed"], "auto", engine="auto", engine_cache=no_choice)
    final = [r.message for r in caplog.records if "finalists" in r.message]
    assert len(final) == 1, final
    ranked = final[0].split(": ", 2)[2].split("; ")  # "engine precision N ms", fastest first
    assert len(ranked) == backends.FINALISTS
    times = [float(entry.split()[2]) for entry in ranked]
    assert times == sorted(times) and ranked[0].startswith(f"{auto.engine_name} {auto.precision} ")


@pytest.mark.slow
def test_cli_says_what_auto_picked_and_engines_agree(folders, cache, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS), encoding="utf-8")
    outs = {}
    for engine in ("torch", "onnxruntime", "auto"):
        outs[engine] = tmp_path / f"{engine}.npy"
        assert main(["embed", "--model", str(folders["embed"]), "--input", str(texts), "--out", str(outs[engine]),
                     "--engine", engine, "--engine-cache", str(cache), "--threads", "1"]) == 0
    assert "embed: engine " in capsys.readouterr().err
    assert_close(torch.from_numpy(np.load(outs["onnxruntime"])), torch.from_numpy(np.load(outs["torch"])), **FP32)


def test_serve_loads_its_pipelines_on_the_engine(folders, cache):
    loaded, _ = load_pipelines(str(folders["classify"]), ["classify"], engine="ctranslate2", engine_cache=cache)
    assert loaded["classify"].engine_name == "ctranslate2"


# ---- refusals ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", RUNTIMES)
def test_a_missing_runtime_names_the_extra(folders, monkeypatch, engine):
    monkeypatch.setitem(sys.modules, engine, None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=rf"--engine {engine} needs the {engine} package.*encoderlab\[engines\]"):
        pipeline("embed", folders["embed"], engine=engine)


def test_openvino_without_nncf_names_it(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "nncf", None)  # OpenVINO's int8 quantizer, part of the extra
    with pytest.raises(ConfigError, match=r"--engine openvino needs the nncf package.*encoderlab\[engines\]"):
        pipeline("embed", folders["embed"], engine="openvino")


@pytest.mark.slow
def test_openvino_fuses_each_attention_into_one_op(folders, tmp_path):
    """Our export as OpenVINO runs it, each attention one fused op. Where the CPU has VNNI (backends.ov_layout) the
    export is laid out for the CPU plugin's fusion: no Softmax runs on its own once compiled, and no 5-d Transpose
    is left (from the fused projection's permute, a separate fp32 Transpose per layer took 10% of int8 MiniLM's
    time on passages). Elsewhere the converter makes one ScaledDotProductAttention op per layer. Read with
    Core.read_model rather than converted, each attention stayed a chain of ops and int8 MiniLM ran 8-10% slower."""
    import openvino as ov

    pipe = pipeline("embed", folders["embed"], engine="openvino", engine_cache=tmp_path)
    core = ov.Core()
    model = core.read_model(str(next(tmp_path.glob(f"*/openvino{3 if backends.ov_layout() else 2}-fp32.xml"))))
    ops = [op.get_type_name() for op in model.get_ops()]
    if not backends.ov_layout():
        assert ops.count("ScaledDotProductAttention") == pipe.model.config.num_layers and "Softmax" not in ops
        return
    assert not [op for op in model.get_ops()
                if op.get_type_name() == "Transpose" and op.get_input_partial_shape(0).rank.get_length() == 5]
    runtime = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).get_runtime_model()
    layers = [op.get_rt_info()["layerType"].astype(str) for op in runtime.get_ops()]
    assert "Softmax" not in layers and "Subgraph" in layers, sorted(set(layers))


@pytest.mark.slow
def test_openvino_without_vnni_keeps_the_standard_export(folders, tmp_path, monkeypatch):
    """A CPU without an int8 dot-product instruction (as an AVX2-only EPYC reports it) gets the standard export,
    converted into one ScaledDotProductAttention op per layer, in files of their own."""
    import openvino as ov

    monkeypatch.setattr(precisions, "cpu_flags", lambda: frozenset({"avx", "avx2", "fma"}))
    assert not backends.ov_layout()
    pipe = pipeline("embed", folders["embed"], engine="openvino", engine_cache=tmp_path)
    model = ov.Core().read_model(str(next(tmp_path.glob("*/openvino2-fp32.xml"))))
    ops = [op.get_type_name() for op in model.get_ops()]
    assert ops.count("ScaledDotProductAttention") == pipe.model.config.num_layers and "Softmax" not in ops
    assert not list(tmp_path.glob("*/openvino3-*"))


@pytest.mark.slow
def test_openvino_int8_is_calibrated_once_and_reused(folders, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        first = pipeline("embed", folders["embed"], "int8", engine="openvino", engine_cache=tmp_path).embed(TEXTS)
    assert any("calibrated on en.txt" in r.message for r in caplog.records)
    assert len(list(tmp_path.glob("*/openvino[23]-int8-*.xml"))) == 1 and not list(tmp_path.glob("*/.openvino.*"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        again = pipeline("embed", folders["embed"], "int8", engine="openvino", engine_cache=tmp_path).embed(TEXTS)
    assert not any("calibrated" in r.message for r in caplog.records)
    assert_close(torch.from_numpy(again), torch.from_numpy(first))


@pytest.mark.slow
def test_auto_skips_a_missing_runtime(folders, monkeypatch, no_choice, caplog):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)
    with caplog.at_level(logging.INFO, logger="encoderlab.infer.backends"):
        pipeline("embed", folders["embed"], engine="auto", engine_cache=no_choice)
    report = " ".join(r.message for r in caplog.records if "engine auto" in r.message)
    assert "onnxruntime fp32" in report and "ctranslate2" not in report


def test_ctranslate2_refuses_an_architecture_it_cannot_hold_and_onnxruntime_runs_it(folders, cache):
    tokenizer = Tokenizer.from_pretrained(folders["embed"])
    config = EncoderConfig.from_preset("modernbert-mini", vocab_size=tokenizer.vocab_size, hidden_size=32,
                                       num_heads=4, intermediate_size=37, num_layers=2, max_position_embeddings=64,
                                       pad_token_id=0)
    assert "pre-norm layers" in ct2_unsupported(config)
    torch.manual_seed(0)
    model = SentenceEmbedder(config).eval()
    with pytest.raises(ConfigError, match="--engine ctranslate2 cannot run embed on this modernbert model: .*pre-norm"):
        prepare(Embed(model, tokenizer), engine="ctranslate2")
    got = prepare(Embed(model, tokenizer), engine="onnxruntime", engine_cache=cache).embed(TEXTS)
    assert_close(torch.from_numpy(got), torch.from_numpy(Embed(model, tokenizer).embed(TEXTS)), **FP32)


def test_options_a_runtime_cannot_honour_are_refused(folders, cache):
    with pytest.raises(ConfigError, match="--engine onnxruntime runs fp32 or int8"):
        pipeline("embed", folders["embed"], "bf16", engine="onnxruntime")
    with pytest.raises(ConfigError, match="--compile compiles torch's encoder"):
        pipeline("embed", folders["embed"], engine="ctranslate2", compile=True)
    with pytest.raises(ConfigError, match="--engine 'tvm'"):
        pipeline("embed", folders["embed"], engine="tvm")
    pipe = pipeline("embed", folders["embed"], engine="onnxruntime", engine_cache=cache)
    batch = batch_of(pipe, TEXTS[:1])
    with pytest.raises(InputError, match="attention maps .* need --engine torch"):
        pipe.model(batch["input_ids"], batch["attention_mask"], output_attentions=True)


@pytest.mark.parametrize("engine", RUNTIMES)
@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
@pytest.mark.slow
def test_every_family_runs_or_is_refused_by_name(tmp_path, cache, family, engine):
    """Each family's encoder on each runtime equals ours on real positions, or (CTranslate2) is refused naming what
    its post-norm BERT spec lacks."""
    model = load_model(save_tiny_hf(family, "base", tmp_path / family), kind="embed").eval()
    missing = ct2_unsupported(model.config) if engine == "ctranslate2" else []
    if missing:
        with pytest.raises(ConfigError, match="CTranslate2's encoder has no"):
            candidates(model.config, engine, "fp32", "embed")
        assert family in ("albert", "electra", "deberta-v2", "modernbert"), missing  # electra: factorized here
        return
    batch = family_batch(model.config)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        expected = model.encoder(**batch).last_hidden_state[real]
        got = runtime_model(model, engine, "fp32", cache_dir(model.encoder, cache), 1).encoder(**batch)
    assert_close(got.last_hidden_state[real], expected, **FP32)


def test_pooling_asked_for_reaches_a_converted_model(folders):
    """--pooling cls with int8 (a converted copy of the model) pools as asked, as the fp32 model does."""
    if not precisions.int8_supported():
        pytest.skip("no int8 kernel on this CPU")
    fp32 = {p: pipeline("embed", folders["embed"], pooling=p).embed(TEXTS) for p in ("cls", "mean")}
    int8 = pipeline("embed", folders["embed"], "int8", pooling="cls").embed(TEXTS)
    assert cosines(int8, fp32["cls"]).mean() > max(0.99, cosines(int8, fp32["mean"]).mean())


def test_off_the_cpu_auto_is_torch_and_a_runtime_is_refused(folders):
    pipe = pipeline("embed", folders["embed"])
    args = (pipe.model, "fp32", None, torch.device("meta"), pipe.tokenizer, pipe.max_length, "embed")
    assert resolve(args[0], "auto", *args[1:])[2] == "torch"
    with pytest.raises(ConfigError, match="--engine onnxruntime runs on the CPU; on meta use --engine torch"):
        resolve(args[0], "onnxruntime", *args[1:])
