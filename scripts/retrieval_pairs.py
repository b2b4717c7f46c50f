"""Write retrieval training data: a TSV with the header `query<TAB>positive<TAB>negative`, the file `finetune embed`,
`finetune colbert` and `finetune splade` read with --train.

    python scripts/retrieval_pairs.py squad --out runs/squad-train.tsv            # 1 mined hard negative a question
    python scripts/retrieval_pairs.py squad --out F --negatives 3 --miner DIR     # 3 rows a question, another miner
    python scripts/retrieval_pairs.py wikipedia --out runs/crop.tsv --pairs 10000               # independent cropping
    python scripts/retrieval_pairs.py wikipedia --out runs/ict.tsv --method ict --pairs 10000   # inverse cloze task

squad: the questions of the TRAINING articles of SQuAD v1.1 part A (bench/rerank.py's held_out() rule, the split of
scripts/squad_beir.py: no held-out article's question or paragraph is written), each with its paragraph as the
positive (`title + " " + paragraph`, the text `index` encodes) and hard negatives mined with a bi-encoder: the
training paragraphs it ranks highest for the question, skipping the positive and any paragraph that contains one of
the question's answers as whole words (case-insensitive), since such a paragraph likely answers it too (the false
negatives among a retriever's top results that RocketQA, Qu et al. 2021, arXiv:2010.08191, section 3.2, found and
denoised). One row per (question, negative), as sentence-transformers' mine_hard_negatives writes with
output_format="triplet"; the negative column is empty with --negatives 0. A question left with no eligible
paragraph is left out (counted in the closing line).

wikipedia: unsupervised pairs from the 100-word passages bench/ann.py cuts from ../shared/data/wikipedia, the articles
in file order, one pair a passage, the negative column empty:
- crop (default): independent cropping, Contriever (Izacard et al. 2021, arXiv:2112.09118, section 3.1): two spans
  drawn independently, each 10-50% of the passage's words, one as the query and one as the positive;
- ict: the inverse cloze task (Lee et al. 2019, arXiv:1906.00300, section 4): one sentence of the passage as the
  query, the passage as the positive, the sentence removed from it 90% of the time (kept 10%, so the model also
  learns word matching).
The same --seed gives the same file. Tabs and newlines inside a text become spaces.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ann import WIKIPEDIA, articles, cut  # noqa: E402  (the passages bench/ann.py indexes)
from rerank import SQUAD, held_out  # noqa: E402  (the one rule that splits the articles)

from encoderlab.errors import EncoderlabError, InputError  # noqa: E402
from encoderlab.io import atomic_write  # noqa: E402

HEADER = ("query", "positive", "negative")
CROP = (0.1, 0.5)  # Contriever's span length, a fraction of the passage (arXiv:2112.09118, section 3.1)
ICT_REMOVE = 0.9  # how often ICT removes the query sentence from its passage (arXiv:1906.00300, section 4)
Row = tuple[str, str, str]


def clean(text: str) -> str:
    """One TSV field: tabs and newlines become spaces."""
    return " ".join(text.split())


def squad_questions(squad: Path) -> tuple[list[str], list[tuple[str, int, list[str]]]]:
    """The training articles' paragraphs (title + text) and their questions (question, paragraph index, answers)."""
    try:
        data = json.loads(squad.read_text(encoding="utf-8"))["data"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise InputError(f"--squad {squad}: expected a SQuAD v1.1 JSON file with a 'data' list ({err})") from err
    paragraphs: list[str] = []
    questions = []
    for number, article in enumerate(data):
        try:
            add_article(article, paragraphs, questions)
        except (KeyError, TypeError, AttributeError) as err:
            raise InputError(f"--squad {squad}: article {number} lacks {err} (expected SQuAD v1.1's title, "
                             f"paragraphs, context, qas, question and answers)") from err
    if not questions:
        raise InputError(f"--squad {squad}: no question of a training article (all held out?)")
    return paragraphs, questions


def add_article(article: dict, paragraphs: list[str], questions: list[tuple[str, int, list[str]]]) -> None:
    """Append a training article's paragraphs and questions; a held-out article adds nothing."""
    if held_out(article["title"]):
        return  # the held-out articles' questions are what bench/late_sparse.py scores on
    title = article["title"].replace("_", " ")  # as scripts/squad_beir.py writes the title
    for paragraph in article["paragraphs"]:
        paragraphs.append(f"{title} {paragraph['context']}")
        questions += [(qa["question"], len(paragraphs) - 1, [a["text"] for a in qa["answers"]])
                      for qa in paragraph["qas"]]


def answer_pattern(answers: list[str]) -> re.Pattern | None:
    """Any of the answers as whole words, case-insensitive ("L" matches "Super Bowl L", not "Lisbon"); None when no
    answer holds a letter or digit."""
    texts = sorted({a.strip() for a in answers if any(c.isalnum() for c in a)}, key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, texts)) + r")(?!\w)", re.IGNORECASE) if texts else None


def mine(miner: str, paragraphs: list[str], questions: list[tuple[str, int, list[str]]], negatives: int,
         dropped: list[str]) -> Iterator[Row]:
    """(question, positive, negative) rows: each question's `negatives` best-ranked paragraphs by the bi-encoder's
    cosine that are neither its paragraph nor hold one of its answers; a question left with none is appended to
    `dropped` (a file has a negative on every row or on none)."""
    if negatives == 0:
        yield from ((clean(q), clean(paragraphs[p]), "") for q, p, _ in questions)
        return
    import torch  # the miner's weights: only squad needs torch

    from encoderlab.infer.pipelines import pipeline

    embedder = pipeline("embed", miner)
    documents = torch.from_numpy(embedder.embed(paragraphs, normalize=True))  # (P, D)
    for start in range(0, len(questions), 256):
        batch = questions[start:start + 256]
        asked = torch.from_numpy(embedder.embed([q for q, _, _ in batch], normalize=True))  # (B, D)
        for (question, gold, answers), order in zip(batch, (asked @ documents.T).argsort(dim=1, descending=True)):
            holds = answer_pattern(answers)
            picked = [int(i) for i in order if paragraphs[int(i)] != paragraphs[gold]  # a duplicate is the positive
                      and not (holds and holds.search(paragraphs[int(i)]))][:negatives]
            if not picked:
                dropped.append(question)
            for negative in picked:
                yield clean(question), clean(paragraphs[gold]), clean(paragraphs[negative])


def crop(words: list[str], rng: random.Random) -> str:
    """A random span of 10-50% of `words` (at least one word)."""
    length = max(1, round(len(words) * rng.uniform(*CROP)))
    start = rng.randrange(len(words) - length + 1)
    return " ".join(words[start:start + length])


def sentences(passage: str) -> list[str]:
    """The passage split after each '. ' (the period kept)."""
    parts = passage.split(". ")
    return [p + "." for p in parts[:-1]] + [parts[-1]]


def ict(passage: str, rng: random.Random) -> tuple[str, str] | None:
    """(sentence, the passage without it 90% of the time); None for a passage of one sentence."""
    parts = sentences(passage)
    if len(parts) < 2:
        return None
    pick = rng.randrange(len(parts))
    rest = parts[:pick] + parts[pick + 1:] if rng.random() < ICT_REMOVE else parts
    return parts[pick], " ".join(rest)


def wikipedia_pairs(folder: Path, method: str, pairs: int, seed: int) -> Iterator[Row]:
    """Up to `pairs` (query, positive, "") rows, one per passage, streamed from the articles in file order."""
    if not any(folder.glob("*/wiki_*.gz")):
        raise InputError(f"--wikipedia {folder}: no */wiki_*.gz files (expected WikiExtractor output, as in "
                         f"../shared/data/wikipedia)")
    rng = random.Random(seed)
    made = 0
    for _, _, body in articles(folder):
        for passage in cut(body):
            pair = (crop(passage.split(), rng), crop(passage.split(), rng)) if method == "crop" else ict(passage, rng)
            if pair is None:
                continue
            yield clean(pair[0]), clean(pair[1]), ""
            made += 1
            if made == pairs:
                return


def write_rows(out: Path, rows: Iterable[Row]) -> int:
    """Write the header and `rows` to `out` atomically: a failure (bad input met while the rows stream, or no row at
    all) leaves `out` as it was; the row count."""
    count = 0

    def write(tmp: Path) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write("\t".join(HEADER) + "\n")
            for row in rows:
                handle.write("\t".join(row) + "\n")
                count += 1
        if count == 0:
            raise InputError(f"--out {out}: no rows made (is the input empty?); nothing written")

    try:
        atomic_write(out, write)
    except OSError as err:  # atomic_write names the file in an OSError; bad input stays bad input (exit 2)
        if isinstance(err.__cause__, EncoderlabError):
            raise err.__cause__ from None
        raise
    return count


def check_args(args: argparse.Namespace) -> None:
    """Refuse a taken --out (without --overwrite) and counts out of range, before any work."""
    if args.out.is_dir():
        raise InputError(f"--out {args.out}: is a folder, expected a .tsv file to write")
    if args.out.exists() and not args.overwrite:
        raise InputError(f"--out {args.out}: exists; pass --overwrite to replace it, or choose another file")
    if getattr(args, "negatives", 0) < 0:
        raise InputError(f"--negatives {args.negatives}: expected 0 or more")
    if getattr(args, "pairs", 1) < 1:
        raise InputError(f"--pairs {args.pairs}: expected 1 or more")


def build_parser() -> argparse.ArgumentParser:
    """`squad` and `wikipedia`, each with --out and --overwrite."""
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sources = cli.add_subparsers(dest="source", required=True)
    squad = sources.add_parser("squad", help="training articles' questions, paragraphs and mined hard negatives")
    squad.add_argument("--squad", type=Path, default=SQUAD, help=f"a SQuAD v1.1 JSON file (default: {SQUAD})")
    squad.add_argument("--miner", default="minilm", help="the bi-encoder that mines negatives (default: minilm)")
    squad.add_argument("--negatives", type=int, default=1, help="hard negatives per question, one row each "
                       "(default: 1; 0: no negatives)")
    wiki = sources.add_parser("wikipedia", help="unsupervised pairs by independent cropping or the inverse cloze task")
    wiki.add_argument("--wikipedia", type=Path, default=WIKIPEDIA, help=f"WikiExtractor folder (default: {WIKIPEDIA})")
    wiki.add_argument("--method", choices=("crop", "ict"), default="crop", help="crop: Contriever's independent "
                      "cropping (default); ict: the inverse cloze task")
    wiki.add_argument("--pairs", type=int, default=10_000, help="pairs to write, one per passage (default: 10000)")
    wiki.add_argument("--seed", type=int, default=0, help="the random seed (default: 0)")
    for sub in (squad, wiki):
        sub.add_argument("--out", required=True, type=Path, help="the TSV file to write")
        sub.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    return cli


def main(argv: list[str] | None = None) -> int:
    """Write the file; 2 and one line on bad input."""
    args = build_parser().parse_args(argv)
    dropped: list[str] = []
    try:
        check_args(args)
        if args.source == "squad":
            paragraphs, questions = squad_questions(args.squad)
            rows = mine(args.miner, paragraphs, questions, args.negatives, dropped)
        else:
            rows = wikipedia_pairs(args.wikipedia, args.method, args.pairs, args.seed)
        count = write_rows(args.out, rows)
    except EncoderlabError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    left = f"; {len(dropped)} questions left out, every other paragraph holding an answer" if dropped else ""
    print(f"wrote {args.out}: {count} rows ({args.source}){left}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
