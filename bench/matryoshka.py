"""Matryoshka embeddings: how much of a sentence vector's quality its first 256, 128 or 64 dimensions keep, fine-tuned
plainly and with `--matryoshka 384,256,128,64` (Kusupati et al. 2022, arXiv:2205.13147).

minilm (all-MiniLM-L6-v2, 384 wide) is fine-tuned twice on the same STS-B training pairs with the cosent loss, the same
recipe and seed: once plainly, once with the loss summed over the vectors cut to 384, 256, 128 and 64 dimensions. Each
model, and minilm untouched, is scored by the Spearman correlation of its cosines with the gold scores on STS-B dev
(GLUE's STS-B test split has no public scores, so dev is the held-out set here), with the vectors cut to each width
and normalised again: what `encoderlab embed --dimensions N` gives. The goal (issue 36): the Matryoshka model's 128
dimensions within 2 Spearman points of its full 384.

    python bench/matryoshka.py            # 1 epoch on 1,000 of STS-B's 5,749 training pairs, 1,000 of 1,500 dev pairs
    python bench/matryoshka.py --train 5749 --dev 1500 --epochs 4   # all of STS-B, sentence-transformers' 4 epochs
    python bench/matryoshka.py --quick    # 256 training and 300 dev pairs: that it runs, not a measurement
    python bench/matryoshka.py --smoke    # a tiny random model (32 wide: 32,16,8,4) on synthetic pairs (make test)

The default subsets (fixed random ones) are what fits about half an hour on a busy 2-core CPU, where a step of 16
pairs takes seconds. Data: ../shared/data/stsb/{train,dev}.tsv (GLUE's STS-B: sentence1, sentence2, score).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import goal, parser, size, smoke_data, tiny_model, training_precision, write_results  # noqa: E402

from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.cards import EmbedOptions  # noqa: E402
from encoderlab.tasks.finetune import FinetuneJob, Reading, finetune, subsample  # noqa: E402
from encoderlab.tasks.metrics import correlation_metrics  # noqa: E402
from encoderlab.tasks.objective import TrainOptions  # noqa: E402
from encoderlab.tasks.spec import task_spec  # noqa: E402

STSB = Path(__file__).resolve().parents[2] / "shared" / "data" / "stsb"
SIZES = {"full": (1000, 1000), "quick": (256, 300), "smoke": (32, 16)}  # (training pairs, dev pairs)
DIMS = {"minilm": (384, 256, 128, 64), "smoke": (32, 16, 8, 4)}  # the full width first


def spearman_by_width(model: str, dev: list, dims: tuple[int, ...]) -> dict[str, float]:
    """Spearman (points) of the cosines of each dev pair with its gold score, the vectors cut to each width."""
    embedder = pipeline("embed", model, normalize=False, batch_size=64)
    first, second = (torch.from_numpy(embedder.embed([e.texts[c] for e in dev])) for c in (0, 1))
    gold = [e.label for e in dev]
    # Cutting the full vectors once equals embedding again with --dimensions d (the pipeline cuts, then
    # normalises; test_matryoshka checks that), at a quarter of the forward passes.
    return {str(d): round(100 * correlation_metrics(gold, (F.normalize(first[:, :d], dim=-1) * F.normalize(
        second[:, :d], dim=-1)).sum(-1).tolist())["spearman"], 2) for d in dims}


def train(model: str, data: Path, out: Path, dims: tuple[int, ...] | None, pairs: int, epochs: float) -> dict:
    """Fine-tune `model` with cosent (with the Matryoshka prefixes `dims`, if given); its time and steps."""
    options = TrainOptions(lr=2e-5, epochs=epochs, batch_size=16, precision=training_precision(), progress=False)
    start = time.perf_counter()
    result = finetune(FinetuneJob("embed", model, str(data / "train.tsv"), out, options, max_train=pairs,
                                  head=EmbedOptions(loss="cosent", matryoshka=dims), keep_state=False))
    return {"seconds": round(time.perf_counter() - start, 1), "steps": result["steps"],
            "train_pairs": result["train_examples"]}


def main() -> None:
    cli = parser(__doc__, "256 training and 300 dev pairs: that it runs, not a measurement")
    cli.add_argument("--train", type=int, default=None, metavar="N", help="training pairs (default: 1,000 of 5,749)")
    cli.add_argument("--dev", type=int, default=None, metavar="N", help="dev pairs scored (default: 1,000 of 1,500)")
    cli.add_argument("--epochs", type=float, default=1.0, metavar="E", help="passes over them (default: 1)")
    args = cli.parse_args()
    mode = size(args)
    pairs, dev_pairs = args.train or SIZES[mode][0], args.dev or SIZES[mode][1]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if mode == "smoke":
            model, data, dims = str(tiny_model(folder / "tiny")), smoke_data(folder / "data") / "stsb", DIMS["smoke"]
        elif not (STSB / "train.tsv").is_file() or not (STSB / "dev.tsv").is_file():
            raise SystemExit(f"{STSB}/train.tsv or dev.tsv is absent: this bench needs GLUE's STS-B "
                             f"(run --smoke for the synthetic check)")
        else:
            model, data, dims = "minilm", STSB, DIMS["minilm"]
        dev = subsample(task_spec("embed").read(str(data / "dev.tsv"), Reading(), {}, EmbedOptions()), dev_pairs)
        figures = {"model": model, "loss": "cosent", "epochs": args.epochs, "batch_size": 16, "lr": 2e-5,
                   "dimensions": list(dims), "dev_pairs": len(dev), "note": "Spearman x 100 on STS-B dev (GLUE's "
                   "test split has no public scores); vectors cut to each width, then normalised",
                   "spearman": {"untouched": spearman_by_width(model, dev, dims)}}
        for name, prefixes in (("plain", None), ("matryoshka", dims)):
            figures[name] = train(model, data, folder / name, prefixes, pairs, args.epochs)
            figures["spearman"][name] = spearman_by_width(str(folder / name), dev, dims)
    full, mid = str(dims[0]), str(dims[2])
    scores = figures["spearman"]
    goals = [goal(f"Matryoshka model: Spearman at {mid} dimensions minus at {full} (points)",
                  scores["matryoshka"][mid] - scores["matryoshka"][full], -2.0)]
    path = write_results(args, "matryoshka", figures, goals)
    for name, row in scores.items():
        print(f"{name:<11}" + "  ".join(f"{d}: {s:6.2f}" for d, s in row.items()))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
