"""Multi-label classification on real data: which kinds of named entity a CoNLL-2003 sentence mentions.

Each sentence of CoNLL-2003 gets the set of entity types its tags name (PER, LOC, ORG, MISC; "none" when it has no
entity): a real multi-label set, since a sentence often names a person and a place. minilm (all-MiniLM-L6-v2) is
fine-tuned with `finetune classify --task-type multilabel` (a sigmoid and binary cross-entropy per class) on training
sentences and scored on the validation file by micro and macro F1 and subset accuracy. The reference beside it is
the classic multi-label baseline, one logistic regression per class over TF-IDF word and character n-grams
(scikit-learn's OneVsRestClassifier), trained and scored on the same sentences. The goal: the fine-tuned encoder's
micro F1 above the baseline's.

    python bench/multilabel.py            # 4,000 of 14,041 training sentences, 3 epochs; 2,000 validation sentences
    python bench/multilabel.py --quick    # 300 and 200: that it runs, not a measurement
    python bench/multilabel.py --smoke    # a tiny random model on synthetic CoNLL files (make test)

Data: ../shared/data/conll2003/{train,valid}.txt.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import make_pipeline, make_union

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import goal, parser, size, smoke_data, tiny_model, training_precision, write_results  # noqa: E402

from encoderlab.cards import ClassifyOptions  # noqa: E402
from encoderlab.tasks.finetune import EvaluateJob, FinetuneJob, evaluate, finetune, subsample  # noqa: E402
from encoderlab.tasks.multilabel import multilabel_metrics  # noqa: E402
from encoderlab.tasks.objective import TrainOptions  # noqa: E402
from encoderlab.tasks.readers import read_conll  # noqa: E402

CONLL = Path(__file__).resolve().parents[2] / "shared" / "data" / "conll2003"
SIZES = {"full": (4000, 2000), "quick": (300, 200), "smoke": (32, 16)}  # (training sentences, validation sentences)
LR = {"full": 5e-5, "quick": 5e-5, "smoke": 1e-3}
EPOCHS = {"full": 3.0, "quick": 1.0, "smoke": 1.0}  # BERT's fine-tuning default (Devlin et al. 2019, A.3)
NONE = "none"


def entity_sets(path: Path, count: int) -> list[tuple[str, list[str]]]:
    """(sentence, its entity types, or [none]) for `count` sentences of a CoNLL file (a fixed random subset)."""
    rows = []
    for sentence in read_conll(path):
        kinds = sorted({tag[2:] for tag in sentence.tags if tag != "O"})
        rows.append((" ".join(sentence.words), kinds or [NONE]))
    return subsample(rows, count)


def table(path: Path, rows: list[tuple[str, list[str]]]) -> Path:
    """A text/labels TSV, the labels of a row joined by "|"."""
    path.write_text("text\tlabels\n" + "".join(f"{' '.join(t.split())}\t{'|'.join(k)}\n" for t, k in rows),
                    encoding="utf-8")
    return path


def baseline(train: list[tuple[str, list[str]]], test: list[tuple[str, list[str]]], classes: list[str]) -> dict:
    """One logistic regression per class over TF-IDF word 1-2-grams and character 2-5-grams: its metrics."""
    def matrix(rows):
        return np.array([[int(c in kinds) for c in classes] for _, kinds in rows])

    features = make_union(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=False),
                          TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, lowercase=False))
    model = make_pipeline(features, OneVsRestClassifier(LogisticRegression(C=10.0, max_iter=2000)))
    model.fit([t for t, _ in train], matrix(train))
    return multilabel_metrics(matrix(test), model.predict([t for t, _ in test]))


def main() -> None:
    cli = parser(__doc__, "300 training and 200 validation sentences: that it runs, not a measurement")
    args = cli.parse_args()
    mode = size(args)
    train_count, test_count = SIZES[mode]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if mode == "smoke":
            model, data = str(tiny_model(folder / "tiny")), smoke_data(folder / "data") / "conll2003"
        elif not (CONLL / "train.txt").is_file() or not (CONLL / "valid.txt").is_file():
            raise SystemExit(f"{CONLL}/train.txt or valid.txt is absent: this bench needs CoNLL-2003 "
                             f"(run --smoke for the synthetic check)")
        else:
            model, data = "minilm", CONLL
        train, test = entity_sets(data / "train.txt", train_count), entity_sets(data / "valid.txt", test_count)
        classes = sorted({k for _, kinds in train for k in kinds})
        start = time.perf_counter()
        reference = baseline(train, test, classes)
        baseline_seconds = time.perf_counter() - start
        options = TrainOptions(lr=LR[mode], epochs=EPOCHS[mode], batch_size=16, precision=training_precision(),
                               progress=mode == "full")
        start = time.perf_counter()
        result = finetune(FinetuneJob("classify", model, str(table(folder / "train.tsv", train)), folder / "run",
                                      options, max_length=64, keep_state=False,
                                      head=ClassifyOptions(task_type="multilabel")))
        train_seconds = time.perf_counter() - start
        ours = evaluate(EvaluateJob("classify", str(folder / "run"), str(table(folder / "test.tsv", test)),
                                    max_length=64))["metrics"]
    figures = {"model": model, "classes": classes, "train_sentences": len(train), "test_sentences": len(test),
               "label_cardinality": round(sum(len(k) for _, k in test) / len(test), 3),
               "lr": LR[mode], "epochs": EPOCHS[mode], "batch_size": 16, "max_length": 64, "steps": result["steps"],
               "encoderlab": {k: round(v, 4) for k, v in ours.items()},
               "tfidf_logistic_regression": {k: round(v, 4) for k, v in reference.items()},
               "seconds": {"finetune": round(train_seconds, 1), "baseline": round(baseline_seconds, 1)}}
    goals = [goal("fine-tuned micro F1 minus the TF-IDF baseline's, on the same validation sentences (points)",
                  100 * (ours["micro_f1"] - reference["micro_f1"]), 0.0)]
    path = write_results(args, "multilabel", figures, goals)
    print(f"micro F1: encoderlab {ours['micro_f1']:.4f}, TF-IDF + logistic regression {reference['micro_f1']:.4f} "
          f"({len(test)} validation sentences); wrote {path}")


if __name__ == "__main__":
    main()
