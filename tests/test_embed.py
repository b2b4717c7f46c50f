"""Sentence embeddings: pooling, batching order, and parity with sentence-transformers on real MiniLM weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from encoderlab.engine import cosine_similarity
from encoderlab.errors import InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.embedding import Embed
from encoderlab.nn.pooling import pool


@pytest.fixture(scope="module")
def minilm(minilm_path):
    """The embed pipeline on minilm, unnormalized mean pooling unless a test asks otherwise."""
    def embed(texts, batch_size=32, **options):
        options.setdefault("normalize", False)
        return pipeline("embed", minilm_path, batch_size=batch_size, **options).embed(texts)
    return embed


@pytest.mark.slow
def test_matches_sentence_transformers_on_every_sst2_dev_sentence(minilm, minilm_path, sst2_dev_sentences):
    from sentence_transformers import SentenceTransformer

    oracle = SentenceTransformer(str(minilm_path), device="cpu")
    expected = oracle.encode(sst2_dev_sentences, batch_size=64, normalize_embeddings=True, convert_to_numpy=True)
    ours = minilm(sst2_dev_sentences, pooling="mean", normalize=True, batch_size=64)
    cosines = (ours * expected).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(expected, axis=-1))
    assert len(cosines) == 872
    worst = int(cosines.argmin())
    assert cosines.min() >= 0.99999, f"sentence {worst} {sst2_dev_sentences[worst]!r}: cosine {cosines[worst]}"
    # Without any flag, both follow the folder (its modules.json ends in Normalize): unit vectors, the same ones.
    np.testing.assert_allclose(oracle.encode(sst2_dev_sentences[:64], convert_to_numpy=True), expected[:64], atol=1e-6)
    default = pipeline("embed", minilm_path, batch_size=64).embed(sst2_dev_sentences)
    np.testing.assert_allclose(default, expected, atol=1e-5, rtol=0)


def test_max_length_comes_from_sentence_transformers_settings(minilm_path):
    # all-MiniLM-L6-v2's sentence_bert_config.json says max_seq_length 256
    assert pipeline("embed", minilm_path).max_length == 256


def test_the_pipeline_runs_without_the_unused_pooler_and_leaves_the_callers_model_whole(minilm_path):
    from encoderlab.checkpoint import load_model
    from encoderlab.tokenizer import Tokenizer

    model = load_model(minilm_path, kind="embed")
    assert model.pooler is not None  # all-MiniLM-L6-v2 is a full BertModel
    embedder = Embed(model, Tokenizer.from_pretrained(minilm_path), normalize=False)
    assert embedder.model.pooler is None and model.pooler is not None
    texts = ["The pooler's output never reaches a sentence vector.", "Short."]
    batch = Tokenizer.from_pretrained(minilm_path).encode_batch(texts)
    with torch.inference_mode():
        expected = pool(model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state,
                        batch.attention_mask, "mean")
    torch.testing.assert_close(torch.from_numpy(embedder.embed(texts)), expected, atol=1e-5, rtol=1e-5)


def test_mean_pooling_ignores_padding(minilm):
    embed = minilm
    short = "A short one."
    alone = embed([short], batch_size=1)
    padded = embed([short, "a much longer sentence " * 12], batch_size=2)
    np.testing.assert_allclose(padded[0], alone[0], atol=1e-5, rtol=1e-5)


def test_results_come_back_in_input_order(minilm):
    embed = minilm
    texts = ["one", "a somewhat longer second text", "three three", "the fourth and by far the longest text here"]
    forward = embed(texts, batch_size=2)
    backward = embed(texts[::-1], batch_size=2)
    np.testing.assert_allclose(forward, backward[::-1], atol=1e-5, rtol=1e-5)


def test_cls_pooling_takes_the_first_token():
    hidden = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "cls"), hidden[:, 0])
    torch.testing.assert_close(pool(hidden, mask, "mean")[0], hidden[0, :3].mean(0))


def test_normalized_vectors_have_unit_norm_and_cosine_ranks(minilm):
    embed = minilm
    vectors = embed(["A man plays a guitar.", "Someone is playing an instrument.",
                                       "Stock prices fell today."], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, atol=1e-5)
    scores = cosine_similarity(vectors[:1], vectors[1:])[0]
    assert scores[0] > scores[1]


@pytest.mark.parametrize("texts", [[], ["fine", "   "], [""]])
def test_empty_inputs_are_refused(minilm, texts):
    embed = minilm
    with pytest.raises(InputError):
        embed(texts)


def test_unknown_pooling_is_refused(minilm):
    embed = minilm
    with pytest.raises(InputError, match="pooling"):
        embed(["text"], pooling="max")
