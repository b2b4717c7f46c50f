"""Fine-tuning heads and pipelines for every family (BERT, RoBERTa, DistilBERT, ALBERT, ELECTRA, DeBERTa-v2).

Parity with transformers both ways for each family's XForSequenceClassification (each family has its own head),
XForTokenClassification, XForQuestionAnswering and the bare XModel of a sentence embedder, on tiny random
models. Then, per family, a tiny random MLM checkpoint with a tokenizer of the family's kind (WordPiece,
byte-level BPE or Unigram, trained here on synthetic sentences) is fine-tuned for a few steps on classify
(single texts, pairs, regression), ner, qa and embed, saved, reloaded and run through the pipelines; what the
pipelines answer must agree with the model before saving, or with `encoderlab evaluate` on the reloaded folder.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from torch.testing import assert_close

from hf_oracle import TOL, randomize
from test_family import HF_CONFIGS, family_batch, tiny_config

from encoderlab import EncoderConfig, load_model
from encoderlab.cli.finetune import add_commands
from encoderlab.infer import precision as precisions
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.embedding import Embed
from encoderlab.tasks.tagging import entities
from encoderlab.models import FAMILIES
from encoderlab.checkpoint import save_pretrained
from encoderlab.nn.model import (MaskedLMModel, ModelOutput, SentenceEmbedder, SequenceClassifier, SpanExtractor,
                                 TokenClassifier)
from encoderlab.tasks.classify import ClassifyTask
from encoderlab.tasks.objective import TrainOptions, train
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.state import seed_everything

DEBERTA = "deberta-v2"
FAMILY_PARAMS = [f for f in FAMILIES if f != DEBERTA] + [
    pytest.param(DEBERTA, marks=pytest.mark.skipif(DEBERTA not in FAMILIES, reason="the deberta-v2 family is not "
                                                   "in encoderlab.models.FAMILIES yet"))]

POSITIVE = ["good", "great", "fine", "nice", "superb"]
NEGATIVE = ["bad", "awful", "poor", "nasty", "dire"]
FILLER = ["the", "movie", "was", "a", "film", "plot", "very", "quite", "and", "it", "so", "this"]
NAMES, CITIES = ["anna", "peter", "maria", "john"], ["paris", "rome", "oslo", "lima"]
WORDS = POSITIVE + NEGATIVE + FILLER + NAMES + CITIES + ["lives", "in", "where", "does", "live", "?", "."]


pytestmark = pytest.mark.usefixtures("one_thread", "int8_compiled")  # see conftest.py


# ---- transformers parity of the task heads ---------------------------------------------------------------------
KINDS = {"classify": ("SequenceClassification", 3), "regression": ("SequenceClassification", 1),
         "ner": ("TokenClassification", 5), "qa": ("QuestionAnswering", 2), "embed": (None, 0)}


def hf_task_class(family: str, kind: str) -> type:
    """transformers' class for one of KINDS in this family: RobertaForSequenceClassification, ..., XModel."""
    base = FAMILIES[family].architectures["base"]
    task = KINDS[kind][0]
    return getattr(transformers, base if task is None else f"{base.removesuffix('Model')}For{task}")


def our_task_model(config: EncoderConfig, kind: str) -> torch.nn.Module:
    """A fresh task model of one of KINDS on a random backbone."""
    if kind in ("classify", "regression"):
        problem_type = "regression" if kind == "regression" else None
        return SequenceClassifier(config.replace(problem_type=problem_type), KINDS[kind][1])
    if kind == "ner":
        return TokenClassifier(config, KINDS[kind][1])
    return SpanExtractor(config) if kind == "qa" else SentenceEmbedder(config)


def outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits (start and end stacked for QA; the last hidden state of a bare model) of ours or transformers'."""
    with torch.no_grad():
        out = model(**batch)
    if isinstance(out, ModelOutput):  # ours: QA logits are (B, T, 2), start and end
        return out.last_hidden_state if out.logits is None else out.logits
    if hasattr(out, "start_logits"):
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def hf_config_of(family: str):
    """The family's tiny transformers config from tests/test_family.py, or skip naming what is missing."""
    if family not in HF_CONFIGS:
        pytest.skip(f"tests/test_family.py has no tiny transformers config for {family} (HF_CONFIGS)")
    return HF_CONFIGS[family]()


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_transformers_loads_our_task_model_with_the_same_outputs(tmp_path: Path, family: str, kind: str) -> None:
    hf_config_of(family)
    torch.manual_seed(0)
    ours = our_task_model(tiny_config(family), kind).eval()
    randomize(ours, seed=5)
    save_pretrained(ours, tmp_path)
    hf_class = hf_task_class(family, kind)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [hf_class.__name__]
    hf, info = hf_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    batch = family_batch(ours.config)
    assert_close(outputs(ours, batch), outputs(hf.eval(), batch), **TOL)
    if kind == "regression":
        assert hf.config.num_labels == 1 and hf.config.problem_type == "regression"


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_transformers_task_checkpoint_loads_into_ours(tmp_path: Path, family: str, kind: str) -> None:
    config = hf_config_of(family)
    config.num_labels = KINDS[kind][1] or 2
    if kind == "regression":
        config.problem_type = "regression"
    torch.manual_seed(0)
    hf = hf_task_class(family, kind)(config).eval()
    randomize(hf, seed=6)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path, kind="embed" if kind == "embed" else None)  # a bare XModel loads as EncoderModel
    expected = {"classify": SequenceClassifier, "regression": SequenceClassifier, "ner": TokenClassifier,
                "qa": SpanExtractor, "embed": SentenceEmbedder}[kind]
    assert type(ours) is expected and ours.config.model_type == family
    assert getattr(ours, "regression", kind == "regression") == (kind == "regression")
    batch = family_batch(ours.config)
    assert_close(outputs(ours, batch), outputs(hf, batch), **TOL)


def test_deberta_head_activation_is_config_data_read_from_pooler_hidden_act(tmp_path: Path) -> None:
    """DeBERTa's ContextPooler applies config.json's pooler_hidden_act: another value is computed, not refused."""
    config = hf_config_of(DEBERTA)
    config.num_labels, config.pooler_hidden_act = 3, "tanh"
    torch.manual_seed(0)
    hf = transformers.DebertaV2ForSequenceClassification(config).eval()
    randomize(hf, seed=7)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.classifier_activation == "tanh"
    batch = family_batch(ours.config)
    assert_close(outputs(ours, batch), outputs(hf, batch), **TOL)
    save_pretrained(ours, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["pooler_hidden_act"] == "tanh"


# ---- a tiny checkpoint per family, with a tokenizer of its kind -----------------------------------------------
def synthetic_sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 9))) for _ in range(count)]


@pytest.fixture(scope="session")
def kind_tokenizers() -> dict[str, Tokenizer]:
    """One tokenizer of each kind trained on 300 synthetic sentences (byte-level BPE needs room for 256 bytes)."""
    texts = synthetic_sentences(300)
    sizes = {"wordpiece": 120, "bpe": 330, "unigram": 120}
    return {kind: Tokenizer.train_from_iterator(kind, texts, vocab_size=size, min_frequency=1)
            for kind, size in sizes.items()}


def checkpoint_config(family: str, tokenizer: Tokenizer) -> EncoderConfig:
    """The family's small preset shrunk to 2 layers of 32, with the tokenizer's vocabulary and pad id."""
    small = next(name for name in FAMILIES[family].presets if EncoderConfig.from_preset(name).hidden_size <= 256)
    preset = EncoderConfig.from_preset(small)
    offset = tokenizer.pad_id + 1 if preset.positions_after_pad else 0  # RoBERTa's positions start after pad
    return EncoderConfig.from_preset(small, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                                     hidden_size=32, num_heads=4, intermediate_size=64, num_layers=2,
                                     max_position_embeddings=64 + offset,
                                     **({"embedding_size": 16} if preset.embedding_size else {}))


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, kind_tokenizers):
    """family -> a folder holding a random tiny MLM model of the family and its tokenizer (made on first use)."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in made:
            tokenizer = kind_tokenizers[FAMILIES[family].tokenizer_kind]
            folder = tmp_path_factory.mktemp(family)
            torch.manual_seed(0)
            save_pretrained(MaskedLMModel(checkpoint_config(family, tokenizer)), folder)
            tokenizer.save(folder)
            made[family] = folder
        return made[family]

    return get


def run(*argv) -> dict:
    """`encoderlab finetune ...` or `encoderlab evaluate ...`, through the CLI's own parser."""
    main = argparse.ArgumentParser(prog="encoderlab")
    add_commands(main.add_subparsers(dest="command", required=True))
    args = main.parse_args([str(a) for a in argv])
    return args.func(args)


FAST = ("--batch-size", "16", "--no-progress", "--max-length", "32")


def polar_sentence(rng: random.Random, label: int) -> str:
    words = rng.choices(FILLER, k=rng.randint(3, 5))
    words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
    return " ".join(words)


# ---- classify --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILY_PARAMS)
@pytest.mark.slow
def test_classifier_learns_and_the_reloaded_pipeline_gives_the_same_probabilities(tmp_path, checkpoints, family):
    folder = checkpoints(family)
    tokenizer = Tokenizer.from_pretrained(folder)
    rng = random.Random(1)
    examples = [TextExample([polar_sentence(rng, i % 2)], ["neg", "pos"][i % 2], f"x:{i}") for i in range(288)]
    task = ClassifyTask(tokenizer, 32, ["neg", "pos"], batch_size=16)
    seed_everything(0)
    model = load_model(folder, kind="classify", num_labels=2).train()
    model.config.labels = task.labels
    train(model, task, task.features(examples[:256]), TrainOptions(lr=5e-3, epochs=6, batch_size=16, progress=False))
    assert task.evaluate(model, examples[256:])["accuracy"] >= 0.8  # chance is 0.5
    logits = task.logits(model.eval(), examples[256:])
    save_pretrained(model, tmp_path, tokenizer, task.info())
    results = pipeline("classify", tmp_path)([e.texts[0] for e in examples[256:]])
    probs = torch.tensor([[r["scores"]["neg"], r["scores"]["pos"]] for r in results])
    assert_close(probs, logits.softmax(-1), atol=2e-6, rtol=0)  # the pipeline rounds to 6 decimals
    assert [r["label"] for r in results] == [task.labels[i] for i in logits.argmax(-1).tolist()]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [FAMILIES[family].architectures["base"].removesuffix("Model")
                                       + "ForSequenceClassification"]


def pair_rows(rng: random.Random, count: int) -> str:
    """sentence1, sentence2, label: the label is the polarity of the second sentence."""
    rows = []
    for i in range(count):
        rows.append(f"{polar_sentence(rng, rng.randint(0, 1))}\t{polar_sentence(rng, i % 2)}\t{['neg', 'pos'][i % 2]}\n")
    return "sentence1\tsentence2\tlabel\n" + "".join(rows)


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_pairs_and_regression_fine_tune_and_reload_through_the_cli(tmp_path, checkpoints, family):
    rng = random.Random(2)
    (tmp_path / "pairs.tsv").write_text(pair_rows(rng, 48), encoding="utf-8")
    scored = "".join(f"{polar_sentence(rng, 1)}\t{polar_sentence(rng, i % 2)}\t{(i % 2) * 4.0 + rng.random()}\n"
                     for i in range(48))
    (tmp_path / "scored.tsv").write_text("sentence1\tsentence2\tscore\n" + scored, encoding="utf-8")
    folder = checkpoints(family)
    pairs = run("finetune", "classify", "--model", folder, "--train", tmp_path / "pairs.tsv", "--eval",
                tmp_path / "pairs.tsv", "--out", tmp_path / "pairs", "--epochs", "1", *FAST)
    result = run("evaluate", "classify", "--model", tmp_path / "pairs", "--data", tmp_path / "pairs.tsv",
                 "--predictions", tmp_path / "pairs.jsonl")
    assert result["metrics"]["accuracy"] == pytest.approx(pairs["best"]["eval_accuracy"])
    rows = [line.split("\t") for line in (tmp_path / "pairs.tsv").read_text().splitlines()[1:]]
    answers = pipeline("classify", tmp_path / "pairs")([[a, b] for a, b, _ in rows])
    assert [r["label"] for r in answers] == [json.loads(line) for line in (tmp_path / "pairs.jsonl").open()]
    assert all(sum(r["scores"].values()) == pytest.approx(1, abs=1e-5) for r in answers)

    regression = run("finetune", "classify", "--task-type", "regression", "--model", folder, "--train",
                     tmp_path / "scored.tsv", "--eval", tmp_path / "scored.tsv", "--out", tmp_path / "sts",
                     "--epochs", "1", *FAST)
    result = run("evaluate", "classify", "--model", tmp_path / "sts", "--data", tmp_path / "scored.tsv",
                 "--predictions", tmp_path / "sts.jsonl")
    assert result["metrics"]["spearman"] == pytest.approx(regression["best"]["eval_spearman"])
    rows = [line.split("\t") for line in (tmp_path / "scored.tsv").read_text().splitlines()[1:]]
    scores = [r["score"] for r in pipeline("classify", tmp_path / "sts")([[a, b] for a, b, _ in rows])]
    saved = [json.loads(line) for line in (tmp_path / "sts.jsonl").open()]
    assert scores == pytest.approx(saved, abs=2e-6)


# ---- ner -------------------------------------------------------------------------------------------------------
def tagged_sentence(rng: random.Random) -> tuple[list[str], list[str]]:
    words, tags = [], []
    for _ in range(rng.randint(4, 7)):
        roll = rng.random()
        word, tag = ((rng.choice(NAMES), "B-PER") if roll < 0.2 else (rng.choice(CITIES), "B-LOC") if roll < 0.4
                     else (rng.choice(FILLER), "O"))
        words.append(word)
        tags.append(tag)
    return words, tags


def word_spans(words: list[str]) -> list[tuple[int, int]]:
    """Character (start, end) of each word in " ".join(words)."""
    spans, position = [], 0
    for word in words:
        spans.append((position, position + len(word)))
        position += len(word) + 1
    return spans


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_ner_fine_tunes_and_the_pipeline_finds_the_entities_evaluate_tags(tmp_path, checkpoints, family):
    rng = random.Random(3)
    sentences = [tagged_sentence(rng) for _ in range(160)]
    conll = "\n".join("".join(f"{w} {t}\n" for w, t in zip(words, tags)) for words, tags in sentences)
    (tmp_path / "train.txt").write_text(conll, encoding="utf-8")
    summary = run("finetune", "ner", "--model", checkpoints(family), "--train", tmp_path / "train.txt", "--eval",
                  tmp_path / "train.txt", "--out", tmp_path / "ner", "--lr", "1e-2", "--epochs", "3", *FAST)
    assert summary["best"]["eval_f1"] > 0.3  # 30 steps learn some entities; random tags score near 0
    run("evaluate", "ner", "--model", tmp_path / "ner", "--data", tmp_path / "train.txt", "--predictions",
        tmp_path / "tags.jsonl")
    predicted = [json.loads(line) for line in (tmp_path / "tags.jsonl").open()]
    texts = [" ".join(words) for words, _ in sentences]
    found = pipeline("ner", tmp_path / "ner")(texts)
    for text, (words, _), tags, result in zip(texts, sentences, predicted, found):
        spans = word_spans(words)
        expected = entities([(start, end, tag, 1.0) for (start, end), tag in zip(spans, tags)], text)
        assert [(e["entity"], e["start"], e["end"]) for e in result["entities"]] == \
               [(e["entity"], e["start"], e["end"]) for e in expected], text
        assert all(e["text"] == text[e["start"]:e["end"]] and 0 < e["score"] <= 1 for e in result["entities"])


# ---- qa --------------------------------------------------------------------------------------------------------
def squad(rng: random.Random, count: int) -> dict:
    paragraphs = []
    for i in range(count):
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        context = f"{' '.join(rng.choices(FILLER, k=3))} {name} lives in {city} . {' '.join(rng.choices(FILLER, k=3))}"
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"where does {name} live ?",
                                                         "answers": [{"text": city,
                                                                      "answer_start": context.index(f"in {city}") + 3}]}]})
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_qa_fine_tunes_and_the_pipeline_answers_as_evaluate_does(tmp_path, checkpoints, family):
    data = squad(random.Random(4), 64)
    (tmp_path / "train.json").write_text(json.dumps(data), encoding="utf-8")
    summary = run("finetune", "qa", "--model", checkpoints(family), "--train", tmp_path / "train.json", "--out",
                  tmp_path / "qa", "--lr", "3e-3", "--epochs", "2", "--batch-size", "16", "--no-progress",
                  "--max-length", "40", "--doc-stride", "8", "--max-query-length", "10")
    history = summary["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    run("evaluate", "qa", "--model", tmp_path / "qa", "--data", tmp_path / "train.json", "--predictions",
        tmp_path / "answers.json")
    expected = json.loads((tmp_path / "answers.json").read_text())
    items = [{"question": qa["question"], "context": p["context"]} for p in data["data"][0]["paragraphs"]
             for qa in p["qas"]]
    answers = pipeline("qa", tmp_path / "qa")(items)
    for i, (item, answer) in enumerate(zip(items, answers)):
        assert answer["answer"] == item["context"][answer["start"]:answer["end"]] and 0 < answer["score"] <= 1
        assert answer["answer"].strip() == expected[f"q{i}"]


# ---- fill-mask and embeddings ----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_fill_mask_gives_the_mlm_models_probabilities(checkpoints, family):
    folder = checkpoints(family)
    tokenizer = Tokenizer.from_pretrained(folder)
    fill = pipeline("fill-mask", folder)
    text = "the movie was [MASK] and the plot was <mask> ."  # either spelling means the tokenizer's own mask
    result = fill([text], top_k=3)[0]
    assert len(result["masks"]) == 2
    ids = tokenizer.encode(text.replace("[MASK]", tokenizer.mask_token).replace("<mask>", tokenizer.mask_token))
    model = load_model(folder)
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0].softmax(-1)  # (T, V)
    for mask in result["masks"]:
        assert ids[mask["position"]] == tokenizer.mask_id
        top = probs[mask["position"]].topk(3)
        assert [p["id"] for p in mask["predictions"]] == top.indices.tolist()
        assert [p["score"] for p in mask["predictions"]] == pytest.approx(top.values.tolist(), abs=1e-6)
        assert all(p["token"] == tokenizer.id_to_token(p["id"]) for p in mask["predictions"])


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_int8_fill_mask_stays_close_to_fp32(checkpoints, family):
    """--precision int8 quantizes every linear of the family (ModernBERT's have no bias): logits stay close."""
    if "int8" not in precisions.supported():
        pytest.skip("no int8 kernel on this CPU")
    folder = checkpoints(family)
    fp32, int8 = pipeline("fill-mask", folder), pipeline("fill-mask", folder, precision="int8")
    assert int8.precision == "int8"
    ids = torch.tensor([Tokenizer.from_pretrained(folder).encode("anna lives in paris and the movie was good")])
    with torch.no_grad():
        expected, got = fp32.model(ids).logits, int8.model(ids).logits.float()
    cosine = torch.nn.functional.cosine_similarity(got.flatten(1), expected.flatten(1))
    assert cosine.min() > 0.99, cosine
    assert (got.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("family", FAMILY_PARAMS)
def test_embed_fine_tunes_with_cls_pooling_and_reloads_as_the_bare_model(tmp_path, checkpoints, family):
    rng = random.Random(5)
    rows = "".join(f"{polar_sentence(rng, 1)}\t{polar_sentence(rng, i % 2)}\t{5.0 * (i % 2)}\n" for i in range(48))
    (tmp_path / "sts.tsv").write_text("sentence1\tsentence2\tscore\n" + rows, encoding="utf-8")
    folder = checkpoints(family)
    summary = run("finetune", "embed", "--model", folder, "--train", tmp_path / "sts.tsv", "--eval",
                  tmp_path / "sts.tsv", "--out", tmp_path / "embed", "--pooling", "cls", "--epochs", "1", *FAST)
    assert summary["info"]["pooling"] == "cls"
    reloaded = load_model(tmp_path / "embed")
    assert isinstance(reloaded, SentenceEmbedder) and reloaded.pooling == "cls"
    config = json.loads((tmp_path / "embed" / "config.json").read_text())
    assert config["architectures"] == [FAMILIES[family].architectures["base"]]
    texts = [polar_sentence(rng, i % 2) for i in range(6)]
    vectors = torch.tensor(pipeline("embed", tmp_path / "embed").embed(texts))
    base = load_model(tmp_path / "embed")
    expected = Embed(base, Tokenizer.from_pretrained(folder), pooling="cls", normalize=False).embed(texts)
    assert_close(vectors, torch.tensor(expected), **TOL)
    plain = torch.tensor(pipeline("embed", folder).embed(texts))  # the MLM checkpoint embeds too, mean-pooled
    assert plain.shape == (6, 32) and torch.isfinite(plain).all()
