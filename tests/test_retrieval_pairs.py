"""scripts/retrieval_pairs.py: SQuAD training questions with hard negatives mined by a bi-encoder (never a held-out
article, never a paragraph holding the answer), Wikipedia pairs by independent cropping and the inverse cloze task,
the same file for the same seed, a file the `finetune embed` reader takes, and bad input refused with one line."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from test_retrieval import tiny_folder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))

import retrieval_pairs  # noqa: E402
from ann import WIKIPEDIA  # noqa: E402
from rerank import SQUAD, held_out  # noqa: E402

from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.tasks.readers import read_texts  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py
WORDS = "river city music war king church school bridge island market tower harbour garden castle".split()


def rows(path: Path) -> list[list[str]]:
    """The data rows of a written TSV, after checking its header."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "query\tpositive\tnegative"
    return [line.split("\t") for line in lines[1:]]


def titles() -> tuple[list[str], list[str]]:
    """Three training and two held-out article titles by held_out()'s rule."""
    names = [f"Article_{i}" for i in range(40)]
    return [t for t in names if not held_out(t)][:3], [t for t in names if held_out(t)][:2]


def write_squad(path: Path) -> Path:
    """Five articles of four paragraphs, two questions each; each answer is the paragraph's own word, and the fourth
    paragraph holds the first one's answer too (a false negative the miner must skip)."""
    train, held = titles()
    data = []
    for a, title in enumerate(train + held):
        paragraphs = []
        for p in range(4):
            word = WORDS[(a * 4 + p) % len(WORDS)]
            also = f" and a {WORDS[a * 4 % len(WORDS)]}" if p == 3 else ""  # paragraph 3 holds paragraph 0's answer too
            context = f"The {word} of {title} number {p} stands near the water{also} and the road ."
            qas = [{"id": f"{title}-{p}-{q}", "question": f"Where is the {word} of {title} {q}?",
                    "answers": [{"text": word, "answer_start": context.index(word)}]} for q in range(2)]
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": title, "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def write_wikipedia(folder: Path) -> Path:
    """Two WikiExtractor files of three articles, each of two 120-word paragraphs of 10-word sentences."""
    for n in range(2):
        (folder / "AA").mkdir(parents=True, exist_ok=True)
        with gzip.open(folder / "AA" / f"wiki_0{n}.gz", "wt", encoding="utf-8") as handle:
            for d in range(3):
                ident = n * 3 + d
                paragraph = " ".join(f"Sentence {s} of article {ident} has {' '.join(WORDS[:5])}." for s in range(12))
                handle.write(f'<doc id="{ident}" url="https://example.org/?curid={ident}" title="Doc {ident}">\n'
                             f"Doc {ident}\n\n{paragraph}\n{paragraph}\n</doc>\n")
    return folder


@pytest.fixture(scope="module")
def miner(tmp_path_factory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("miner"))


@pytest.fixture(scope="module")
def squad(tmp_path_factory) -> Path:
    return write_squad(tmp_path_factory.mktemp("squad") / "squad.json")


@pytest.fixture(scope="module")
def wikipedia(tmp_path_factory) -> Path:
    return write_wikipedia(tmp_path_factory.mktemp("wiki"))


def test_squad_rows_are_training_questions_with_the_best_eligible_negatives(squad, miner, tmp_path) -> None:
    out = tmp_path / "train.tsv"
    assert retrieval_pairs.main(["squad", "--squad", str(squad), "--miner", str(miner), "--negatives", "2",
                                 "--out", str(out)]) == 0
    written = rows(out)
    train, held = titles()
    assert len(written) == 3 * 4 * 2 * 2  # 3 articles x 4 paragraphs x 2 questions x 2 negatives
    assert not any(f"{t} " in field for row in written for field in row for t in held)  # nothing held out
    data = json.loads(squad.read_text())["data"]
    paragraphs = [f"{a['title'].replace('_', ' ')} {p['context']}" for a in data if a["title"] in train
                  for p in a["paragraphs"]]
    answers = {qa["question"]: qa["answers"][0]["text"] for a in data for p in a["paragraphs"] for qa in p["qas"]}
    # the ranking recomputed: the embed pipeline's cosines over the same texts, answer-holding paragraphs skipped
    embedder = pipeline("embed", str(miner))
    vectors = embedder.embed(paragraphs, normalize=True)
    for i in range(0, len(written), 2):
        question, positive = written[i][:2]
        assert positive in paragraphs and answers[question] in positive
        cosines = vectors @ embedder.embed([question], normalize=True)[0]
        eligible = sorted((j for j, p in enumerate(paragraphs) if answers[question] not in p.split()),
                          key=lambda j: -cosines[j])
        assert [written[i][2], written[i + 1][2]] == [paragraphs[j] for j in eligible[:2]]
    skipped = [row for row in written if row[1].startswith(f"{train[0].replace('_', ' ')} The {WORDS[0]} ")]
    assert skipped and not any(f" a {WORDS[0]} " in row[2] for row in skipped)
    examples = read_texts(out, need_label=False)  # the reader `finetune embed --train` uses
    assert [e.texts for e in examples] == [tuple(row) for row in written]


def test_squad_without_negatives_is_pairs_the_embed_reader_takes(squad, tmp_path) -> None:
    out = tmp_path / "pairs.tsv"
    assert retrieval_pairs.main(["squad", "--squad", str(squad), "--negatives", "0", "--out", str(out)]) == 0
    assert {len(e.texts) for e in read_texts(out, need_label=False)} == {2}
    assert len(rows(out)) == 3 * 4 * 2


@pytest.mark.parametrize("method", ["crop", "ict"])
def test_wikipedia_pairs_follow_their_recipe_and_the_seed(wikipedia, tmp_path, method: str) -> None:
    paths = [tmp_path / f"{seed}-{n}.tsv" for seed, n in ((0, 0), (0, 1), (1, 0))]
    for path, seed in zip(paths, (0, 0, 1)):
        assert retrieval_pairs.main(["wikipedia", "--wikipedia", str(wikipedia), "--method", method, "--pairs", "8",
                                     "--seed", str(seed), "--out", str(path)]) == 0
    assert paths[0].read_bytes() == paths[1].read_bytes() != paths[2].read_bytes()
    written = rows(paths[0])
    assert len(written) == 8 and all(row[2] == "" for row in written)
    texts = [" ".join(line for line in gzip.open(f, "rt").read().split("\n") if len(line.split()) >= 8)
             for f in sorted(wikipedia.glob("AA/*.gz"))]
    inside = lambda span: any(span in text for text in texts)  # noqa: E731
    for query, positive, _ in written:
        assert inside(query) and len(query.split()) <= (50 if method == "crop" else 11)
        if method == "crop":  # two spans of 10-50% of a passage (50-100 words), each a run of its words
            assert inside(positive) and 5 <= len(positive.split()) <= 50
        else:  # the rest of the passage: 50-100 words less one sentence
            assert 39 <= len(positive.split()) <= 100
    if method == "ict":  # removed from its passage 90% of the time: over 8 pairs, at least once
        assert any(query not in positive for query, positive, _ in written)
    assert {len(e.texts) for e in read_texts(paths[0], need_label=False)} == {2}


def test_refusals_exit_2_with_one_line_and_write_nothing(squad, wikipedia, tmp_path, capsys) -> None:
    taken = tmp_path / "taken.tsv"
    taken.write_text("mine\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"title": "Article_0"}]}')
    cases = [(["wikipedia", "--wikipedia", str(wikipedia), "--out", str(taken)], "--overwrite"),
             (["wikipedia", "--wikipedia", str(wikipedia), "--pairs", "0", "--out", str(tmp_path / "a.tsv")],
              "--pairs 0"),
             (["wikipedia", "--wikipedia", str(tmp_path), "--out", str(tmp_path / "b.tsv")], "wiki_*.gz"),
             (["squad", "--squad", str(bad), "--out", str(tmp_path / "c.tsv")], "lacks"),
             (["squad", "--squad", str(squad), "--negatives", "-1", "--out", str(tmp_path / "d.tsv")], "--negatives")]
    for argv, words in cases:
        assert retrieval_pairs.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert taken.read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "taken.tsv"]


def test_partial_negatives_are_refused_by_the_reader(tmp_path) -> None:
    path = tmp_path / "mixed.tsv"
    path.write_text("query\tpositive\tnegative\nq one\tp one\tn one\nq two\tp two\t\n")
    with pytest.raises(Exception, match=r"mixed.tsv:3: .*negative.* every row, or on none"):
        read_texts(path, need_label=False)


def test_real_data_keeps_held_out_articles_out(tmp_path) -> None:
    if not SQUAD.is_file() or not any(WIKIPEDIA.glob("*/wiki_*.gz")):
        pytest.skip(f"real data absent: {SQUAD} and {WIKIPEDIA}/*/wiki_*.gz (../shared/data)")
    out = tmp_path / "squad.tsv"
    assert retrieval_pairs.main(["squad", "--negatives", "0", "--out", str(out)]) == 0
    data = json.loads(SQUAD.read_text(encoding="utf-8"))["data"]
    held = {qa["question"] for a in data if held_out(a["title"]) for p in a["paragraphs"] for qa in p["qas"]}
    trained = {qa["question"] for a in data if not held_out(a["title"]) for p in a["paragraphs"] for qa in p["qas"]}
    questions = [row[0] for row in rows(out)]
    assert len(questions) > 4000 and not (set(questions) & (held - trained))
    wiki = tmp_path / "crop.tsv"
    assert retrieval_pairs.main(["wikipedia", "--pairs", "50", "--out", str(wiki)]) == 0
    assert len(rows(wiki)) == 50


def test_an_answer_counts_as_whole_words_only() -> None:
    holds = retrieval_pairs.answer_pattern(["L", "Super Bowl L", "."])
    assert holds.search("It was called Super Bowl L.") and holds.search("the letter l here")
    assert not holds.search("Lisbon and Lyon") and retrieval_pairs.answer_pattern([".", " "]) is None
