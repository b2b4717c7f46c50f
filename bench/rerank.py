"""Reranking: a cross-encoder fine-tuned with `finetune rerank` against the bi-encoder `similarity` on SQuAD questions.

Each SQuAD question was written about one paragraph of a Wikipedia article; the task is to find that paragraph among
all the paragraphs of its article (about 43 on average in part A). The bi-encoder (minilm's sentence vectors,
cosine) ranks them all; the cross-encoder, minilm's encoder under a new one-logit head fine-tuned on other articles'
questions, re-orders the bi-encoder's top 10, as a retrieve-then-rerank system does (MRR@10 and nDCG@10 look no
further). Both are scored by MRR@10, nDCG@10 and hit@1 on the same held-out questions.

Each training question comes with its paragraph and 3 wrong paragraphs drawn from the bi-encoder's top 10 (the hard
negatives a reranker meets), so `finetune rerank` trains listwise (a softmax over the question's 4 paragraphs, as
Gao et al. 2021 train rerankers on a retriever's results). 100 other questions of the training articles are the
dev set that picks the best checkpoint; the held-out articles are never seen before the final scoring.

    python bench/rerank.py            # 1,600 training questions of 23 articles, 1 epoch, 400 held out (about 1 h)
    python bench/rerank.py --save runs/rerank-1   # ... and keep the cross-encoder
    python bench/rerank.py --init runs/rerank-1 --save runs/rerank-2   # 1 more epoch on the next 1,600 questions
    python bench/rerank.py --train-questions 1000 --save DIR   # a shortened run: the first 1,000 of the 1,600
    python bench/rerank.py --quick    # 32 / 16 from 2 articles each: that it runs, not a measurement
    python bench/rerank.py --smoke    # a tiny random model on synthetic articles (make test)

Held-out questions come from the articles whose title's SHA-1 falls in the last third, so no article gives both
training and held-out questions. Data: ../shared/data/squad_v1.1/dev-v1.1.part-a.json.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import goal, parser, size, tiny_model, training_precision, write_results  # noqa: E402

from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.tasks.finetune import EvaluateJob, FinetuneJob, evaluate, finetune  # noqa: E402
from encoderlab.tasks.objective import TrainOptions  # noqa: E402
from encoderlab.tasks.rerank import ranking_metrics  # noqa: E402

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad_v1.1" / "dev-v1.1.part-a.json"
# questions to train on, to pick the checkpoint with and to hold out, the bi-encoder's top passages reranked, tokens
# per pair, and the most training and held-out articles they come from
SIZES = {"full": (1600, 100, 400, 10, 256, (None, None)), "quick": (32, 8, 16, 5, 128, (2, 2)),
         "smoke": (24, 6, 12, 4, 32, (None, None))}
LR = {"full": 5e-5, "quick": 5e-5, "smoke": 1e-3}  # the top of BERT's fine-tuning grid (Devlin et al. 2019, A.3)
EPOCHS = {"full": 1.0, "quick": 1.0, "smoke": 1.0}
EVAL_EVERY = {"full": 100, "quick": 0, "smoke": 0}  # steps between dev scorings (0: at the end only)
SAVE_EVERY = 25  # --save: steps between saves of the training state (about 4 minutes of CPU training)
HARD = 3  # negatives per training question, drawn from the bi-encoder's top 10 without its paragraph
BATCH = 4  # questions per step: 16 (question, paragraph) pairs


def articles_of_squad() -> list[tuple[str, list[str], list[tuple[str, int]]]]:
    """(title, paragraphs, [(question, index of its paragraph)]) per article."""
    out = []
    for article in json.loads(SQUAD.read_text(encoding="utf-8"))["data"]:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        questions = [(q["question"], i) for i, p in enumerate(article["paragraphs"]) for q in p["qas"]]
        out.append((article["title"], paragraphs, questions))
    return out


def synthetic_articles() -> list[tuple[str, list[str], list[tuple[str, int]]]]:
    """Made-up articles whose questions name a word of their paragraph, for --smoke."""
    rng = random.Random(0)
    words = "river city music war king church school bridge island market".split()
    out = []
    for a in range(9):
        keys = rng.sample(words, 4)
        paragraphs = [f"this part is about the {k} and more . " * 2 for k in keys]
        out.append((f"article {a}", paragraphs, [(f"what about the {k} ? {q}", i) for i, k in enumerate(keys)
                                                 for q in range(3)]))
    return out


def held_out(title: str) -> bool:
    """The last third of the titles by SHA-1: held-out articles."""
    return int(hashlib.sha1(title.encode()).hexdigest(), 16) % 3 == 2


def bi_encoder_rankings(embed, articles, picked) -> list[list[int]]:
    """For each (article, question, gold) picked: the article's paragraph indices by cosine to the question."""
    vectors = {a: torch.tensor(embed(articles[a][1])) for a in {a for a, _, _ in picked}}
    questions = torch.tensor(embed([q for _, q, _ in picked]))
    out = []
    for (a, _, _), q in zip(picked, questions):
        cosines = torch.nn.functional.cosine_similarity(vectors[a], q[None], dim=-1)
        out.append(cosines.argsort(descending=True).tolist())
    return out


def pairs_file(path: Path, rows: list[tuple[str, str, int]]) -> Path:
    """A query/passage/label TSV (tabs and newlines inside texts become spaces)."""
    clean = [(" ".join(q.split()), " ".join(p.split()), y) for q, p, y in rows]
    path.write_text("query\tpassage\tlabel\n" + "".join(f"{q}\t{p}\t{y}\n" for q, p, y in clean), encoding="utf-8")
    return path


def pick(articles, held: bool, count: int, rng: random.Random, most: int | None) -> list[tuple[int, str, int]]:
    """`count` (article index, question, gold paragraph) of the held-out (or the training) articles (the first
    `most` of them: every paragraph of an article is embedded, the bulk of a small run's time)."""
    chosen = [a for a, (title, _, _) in enumerate(articles) if held_out(title) == held][:most]
    pool = [(a, q, gold) for a in chosen for q, gold in articles[a][2]]
    return rng.sample(pool, min(count, len(pool)))


def main() -> None:
    cli = parser(__doc__, "32 training and 16 held-out questions from 2 articles each: that it runs, not a measurement")
    cli.add_argument("--init", metavar="FOLDER", help="continue from this cross-encoder (a folder --save wrote) on the "
                     "next training questions, none of those of the first run; results in rerank_continued.json")
    cli.add_argument("--save", metavar="FOLDER", help="keep the fine-tuned cross-encoder in FOLDER")
    cli.add_argument("--train-questions", type=int, metavar="N", help="train on N questions instead of the size's "
                     "count (a shortened run where an hour is not available; the dev and held-out sets stay)")
    args = cli.parse_args()
    mode = size(args)
    train_count, dev_count, held_count, top, max_length, most = SIZES[mode]
    if args.train_questions is not None and not 0 < args.train_questions <= train_count:
        raise SystemExit(f"--train-questions: expected 1 to {train_count}, got {args.train_questions}")
    if mode != "smoke" and not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} is absent: this bench needs SQuAD (run --smoke for the synthetic check)")
    articles = synthetic_articles() if mode == "smoke" else articles_of_squad()
    rng = random.Random(0)
    training = pick(articles, False, train_count + dev_count, rng, most[0])
    training, dev = training[:train_count][:args.train_questions], training[train_count:]
    testing = pick(articles, True, held_count, rng, most[1])
    if args.init:  # the same dev and held-out questions; training questions the first run did not see
        seen = set(training + dev)
        training = [x for x in pick(articles, False, len(articles) * 10**4, rng, most[0]) if x not in seen][:train_count]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        base = str(tiny_model(folder / "tiny")) if mode == "smoke" else "minilm"
        model = args.init or base  # where the cross-encoder starts
        embed = pipeline("embed", base, batch_size=64)
        as_vectors = lambda texts: [r["embedding"] for r in embed(texts)]  # noqa: E731
        start = time.perf_counter()
        test_ranks = bi_encoder_rankings(as_vectors, articles, testing)
        bi_seconds = time.perf_counter() - start
        bi = ranking_metrics([[float(i == gold) for i in ranked] for (_, _, gold), ranked in zip(testing, test_ranks)])
        train_ranks = bi_encoder_rankings(as_vectors, articles, training)
        rows = []
        for (a, q, gold), ranked in zip(training, train_ranks):
            paragraphs = articles[a][1]
            rows.append((q, paragraphs[gold], 1))
            wrong = [i for i in ranked[:top] if i != gold]
            rows += [(q, paragraphs[i], 0) for i in rng.sample(wrong, min(HARD, len(wrong)))]
        train = pairs_file(folder / "train.tsv", rows)
        # dev and held-out: the bi-encoder's top `top` of each question, in its order, for the cross-encoder to re-order
        reranked = lambda picked, ranks: [(q, articles[a][1][i], int(i == gold))  # noqa: E731
                                          for (a, q, gold), ranked in zip(picked, ranks) for i in ranked[:top]]
        dev_file = pairs_file(folder / "dev.tsv", reranked(dev, bi_encoder_rankings(as_vectors, articles, dev)))
        test = pairs_file(folder / "test.tsv", reranked(testing, test_ranks))
        # --save: trained in FOLDER itself, its state saved every SAVE_EVERY steps, so a run cut off (a session's
        # end, a kill) continues there when the same command runs again: the data above is the same (seeded)
        out = Path(args.save) if args.save else folder / "cross"
        options = TrainOptions(lr=LR[mode], epochs=EPOCHS[mode], batch_size=BATCH, eval_every=EVAL_EVERY[mode],
                               save_every=SAVE_EVERY if args.save else 0, precision=training_precision(),
                               progress=mode == "full")
        start = time.perf_counter()
        summary = finetune(FinetuneJob("rerank", model, str(train), out, options, eval=str(dev_file),
                                       max_length=max_length, keep_state=bool(args.save),
                                       resume=(out / "checkpoints" / "latest").exists()))
        train_seconds = time.perf_counter() - start
        start = time.perf_counter()
        cross = evaluate(EvaluateJob("rerank", str(out), str(test), max_length=max_length))["metrics"]
        rerank_seconds = time.perf_counter() - start
    recall = sum(gold in ranked[:top] for (_, _, gold), ranked in zip(testing, test_ranks)) / len(testing)
    figures = {"model": base, "cross_encoder_starts_from": args.init or f"{base}'s encoder under a new one-logit head",
               "lr": LR[mode], "epochs": EPOCHS[mode], "loss": "listwise",
               "questions_per_step": BATCH, "hard_negatives_from_the_bi_encoder_top": HARD,
               "train_questions": len(training), "train_pairs": len(rows), "dev_questions": len(dev),
               "dev_mrr_at_10_by_step": {row["step"]: round(row["eval_mrr_at_10"], 4) for row in summary["history"]
                                         if "eval_mrr_at_10" in row},
               "best_step": summary["best"].get("step"),
               "train_articles": len({a for a, _, _ in training}), "held_out_articles": len({a for a, _, _ in testing}),
               "held_out_questions": len(testing), "reranked_top": top, "max_length": max_length,
               "mean_paragraphs_per_article": round(sum(len(p) for _, p, _ in articles) / len(articles), 1),
               "bi_encoder_recall_at_top": round(recall, 4),
               "bi_encoder": {k: round(v, 4) for k, v in bi.items()},
               "cross_encoder": {k: round(v, 4) for k, v in cross.items() if k != "queries"},
               "seconds": {"bi_encoder_ranking": round(bi_seconds, 1), "cross_encoder_training": round(train_seconds, 1),
                           "cross_encoder_reranking": round(rerank_seconds, 1)}}
    goals = [goal("cross-encoder MRR@10 minus the bi-encoder's, on the same held-out questions (points)",
                  100 * (cross["mrr_at_10"] - bi["mrr_at_10"]), 0.0)]
    path = write_results(args, "rerank_continued" if args.init else "rerank", figures, goals)
    print(f"MRR@10: bi-encoder {bi['mrr_at_10']:.4f}, cross-encoder reranking its top {top} "
          f"{cross['mrr_at_10']:.4f} ({len(testing)} held-out questions); wrote {path}")


if __name__ == "__main__":
    main()
