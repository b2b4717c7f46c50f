"""The one inference engine: padding, batching order, a folder's settings, and the same answer from every command.

`embed` (CLI), the Python pipeline, the server and the ONNX runner give the same vectors for the same texts, and
follow the folder (minilm: unit vectors) without a flag; QA options (allow_null, n_best) give the same answers
through the pipeline, the `qa` command and `evaluate qa`; the window (engine.window) is the same at every entry point.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from torch.testing import assert_close

from hf_oracle import randomize

from encoderlab import EncoderConfig
from encoderlab.cli import main
from encoderlab.checkpoint import load_model, save_pretrained
from encoderlab.engine import MAX_PADDING, pad, pad_batch, sorted_batches
from encoderlab.folder import Settings, settings
from encoderlab.infer.onnx import OnnxRunner, export_onnx
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
from encoderlab.nn.model import SpanExtractor
from encoderlab.tasks.finetune import EvaluateJob, FinetuneJob, task_for_model, train_window
from encoderlab.tokenizer import Tokenizer
from encoderlab.viz.attention import attention_maps

FP32 = {"atol": 1e-5, "rtol": 1e-5}
TEXTS = ["A man is playing a guitar.", "The market fell sharply on Monday.", "tea",
         "where does anna live?", "a long walk by the river at dusk, slowly, with a dog and two friends"]
WORDS = "anna peter maria john paris rome oslo lima lives in where does is from the a went to saw and city".split()

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


# ---- padding and batching ------------------------------------------------------------------------------------
def test_pad_fills_rows_to_the_longest_or_a_multiple():
    assert pad([[1, 2, 3], [4]], 0).tolist() == [[1, 2, 3], [4, 0, 0]]
    assert pad([[1, 2, 3], [4]], -100, multiple_of=4).tolist() == [[1, 2, 3, -100], [4, -100, -100, -100]]
    batch = pad_batch([[5, 6], [7, 8, 9]], [[0, 0], [0, 1, 1]], pad_id=1)
    assert batch["input_ids"].tolist() == [[5, 6, 1], [7, 8, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0], [0, 1, 1]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_sorted_batches_are_longest_first():
    assert sorted_batches([2, 9, 4, 7, 1], 2) == [[1, 3], [2, 0], [4]]
    assert sorted_batches([], 4) == []


def test_a_batch_closes_where_the_next_input_would_pad_it_beyond_the_cap():
    lengths = [20] * 40 + [250] * 4 + [240] * 2  # short sentences and long passages: one batch of 32 would mix them
    batches = sorted_batches(lengths, 32)
    assert [lengths[i] for i in batches[0]] == [250] * 4 + [240] * 2  # closed before the first short one
    assert [len(b) for b in batches] == [6, 32, 8]
    for batch in batches:
        positions = len(batch) * max(lengths[i] for i in batch)
        assert positions - sum(lengths[i] for i in batch) <= MAX_PADDING * positions


def test_a_batch_of_few_tokens_is_not_cut_for_padding():
    lengths = [9, 2, 2, 2]  # 15 real tokens of 36 positions: below MIN_BATCH_TOKENS, one batch all the same
    assert sorted_batches(lengths, 8) == [[0, 1, 2, 3]]


# ---- a folder's settings -------------------------------------------------------------------------------------
def test_minilm_settings_come_from_its_sentence_transformers_files(minilm_path):
    given = settings(minilm_path)
    assert (given.pooling, given.normalize, given.max_length) == ("mean", True, 256)


def test_a_plain_folder_has_the_defaults(tmp_path):
    assert settings(tmp_path) == Settings()


# ---- the same vectors from every command ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm_onnx(tmp_path_factory, minilm_path) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "minilm"
    export_onnx(minilm_path, out)
    return out


def cli_embed(tmp_path: Path, *flags: str) -> np.ndarray:
    source, out = tmp_path / "in.txt", tmp_path / "out.npy"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["embed", "--model", "minilm", "--input", str(source), "--out", str(out), *flags]) == 0
    return np.load(out)


def server_embed(minilm_path: Path) -> np.ndarray:
    pipelines, reasons = load_pipelines(str(minilm_path), tasks=["embed"])
    with TestClient(create_app(pipelines, Limits(), model="minilm", unavailable=reasons)) as client:
        response = client.post("/embed", json={"texts": TEXTS})
    assert response.status_code == 200, response.text
    return np.array([r["embedding"] for r in response.json()["results"]], dtype=np.float32)


def test_embed_cli_pipeline_server_and_onnx_give_the_same_unit_vectors(tmp_path, minilm_path, minilm_onnx):
    reference = torch.from_numpy(pipeline("embed", minilm_path).embed(TEXTS))
    assert_close(reference.norm(dim=-1), torch.ones(len(TEXTS)), **FP32)  # minilm's folder says Normalize
    for name, vectors in (("cli", cli_embed(tmp_path)), ("server", server_embed(minilm_path)),
                          ("onnx", OnnxRunner(minilm_onnx, threads=1).embed(TEXTS, batch_size=2))):
        assert_close(torch.from_numpy(vectors), reference, **FP32, msg=lambda m: f"{name}: {m}")


def test_no_normalize_opts_out_everywhere(tmp_path, minilm_path, minilm_onnx):
    raw = pipeline("embed", minilm_path, normalize=False).embed(TEXTS)
    assert np.linalg.norm(raw, axis=-1).min() > 2  # mean-pooled MiniLM vectors are far from unit length
    assert_close(torch.from_numpy(cli_embed(tmp_path, "--no-normalize")), torch.from_numpy(raw), **FP32)
    assert_close(torch.from_numpy(OnnxRunner(minilm_onnx, threads=1).embed(TEXTS, normalize=False)),
                 torch.from_numpy(raw), atol=1e-4, rtol=1e-5)  # the vectors are about 5 long: 1e-5 relative
    unit = raw / np.linalg.norm(raw, axis=-1, keepdims=True)
    assert_close(torch.from_numpy(cli_embed(tmp_path, "--normalize")), torch.from_numpy(unit), **FP32)


# ---- QA options mean the same everywhere ---------------------------------------------------------------------
QUESTIONS = [(f"where does {who} live ?", f"{who} lives in {town} and {other} went to {far} .")
             for who, town, other, far in zip(WORDS[:4], WORDS[4:8], WORDS[1:5], WORDS[5:9])] + \
            [("who went to the city ?", "peter went to the city and anna saw oslo and lima from rome .")] * 2


@pytest.fixture(scope="module")
def qa_folders(tmp_path_factory) -> dict[str, Path]:
    """One random QA model saved twice: with the default decoding, and with allow_null, n_best 1 and one-token
    answers (so that many questions have no valid span, whatever the random weights)."""
    tokenizer = Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=100, min_frequency=1)
    config = EncoderConfig.from_preset("bert-tiny", hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                                       vocab_size=tokenizer.vocab_size, max_position_embeddings=64)
    model = SpanExtractor(config).eval()
    randomize(model, seed=4)
    folders = {}
    for name, options in (("plain", {}), ("null", {"allow_null": True, "n_best": 1, "max_answer_length": 1})):
        folders[name] = tmp_path_factory.mktemp(name)
        save_pretrained(model, folders[name], tokenizer, {"task": "qa", "max_length": 64, "doc_stride": 16,
                                                          "max_query_length": 16, **options})
    return folders


def squad_file(path: Path) -> Path:
    paragraphs = [{"context": c, "qas": [{"id": f"q{i}", "question": q, "answers": [{"text": c.split()[0],
                                                                                      "answer_start": 0}]}]}
                  for i, (q, c) in enumerate(QUESTIONS)]
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


def answers_everywhere(folder: Path, tmp_path: Path, capsys) -> dict[str, list[str]]:
    """The answers of the pipeline, the `qa` command and `evaluate qa --predictions` to QUESTIONS."""
    items = [{"question": q, "context": c} for q, c in QUESTIONS]
    piped = [r["answer"].strip() for r in pipeline("qa", folder)(items)]
    inputs = tmp_path / "questions.jsonl"
    inputs.write_text("".join(json.dumps(item) + "\n" for item in items))
    capsys.readouterr()
    assert main(["qa", "--model", str(folder), "--input", str(inputs), "--json"]) == 0
    cli = [r["answer"].strip() for r in json.loads(capsys.readouterr().out)]
    predictions = tmp_path / "predictions.json"
    assert main(["evaluate", "qa", "--model", str(folder), "--data", str(squad_file(tmp_path / "dev.json")),
                 "--predictions", str(predictions)]) == 0
    evaluated = json.loads(predictions.read_text())
    return {"pipeline": piped, "cli": cli, "evaluate": [evaluated[f"q{i}"] for i in range(len(QUESTIONS))]}


@pytest.mark.parametrize("name", ["plain", "null"])
def test_qa_options_give_the_same_answers_in_pipeline_cli_and_evaluate(qa_folders, tmp_path, capsys, name):
    found = answers_everywhere(qa_folders[name], tmp_path, capsys)
    assert found["pipeline"] == found["cli"] == found["evaluate"], found


def test_qa_options_change_the_answers(qa_folders, tmp_path, capsys):
    """The folder's allow_null and n_best are honoured, not ignored: some answer differs from the defaults."""
    plain = answers_everywhere(qa_folders["plain"], tmp_path, capsys)["pipeline"]
    null = answers_everywhere(qa_folders["null"], tmp_path, capsys)["pipeline"]
    assert "" not in plain and plain != null
    assert pipeline("qa", qa_folders["null"]).info()["allow_null"] is True


# ---- the window: one resolver, every entry point --------------------------------------------------------------------
def windows_everywhere(folder: Path, tmp_path: Path, capsys, text: str, flag: int | None) -> dict[str, int]:
    """The window each entry point takes for `folder`, with --max-length `flag` where the entry point has one."""
    tokenizer, asked = Tokenizer.from_pretrained(folder), flag or settings(folder).max_length
    evaluate_job = EvaluateJob("embed", str(folder), "unused.tsv", max_length=flag)
    maps = attention_maps(load_model(folder, kind="base"), tokenizer, text, max_length=asked)
    found = {"pipeline": pipeline("embed", folder, max_length=flag).max_length,
             "server": load_pipelines(str(folder), tasks=["embed"], max_length=flag)[0]["embed"].max_length,
             "attention": len(maps.tokens),
             "evaluate": task_for_model(evaluate_job, load_model(folder, kind="embed"), {}, tokenizer).max_length,
             "finetune": train_window(FinetuneJob("embed", str(folder), "unused.tsv", tmp_path, max_length=asked),
                                      tokenizer)}  # fine-tuning reads no folder settings: --max-length 514 here
    if flag is None:  # the commands with no --max-length follow the folder
        assert main(["attention", "--model", str(folder), text, "--head", "0", "--out", str(tmp_path / "a.png"),
                     "--json"]) == 0
        found["attention cli"] = len(json.loads(capsys.readouterr().out)["tokens"])
        found["onnx"] = export_onnx(folder, tmp_path / "m")["max_length"]
    return found


@pytest.mark.parametrize("flag, expected", [(None, 512), (100, 100), (600, 512)])
@pytest.mark.slow
def test_every_entry_point_takes_the_same_window(tmp_path, capsys, roberta_window_path, long_text, flag, expected):
    """Issue 36: a RoBERTa-family folder whose sentence-transformers file asks for 514 tokens (its position count)
    gets 512 (positions start at pad_token_id + 1) from every entry point, and a flag's value within it."""
    folder = tmp_path / "model"
    shutil.copytree(roberta_window_path, folder)
    (folder / "sentence_bert_config.json").write_text('{"max_seq_length": 514}', encoding="utf-8")
    found = windows_everywhere(folder, tmp_path, capsys, long_text, flag)
    assert set(found.values()) == {expected}, found
