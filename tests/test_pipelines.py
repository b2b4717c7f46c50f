"""Pipelines against transformers' own pipelines on the same folders, the batching engine, and precision modes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close
from transformers import (BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification)
from transformers import pipeline as hf_pipeline

from encoderlab.cli import main
from encoderlab.errors import InputError
from encoderlab.infer import precision as precisions
from encoderlab.engine import Encoded, sorted_batches
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.tagging import NER, entities, word_tags
from encoderlab.tokenizer import Tokenizer
from conftest import shared_file
from hf_oracle import randomize

WORDS = ("anna peter maria john paris rome oslo lima lives in where does is from the a movie was good bad "
         "very city of capital france italy and to he she it went saw").split()
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
TEXTS = ["anna lives in paris .", "where does peter live ?", "the movie was very good and it was the capital",
         "maria", "john went to rome and saw lima and oslo with anna and peter ."]


pytestmark = pytest.mark.usefixtures("one_thread", "int8_compiled")  # see conftest.py


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=120, min_frequency=1)
    tokenizer.save(folder)
    return folder


def hf_folder(tmp_path_factory, tokenizer_folder: Path, cls, name: str, **config) -> Path:
    """A random transformers model of class `cls`, saved with the tiny tokenizer."""
    tokenizer = Tokenizer.from_pretrained(tokenizer_folder)
    base = {"vocab_size": tokenizer.vocab_size, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 37, "max_position_embeddings": 64}
    torch.manual_seed(0)
    model = cls(BertConfig(**(base | config))).eval()
    randomize(model, seed=3)
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module")
def mlm_folder(tmp_path_factory, tokenizer_folder) -> Path:
    return hf_folder(tmp_path_factory, tokenizer_folder, BertForMaskedLM, "mlm")


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory, tokenizer_folder) -> Path:
    return hf_folder(tmp_path_factory, tokenizer_folder, BertForSequenceClassification, "cls",
                     id2label={0: "neg", 1: "neutral", 2: "pos"}, label2id={"neg": 0, "neutral": 1, "pos": 2})


@pytest.fixture(scope="module")
def tagger_folder(tmp_path_factory, tokenizer_folder) -> Path:
    return hf_folder(tmp_path_factory, tokenizer_folder, BertForTokenClassification, "ner",
                     id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)})


@pytest.fixture(scope="module")
def qa_folder(tmp_path_factory, tokenizer_folder) -> Path:
    return hf_folder(tmp_path_factory, tokenizer_folder, BertForQuestionAnswering, "qa")


def oracle(task: str, folder: Path, **options):
    return hf_pipeline(task, model=str(folder), tokenizer=str(folder), device="cpu", **options)


# ---- parity with transformers' pipelines ------------------------------------------------------------
def test_fill_mask_matches_transformers(mlm_folder):
    texts = ["anna lives in [MASK] .", "the [MASK] of france is paris", "where does [MASK] live ?"]
    ours = pipeline("fill-mask", mlm_folder)(texts, top_k=5)
    theirs = oracle("fill-mask", mlm_folder)(texts, top_k=5)
    for mine, reference in zip(ours, theirs):
        (mask,) = mine["masks"]
        assert [p["id"] for p in mask["predictions"]] == [r["token"] for r in reference]
        assert_close(torch.tensor([p["score"] for p in mask["predictions"]]),
                     torch.tensor([r["score"] for r in reference]), atol=1e-5, rtol=1e-4)


def test_fill_mask_several_masks(mlm_folder):
    (result,) = pipeline("fill-mask", mlm_folder)(["[MASK] lives in [MASK] and <mask> ."], top_k=3)
    assert len(result["masks"]) == 3 and all(len(m["predictions"]) == 3 for m in result["masks"])
    assert result["masks"][0]["position"] < result["masks"][1]["position"] < result["masks"][2]["position"]
    assert "[MASK]" not in result["filled"]
    theirs = oracle("fill-mask", mlm_folder)("[MASK] lives in [MASK] and [MASK] .", top_k=3)
    assert [[p["id"] for p in m["predictions"]] for m in result["masks"]] == [[r["token"] for r in t] for t in theirs]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_fill_mask_with_the_tokenizers_own_mask_token(kind, tmp_path_factory):
    """RoBERTa's <mask> and ALBERT's [MASK]: either spelling in the input, the oracle given the kind's own."""
    tokenizer = Tokenizer.train_from_iterator(kind, [" ".join(WORDS)] * 3, vocab_size=300, min_frequency=1)
    folder = tmp_path_factory.mktemp(f"tok-{kind}")
    tokenizer.save(folder)
    mlm = hf_folder(tmp_path_factory, folder, BertForMaskedLM, f"mlm-{kind}")
    own = tokenizer.mask_token
    ours = pipeline("fill-mask", mlm)(["anna lives in [MASK] .", "anna lives in <mask> ."], top_k=3)
    theirs = oracle("fill-mask", mlm)(f"anna lives in {own} .", top_k=3)
    assert [p["id"] for p in ours[0]["masks"][0]["predictions"]] == [r["token"] for r in theirs]
    assert ours[0]["masks"] == ours[1]["masks"]
    assert own not in ours[0]["filled"] and ours[0]["filled"].startswith("anna lives in")


def test_classify_matches_transformers(classifier_folder):
    ours = pipeline("classify", classifier_folder)(TEXTS)
    theirs = oracle("text-classification", classifier_folder, top_k=None)(TEXTS)
    for mine, reference in zip(ours, theirs):
        expected = {r["label"]: r["score"] for r in reference}
        assert mine["label"] == max(expected, key=expected.get)
        assert_close(torch.tensor([mine["scores"][k] for k in expected]), torch.tensor(list(expected.values())),
                     atol=1e-5, rtol=1e-4)


def test_classify_pairs_match_transformers(classifier_folder):
    pairs = [["anna lives in paris", "where does anna live ?"], ["the movie", "was good"]]
    ours = pipeline("classify", classifier_folder)(pairs)
    theirs = oracle("text-classification", classifier_folder, top_k=None)(
        [{"text": a, "text_pair": b} for a, b in pairs])
    for mine, reference in zip(ours, theirs):
        assert_close(torch.tensor([mine["scores"][r["label"]] for r in reference]),
                     torch.tensor([r["score"] for r in reference]), atol=1e-5, rtol=1e-4)


def test_ner_entities_match_transformers_first_aggregation(tagger_folder):
    texts = [t.replace("anna", "Anna") for t in TEXTS]  # offsets must point into the original text
    ours = pipeline("ner", tagger_folder)(texts)
    theirs = oracle("token-classification", tagger_folder, aggregation_strategy="first")(texts)
    for text, mine, reference in zip(texts, ours, theirs):
        assert [(e["entity"], e["start"], e["end"]) for e in mine["entities"]] == \
            [(r["entity_group"], r["start"], r["end"]) for r in reference]
        assert all(e["text"] == text[e["start"]:e["end"]] for e in mine["entities"])


def test_qa_matches_transformers_on_one_window(qa_folder):
    """transformers 5 has no QA pipeline: the oracle is its model's logits, decoded by brute force over all spans."""
    from transformers import AutoTokenizer

    items = [{"question": "where does anna live ?", "context": "anna lives in paris and peter lives in rome ."},
             {"question": "who went to lima ?", "context": "john went to lima ."}]
    ours = pipeline("qa", qa_folder)(items)
    hf_model = BertForQuestionAnswering.from_pretrained(qa_folder).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(qa_folder)
    for mine, item in zip(ours, items):
        encoded = hf_tokenizer(item["question"], item["context"], return_offsets_mapping=True, return_tensors="pt")
        offsets, sequence = encoded.pop("offset_mapping")[0].tolist(), encoded.sequence_ids(0)
        with torch.inference_mode():
            out = hf_model(**encoded)
        start, end = out.start_logits[0], out.end_logits[0]
        context = [i for i, s in enumerate(sequence) if s == 1]
        best = max(((float(start[s] + end[e]), s, e) for s in context for e in context if s <= e < s + 30))
        assert (mine["start"], mine["end"]) == (offsets[best[1]][0], offsets[best[2]][1])
        assert mine["answer"] == item["context"][mine["start"]:mine["end"]]


def test_qa_long_context_is_windowed_not_truncated(qa_folder, caplog):
    context = " ".join(["john went to rome and saw lima ."] * 40)  # ~320 tokens, the model's window is 64
    qa = pipeline("qa", qa_folder, doc_stride=16)
    (result,) = qa([{"question": "where did john go ?", "context": context}])
    assert result["answer"] == context[result["start"]:result["end"]]
    # The best span over every window: each window alone, scored by the same model, never beats it.
    from encoderlab.tasks.qa import QATask
    from encoderlab.tasks.readers import QAExample

    task = QATask(qa.tokenizer, qa.max_length, qa.doc_stride, max_query_length=16, batch_size=4)
    windows = task.windows([QAExample("0", "", context, "where did john go ?")])
    assert len(windows) > 5
    best = float("-inf")
    with torch.inference_mode():
        for window in windows:
            ids = torch.tensor([window.input_ids])
            out = qa.model(ids, torch.ones_like(ids), torch.tensor([window.token_type_ids]))
            start, end = out.start_logits, out.end_logits
            found = task.best_span(start[0], end[0], window.spans)
            if found and found[0] > best:
                best, span = found[0], found[1:]
    assert (result["start"], result["end"]) == span
    assert not any("truncated" in r.message for r in caplog.records)


# ---- the engine -------------------------------------------------------------------------------------
def test_results_come_back_in_input_order_whatever_the_batch(classifier_folder):
    texts = TEXTS * 7
    one = pipeline("classify", classifier_folder, batch_size=1)(texts)
    many = pipeline("classify", classifier_folder, batch_size=8)(texts)
    assert [r["label"] for r in one] == [r["label"] for r in many]
    assert_close(torch.tensor([r["score"] for r in one]), torch.tensor([r["score"] for r in many]),
                 atol=1e-5, rtol=1e-4)


def test_sorted_batches_cover_every_input_once():
    lengths = [5, 1, 9, 3, 3, 7, 2]
    batches = sorted_batches(lengths, 3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [lengths[i] for i in batches[0]] == [9, 7, 5]


def test_long_texts_are_truncated_with_a_warning(classifier_folder, caplog):
    long_text = " ".join(WORDS * 10)
    with caplog.at_level(logging.WARNING):
        (result,) = pipeline("classify", classifier_folder)([long_text])
    assert "label" in result
    assert any("truncated" in r.message for r in caplog.records)


@pytest.mark.parametrize("bad", [[], [""], ["   "], "a single string", [3]])
def test_bad_inputs_are_refused(classifier_folder, bad):
    with pytest.raises(InputError):
        pipeline("classify", classifier_folder)(bad)


def test_wrong_checkpoint_kind_is_refused(classifier_folder, mlm_folder):
    with pytest.raises(InputError, match="ner needs a token-classification checkpoint"):
        pipeline("ner", classifier_folder)
    with pytest.raises(InputError, match="no \\[MASK\\]"):
        pipeline("fill-mask", mlm_folder)(["no mask here"])


def test_ner_merges_subwords_and_bioes():
    item = Encoded([2, 10, 11, 12, 13, 3], [0] * 6, [(0, 0), (0, 3), (3, 5), (6, 11), (12, 16), (0, 0)],
                   [None, 0, 0, 0, 0, None])
    probs = torch.zeros(6, 5)
    for position, tag in ((1, 1), (2, 0), (3, 2), (4, 3)):  # B-PER, (sub-word), I-PER, B-LOC
        probs[position, tag] = 1.0
    words = word_tags(item, probs, TAGS)
    assert [(s, e, t) for s, e, t, _ in words] == [(0, 5, "B-PER"), (6, 11, "I-PER"), (12, 16, "B-LOC")]
    found = entities(words, "abcde fghij klmn")
    assert [(e["entity"], e["start"], e["end"], e["text"]) for e in found] == \
        [("PER", 0, 11, "abcde fghij"), ("LOC", 12, 16, "klmn")]
    bioes = [(0, 4, "S-LOC", 0.9), (5, 9, "B-PER", 0.8), (10, 14, "E-PER", 0.6), (15, 19, "I-PER", 0.5)]
    assert [(e["entity"], e["start"], e["end"]) for e in entities(bioes, "x" * 19)] == \
        [("LOC", 0, 4), ("PER", 5, 14), ("PER", 15, 19)]


# ---- precision modes --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["bf16", "int8"])
@pytest.mark.slow
def test_precision_modes_stay_close_to_fp32_on_minilm(minilm_path, sst2_dev_sentences, mode):
    if mode not in precisions.supported():
        pytest.skip(f"{mode} is not supported on this machine")
    texts = sst2_dev_sentences[:64]
    reference = pipeline("embed", minilm_path).embed(texts)
    other = pipeline("embed", minilm_path, precision=mode)
    assert other.precision == mode
    vectors = other.embed(texts)
    cosine = (reference * vectors).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(vectors, axis=1)
    assert cosine.mean() >= 0.99 and cosine.min() >= 0.97, (cosine.mean(), cosine.min())


@pytest.mark.parametrize("mode", ["bf16", "int8"])
@pytest.mark.slow
def test_precision_modes_cost_at_most_a_point_of_stsb_spearman(minilm_path, mode):
    """The task-metric half of the precision check: STS-B dev Spearman (x100) of minilm within 1 point of fp32."""
    from scipy.stats import spearmanr

    if mode not in precisions.supported():
        pytest.skip(f"{mode} is not supported on this machine")
    lines = shared_file("stsb/dev.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0].split("\t"), [line.split("\t") for line in lines[1:401]]
    first, second, score = (header.index(c) for c in ("sentence1", "sentence2", "score"))
    gold = [float(r[score]) for r in rows]

    def spearman(embedder) -> float:
        a, b = embedder.embed([r[first] for r in rows]), embedder.embed([r[second] for r in rows])
        return 100 * spearmanr((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1), gold).statistic

    reference = spearman(pipeline("embed", minilm_path))
    assert reference > 80, reference  # minilm itself must be doing the task, or the comparison means nothing
    assert abs(reference - spearman(pipeline("embed", minilm_path, precision=mode))) <= 1.0


def test_int8_linear_is_close_to_fp32():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    x = torch.randn(5, 7, 64)
    quantized = precisions.Int8Linear(linear)
    if not precisions.int8_supported():
        pytest.skip("no int8 matmul in this torch build")
    y, reference = quantized(x), linear(x)
    assert y.shape == reference.shape
    assert torch.nn.functional.cosine_similarity(y.flatten(), reference.flatten(), dim=0) > 0.999


@pytest.mark.slow
def test_auto_picks_a_supported_mode(classifier_folder):
    """auto times every mode this CPU runs at load (int8 among them where it has a kernel): 5 CPU s on Ice Lake."""
    auto = pipeline("classify", classifier_folder, precision="auto")
    assert auto.precision in precisions.supported()
    assert len(auto(TEXTS)) == len(TEXTS)


def test_unsupported_precision_falls_back_to_fp32(classifier_folder, monkeypatch, caplog):
    monkeypatch.setattr(precisions, "bf16_supported", lambda device="cpu": False)
    with caplog.at_level(logging.WARNING):
        classify = pipeline("classify", classifier_folder, precision="bf16")
    assert classify.precision == "fp32" and any("not supported" in r.message for r in caplog.records)


# ---- the CLI ----------------------------------------------------------------------------------------
def test_cli_commands_print_json(mlm_folder, classifier_folder, tagger_folder, qa_folder, capsys, tmp_path):
    assert main(["fill-mask", "--model", str(mlm_folder), "anna lives in [MASK] .", "--json", "--top-k", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out[0]["masks"][0]["predictions"]) == 2
    assert main(["classify", "--model", str(classifier_folder), *TEXTS[:2], "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert main(["ner", "--model", str(tagger_folder), TEXTS[0]]) == 0
    assert TEXTS[0] in capsys.readouterr().out
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "who ?", "context": "anna lives in paris"}) + "\n", encoding="utf-8")
    assert main(["qa", "--model", str(qa_folder), "--input", str(questions), "--json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)
    assert answer["answer"] == "anna lives in paris"[answer["start"]:answer["end"]]


def test_cli_bad_input_exits_2(mlm_folder, qa_folder, capsys):
    assert main(["fill-mask", "--model", str(mlm_folder), "no mask"]) == 2
    assert "no [MASK]" in capsys.readouterr().err
    assert main(["qa", "--model", str(qa_folder), "--question", "who ?"]) == 2
    assert main(["classify", "--model", str(mlm_folder) + "-absent", "x"]) == 2


def test_ner_long_text_is_windowed_and_agrees_with_short_pieces(tagger_folder, caplog):
    """Entities of a text far over the window are found all along it, and far from window edges they are
    those of the sentence read alone."""
    sentence = "john went to rome and saw lima and oslo with anna and peter ."
    text = " ".join([sentence] * 30)  # ~450 tokens, the window is 64
    ner = pipeline("ner", tagger_folder)
    with caplog.at_level(logging.WARNING):
        (result,) = ner([text])
    assert not any("truncated" in r.message for r in caplog.records)
    alone = [(e["entity"], e["text"]) for e in ner([sentence])[0]["entities"]]
    assert alone, "the random tagger should tag something in the sentence"
    assert max(e["end"] for e in result["entities"]) > len(text) - len(sentence)  # entities to the very end
    assert all(e["text"] == text[e["start"]:e["end"]] for e in result["entities"])
    found = {(e["entity"], e["text"]) for e in result["entities"]}
    assert set(alone) <= found
