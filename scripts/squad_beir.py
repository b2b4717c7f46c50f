"""Write SQuAD v1.1 (part A by default) as a BEIR retrieval folder (Thakur et al. 2021, arXiv:2104.08663): each
question's relevant document is the paragraph it was written about, searched among every paragraph of every article.

    python scripts/squad_beir.py --out runs/squad-beir
    encoderlab evaluate retrieval --model minilm --data runs/squad-beir            # the held-out articles' questions

    OUT/corpus.jsonl     every unique paragraph: {"_id": "p<article>_<paragraph>", "title": article title, "text"}
    OUT/queries.jsonl    every question: {"_id": SQuAD's question id, "text"}
    OUT/qrels/test.tsv   query-id, corpus-id, score 1 (BEIR's header line first): the questions of the held-out
                         articles of bench/rerank.py (title SHA-1 in the last third), never trained on there
    OUT/qrels/train.tsv  the same for the other articles' questions (what bench/rerank.py trains its reranker on)

One corpus for both splits, as BEIR's MS MARCO and NQ folders have: a held-out question must find its paragraph among
all of them, the training articles' paragraphs included. A paragraph that occurs twice is one document."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rerank import SQUAD, held_out  # noqa: E402  (the one rule that splits the articles)

from encoderlab.io import atomic_write_text, check_out_folder  # noqa: E402


def squad_to_beir(squad: Path, out: Path) -> dict[str, int]:
    """Write the BEIR folder; the counts of documents, queries and judgements per split."""
    corpus: dict[str, dict] = {}
    by_text: dict[str, str] = {}
    queries: list[dict] = []
    qrels: dict[str, list[str]] = {"test": [], "train": []}
    for a, article in enumerate(json.loads(squad.read_text(encoding="utf-8"))["data"]):
        split = "test" if held_out(article["title"]) else "train"
        for p, paragraph in enumerate(article["paragraphs"]):
            text = paragraph["context"]
            doc = by_text.setdefault(text, f"p{a:02d}_{p:03d}")
            corpus.setdefault(doc, {"_id": doc, "title": article["title"].replace("_", " "), "text": text})
            for qa in paragraph["qas"]:
                queries.append({"_id": qa["id"], "text": qa["question"]})
                qrels[split].append(f"{qa['id']}\t{doc}\t1")
    jsonl = lambda rows: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # noqa: E731
    atomic_write_text(out / "corpus.jsonl", jsonl(corpus.values()))
    atomic_write_text(out / "queries.jsonl", jsonl(queries))
    for split, lines in qrels.items():
        atomic_write_text(out / "qrels" / f"{split}.tsv", "query-id\tcorpus-id\tscore\n" + "\n".join(lines) + "\n")
    return {"documents": len(corpus), "queries": len(queries), "test": len(qrels["test"]),
            "train": len(qrels["train"])}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--out", required=True, type=Path, help="the BEIR folder to write")
    cli.add_argument("--squad", type=Path, default=SQUAD, help=f"a SQuAD v1.1 JSON file (default: {SQUAD})")
    cli.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    args = cli.parse_args()
    check_out_folder(args.out, args.overwrite)
    counts = squad_to_beir(args.squad, args.out)
    print(f"wrote {args.out}: {counts['documents']} paragraphs, {counts['queries']} questions; qrels/test.tsv "
          f"{counts['test']} (held-out articles), qrels/train.tsv {counts['train']}")


if __name__ == "__main__":
    main()
