"""Readers of fine-tuning data: GLUE TSV/CSV, JSONL, CoNLL (tag schemes), SQuAD v1.1/v2.0, and their refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import shared_file

from encoderlab import io
from encoderlab.errors import InputError
from encoderlab.tasks.readers import read_conll, read_squad, read_table, read_texts, to_iob2


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.write_bytes(text.encode(encoding))
    return path


# ---- tables ------------------------------------------------------------------------------------------------
def test_tsv_with_bom_pairs_and_string_labels(tmp_path):
    path = write(tmp_path / "mnli.tsv", "\ufeffindex\tsentence1\tsentence2\tgold_label\n"
                                        "0\tA man eats.\tSomeone eats.\tentailment\n"
                                        "1\tA dog runs.\tA cat sleeps.\tcontradiction\n")
    examples = read_table(path)
    assert [e.texts for e in examples] == [("A man eats.", "Someone eats."), ("A dog runs.", "A cat sleeps.")]
    assert [e.label for e in examples] == ["entailment", "contradiction"]
    assert examples[1].where == f"{path}:3"


def test_tsv_keeps_glue_quotes_but_unquotes_writer_quoting(tmp_path):
    # GLUE keeps a quoted sentence's quotes as text; a pandas-style field ("" inside, or a tab) is unquoted.
    path = write(tmp_path / "q.tsv", 'sentence\tlabel\n"Would you like to?"\t1\n"He said ""hi"""\t0\n'
                                     '"a\tb"\t1\n')
    assert [e.texts[0] for e in read_table(path)] == ['"Would you like to?"', 'He said "hi"', "a\tb"]


def test_csv_quoted_commas_and_newlines(tmp_path):
    path = write(tmp_path / "d.csv", 'text,label\n"hello, world",pos\n"two\nlines",neg\nplain,pos\n')
    examples = read_table(path)
    assert [e.texts[0] for e in examples] == ["hello, world", "two\nlines", "plain"]
    assert [e.where.rsplit(":", 1)[1] for e in examples] == ["2", "3", "5"]


def test_malformed_row_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.tsv", "sentence\tlabel\ngood one\t1\nmissing a label\n")
    with pytest.raises(InputError, match=r"bad\.tsv:3: expected 2 fields"):
        read_table(path)


def test_malformed_csv_quote_names_line(tmp_path):
    path = write(tmp_path / "bad.csv", 'text,label\nfine,1\n"broken" quote,0\n')
    with pytest.raises(InputError, match=r"bad\.csv:3: malformed CSV"):
        read_table(path)


def test_non_utf8_names_the_line(tmp_path):
    path = write(tmp_path / "latin.tsv", "sentence\tlabel\ncafé\t1\n", encoding="latin-1")
    with pytest.raises(InputError, match=r"latin\.tsv:2: not valid UTF-8"):
        read_table(path)


def test_regression_scores_and_bad_score(tmp_path):
    path = write(tmp_path / "sts.tsv", "sentence1\tsentence2\tscore\na\tb\t4.250\n")
    assert read_table(path, regression=True)[0].label == 4.25
    write(path, "sentence1\tsentence2\tscore\na\tb\thigh\n")
    with pytest.raises(InputError, match=r"sts\.tsv:2: expected a number"):
        read_table(path, regression=True)


def test_headerless_columns_by_index(tmp_path):
    path = write(tmp_path / "cola.tsv", "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n")
    examples = read_table(path, text_cols=["3"], label_col="1", header=False)
    assert [(e.texts, e.label) for e in examples] == [(("Our friends won't buy this.",), "1"),
                                                      (("They drank the pub.",), "0")]


SEMEVAL = ("main-captions\tMSRvid\t2012test\t0001\t5.000\tA plane is taking off.\tAn air plane is taking off.\n"
           "main-news\tdeft-news\t2014\t0002\t1.250\tA man, a plan.\tA canal, Panama.\tnone\tnone\n"
           "main-forums\tanswers\t2015\t0003\t3.800\t\"Quoted\" text\tMore text\tsource\n")


def test_trailing_fields_read_by_named_columns_with_one_warning(tmp_path, caplog):
    path = write(tmp_path / "sts-dev.csv", SEMEVAL)  # the SemEval STS benchmark: tab-separated despite .csv
    with caplog.at_level("WARNING"):
        examples = read_table(path, text_cols=["5", "6"], label_col="4", regression=True, header=False)
    assert [(e.texts, e.label) for e in examples] == [
        (("A plane is taking off.", "An air plane is taking off."), 5.0), (("A man, a plan.", "A canal, Panama."), 1.25),
        (('"Quoted" text', "More text"), 3.8)]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: 2 of 3 rows have other than 7 fields; read by the named columns, other fields ignored"]
    detected = write(tmp_path / "glue.tsv", "sentence1\tsentence2\tscore\na\tb\t1.0\tc\n")
    with pytest.raises(InputError, match=r"glue\.tsv:2: expected 3 fields"):  # columns detected, not named: strict
        read_table(detected, regression=True)
    write(path, SEMEVAL + "main\tx\t2015\t0004\t2.0\tonly one sentence\n")  # a named column missing: refused
    with pytest.raises(InputError, match=r"sts-dev\.csv:4: expected 7 fields"):
        read_table(path, text_cols=["5", "6"], label_col="4", regression=True, header=False)


COLA = "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThey drank.\ngj04\t1\t\tGo.\n"


def test_first_row_of_data_taken_as_header_is_refused(tmp_path):
    path = write(tmp_path / "cola.tsv", COLA)
    with pytest.raises(InputError, match=r"cola\.tsv:1: the first row looks like data \(its label '1' is one of "
                                         r"the labels of the other rows\).*pass --no-header"):
        read_table(path, text_cols=["3"], label_col="1")
    assert len(read_table(path, text_cols=["3"], label_col="1", header=False)) == 3
    with pytest.raises(InputError, match=r"cannot tell which column holds the label .*the first row looks like "
                                         r"data \('1' is a number\): if the file has no header, pass --no-header"):
        read_table(path)
    scores = write(tmp_path / "sts.tsv", "a\tb\t4.5\nc d\te\t3.0\n")  # a score in the label cell
    with pytest.raises(InputError, match=r"sts\.tsv:1: the first row looks like data \(its label '4\.5' is a score"):
        read_table(scores, text_cols=["0", "1"], label_col="2", regression=True)
    header = write(tmp_path / "named.tsv", "text\tclass\nfine film\t1\nbad film\t0\n")  # a real header is fine
    assert len(read_table(header, text_cols=["0"], label_col="1")) == 2


def test_folder_of_class_folders(tmp_path, caplog):
    for label, texts in (("pos", ["A fine film.", "Great<br />fun"]), ("neg", ["Dull.\n"]), ("unsup", ["?"])):
        (tmp_path / label).mkdir()
        for i, text in enumerate(texts):
            write(tmp_path / label / f"{i}_7.txt", text)
    (tmp_path / "urls_pos.txt").write_text("http://x\n")
    examples = read_texts(tmp_path, classes=["neg", "pos"])
    assert [(e.texts, e.label) for e in examples] == [(("Dull.",), "neg"), (("A fine film.",), "pos"),
                                                      (("Great<br />fun",), "pos")]
    assert {e.label for e in read_texts(tmp_path)} == {"neg", "pos", "unsup"}
    with pytest.raises(InputError, match=r"no \.txt files in other \(subfolders with \.txt files: neg, pos, unsup\)"):
        read_texts(tmp_path, classes=["neg", "other"])


def test_progress_off_a_terminal_writes_lines_not_carriage_returns(capsys, monkeypatch):
    monkeypatch.setattr(io, "LOG_INTERVAL", 0.0)
    with io.progress_bar(total=3, desc="train") as bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    lines = err.splitlines()
    assert len(lines) >= 2 and lines[-1].startswith("train: 100%")


def test_undetectable_columns_ask_for_options(tmp_path):
    path = write(tmp_path / "x.tsv", "a\tb\tc\tlabel\n1\t2\t3\t0\n")
    with pytest.raises(InputError, match="--text-cols"):
        read_table(path)
    with pytest.raises(InputError, match="no column 'nope'"):
        read_table(path, text_cols=["nope"])


def test_empty_label_is_an_error(tmp_path):
    path = write(tmp_path / "x.tsv", "sentence\tlabel\nfine\t\n")
    with pytest.raises(InputError, match=r"x\.tsv:2: the label is empty"):
        read_table(path)


def test_jsonl(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"premise": "p1", "hypothesis": "h1", "label": 2}\n\n'
                                       '{"premise": "p2", "hypothesis": "h2", "label": 0}\n{"premise": "p3"}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:4: missing key\(s\) hypothesis, label"):
        read_texts(path)
    write(path, '{"premise": "p1", "hypothesis": "h1", "label": 2}\n{oops\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: not valid JSON"):
        read_texts(path)
    write(path, '{"premise": "p1", "hypothesis": "h1", "label": 2}\n')
    assert read_texts(path)[0].texts == ("p1", "h1") and read_texts(path)[0].label == "2"


def test_real_sst2_and_stsb_read_whole():
    sst2 = read_texts(shared_file("sst2/dev.tsv"))
    assert len(sst2) == 872 and {e.label for e in sst2} == {"0", "1"}
    sts = read_texts(shared_file("stsb/dev.tsv"), regression=True)
    assert len(sts) == 1500 and all(len(e.texts) == 2 and 0 <= e.label <= 5 for e in sts)


# ---- CoNLL ----------------------------------------------------------------------------------------------------
CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP {eu}
rejects VBZ B-VP O
German JJ B-NP {german}
call NN I-NP O

Peter NNP B-NP {p1}
Blackburn NNP I-NP {p2}
"""


@pytest.mark.parametrize("scheme, tags", [
    ("iob2", {"eu": "B-ORG", "german": "B-MISC", "p1": "B-PER", "p2": "I-PER"}),
    ("iob1", {"eu": "I-ORG", "german": "I-MISC", "p1": "I-PER", "p2": "I-PER"}),
    ("bioes", {"eu": "S-ORG", "german": "S-MISC", "p1": "B-PER", "p2": "E-PER"}),
])
def test_conll_schemes_become_iob2(tmp_path, scheme, tags):
    path = write(tmp_path / f"{scheme}.txt", CONLL.format(**tags))
    sentences = read_conll(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]]
    assert [s.tags for s in sentences] == [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"]]
    assert sentences[1].where == f"{path}:8"


def test_iob1_adjacent_entities_and_type_change():
    assert to_iob2(["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-ORG"], "x") == \
        ["B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-ORG"]


def test_conll_bad_tag_and_ragged_columns(tmp_path):
    path = write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects VBZ X-ORG\n")
    with pytest.raises(InputError, match=r"bad\.txt:2: expected 4 columns"):
        read_conll(path)
    write(path, "EU NNP B-NP B-ORG\nrejects VBZ B-VP Q-ORG\n")
    with pytest.raises(InputError, match="bad.txt:1: tag 'Q-ORG'"):
        read_conll(path)


def test_conll_tag_column_option(tmp_path):
    path = write(tmp_path / "two.txt", "EU B-ORG x\nsays O y\n")
    assert read_conll(path, tag_col=1)[0].tags == ["B-ORG", "O"]


def test_real_conll_valid():
    sentences = read_conll(shared_file("conll2003/valid.txt"))
    assert len(sentences) == 3250
    assert sum(tag.startswith("B-") for s in sentences for tag in s.tags) == 5942  # entities in CoNLL-2003 dev


# ---- SQuAD ----------------------------------------------------------------------------------------------------
def squad(version: str, qas: list[dict]) -> dict:
    return {"version": version, "data": [{"title": "T", "paragraphs": [
        {"context": "The cat sat on the mat in Paris.", "qas": qas}]}]}


def test_squad_v1_and_v2(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(squad("2.0", [
        {"id": "q1", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 26}]},
        {"id": "q2", "question": "Who owns it?", "answers": [], "is_impossible": True,
         "plausible_answers": [{"text": "cat", "answer_start": 4}]},
    ])))
    first, second = read_squad(path)
    assert (first.id, first.answers[0].text, first.answers[0].start, first.is_impossible) == ("q1", "Paris", 26, False)
    assert second.is_impossible and second.answers == []


def test_squad_offsets_repaired_or_refused(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(squad("1.1", [{"id": "q1", "question": "What?",
                                              "answers": [{"text": "mat", "answer_start": 17}]}])))
    assert read_squad(path)[0].answers[0].start == 19  # off by two, re-found nearby
    path.write_text(json.dumps(squad("1.1", [{"id": "q9", "question": "What?",
                                              "answers": [{"text": "dog", "answer_start": 4}]}])))
    with pytest.raises(InputError, match="question q9: answer 'dog' does not occur"):
        read_squad(path)
    path.write_text('{"data": [\n  {"title": oops}]}')
    with pytest.raises(InputError, match=r"s\.json:2: not valid JSON"):
        read_squad(path)
