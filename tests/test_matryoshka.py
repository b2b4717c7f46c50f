"""Matryoshka embeddings (issue 36): `finetune embed --matryoshka` sums the loss over the vectors' prefixes, and
`--dimensions N` on the embed pipeline, `embed`, `similarity` and POST /embed cuts vectors to their first N values."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fastapi.testclient import TestClient

from encoderlab import EncoderConfig, EncoderModel, load_model, save_pretrained
from encoderlab.cli import main
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app
from encoderlab.tasks.embedding import EmbedTask, embedding_loss
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

WORDS = "a the cat dog sat ran on mat park good bad very film was it".split()
HIDDEN = 32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A random 2-layer, 32-wide encoder with a whole-word WordPiece vocabulary, saved as a folder."""
    folder = tmp_path_factory.mktemp("tiny")
    chars = sorted({c for word in WORDS for c in word})
    vocab = dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *WORDS])
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token in vocab), encoding="utf-8")
    tokenizer = Tokenizer.from_pretrained(folder)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=HIDDEN, num_heads=2, intermediate_size=64,
                                       num_layers=2, vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    torch.manual_seed(0)
    save_pretrained(EncoderModel(config), folder)
    tokenizer.save(folder)
    return folder


def pairs(count: int, seed: int = 0) -> list[TextExample]:
    """Scored sentence pairs of the tiny vocabulary."""
    rng = random.Random(seed)
    return [TextExample([" ".join(rng.choices(WORDS, k=5)), " ".join(rng.choices(WORDS, k=4))],
                        float(rng.randint(0, 5)), f"row {i}") for i in range(count)]


def batch_and_vectors(tiny: Path, task: EmbedTask, examples: list[TextExample]):
    """A training batch, the embedder, and its (B, H) vectors of each column."""
    model = load_model(tiny, kind="embed")
    batch = task.collate(task.features(examples))
    vectors = [model(batch[c]["input_ids"], batch[c]["attention_mask"], batch[c]["token_type_ids"]).embedding
               for c in ("0", "1")]
    return batch, model, vectors


def by_hand(name: str, a: torch.Tensor, b: torch.Tensor, scores: torch.Tensor, scale: float) -> torch.Tensor:
    """The loss of one prefix written out again, pair by pair, times the batch's pairs."""
    a, b = a / a.norm(dim=-1, keepdim=True), b / b.norm(dim=-1, keepdim=True)
    cos = (a * b).sum(-1)
    n = len(scores)
    if name == "cosine":
        return ((cos - scores / scores.abs().max()) ** 2).sum()
    if name == "cosent":
        terms = [torch.zeros(())] + [scale * (cos[j] - cos[i]) for i in range(n) for j in range(n)
                                     if scores[i] > scores[j]]
        return torch.log(torch.stack(terms).exp().sum()) * n
    logits = scale * a @ b.T  # mnrl: row i's positive is b[i]
    return -torch.stack([logits[i].log_softmax(-1)[i] for i in range(n)]).mean() * n


# ---- the loss -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss", ["cosent", "cosine", "mnrl"])
def test_matryoshka_loss_is_the_sum_of_the_prefix_losses(tiny, loss):
    tokenizer, examples, dims = Tokenizer.from_pretrained(tiny), pairs(8), (32, 16, 4)
    task = EmbedTask(tokenizer, 32, loss, 20.0, matryoshka=dims)
    batch, model, vectors = batch_and_vectors(tiny, task, examples)
    (got, count, unit), = task.loss(model, batch).values()  # the batch's loss times its rows, per row
    assert unit == "sequences" and int(count) == len(batch["labels"])
    expected = sum(by_hand(loss, vectors[0][:, :d], vectors[1][:, :d], batch["labels"], 20.0) for d in dims)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    got.backward()  # every prefix trains the encoder
    assert model.encoder.embeddings.word.weight.grad.abs().sum() > 0


def test_the_full_width_among_the_prefixes_adds_the_plain_loss(tiny):
    tokenizer, examples = Tokenizer.from_pretrained(tiny), pairs(8)
    plain = EmbedTask(tokenizer, 32, "cosent")
    matryoshka = EmbedTask(tokenizer, 32, "cosent", matryoshka=(HIDDEN, 8))
    batch, model, vectors = batch_and_vectors(tiny, plain, examples)
    short = embedding_loss("cosent", [v[:, :8] for v in vectors], batch["labels"], 20.0, None)
    (long_total,), (plain_total,) = ([term.total for term in task.loss(model, batch).values()]
                                     for task in (matryoshka, plain))
    torch.testing.assert_close(long_total, plain_total + short)


@pytest.mark.parametrize("dims, message", [((0, 8), "distinct positive"), ((8, 8), "distinct positive"),
                                           ((-4,), "distinct positive")])
def test_bad_prefixes_are_refused(tiny, dims, message):
    with pytest.raises(ConfigError, match=message):
        EmbedTask(Tokenizer.from_pretrained(tiny), 32, "cosent", matryoshka=dims)


def test_a_prefix_wider_than_the_model_is_refused(tiny):
    task = EmbedTask(Tokenizer.from_pretrained(tiny), 32, "cosent", matryoshka=(64, 16))
    batch, model, _ = batch_and_vectors(tiny, task, pairs(4))
    with pytest.raises(ConfigError, match="--matryoshka 64: above the model's hidden size 32"):
        task.loss(model, batch)


# ---- finetune embed --matryoshka --------------------------------------------------------------------------------
def scored_file(path: Path, count: int) -> Path:
    path.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{e.texts[0]}\t{e.texts[1]}\t{e.label}\n"
                                                              for e in pairs(count, seed=1)), encoding="utf-8")
    return path


def test_finetune_embed_with_matryoshka_records_its_dimensions(tiny, tmp_path):
    data = scored_file(tmp_path / "train.tsv", 48)
    assert main(["finetune", "embed", "--model", str(tiny), "--train", str(data), "--eval", str(data), "--out",
                 str(tmp_path / "out"), "--matryoshka", "32,16,8", "--epochs", "1", "--batch-size", "16",
                 "--no-progress", "--threads", "1"]) == 0
    info = json.loads((tmp_path / "out" / "task.json").read_text(encoding="utf-8"))
    assert info["matryoshka"] == [32, 16, 8] and info["loss"] == "cosent"
    assert pipeline("embed", tmp_path / "out", dimensions=8).embed(["a cat sat"]).shape == (1, 8)


def test_finetune_refuses_bad_matryoshka_options(tiny, tmp_path, capsys):
    data = scored_file(tmp_path / "train.tsv", 16)
    common = ["finetune", "embed", "--model", str(tiny), "--train", str(data), "--out", str(tmp_path / "out"),
              "--no-progress", "--threads", "1", "--matryoshka"]
    assert main(common + ["64,16"]) == 2
    assert "--matryoshka 64: above the model's hidden size 32" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused from config.json, before training wrote anything
    assert main(common + ["16,0"]) == 2
    assert "expected distinct positive dimensions" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(common + ["16,half"])
    assert "expected whole numbers separated by commas" in capsys.readouterr().err


# ---- --dimensions ------------------------------------------------------------------------------------------------
TEXTS = ["a cat sat on the mat", "the dog ran in the park", "it was a very good film"]


def test_dimensions_cut_then_renormalise(tiny):
    full = pipeline("embed", tiny, normalize=False).embed(TEXTS)
    cut = pipeline("embed", tiny, normalize=False, dimensions=8).embed(TEXTS)
    np.testing.assert_allclose(cut, full[:, :8], rtol=1e-5, atol=1e-6)
    unit = pipeline("embed", tiny, normalize=True, dimensions=8)
    vectors = unit.embed(TEXTS)
    assert vectors.shape == (3, 8) and unit.info()["dimensions"] == 8
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(vectors, F.normalize(torch.from_numpy(full[:, :8]), dim=-1).numpy(), rtol=1e-5,
                               atol=1e-6)
    assert unit.embed(TEXTS, dimensions=4).shape == (3, 4)  # one call's own width
    assert [len(r["embedding"]) for r in unit(TEXTS, dimensions=HIDDEN)] == [HIDDEN] * 3


@pytest.mark.parametrize("dimensions", [0, -1, HIDDEN + 1])
def test_dimensions_out_of_range_are_refused(tiny, dimensions):
    with pytest.raises(InputError, match=f"dimensions {dimensions}: expected a whole number from 1 to {HIDDEN}"):
        pipeline("embed", tiny, dimensions=dimensions)
    with pytest.raises(InputError, match="from 1 to 32"):
        pipeline("embed", tiny).embed(TEXTS, dimensions=dimensions)


def test_embed_and_similarity_commands_take_dimensions(tiny, tmp_path, capsys):
    source, out = tmp_path / "texts.txt", tmp_path / "vectors.npy"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["embed", "--model", str(tiny), "--input", str(source), "--out", str(out), "--dimensions", "8",
                 "--normalize"]) == 0
    vectors = np.load(out)
    assert vectors.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, rtol=1e-5)
    capsys.readouterr()
    assert main(["similarity", "--model", str(tiny), "--dimensions", "8", "--json", *TEXTS]) == 0
    ranking = json.loads(capsys.readouterr().out)["ranking"]
    expected = {TEXTS[i]: float(vectors[0] @ vectors[i]) for i in (1, 2)}
    assert {r["text"]: pytest.approx(expected[r["text"]], abs=1e-5) for r in ranking} == expected
    assert main(["embed", "--model", str(tiny), "--input", str(source), "--out", str(out), "--dimensions",
                 "33"]) == 2
    assert "dimensions 33: expected a whole number from 1 to 32" in capsys.readouterr().err


def test_server_embed_takes_dimensions(tiny):
    embedder = pipeline("embed", tiny)
    with TestClient(create_app({"embed": embedder}, Limits(), model=str(tiny))) as client:
        answer = client.post("/embed", json={"texts": TEXTS, "dimensions": 8})
        assert answer.status_code == 200, answer.text
        got = np.array([r["embedding"] for r in answer.json()["results"]], dtype=np.float32)
        np.testing.assert_allclose(got, embedder.embed(TEXTS, dimensions=8), rtol=1e-5, atol=1e-6)
        full = client.post("/embed", json={"texts": TEXTS}).json()["results"]
        assert [len(r["embedding"]) for r in full] == [HIDDEN] * 3
        too_wide = client.post("/embed", json={"texts": TEXTS, "dimensions": 33})
        assert too_wide.status_code == 422 and "from 1 to 32" in too_wide.json()["detail"]
        assert client.post("/embed", json={"texts": TEXTS, "dimensions": 0}).status_code == 422
