"""Long documents: IMDB reviews classified whole in sliding windows (--stride) against plain truncation.

IMDB's reviews average 230 words and run to about 2,500, far past a 128-token window. The same model (minilm), recipe
and seed are fine-tuned twice on the same reviews with --max-length 128: once truncated (the first 128 tokens, as
before), once read whole in windows sharing --stride tokens, each window trained with its review's label and
predictions averaging the windows' logits. Both are scored on the same held-out reviews, and separately on those
longer than the window, where the two can differ.

    python bench/long_documents.py               # 4,000 reviews to train, 2,000 held out (about 20 min on 1 core)
    python bench/long_documents.py --train 300 --held-out 200   # a smaller run
    python bench/long_documents.py --quick       # 64 / 48: that it runs, not a measurement
    python bench/long_documents.py --smoke       # a tiny random model on synthetic long texts (make test)

The held-out reviews are those whose id hashes into the last fifth (SHA-1), so no review is in both parts; the
reviews of each part are a fixed random subset. Data: ../shared/data/imdb/train.tsv (`id rating label text`).
"""

from __future__ import annotations

import csv
import hashlib
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import goal, parser, size, tiny_model, training_precision, write_results  # noqa: E402

from encoderlab.cards import ClassifyOptions  # noqa: E402
from encoderlab.tasks.finetune import EvaluateJob, FinetuneJob, Reading, evaluate, finetune  # noqa: E402
from encoderlab.tasks.objective import TrainOptions  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402

IMDB = Path(__file__).resolve().parents[2] / "shared" / "data" / "imdb" / "train.tsv"
SIZES = {"full": (4000, 2000), "quick": (64, 48), "smoke": (24, 12)}
WINDOW, STRIDE = 128, 32


def imdb_split(train: int, held_out: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(text, label) of `train` reviews and of `held_out` others, chosen by the SHA-1 of their id."""
    parts: dict[bool, list[tuple[str, str]]] = {False: [], True: []}
    with IMDB.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE):
            last_fifth = int(hashlib.sha1(row["id"].encode()).hexdigest(), 16) % 5 == 4
            parts[last_fifth].append((row["text"].replace("<br />", " "), row["label"]))
    rng = random.Random(0)
    return rng.sample(parts[False], train), rng.sample(parts[True], held_out)


def synthetic(train: int, held_out: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Long made-up reviews whose label word sits anywhere in them, for --smoke."""
    rng = random.Random(0)
    filler = "the a movie film was is very quite plot acting story and but it of".split()

    def review(i: int) -> tuple[str, str]:
        words = rng.choices(filler, k=rng.randint(20, 300))
        words.insert(rng.randrange(len(words)), "great" if i % 2 else "awful")
        return " ".join(words), "pos" if i % 2 else "neg"

    return [review(i) for i in range(train)], [review(i) for i in range(held_out)]


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text\tlabel\n" + "".join(f"{text}\t{label}\n" for text, label in rows), encoding="utf-8")
    return path


def run(model: str, folder: Path, train: Path, test: Path, stride: int | None, epochs: float,
        precision: str) -> dict:
    """Fine-tune one way (truncated, or windows with `stride`) and score the held-out reviews."""
    out = folder / ("windows" if stride else "truncated")
    options = TrainOptions(lr=5e-5, epochs=epochs, batch_size=32, precision=precision, progress=False)
    start = time.perf_counter()
    trained = finetune(FinetuneJob("classify", model, str(train), out, options, head=ClassifyOptions(stride=stride),
                                   max_length=WINDOW))
    scored = evaluate(EvaluateJob("classify", str(out), str(test), Reading(), precision=precision))
    return {"accuracy": scored["metrics"]["accuracy"], "train_features": trained["train_features"],
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    cli = parser(__doc__, "64 training and 48 held-out reviews: that it runs, not a measurement")
    cli.add_argument("--train", type=int, default=None, metavar="N", help="training reviews (default: 4,000)")
    cli.add_argument("--held-out", type=int, default=None, metavar="N", help="held-out reviews (default: 2,000)")
    args = cli.parse_args()
    mode = size(args)
    sizes = (args.train or SIZES[mode][0], args.held_out or SIZES[mode][1])
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if mode == "smoke":
            model, (train_rows, test_rows) = str(tiny_model(folder / "tiny")), synthetic(*sizes)
        elif not IMDB.is_file():
            raise SystemExit(f"{IMDB} is absent: this bench needs IMDB (run --smoke for the synthetic check)")
        else:
            model, (train_rows, test_rows) = "minilm", imdb_split(*sizes)
        train, test = write_tsv(folder / "train.tsv", train_rows), write_tsv(folder / "test.tsv", test_rows)
        tokenizer = Tokenizer.from_pretrained(model)
        long_rows = [row for row in test_rows if len(tokenizer.encode(row[0], truncation=False)) > WINDOW]
        test_long = write_tsv(folder / "test-long.tsv", long_rows or test_rows[:1])
        figures = {"model": model, "window": WINDOW, "stride": STRIDE, "train_reviews": len(train_rows),
                   "held_out_reviews": len(test_rows), "held_out_longer_than_window": len(long_rows)}
        for name, stride in (("truncated", None), ("windows", STRIDE)):
            figures[name] = run(model, folder, train, test, stride, 1.0, training_precision())
            figures[name]["accuracy_on_long"] = evaluate(EvaluateJob(
                "classify", str(folder / name), str(test_long), Reading()))["metrics"]["accuracy"]
    gain = figures["windows"]["accuracy"] - figures["truncated"]["accuracy"]
    goals = [goal("held-out accuracy, windows minus truncation (points)", 100 * gain, 0.0),
             goal("held-out accuracy on reviews longer than the window, windows minus truncation (points)",
                  100 * (figures["windows"]["accuracy_on_long"] - figures["truncated"]["accuracy_on_long"]), 0.0)]
    path = write_results(args, "long_documents", figures, goals)
    print(f"truncated {figures['truncated']['accuracy']:.4f}, windows {figures['windows']['accuracy']:.4f} "
          f"({len(long_rows)} of {len(test_rows)} held-out reviews are longer than {WINDOW} tokens); wrote {path}")


if __name__ == "__main__":
    main()
