"""Bad input everywhere a user hands us data, through the real CLI: one line on stderr, exit 2 (1 for OS errors).

One table of cases: each writes a bad file (or passes a bad argument), runs `encoderlab.cli.main` in-process
and checks that stderr is a single `error: ...` line naming the file and line, key or tensor at fault, never
a traceback. Then hypothesis fuzzes the readers, the tokenizer wrapper and the pipelines' input checks for a
bounded number of examples, and a scan of the source checks that no code path runs configuration as code.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from encoderlab.cli import main
from encoderlab.errors import ConfigError, InputError
from encoderlab.tasks import readers
from encoderlab.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["anna", "peter", "lives", "in", "paris", "rome", "the", "movie", "was", "good", "bad", "very", "where",
         "does", "is", "from"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


# ---- tiny checkpoint folders (transformers writes them: it is the oracle, never imported by encoderlab) ---------
@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train_from_iterator("wordpiece", [" ".join(WORDS)] * 3, vocab_size=80, min_frequency=1)


@dataclass
class Folders:
    """The checkpoint folders the cases run against."""

    base: Path
    mlm: Path
    classify: Path
    ner: Path
    qa: Path


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer) -> Folders:
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    def save(cls, name: str, **config) -> Path:
        base = {"vocab_size": tokenizer.vocab_size, "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 37, "max_position_embeddings": 64}
        torch.manual_seed(0)
        folder = tmp_path_factory.mktemp(name)
        cls(BertConfig(**(base | config))).eval().save_pretrained(folder)
        tokenizer.save(folder)
        return folder

    return Folders(base=save(BertModel, "base"), mlm=save(BertForMaskedLM, "mlm"),
                   classify=save(BertForSequenceClassification, "cls", id2label={0: "neg", 1: "pos"},
                                 label2id={"neg": 0, "pos": 1}),
                   ner=save(BertForTokenClassification, "ner", id2label=dict(enumerate(TAGS)),
                            label2id={t: i for i, t in enumerate(TAGS)}),
                   qa=save(BertForQuestionAnswering, "qa"))


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """(exit code, stderr) of the real CLI; an exception escaping main fails the test with its traceback."""
    try:
        code = main([str(a) for a in argv])
    except Exception:  # noqa: BLE001 (the point is to catch whatever escapes)
        pytest.fail("an exception escaped the CLI:\n" + traceback.format_exc())
    return code, capsys.readouterr().err


def write(folder: Path, name: str, data: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)
    return path


def damaged_copy(source: Path, tmp: Path, damage: Callable[[Path], None]) -> Path:
    """A copy of a checkpoint folder with `damage(folder)` applied."""
    folder = tmp / "damaged"
    shutil.copytree(source, folder)
    damage(folder)
    return folder


def edit_tensors(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        tensors = load_file(folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, folder / "model.safetensors")
    return damage


def edit_config(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        result = edit(config)
        (folder / "config.json").write_text(json.dumps(config if result is None else result), encoding="utf-8")
    return damage


def truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        path = folder / name
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])
    return damage


# ---- the table -----------------------------------------------------------------------------------------------
# Each case builds its input under tmp and returns (argv, fragments stderr must contain).
Make = Callable[[Path, Folders], tuple[list, list[str]]]
CASES: dict[str, tuple[Make, int]] = {}


def case(name: str, code: int = 2) -> Callable[[Make], Make]:
    def register(make: Make) -> Make:
        assert name not in CASES, name
        CASES[name] = (make, code)
        return make
    return register


def embed(tmp: Path, f: Folders, name: str, data: str | bytes) -> list:
    return ["embed", "--model", f.base, "--input", write(tmp, name, data), "--out", tmp / "out.npy"]


def simple_case(name: str, argv: Callable[[Path, Folders], list], *fragments: str, code: int = 2) -> None:
    case(name, code)(lambda tmp, f: (argv(tmp, f), list(fragments)))


# embed: one text per line
simple_case("embed-empty-file", lambda t, f: embed(t, f, "empty.txt", ""), "empty.txt", "empty")
simple_case("embed-whitespace-file", lambda t, f: embed(t, f, "blank.txt", " \n\t\n"), "blank.txt", "empty")
simple_case("embed-non-utf8", lambda t, f: embed(t, f, "latin1.txt", "ok\ncafé\n".encode("latin-1")),
            "latin1.txt:2", "UTF-8")
simple_case("embed-nul-byte", lambda t, f: embed(t, f, "nul.txt", b"ok\r\nfine\nbad\x00byte\n"), "nul.txt:3", "NUL")
simple_case("embed-nul-after-cr-lines", lambda t, f: embed(t, f, "cr.txt", b"a\rb\rc\x00\r"), "cr.txt:3", "NUL")
simple_case("embed-blank-line", lambda t, f: embed(t, f, "gap.txt", "one\n\nthree\n"), "gap.txt:2", "empty line")
simple_case("embed-missing-file", lambda t, f: ["embed", "--model", f.base, "--input", t / "absent.txt",
                                                "--out", t / "o.npy"], "absent.txt", "no such file")
simple_case("embed-input-is-folder", lambda t, f: ["embed", "--model", f.base, "--input", t,
                                                   "--out", t / "o.npy"], "folder")
simple_case("embed-missing-model", lambda t, f: embed(t, f, "a.txt", "x\n")[:2] + [t / "nowhere"]
            + embed(t, f, "a.txt", "x\n")[3:], "nowhere", "no such folder")

# similarity: texts as arguments
simple_case("similarity-empty-text", lambda t, f: ["similarity", "--model", f.base, "", "b"], "text 0", "empty")
simple_case("similarity-whitespace-text", lambda t, f: ["similarity", "--model", f.base, "a", " \t "],
            "text 1", "whitespace")
simple_case("similarity-one-text", lambda t, f: ["similarity", "--model", f.base, "alone"], "at least two")

# pipelines: classify, ner, fill-mask, qa
simple_case("classify-empty-text", lambda t, f: ["classify", "--model", f.classify, ""], "text 0", "empty")
simple_case("classify-pair-count", lambda t, f: ["classify", "--model", f.classify, "a", "b", "--pair", "c"],
            "2 texts but 1")
simple_case("classify-empty-pair", lambda t, f: ["classify", "--model", f.classify, "a", "--pair", " "],
            "pair text 0", "empty")
simple_case("classify-input-nul", lambda t, f: ["classify", "--model", f.classify, "--input",
                                                write(t, "in.txt", b"a\nb\x00\n")], "in.txt:2", "NUL")
simple_case("classify-no-texts", lambda t, f: ["classify", "--model", f.classify], "no input texts")
simple_case("classify-wrong-checkpoint", lambda t, f: ["classify", "--model", f.mlm, "a"],
            "sequence-classification checkpoint")
simple_case("ner-whitespace-text", lambda t, f: ["ner", "--model", f.ner, "   "], "text 0", "whitespace")
simple_case("fill-mask-no-mask", lambda t, f: ["fill-mask", "--model", f.mlm, "no mask here"], "text 0", "[MASK]")
simple_case("fill-mask-non-utf8", lambda t, f: ["fill-mask", "--model", f.mlm, "--input",
                                                write(t, "m.txt", b"[MASK] ok\n\xff\xfe\n")], "m.txt:2", "UTF-8")
simple_case("qa-input-not-json", lambda t, f: ["qa", "--model", f.qa, "--input", write(
    t, "q.jsonl", '{"question": "who", "context": "anna"}\n{oops\n')], "q.jsonl:2", "JSON")
simple_case("qa-input-not-an-object", lambda t, f: ["qa", "--model", f.qa, "--input", write(
    t, "q.jsonl", '{"question": "who", "context": "anna"}\n[1, 2]\n')], "q.jsonl:2", "question")
simple_case("qa-input-missing-context", lambda t, f: ["qa", "--model", f.qa, "--input", write(
    t, "q.jsonl", '{"question": "who"}\n')], "q.jsonl:1", "context")
simple_case("qa-empty-question", lambda t, f: ["qa", "--model", f.qa, "--question", " ", "--context", "anna"],
            "question", "empty")
simple_case("qa-empty-context-file", lambda t, f: ["qa", "--model", f.qa, "--question", "who", "--context-file",
                                                   write(t, "ctx.txt", "\n\n")], "ctx.txt", "empty")
simple_case("qa-no-question", lambda t, f: ["qa", "--model", f.qa, "--context", "anna"], "--question")
simple_case("pipeline-corrupt-task-json", lambda t, f: ["classify", "--model", damaged_copy(
    f.classify, t, lambda d: write(d, "task.json", "{not json")), "a"], "task.json", "JSON")
simple_case("pipeline-task-json-not-object", lambda t, f: ["classify", "--model", damaged_copy(
    f.classify, t, lambda d: write(d, "task.json", "[1]")), "a"], "task.json", "object")


# finetune classify: TSV / CSV / JSONL readers
def finetune(task: str, tmp: Path, f: Folders, name: str, data: str | bytes, *extra) -> list:
    return ["finetune", task, "--model", f.base, "--train", write(tmp, name, data), "--out", tmp / "run",
            "--no-progress", *extra]


TSV = "sentence\tlabel\nanna lives in paris\tpos\nthe movie was bad\tneg\n"
simple_case("tsv-empty", lambda t, f: finetune("classify", t, f, "train.tsv", ""), "train.tsv", "empty")
simple_case("tsv-header-only", lambda t, f: finetune("classify", t, f, "train.tsv", "sentence\tlabel\n"),
            "train.tsv", "no examples")
simple_case("tsv-missing-column", lambda t, f: finetune("classify", t, f, "train.tsv", TSV + "only text\n"),
            "train.tsv:4", "expected 2 fields")
simple_case("tsv-extra-column", lambda t, f: finetune("classify", t, f, "train.tsv", TSV + "a\tpos\textra\n"),
            "train.tsv:4", "got 3")
simple_case("tsv-label-col-absent", lambda t, f: finetune("classify", t, f, "train.tsv", TSV, "--label-col", "gold"),
            "train.tsv", "no column 'gold'")
simple_case("tsv-text-col-absent", lambda t, f: finetune("classify", t, f, "train.tsv", TSV, "--text-cols", "7"),
            "train.tsv", "no column '7'")
simple_case("tsv-no-label-column", lambda t, f: finetune("classify", t, f, "train.tsv",
                                                         "sentence\tcomment\na\tb\n"), "train.tsv", "label")
simple_case("tsv-empty-label", lambda t, f: finetune("classify", t, f, "train.tsv", TSV + "anna\t \n"),
            "train.tsv:4", "label is empty")
simple_case("tsv-score-not-number", lambda t, f: finetune("classify", t, f, "train.tsv", TSV, "--task-type",
                                                          "regression"), "train.tsv:2", "number")
simple_case("tsv-nul-byte", lambda t, f: finetune("classify", t, f, "train.tsv", TSV + "an\x00na\tpos\n"),
            "train.tsv:4", "NUL")
simple_case("tsv-non-utf8", lambda t, f: finetune("classify", t, f, "train.tsv", TSV.encode() + b"caf\xe9\tpos\n"),
            "train.tsv:4", "UTF-8")
simple_case("tsv-mixed-endings-ragged", lambda t, f: finetune("classify", t, f, "train.tsv",
                                                              TSV.replace("\n", "\r\n", 1) + "x\ry\tpos\n"),
            "train.tsv:4", "expected 2 fields")
simple_case("tsv-unknown-eval-label", lambda t, f: finetune("classify", t, f, "train.tsv", TSV, "--eval", write(
    t, "dev.tsv", TSV + "anna\tneutral\n")), "dev.tsv:4", "'neutral'")
simple_case("csv-unclosed-quote", lambda t, f: finetune("classify", t, f, "train.csv",
                                                        'sentence,label\n"anna,pos\nb,neg\n'), "train.csv", "CSV")
simple_case("csv-form-feed-is-text", lambda t, f: finetune("classify", t, f, "train.csv",
                                                           "sentence,label\na\x0cb,pos\nc,d,e\n"),
            "train.csv:3", "expected 2 fields")
simple_case("jsonl-bad-line", lambda t, f: finetune("classify", t, f, "train.jsonl",
                                                    '{"text": "a", "label": "pos"}\n{"text": \n'),
            "train.jsonl:2", "JSON")
JSONL = '{"text": "a", "label": "pos"}\n'
simple_case("jsonl-not-object", lambda t, f: finetune("classify", t, f, "train.jsonl", JSONL + "[1]\n"),
            "train.jsonl:2", "object")
simple_case("jsonl-missing-key", lambda t, f: finetune("classify", t, f, "train.jsonl",
                                                       '{"text": "a", "label": "pos"}\n{"text": "b"}\n'),
            "train.jsonl:2", "label")
simple_case("jsonl-text-not-string", lambda t, f: finetune("classify", t, f, "train.jsonl",
                                                           JSONL + '{"text": 3, "label": "neg"}\n'),
            "train.jsonl:2", "string")
simple_case("jsonl-empty-text", lambda t, f: finetune("classify", t, f, "train.jsonl",
                                                      '{"text": "a", "label": "pos"}\n{"text": " ", "label": "neg"}\n'),
            "train.jsonl:2", "empty")
simple_case("tsv-empty-text", lambda t, f: finetune("classify", t, f, "train.tsv", TSV + " \tpos\n"),
            "train.tsv:4", "empty")

# finetune ner: CoNLL
CONLL = "-DOCSTART- O\n\nanna B-PER\nlives O\nin O\nparis B-LOC\n\n"
simple_case("conll-ragged-line", lambda t, f: finetune("ner", t, f, "train.conll", CONLL + "rome NNP B-LOC\n"),
            "train.conll:8", "expected 2 columns")
simple_case("conll-bad-tag", lambda t, f: finetune("ner", t, f, "train.conll", CONLL + "rome X-LOC\n"),
            "train.conll:8", "'X-LOC'")
simple_case("conll-empty", lambda t, f: finetune("ner", t, f, "train.conll", "-DOCSTART- O\n\n"),
            "train.conll", "no sentences")
simple_case("conll-tag-col-absent", lambda t, f: finetune("ner", t, f, "train.conll", CONLL, "--tag-col", "4"),
            "train.conll:3", "tag column 4")
simple_case("conll-nul", lambda t, f: finetune("ner", t, f, "train.conll", CONLL + "ro\x00me B-LOC\n"),
            "train.conll:8", "NUL")
simple_case("conll-cr-line-endings-ragged", lambda t, f: finetune("ner", t, f, "train.conll",
                                                                  "anna B-PER\rlives\rin O\r"),
            "train.conll:2", "expected 2 columns")
simple_case("conll-jsonl-unequal", lambda t, f: finetune("ner", t, f, "train.jsonl",
                                                         '{"tokens": ["a", "b"], "tags": ["O"]}\n'),
            "train.jsonl:1", "equal-length")


# finetune qa: SQuAD
def squad(qas: list, context: str = "anna lives in paris") -> str:
    return json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]})


def question(*answers: dict, **extra) -> dict:
    return {"id": "q1", "question": "where does anna live", "answers": list(answers)} | extra


simple_case("squad-answer-not-in-context", lambda t, f: finetune("qa", t, f, "train.json", squad(
    [question({"text": "rome", "answer_start": 14})])), "train.json", "question q1", "'rome'")
simple_case("squad-answer-start-not-int", lambda t, f: finetune("qa", t, f, "train.json", squad(
    [question({"text": "paris", "answer_start": "14"})])), "train.json", "question q1", "answer_start")
simple_case("squad-no-answers", lambda t, f: finetune("qa", t, f, "train.json", squad([question()])),
            "train.json", "question q1", "no answers")
simple_case("squad-not-json", lambda t, f: finetune("qa", t, f, "train.json", '{"data": [\n  {"title": x}]}'),
            "train.json:2", "JSON")
simple_case("squad-no-data", lambda t, f: finetune("qa", t, f, "train.json", '{"version": "1.1"}'),
            "train.json", "'data'")
simple_case("squad-article-not-object", lambda t, f: finetune("qa", t, f, "train.json", '{"data": [5]}'),
            "train.json", "article 0")
simple_case("squad-paragraph-no-context", lambda t, f: finetune("qa", t, f, "train.json", json.dumps(
    {"data": [{"title": "t", "paragraphs": [{"qas": []}]}]})), "train.json", "paragraph 0", "'context'")
simple_case("squad-question-not-object", lambda t, f: finetune("qa", t, f, "train.json", squad(["q"])),
            "train.json", "paragraph 0", "'id'")
simple_case("squad-empty-file", lambda t, f: finetune("qa", t, f, "train.json", "  \n"), "train.json", "empty")


# evaluate
def evaluate(task: str, tmp: Path, model: Path, name: str, data: str | bytes) -> list:
    return ["evaluate", task, "--model", model, "--data", write(tmp, name, data)]


simple_case("evaluate-unknown-label", lambda t, f: evaluate("classify", t, f.classify, "dev.tsv",
                                                            "sentence\tlabel\na\tpos\nb\tmaybe\n"),
            "dev.tsv:3", "'maybe'")
simple_case("evaluate-unknown-tag", lambda t, f: evaluate("ner", t, f.ner, "dev.conll", "anna B-PER\nx B-ORG\n"),
            "dev.conll:1", "'B-ORG'")
simple_case("evaluate-ragged-tsv", lambda t, f: evaluate("classify", t, f.classify, "dev.tsv",
                                                         "sentence\tlabel\na\tpos\tx\n"), "dev.tsv:2", "fields")
simple_case("evaluate-squad-offsets", lambda t, f: evaluate("qa", t, f.qa, "dev.json", squad(
    [question({"text": "berlin", "answer_start": 0})])), "dev.json", "'berlin'")


# tokenizer train and prepare: raw corpora
def tok_train(tmp: Path, name: str, data: str | bytes, *extra) -> list:
    return ["tokenizer", "train", "--corpus", write(tmp, name, data), "--out", tmp / "tok", "--vocab-size", "50",
            *extra]


simple_case("tokenizer-empty-corpus", lambda t, f: tok_train(t, "corpus.txt", "\n\n"), "corpus.txt", "no text")
simple_case("tokenizer-nul", lambda t, f: tok_train(t, "corpus.txt", "a b\nc\x00d\n"), "corpus.txt:2", "NUL")
simple_case("tokenizer-non-utf8", lambda t, f: tok_train(t, "corpus.txt", b"a b\n\n\xc3\x28\n"),
            "corpus.txt:3", "UTF-8")
simple_case("tokenizer-bad-gzip", lambda t, f: tok_train(t, "corpus.txt.gz", gzip.compress(b"a b c\n" * 200)[:20]),
            "corpus.txt.gz", "gzip")
simple_case("tokenizer-jsonl-no-text", lambda t, f: tok_train(t, "corpus.jsonl", '{"text": "a"}\n{"body": "b"}\n'),
            "corpus.jsonl:2", "text")
simple_case("tokenizer-empty-folder", lambda t, f: ["tokenizer", "train", "--corpus", (t / "empty").mkdir() or
                                                    t / "empty", "--out", t / "tok"], "empty", "no files")
simple_case("tokenizer-vocab-too-small", lambda t, f: tok_train(t, "corpus.txt", "a b c\n", "--vocab-size", "3"),
            "vocab_size=3")
simple_case("tokenizer-wiki-unclosed", lambda t, f: tok_train(t, "wiki_00", '<doc id="1" title="T">\nT\ntext\n'),
            "wiki_00", "never closed")


def prep(tmp: Path, f: Folders, name: str, data: str | bytes, tokenizer: Path | None = None) -> list:
    return ["prepare", "--corpus", write(tmp, name, data), "--tokenizer", tokenizer or f.base, "--out",
            tmp / "shards", "--workers", "1", "--holdout", "0"]


simple_case("prepare-nul", lambda t, f: prep(t, f, "c.txt", "anna lives\n\npar\x00is\n"), "c.txt:3", "NUL")
simple_case("prepare-empty", lambda t, f: prep(t, f, "c.txt", "\n \n"), "no text")
simple_case("prepare-missing-tokenizer", lambda t, f: prep(t, f, "c.txt", "anna\n", t / "no-tok"), "no-tok")
simple_case("prepare-corrupt-tokenizer-json", lambda t, f: prep(t, f, "c.txt", "anna\n", damaged_copy(
    f.base, t, truncate("tokenizer.json", 0.5))), "tokenizer.json", "not valid UTF-8 JSON")
simple_case("prepare-vocab-lacks-specials", lambda t, f: prep(
    t, f, "c.txt", "anna\n", write(t, "tok/vocab.txt", "a\nb\n").parent), "vocab.txt", "[PAD]")


# pretrain: YAML recipes
def recipe(tmp: Path, text: str | bytes, *extra) -> list:
    return ["pretrain", "--config", write(tmp, "recipe.yaml", text), "--out", tmp / "run", *extra]


simple_case("yaml-wrong-type-int", lambda t, f: recipe(t, "data: d\nmax_steps: ten\n"), "recipe.yaml", "max_steps",
            "int")
simple_case("yaml-wrong-type-list", lambda t, f: recipe(t, "data: d\nlr: [1]\n"), "recipe.yaml", "lr", "float")
simple_case("yaml-wrong-type-bool", lambda t, f: recipe(t, "data: d\nwhole_word: 3\n"), "recipe.yaml", "whole_word")
simple_case("yaml-unknown-key", lambda t, f: recipe(t, "data: d\nmax_stepz: 10\n"), "recipe.yaml", "'max_stepz'")
simple_case("yaml-unknown-nested-key", lambda t, f: recipe(t, "data: d\nmodel:\n  hidden_dropuot: 0.0\n"),
            "recipe.yaml", "hidden_dropuot")
simple_case("yaml-nested-wrong-type", lambda t, f: recipe(t, "data: d\nmodel:\n  hidden_dropout: high\n"),
            "recipe.yaml", "hidden_dropout")
simple_case("yaml-nested-pad-id-string", lambda t, f: recipe(t, "data: d\nmodel:\n  pad_token_id: zero\n"),
            "recipe.yaml", "pad_token_id")
simple_case("yaml-nested-eps-string", lambda t, f: recipe(t, "data: d\nmodel:\n  layer_norm_eps: tiny\n"),
            "recipe.yaml", "layer_norm_eps")
simple_case("yaml-nested-act-list", lambda t, f: recipe(t, "data: d\nmodel:\n  hidden_act: [gelu]\n"),
            "recipe.yaml", "hidden_act")
simple_case("yaml-model-not-mapping", lambda t, f: recipe(t, "data: d\nmodel: big\n"), "recipe.yaml", "model")
simple_case("yaml-not-mapping", lambda t, f: recipe(t, "- a\n- b\n"), "recipe.yaml", "mapping")
simple_case("yaml-syntax", lambda t, f: recipe(t, "data: d\nlr: [1\nseed: 2\n"), "recipe.yaml", "line")
simple_case("yaml-non-utf8", lambda t, f: recipe(t, b"data: caf\xe9\n"), "recipe.yaml", "UTF-8")
simple_case("yaml-nul", lambda t, f: recipe(t, b"data: d\x00\n"), "recipe.yaml")
simple_case("yaml-negative-steps", lambda t, f: recipe(t, "data: d\nmax_steps: -5\n"), "recipe.yaml", "max_steps")
simple_case("yaml-unknown-preset", lambda t, f: recipe(t, "data: d\npreset: bert-giant\n"), "recipe.yaml",
            "bert-giant")
simple_case("yaml-missing-file", lambda t, f: ["pretrain", "--config", t / "absent.yaml", "--out", t / "run"],
            "absent.yaml", "no such")
simple_case("yaml-set-without-equals", lambda t, f: recipe(t, "data: d\n", "--set", "max_steps"), "--set", "key=value")
simple_case("yaml-set-wrong-type", lambda t, f: recipe(t, "data: d\n", "--set", "batch_size=many"), "batch_size")
simple_case("yaml-data-missing", lambda t, f: recipe(t, "max_steps: 1\n"), "recipe.yaml", "data")
simple_case("pretrain-stop-at-zero", lambda t, f: recipe(t, "data: d\n", "--stop-at", "0"), "--stop-at", "1 or more")
XFAIL: dict[str, str] = {}  # case name -> why it is known to fail
simple_case("yaml-data-folder-absent", lambda t, f: recipe(t, f"data: {t / 'no-shards'}\nmax_steps: 1\n"),
            "no-shards")


@case("yaml-python-object-tag")
def _(tmp: Path, f: Folders) -> tuple[list, list[str]]:
    marker = tmp / "yaml-ran"
    text = f"data: d\nseed: !!python/object/apply:os.system [\"touch '{marker}'\"]\n"
    return recipe(tmp, text), ["recipe.yaml", "python/object"]


# checkpoints: info and export onnx
def info(folder: Path) -> list:
    return ["info", "--model", folder]


simple_case("ckpt-truncated", lambda t, f: info(damaged_copy(f.base, t, truncate("model.safetensors"))),
            "model.safetensors", "truncated")
simple_case("ckpt-garbage", lambda t, f: info(damaged_copy(f.base, t, lambda d: write(
    d, "model.safetensors", b"\xff" * 100))), "model.safetensors", "corrupted")
simple_case("ckpt-extra-tensor", lambda t, f: info(damaged_copy(f.base, t, edit_tensors(
    lambda s: s.update({"encoder.layer.0.extra.weight": torch.zeros(2)})))), "encoder.layer.0.extra.weight",
            "unexpected")
simple_case("ckpt-missing-tensor", lambda t, f: info(damaged_copy(f.base, t, edit_tensors(
    lambda s: s.pop("encoder.layer.1.output.dense.weight")))), "missing", "encoder.layer.1.output.dense.weight")
simple_case("ckpt-wrong-shape", lambda t, f: info(damaged_copy(f.base, t, edit_tensors(
    lambda s: s.update({"encoder.layer.0.intermediate.dense.weight": torch.zeros(36, 32)})))),
            "encoder.layer.0.intermediate.dense.weight (36, 32)", "(37, 32)")
simple_case("ckpt-no-weights", lambda t, f: info(damaged_copy(f.base, t, lambda d: (d / "model.safetensors").unlink())),
            "damaged", "no weights")
simple_case("ckpt-no-config", lambda t, f: info(damaged_copy(f.base, t, lambda d: (d / "config.json").unlink())),
            "damaged", "config.json")
simple_case("ckpt-config-unknown-key", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(rotary_base=10000)))), "config.json", "'rotary_base'")
simple_case("ckpt-config-not-object", lambda t, f: info(damaged_copy(f.base, t, edit_config(lambda c: [c]))),
            "config.json", "object")
simple_case("ckpt-config-not-json", lambda t, f: info(damaged_copy(f.base, t, truncate("config.json"))),
            "config.json", "JSON")
simple_case("ckpt-config-wrong-type", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(hidden_size="32")))), "config.json", "hidden_size")
simple_case("ckpt-config-pad-id-null", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(pad_token_id=None)))), "config.json", "pad_token_id")
simple_case("ckpt-config-eps-string", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(layer_norm_eps="small")))), "config.json", "layer_norm_eps")
simple_case("ckpt-config-id2label-list", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(id2label=["a", "b"])))), "config.json", "id2label")
simple_case("ckpt-config-id2label-bad-key", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(id2label={"first": "a"})))), "config.json", "id2label")
simple_case("ckpt-config-model-type-list", lambda t, f: info(damaged_copy(f.base, t, edit_config(
    lambda c: c.update(model_type=["bert"])))), "config.json", "model_type")
simple_case("ckpt-bin-garbage", lambda t, f: info(damaged_copy(f.base, t, lambda d: (
    (d / "model.safetensors").unlink(), write(d, "pytorch_model.bin", b"not a pickle")))), "pytorch_model.bin")
simple_case("ckpt-bad-shard-index", lambda t, f: info(damaged_copy(f.base, t, lambda d: (
    (d / "model.safetensors").unlink(), write(d, "model.safetensors.index.json", '{"weight_map": 3}')))),
            "model.safetensors.index.json")
simple_case("ckpt-shard-index-names-absent-file", lambda t, f: info(damaged_copy(f.base, t, lambda d: (
    (d / "model.safetensors").unlink(), write(d, "model.safetensors.index.json",
                                              '{"weight_map": {"a": "model-1.safetensors"}}')))),
            "model-1.safetensors")
simple_case("export-truncated", lambda t, f: ["export", "onnx", "--model", damaged_copy(
    f.base, t, truncate("model.safetensors")), "--out", t / "m"], "model.safetensors", "truncated")
simple_case("export-task-head-wrong-shape", lambda t, f: ["export", "onnx", "--model", damaged_copy(
    f.classify, t, edit_tensors(lambda s: s.update({"classifier.weight": torch.zeros(2, 31)}))), "--out", t / "m"],
            "classifier.weight", "(2, 31)")
simple_case("export-corrupt-task-json", lambda t, f: ["export", "onnx", "--model", damaged_copy(
    f.classify, t, lambda d: write(d, "task.json", "{")), "--out", t / "m"], "task.json", "JSON")


@case("ckpt-pickle-with-code")
def _(tmp: Path, f: Folders) -> tuple[list, list[str]]:
    marker = tmp / "pickle-ran"

    def plant(folder: Path) -> None:
        state = {k: v for k, v in load_file(folder / "model.safetensors").items()}
        state["embeddings.word_embeddings.weight"] = Payload(f"touch '{marker}'")
        torch.save(state, folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()

    return info(damaged_copy(f.base, tmp, plant)), ["pytorch_model.bin", "weights_only"]


class Payload:
    """Unpickling this runs a shell command: what a malicious pytorch_model.bin does."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=XFAIL[n], strict=True))
                                  if n in XFAIL else n for n in sorted(CASES)])
def test_bad_input_is_one_line_naming_the_fault(name: str, folders: Folders, tmp_path: Path, capsys) -> None:
    make, expected_code = CASES[name]
    argv, fragments = make(tmp_path, folders)
    code, err = run_cli(argv, capsys)
    assert "Traceback" not in err, err
    assert code == expected_code, err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), repr(err)
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not list(tmp_path.glob("*-ran")), "a planted payload ran"
    assert not (tmp_path / "out.npy").exists() and not (tmp_path / "run" / "model.safetensors").exists()


def test_the_planted_pickle_is_live(tmp_path: Path) -> None:
    """The payload of ckpt-pickle-with-code runs under an unrestricted unpickler (else that case could not fail)."""
    marker = tmp_path / "control-ran"
    torch.save({"w": Payload(f"touch '{marker}'")}, tmp_path / "control.bin")
    torch.load(tmp_path / "control.bin", weights_only=False)
    assert marker.exists()


# ---- accepted: mixed line endings, a BOM, texts far over the limit ------------------------------------------
def test_mixed_line_endings_and_bom_are_accepted(folders: Folders, tmp_path: Path, capsys) -> None:
    import numpy as np

    argv = embed(tmp_path, folders, "mixed.txt", "\ufeffanna lives\r\nin paris\rthe movie\nwas good\r\n".encode())
    code, err = run_cli(argv, capsys)
    assert code == 0, err
    assert np.load(tmp_path / "out.npy").shape == (4, 32)


def test_mixed_line_endings_read_the_same_in_every_reader(tmp_path: Path) -> None:
    unix = "sentence\tlabel\nanna lives\tpos\nthe movie\tneg\n"
    expected = [(e.texts, e.label) for e in readers.read_table(write(tmp_path, "u.tsv", unix))]
    for endings in ("\r\n", "\r"):
        got = readers.read_table(write(tmp_path, "m.tsv", unix.replace("\n", endings, 2)))
        assert [(e.texts, e.label) for e in got] == expected
        got = readers.read_table(write(tmp_path, "m.csv", unix.replace("\t", ",").replace("\n", endings, 2)))
        assert [(e.texts, e.label) for e in got] == expected
    conll = "anna B-PER\nlives O\n\nparis B-LOC\n"
    expected = [(s.words, s.tags) for s in readers.read_conll(write(tmp_path, "u.conll", conll))]
    for endings in ("\r\n", "\r"):
        got = readers.read_conll(write(tmp_path, "m.conll", conll.replace("\n", endings, 1)))
        assert [(s.words, s.tags) for s in got] == expected
    jsonl = '{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n'
    assert len(readers.read_jsonl(write(tmp_path, "m.jsonl", jsonl.replace("\n", "\r", 1)))) == 2


def test_texts_far_over_the_limit_are_truncated_not_refused(folders: Folders, tmp_path: Path, capsys) -> None:
    import numpy as np

    long_text = " ".join(WORDS * 2000)  # ~30k tokens against a 64-position model
    code, err = run_cli(embed(tmp_path, folders, "long.txt", f"short\n{long_text}\n"), capsys)
    assert code == 0 and "Traceback" not in err, err
    assert np.load(tmp_path / "out.npy").shape == (2, 32)
    code, err = run_cli(["classify", "--model", folders.classify, "--json", long_text, "anna"], capsys)
    assert code == 0 and "Traceback" not in err, err
    code, err = run_cli(["qa", "--model", folders.qa, "--json", "--question", "where", "--context", long_text[:5000]],
                        capsys)
    assert code == 0 and "Traceback" not in err, err


# ---- fuzzing: readers, tokenizer wrapper, pipeline input checks ----------------------------------------------
READERS = {"tsv": readers.read_table, "csv": readers.read_table, "jsonl": readers.read_jsonl,
           "conll": readers.read_conll, "json": readers.read_squad}
LINE_PIECES = st.sampled_from(["\t", ",", "\n", "\r\n", "\r", '"', "\x00", " ", "label", "sentence", "text", "O",
                               "B-PER", "I-LOC", "-DOCSTART-", "{", "}", '"text": ', '"label": ', "[", "]", "1", "x",
                               '{"data": [', '"paragraphs": ', '"context": ', '"qas": ', '"answers": ', "\ufeff",
                               "\x0c", "\u2028", "é"])
FUZZ_TEXT = st.one_of(st.lists(LINE_PIECES, max_size=40).map("".join), st.text(max_size=200))
FUZZ_BYTES = st.one_of(FUZZ_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=200))


@pytest.mark.parametrize("suffix", sorted(READERS))
@FUZZ
@given(data=FUZZ_BYTES)
def test_readers_parse_or_raise_input_error(tmp_path_factory, suffix: str, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / f"data.{suffix}"
    path.write_bytes(data)
    try:
        READERS[suffix](path)
    except (InputError, ConfigError) as err:
        assert str(path) in str(err), err


@FUZZ
@given(data=FUZZ_BYTES)
def test_squad_answers_fuzzed_in_structure(tmp_path_factory, data: bytes) -> None:
    """A well-formed SQuAD shell around fuzzed answers: offsets that do not match are re-found or refused."""
    text = data.decode("utf-8", "replace")
    answers = [{"text": text[:5], "answer_start": len(text) % 7 - 3}, {"text": text[3:9], "answer_start": 2}]
    path = tmp_path_factory.mktemp("fuzz") / "squad.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": text, "qas": [question(*answers)]}]}]}),
                    encoding="utf-8")
    try:
        (example,) = readers.read_squad(path)
    except InputError as err:
        assert "question q1" in str(err)
        return
    for answer in example.answers:
        assert text[answer.start:answer.start + len(answer.text)] == answer.text


UNICODE = st.text(alphabet=st.characters(codec="utf-8"), max_size=300)  # any code point but lone surrogates


@FUZZ
@given(text=UNICODE, pair=st.none() | UNICODE, max_length=st.integers(3, 80), repeat=st.integers(1, 50))
def test_tokenizer_encode_never_crashes(tokenizer: Tokenizer, text: str, pair: str | None, max_length: int,
                                        repeat: int) -> None:
    ids = tokenizer.encode(text * repeat, pair, max_length=max_length)
    assert len(ids) <= max_length
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert ids[0] == tokenizer.cls_id and ids[-1] == tokenizer.sep_id


@FUZZ
@given(texts=st.lists(UNICODE, min_size=1, max_size=5), pairs=st.booleans(), max_length=st.integers(3, 64))
def test_tokenizer_encode_batch_never_crashes(tokenizer: Tokenizer, texts: list[str], pairs: bool,
                                              max_length: int) -> None:
    batch = tokenizer.encode_batch(texts, texts[::-1] if pairs else None, max_length=max_length)
    assert batch.input_ids.shape[0] == len(texts) and batch.input_ids.shape[1] <= max_length
    assert int(batch.input_ids.min()) >= 0 and int(batch.input_ids.max()) < tokenizer.vocab_size
    assert batch.attention_mask.shape == batch.input_ids.shape == batch.token_type_ids.shape


PY_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | UNICODE,
                         lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                             st.sampled_from(["question", "context", "text", "x"]), inner, max_size=3), max_leaves=8)


@pytest.fixture(scope="module")
def pipelines(folders: Folders) -> dict:
    from encoderlab.infer.pipelines import pipeline

    return {task: pipeline(task, getattr(folders, attr), batch_size=4) for task, attr in
            (("fill-mask", "mlm"), ("embed", "base"), ("classify", "classify"), ("ner", "ner"), ("qa", "qa"))}


@pytest.mark.parametrize("task", ["fill-mask", "embed", "classify", "ner", "qa"])
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(value=PY_VALUES)
def test_pipelines_return_results_or_input_error(pipelines: dict, task: str, value) -> None:
    try:
        results = pipelines[task](value)
    except InputError:
        return
    assert isinstance(results, list) and results


# ---- no configuration is ever executed as code -----------------------------------------------------------------
UNSAFE = {
    "eval(": re.compile(r"(?<![\w.])eval\("),
    "exec(": re.compile(r"(?<![\w.])exec\("),
    "yaml.load without SafeLoader": re.compile(r"yaml\.(load|load_all|unsafe_load|full_load)\((?![^)]*SafeLoader)"),
    "pickle.load": re.compile(r"\b(c?pickle|dill|joblib|marshal|shelve)\.(load|loads|open)\b"),
    "torch.load without weights_only=True": re.compile(r"torch\.load\((?![^)]*weights_only=True)"),
    "numpy allow_pickle=True": re.compile(r"allow_pickle\s*=\s*True"),
    "__import__ / compile(": re.compile(r"(?<![\w.])(__import__|compile)\("),
}


@pytest.mark.parametrize("line", ["eval(text)", "exec(code, {})", "yaml.load(f, Loader=yaml.Loader)",
                                  "yaml.unsafe_load(f)", "pickle.load(f)", "torch.load(path)",
                                  "torch.load(path, weights_only=False)", "np.load(p, allow_pickle=True)"])
def test_the_scan_catches_each_unsafe_call(line: str) -> None:
    assert any(pattern.search(line) for pattern in UNSAFE.values())


@pytest.mark.parametrize("line", ["yaml.safe_load(text)", "torch.load(p, map_location='cpu', weights_only=True)",
                                  "re.compile(r'x')", "model.eval()", "torch.compile(model)"])
def test_the_scan_passes_safe_calls(line: str) -> None:
    assert not any(pattern.search(line) for pattern in UNSAFE.values())


def test_no_code_path_executes_configuration_as_code() -> None:
    found = []
    for path in sorted((ROOT / "src" / "encoderlab").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            found += [f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()}"
                      for what, pattern in UNSAFE.items() if pattern.search(code)]
    assert not found, "\n".join(found)
