"""Pipelines with compile=True (torch.compile of the encoder) against the same pipelines run eagerly.

Compiled code takes other paths than eager (written-out fp32 attention instead of SDPA, fused quantization), so
these tests pin it to the eager results on inputs of several lengths with padding, in each precision.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from encoderlab.cli import main
from encoderlab.errors import ConfigError
from encoderlab.infer import precision as precisions
from encoderlab.infer.pipelines import pipeline
from encoderlab.tokenizer import Tokenizer
from hf_oracle import randomize

WORDS = "the movie was very good bad and it a plot actors long short film story boring great".split()
# 1 to 40 words (batches of several lengths, each padded), then 70 to 110: compiled attention is written out
# for sequences up to attention.SHORT (64) tokens and keeps SDPA above that, so both paths are compared.
TEXTS = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(n))
         for i, n in enumerate([1 + (i * 13) % 40 for i in range(37)] + list(range(70, 111, 8)))]
SHORT_TEXTS = TEXTS[:37]  # the 1 to 40 words: the written-out attention only

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory) -> Path:
    """A random 2-layer BertForSequenceClassification (hidden 64) with a tiny WordPiece tokenizer."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128, num_labels=3)).eval()
    randomize(model, seed=5)
    folder = tmp_path_factory.mktemp("compiled-cls")
    model.save_pretrained(folder)
    tokenizer.save(folder)
    return folder


def probabilities(results: list[dict]) -> np.ndarray:
    """(N, labels) probabilities from classify results, labels in a fixed order."""
    return np.array([[score for _, score in sorted(r["scores"].items())] for r in results])


@pytest.mark.parametrize("mode", ["fp32", "bf16", "int8"])
@pytest.mark.slow
def test_compiled_classify_matches_eager(classifier_folder, mode):
    """fp32 takes each compiled variant: short batches (written-out attention), long ones (SDPA) and a batch of one
    (no padding). bf16 and int8 change the linears and the passes around them, not the attention's path, so they
    take the short batches: each variant is one more compile (~15 CPU s)."""
    if mode not in precisions.supported():
        pytest.skip(f"{mode} is not supported on this machine")
    texts = TEXTS if mode == "fp32" else SHORT_TEXTS
    eager = pipeline("classify", classifier_folder, precision=mode, batch_size=8)
    compiled = pipeline("classify", classifier_folder, precision=mode, batch_size=8, compile=True)
    assert compiled.info()["compiled"] and not eager.info()["compiled"]
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled(SHORT_TEXTS[:8])  # the loading's warm-up compiled the variant a call of short texts runs: no new graph
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    expected, got = probabilities(eager(texts)), probabilities(compiled(texts))
    assert expected.std(0).max() > 0.01  # the texts get different outputs, so a broken mask would show
    # fp32 differs only by summation order; bf16 and int8 also round (and quantize) at other points.
    tolerance = {"fp32": 1e-5, "bf16": 3e-2, "int8": 3e-2}[mode]
    np.testing.assert_allclose(got, expected, atol=tolerance, rtol=0)
    if mode == "fp32":
        alone = probabilities(compiled(TEXTS[5:6]))  # a batch of one: no padding at all
        np.testing.assert_allclose(alone, expected[5:6], atol=tolerance, rtol=0)


@pytest.mark.slow
def test_compiled_classify_from_the_cli(classifier_folder, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS[:5]), encoding="utf-8")
    assert main(["classify", "--model", str(classifier_folder), "--input", str(texts), "--compile", "--json"]) == 0
    compiled = json.loads(capsys.readouterr().out)
    assert main(["classify", "--model", str(classifier_folder), "--input", str(texts), "--json"]) == 0
    eager = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(probabilities(compiled), probabilities(eager), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_compile_without_a_cxx_compiler_is_a_clear_error(classifier_folder):
    """A machine where inductor cannot build its C++ gets a ConfigError that names --compile and the reason."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    # config.patch, not monkeypatch: force_disable_caches is an alias in inductor's config, and monkeypatch's
    # undo leaves it unreadable, which broke every later compile in the process.
    with (inductor.patch({"cpp.cxx": (None, "no-such-c++-compiler"), "fx_graph_cache": False}),
          torch.compiler.config.patch(force_disable_caches=True),  # or a cached kernel from an earlier test is reused
          pytest.raises(ConfigError, match="--compile") as caught):
        pipeline("classify", classifier_folder, compile=True)
    assert "raised:)" not in str(caught.value)  # the backend's own error, not dynamo's wrapper line
    torch._dynamo.reset()
    compiled = pipeline("classify", classifier_folder, compile=True)  # this process can compile again
    np.testing.assert_allclose(probabilities(compiled(TEXTS[:4])),
                               probabilities(pipeline("classify", classifier_folder)(TEXTS[:4])), atol=1e-5, rtol=0)
