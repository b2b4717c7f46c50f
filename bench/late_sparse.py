"""Late interaction and learned sparse retrieval against a bi-encoder and BM25: ColBERT (`finetune colbert` from
minilm), SPLADE (`finetune splade` from encoderlab-fill-mask) and the bi-encoder (`finetune embed` from minilm),
trained on the same data with the same steps, indexed and scored on the held-out articles of SQuAD part A.

The training data is scripts/retrieval_pairs.py's `squad` file: the training articles' questions, their paragraphs,
and one hard negative each mined by minilm (answer-holding paragraphs skipped). All three commands read it with the
same --train, --max-train, --epochs, --batch-size, --max-length, --lr and --seed (TRAINING below; LR would give a
contender a rate of its own). Each model then indexes the SQuAD part A BEIR folder (scripts/squad_beir.py) with
`encoderlab index` (the folder's task.json picks the kind: dense, multivector or sparse); BM25 is `index --bm25` on
the bi-encoder's index, and colbert-2bit is ColBERT's model indexed with `--residual-bits 2` (ColBERTv2's
compression). Figures, all through the CLI (`evaluate retrieval --json`, `--fuse` for dense + SPLADE with the
default fusion, the weighted sum of z-scores that bench/retrieval.py picked for dense + BM25):
- MRR@10 and nDCG@10 (and Recall@10/100) on qrels/test.tsv, the held-out articles' questions, for BM25, the
  bi-encoder, ColBERT (float16, and in 2-bit residuals), SPLADE, the inference-free SPLADE (`--inference-free`:
  queries are a learned token-weight table), the dense + SPLADE fusions, and the bi-encoder and ColBERT each fused
  with BM25 (`--mode hybrid`);
- CPU query latency, one thread, one query at a time: p50 of a whole search (encode + search) through the index the
  `search` command opens, p50 of our query encoding alone, and p50 of sentence-transformers' query encoding
  (SentenceTransformer, MultiVectorEncoder, SparseEncoder loading the same folders, encoding the same queries);
- the index size on disk (vectors and search structures such as a multi-vector index's centroids and codes, the
  stored documents aside; BM25: its folder), and training seconds;
- interop: the largest absolute difference between our query vectors and sentence-transformers' for each model.
Goals (issue 44): ColBERT >= the bi-encoder in MRR@10 and nDCG@10; SPLADE >= BM25 in nDCG@10; dense + SPLADE fusion
>= dense + 1 point nDCG@10 (each asked of both SPLADE variants); interop <= 1e-4.

    python bench/late_sparse.py            # all 1,545 paragraphs, 2,933 held-out questions; every training row
                                           # (5,190), 1 epoch, batch 32, 128 tokens: 20 min to an hour a model
    python bench/late_sparse.py --max-train 1000   # ... trained on 1,000 of the rows (a fixed sample) instead
                                                   # (written to late_sparse_1000.json)
    python bench/late_sparse.py --index-window 128 # ... documents read in 128 tokens (late_sparse_w128.json)
    python bench/late_sparse.py --quick    # 100 paragraphs and their held-out questions, 64 training rows
    python bench/late_sparse.py --smoke    # tiny random models on synthetic documents (make test)
    python bench/late_sparse.py --only bm25,dense   # some of the contenders (fusion needs dense and splade)

Trained models, indexes and the training file are cached under $LATE_SPARSE_CACHE (/work/cache/late_sparse), each
with the settings it was made with: a rerun with the same settings reuses them. Every model indexes the paragraphs
whole (512 tokens: INDEX_WINDOW), as BM25 reads them. The first run mines the training
file (minilm over 977 training paragraphs and 5,190 questions: about 10 min on 2 busy cores), --quick included.
A missing `finetune colbert` / `finetune splade` command stops the bench with one line: it is not skipped.
Data: ../shared/data/squad_v1.1/dev-v1.1.part-a.json. Run with OMP_NUM_THREADS=1 on a shared machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from common import goal, parser, size, tiny_model, write_results  # noqa: E402
from rerank import SQUAD  # noqa: E402
from retrieval import subset, synthetic  # noqa: E402
from squad_beir import squad_to_beir  # noqa: E402

from encoderlab.choices import DOCUMENT_FLOPS, QUERY_FLOPS, START_TERMS  # noqa: E402
from encoderlab.cli import build_parser  # noqa: E402
from encoderlab.cli import main as encoderlab_main  # noqa: E402
from encoderlab.cli.retrieval import open_index, search_options  # noqa: E402
from encoderlab.retrieval.corpus import read_qrels, read_queries  # noqa: E402
from encoderlab.retrieval.meta import BM25, INDEX_FILE  # noqa: E402

CACHE = Path(os.environ.get("LATE_SPARSE_CACHE", "/work/cache/late_sparse"))
CONTENDERS = ("bm25", "dense", "colbert", "colbert-2bit", "splade", "splade-free")
ORDER = ("dense", "bm25", "colbert", "colbert-2bit", "splade", "splade-free")  # BM25 searches dense's index
# Contenders that search another one's model through an index of their own, built with these `index` flags:
# BM25 (`index --bm25` beside the bi-encoder's vectors) and ColBERT's index in ColBERTv2's 2-bit residuals
MODEL_OF = {"bm25": "dense", "colbert-2bit": "colbert"}
INDEX_FLAGS = {"colbert-2bit": ["--residual-bits=2"]}
# What each model is fine-tuned from, and the command (a missing one stops the bench)
BASE = {"dense": ("embed", "minilm"), "colbert": ("colbert", "minilm"), "splade": ("splade", "encoderlab-fill-mask"),
        "splade-free": ("splade", "encoderlab-fill-mask")}
# The contenders' own flags beside TRAINING's (the same for all), recorded with their models: SPLADE's FLOPS weights
# are the defaults (NAVER's SPLADE-max); the inference-free documents' is sentence-transformers 6.2's example weight,
# 3e-5, which scored 5.8 nDCG@10 points above the default's 6e-4 here, at 7.7x the index (docs/sparse.md).
# Both start sparse (--start-terms, the default; named so that a model cached before it is trained again).
FLAGS = {"splade": [f"--query-flops={QUERY_FLOPS:g}", f"--document-flops={DOCUMENT_FLOPS:g}",
                    f"--start-terms={START_TERMS}"],
         "splade-free": ["--inference-free", "--document-flops=3e-05", f"--start-terms={START_TERMS}"]}
# A learning rate of a contender's own (none now). Before the sparse start (--start-terms), the full SPLADE started
# from a masked LM whose log-saturated logits every query and document shared in large part (a first batch's loss of
# 940, against 1.3 for the inference-free one, whose queries start as IDF): at 5e-5 it spent 59 of its 163 steps
# bringing that under 3 and scored 0.701 nDCG@10 at 512 tokens (bench/results/late_sparse_lr5e-5.json); at 2e-4, 24
# steps and 0.784, so the bench trained it at 2e-4. With the sparse start, 2e-4 scored 0.870 and 5e-5 0.877
# (docs/retrieval.md), so every model now trains at TRAINING's rate.
LR: dict[str, float] = {}
SPARSE = ("splade", "splade-free")
HYBRID = ("dense", "colbert")  # indexed with BM25 beside them (`index --bm25`): `--mode hybrid` fuses the two
# The same for every model: training rows (None: all), epochs, batch size, tokens, learning rate (the top of BERT's
# fine-tuning grid, Devlin et al. 2019, A.3, for the short runs; 1e-3 for the tiny random models of --smoke), seed.
# full: every training row, 5,190 = 163 steps of 32 triplets at 128 tokens: at one thread on the Ice Lake,
# 1,345 s for the bi-encoder, 1,842 s for ColBERT and about an hour for each SPLADE (--max-train N for fewer).
TRAINING = {"full": {"max_train": None, "epochs": 1, "batch_size": 32, "max_length": 128, "lr": 5e-5, "seed": 0},
            "quick": {"max_train": 64, "epochs": 1, "batch_size": 16, "max_length": 64, "lr": 5e-5, "seed": 0},
            "smoke": {"max_train": 24, "epochs": 1, "batch_size": 8, "max_length": 32, "lr": 1e-3, "seed": 0}}
DOCUMENTS = {"full": None, "quick": 100, "smoke": None}  # corpus paragraphs kept (None: all)
# Every model indexes whole paragraphs, as BM25 does: 512 tokens, the window of minilm and of encoderlab-fill-mask
# (SQuAD part A's paragraphs hold 173 tokens on average; at the training window, 128, two in three lose their tail).
# Queries keep the models' own window. None: the model's (the tiny random models of --smoke).
INDEX_WINDOW = {"full": 512, "quick": 512, "smoke": None}
LATENCY_QUERIES = {"full": 200, "quick": 20, "smoke": 8}  # held-out questions timed one at a time
INTEROP_QUERIES = 16


def run_cli(*argv: Any) -> dict[str, Any]:
    """Run an `encoderlab` command in this process and return its --json output; exit loudly if it fails."""
    words = [str(a) for a in argv]
    print("$ encoderlab", " ".join(words), file=sys.stderr, flush=True)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = encoderlab_main(words)
    if code:
        raise SystemExit(f"encoderlab {' '.join(words[:2])} exited {code}")
    text = out.getvalue()
    return json.loads(text[text.index("{"):]) if "{" in text else {}


def has_command(words: list[str]) -> bool:
    """Whether the CLI parses `words` (a command that does not exist is an argparse error)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            build_parser().parse_args(words)
        except SystemExit:
            return False
    return True


def require_commands(names: list[str]) -> None:
    """Stop with one line when a contender's `finetune` command does not exist (never skip it silently)."""
    missing = [BASE[n][0] for n in names if n in BASE and not has_command(
        ["finetune", BASE[n][0], "--model", "m", "--train", "t.tsv", "--out", "o"])]
    if missing:
        others = ",".join(c for c in ORDER if c not in missing)
        raise SystemExit(f"encoderlab finetune {' and '.join(missing)}: no such command (issue 44's "
                         f"{', '.join(missing)} part{'s' if len(missing) > 1 else ''}); --only {others} runs the "
                         f"others")


def cached(folder: Path, settings: dict[str, Any], make) -> dict[str, Any]:
    """make(folder) unless `folder` holds what the same settings made; the settings and make's seconds."""
    record = folder.with_name(folder.name + ".json")
    if folder.is_dir() and record.is_file() and json.loads(record.read_text())["settings"] == settings:
        return json.loads(record.read_text()) | {"cached": True}
    started = time.perf_counter()
    make(folder)
    done = {"settings": settings, "seconds": round(time.perf_counter() - started, 1)}
    record.write_text(json.dumps(done, indent=2))
    return done | {"cached": False}


def results_name(max_train: int | None, window: int | None, names: list[str] | None = None) -> str:
    """The results file's name: late_sparse, or for a run of other settings or of some contenders (--only) a file of
    its own (late_sparse_1000, late_sparse_w128, late_sparse_5190_w128, late_sparse_only_splade-free), so that it
    never overwrites the default run's figures."""
    some = names is not None and set(names) != set(CONTENDERS)
    return ("late_sparse" + (f"_{max_train}" if max_train else "") + (f"_w{window}" if window else "")
            + (f"_only_{'_'.join(n for n in ORDER if n in names)}" if some else ""))


def train(name: str, base: str, data: Path, folder: Path, mode: str) -> dict[str, Any]:
    """Fine-tune `base` as `name` on `data` with TRAINING[mode] (cached)."""
    options = TRAINING[mode] | ({"lr": LR[name]} if name in LR and mode != "smoke" else {})
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in options.items()] + FLAGS.get(name, [])
    settings = {"command": ["finetune", BASE[name][0], *FLAGS.get(name, [])], "model": base, "train": str(data),
                **options}
    return cached(folder, settings, lambda out: run_cli(
        "finetune", BASE[name][0], "--model", base, "--train", data, "--out", out, *flags, "--overwrite",
        "--no-progress", "--json"))


def build_index(model: Path, trained: dict[str, Any], corpus: Path, folder: Path, bm25: bool,
                window: int | None, flags: list[str]) -> dict[str, Any]:
    """`encoderlab index` of `corpus` with `model` (cached, made again when the model was trained again), the
    documents read in `window` tokens (None: the model's own), with `flags` besides."""
    settings = {"model": str(model), "trained": trained, "corpus": str(corpus), "bm25": bm25} | (
        {"max_length": window} if window else {}) | ({"flags": flags} if flags else {})
    return cached(folder, settings, lambda out: run_cli(
        "index", "--model", model, "--corpus", corpus, "--out", out, *(["--bm25"] if bm25 else []), "--overwrite",
        *([f"--max-length={window}"] if window else []), *flags, "--no-progress", "--json"))


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def index_bytes(index: Path, name: str) -> int:
    """BM25: its folder; a model: its shards' vectors (.npy/.npz and the like) and the search structures beside them
    (a multi-vector index's centroids and codes), the stored documents (.jsonl), index.json and BM25 aside."""
    if name == "bm25":
        return folder_bytes(index / BM25)
    return sum(p.stat().st_size for p in index.rglob("*") if p.is_file() and p.suffix != ".jsonl"
               and p.name != INDEX_FILE and BM25 not in p.relative_to(index).parts)


def evaluate(index: Path, data: Path, mode: str, run: Path) -> dict[str, Any]:
    """`evaluate retrieval --json` of the index on the held-out questions; the TREC run kept at `run`."""
    return run_cli("evaluate", "retrieval", "--index", index, "--data", data, "--mode", mode, "--run", run,
                   "--no-progress", "--json")["metrics"]


def opened(index: Path, mode: str) -> tuple[Any, dict[str, Any]]:
    """The index as the `search` command opens it (its kind's query encoder) and search's default options."""
    args = build_parser().parse_args(["search", "--index", str(index), "--mode", mode, "query"])
    return open_index(args, str(index)), search_options(args)


def our_vectors(encoder: Any, texts: list[str]) -> Any:
    """Our query vectors, by the query encoder the index holds: the Embed pipeline's `embed` (N, D), the sparse
    pipeline's `vectors(query=True)` (N, V) or the multi-vector encoder's `queries` (Q, T, dim) cut by its mask."""
    if hasattr(encoder, "embed"):
        return encoder.embed(texts)
    if hasattr(encoder, "vectors"):
        return encoder.vectors(texts, query=True)
    vectors, mask = encoder.queries(texts)
    return [v[m.bool()] for v, m in zip(vectors, mask)]


def their_encoder(name: str, folder: Path) -> Any:
    """sentence-transformers' class for the folder: SentenceTransformer, MultiVectorEncoder or SparseEncoder."""
    import sentence_transformers as st

    cls = {"dense": st.SentenceTransformer, "colbert": st.MultiVectorEncoder}.get(name, st.SparseEncoder)
    return cls(str(folder), device="cpu")


def their_vectors(name: str, model: Any, texts: list[str]) -> Any:
    """sentence-transformers' query vectors of `texts`."""
    if name == "dense":
        return model.encode(texts, normalize_embeddings=True)
    return model.encode_query(texts)


def rows(vectors: Any) -> list[np.ndarray]:
    """One float64 array per query, from a (N, D) array, a sparse matrix or tensor, or a list of (T, D) tensors."""
    if hasattr(vectors, "toarray"):  # scipy sparse
        vectors = vectors.toarray()
    if isinstance(vectors, torch.Tensor):
        vectors = vectors.to_dense() if vectors.is_sparse else vectors
    return [np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64) for v in vectors]


def interop(name: str, encoder: Any, theirs: Any, texts: list[str]) -> float:
    """Largest |ours - theirs| over the query vectors (inf where the shapes differ)."""
    ours, other = rows(our_vectors(encoder, texts)), rows(their_vectors(name, theirs, texts))
    if [a.shape for a in ours] != [b.shape for b in other]:
        return float("inf")
    return max(float(np.abs(a - b).max()) for a, b in zip(ours, other))


def p50_ms(calls: dict[str, Any], texts: list[str]) -> dict[str, float]:
    """Median milliseconds of each call([text]) over `texts`, after one warm-up each; the calls take turns on each
    text, so a load that comes and goes on a shared machine weighs on all of them alike."""
    for call in calls.values():
        call(texts[:1])
    times: dict[str, list[float]] = {name: [] for name in calls}
    for text in texts:
        for name, call in calls.items():
            started = time.perf_counter()
            call([text])
            times[name].append(time.perf_counter() - started)
    return {name: round(1000 * statistics.median(seconds), 2) for name, seconds in times.items()}


def speed_and_interop(name: str, model: Path | None, index: Path, texts: list[str]) -> dict[str, Any]:
    """Query latency p50 (ours: search and encode; theirs: encode) and interop, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        searcher, options = opened(index, "bm25" if name == "bm25" else "dense")
        calls = {"search_ms_p50": lambda q: searcher.search(q, 10, **options)}
        if name == "bm25":
            return p50_ms(calls, texts)
        kind = MODEL_OF.get(name, name)
        encoder, theirs = searcher.embedder, their_encoder(kind, model)
        calls |= {"encode_ms_p50": lambda q: our_vectors(encoder, q),
                  "sentence_transformers_encode_ms_p50": lambda q: their_vectors(kind, theirs, q)}
        return p50_ms(calls, texts) | {"interop_max_abs_diff": interop(kind, encoder, theirs,
                                                                        texts[:INTEROP_QUERIES])}
    finally:
        torch.set_num_threads(threads)


def smoke_training(data: Path, out: Path) -> Path:
    """The shared TSV from a synthetic BEIR folder's train qrels: query, its document, another document."""
    documents = [json.loads(line) for line in (data / "corpus.jsonl").read_text().splitlines()]
    text = {d["_id"]: d["text"] for d in documents}
    queries, rng = read_queries(data / "queries.jsonl"), random.Random(0)
    lines = ["query\tpositive\tnegative"]
    for q, judged in read_qrels(data / "qrels" / "train.tsv").items():
        doc = next(iter(judged))
        other = rng.choice([d for d in text if d != doc])
        lines.append(f"{queries[q]}\t{text[doc]}\t{text[other]}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def inputs(mode: str, scratch: Path) -> tuple[Path, Path, dict[str, str]]:
    """The BEIR folder, the training TSV and the base model of each contender."""
    if mode == "smoke":
        data = synthetic(scratch / "beir")
        bases = {"dense": str(tiny_model(scratch / "tiny")), "colbert": str(scratch / "tiny"),
                 "splade": str(tiny_model(scratch / "tiny-mlm", masked_lm=True))}
        bases["splade-free"] = bases["splade"]
        return data, smoke_training(data, scratch / "train.tsv"), bases
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} is absent: this bench needs SQuAD v1.1 part A (run --smoke for the synthetic check)")
    beir = CACHE / "squad-beir"
    if not (beir / "qrels" / "test.tsv").is_file():
        squad_to_beir(SQUAD, beir)
    train_file = CACHE / "train.tsv"
    if not train_file.is_file():
        import retrieval_pairs

        if retrieval_pairs.main(["squad", "--out", str(train_file)]):
            raise SystemExit("scripts/retrieval_pairs.py squad failed")
    data = beir
    if DOCUMENTS[mode] is not None:
        data = CACHE / f"squad-beir-{DOCUMENTS[mode]}"
        subset(beir, data, DOCUMENTS[mode])
    return data, train_file, {n: base for n, (_, base) in BASE.items()}


def contender(name: str, mode: str, work: Path, data: Path, train_file: Path, bases: dict[str, str],
              texts: list[str]) -> dict[str, Any]:
    """Train (but BM25), index, score and time one contender; its figures."""
    kind = MODEL_OF.get(name, name)
    model = work / kind
    trained = train(kind, bases[kind], train_file, model, mode)
    index = work / "index-dense" if name in ("bm25", "dense") else work / f"index-{name}"
    record = {k: trained[k] for k in ("settings", "seconds")}
    made = build_index(model, record, data / "corpus.jsonl", index, bm25=name in ("bm25", *HYBRID),
                       window=INDEX_WINDOW[mode], flags=INDEX_FLAGS.get(name, []))
    metrics = evaluate(index, data, "bm25" if name == "bm25" else "dense", work / f"{name}.run")
    return {"base": "BM25 (bm25s)" if name == "bm25" else bases[kind], "metrics": metrics,
            "index_bytes": index_bytes(index, name), "index_seconds": made["seconds"],
            "train_seconds": None if name == "bm25" else trained["seconds"],
            "trained_now": not trained["cached"]} | speed_and_interop(name, model, index, texts)


def contenders(only: str) -> list[str]:
    """The contenders `--only` asks for, in the order they run: the bi-encoder with BM25 (BM25 searches its index)."""
    asked = {n.strip() for n in only.split(",") if n.strip()}
    if not asked or not asked <= set(CONTENDERS):
        raise SystemExit(f"--only {only}: expected names among {', '.join(CONTENDERS)}")
    return [n for n in ORDER if n in asked or n in {MODEL_OF[a] for a in asked if a in MODEL_OF}]


def main() -> None:
    cli = parser(__doc__, "100 paragraphs and their held-out questions, 64 training rows: that it runs")
    cli.add_argument("--only", default=",".join(CONTENDERS), help=f"contenders, comma-separated, of "
                     f"{', '.join(CONTENDERS)} (default: all; bm25 and colbert-2bit bring dense and colbert, whose "
                     f"models they search)")
    cli.add_argument("--max-train", type=int, metavar="N", help="training rows for every model (default: all; "
                     "--quick 64)")
    cli.add_argument("--index-window", type=int, metavar="T", help="tokens each model reads of a document when "
                     "indexing (default: 512, whole paragraphs; the models were trained at 128)")
    args = cli.parse_args()
    mode = size(args)
    if args.max_train:
        TRAINING[mode]["max_train"] = args.max_train
    names = contenders(args.only)
    file_name = results_name(args.max_train, args.index_window if args.index_window != INDEX_WINDOW[mode] else None,
                             names)
    if args.index_window:
        INDEX_WINDOW[mode] = args.index_window
    require_commands(names)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        data, train_file, bases = inputs(mode, scratch)
        rows = sum(1 for _ in open(train_file)) - 1  # the header aside
        TRAINING[mode]["max_train"] = min(TRAINING[mode]["max_train"] or rows, rows)  # the records name the count
        work = scratch / "work" if mode == "smoke" else CACHE / mode
        work.mkdir(parents=True, exist_ok=True)
        qrels, queries = read_qrels(data / "qrels" / "test.tsv"), read_queries(data / "queries.jsonl")
        texts = [queries[q] for q in sorted(qrels)][:LATENCY_QUERIES[mode]]
        figures: dict[str, Any] = {
            "data": "synthetic" if mode == "smoke" else "SQuAD v1.1 part A as BEIR (scripts/squad_beir.py), "
            "qrels/test.tsv", "documents": sum(1 for _ in open(data / "corpus.jsonl")), "queries": len(qrels),
            "training": TRAINING[mode] | {"file": "synthetic" if mode == "smoke" else str(train_file), "rows": rows,
                                          "lr_of": {} if mode == "smoke" else LR},
            "threads": torch.get_num_threads(), "latency_queries": len(texts), "index_window": INDEX_WINDOW[mode]}
        for name in names:
            figures[name] = contender(name, mode, work, data, train_file, bases, texts)
        for first in HYBRID:
            if {first, "bm25"} <= set(names):
                figures[f"{first}+bm25"] = {"metrics": evaluate(work / f"index-{first}", data, "hybrid",
                                                                work / f"{first}+bm25.run")}
        for sparse in SPARSE:
            if {"dense", sparse} <= set(names):
                figures[f"dense+{sparse}"] = {"metrics": run_cli(
                    "evaluate", "retrieval", "--data", data, "--fuse", work / "dense.run", work / f"{sparse}.run",
                    "--json")["metrics"]}
        if mode == "smoke":
            shutil.rmtree(work, ignore_errors=True)
    goals = goals_of(figures)
    path = write_results(args, file_name, figures, goals)
    for name in [*CONTENDERS, *(f"{first}+bm25" for first in HYBRID), *(f"dense+{sparse}" for sparse in SPARSE)]:
        if name in figures:
            print(f"{name:<18}" + "  ".join(f"{k} {v:.4f}" for k, v in figures[name]["metrics"].items()))
    for row in goals:
        print(f"{'met ' if row['met'] else 'MISS'} {row['what']}: {row['value']} (target {row['target']})")
    print(f"wrote {path}")


def goals_of(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 44's goals for the contenders that ran."""
    score = lambda name, metric: figures[name]["metrics"][metric]  # noqa: E731
    goals = []
    if {"colbert", "dense"} <= set(figures):
        goals += [goal(f"ColBERT {label} minus the bi-encoder's (points)",
                       100 * (score("colbert", metric) - score("dense", metric)), 0.0)
                  for metric, label in (("mrr_at_10", "MRR@10"), ("ndcg_at_10", "nDCG@10"))]
    for sparse, label in (("splade", "SPLADE"), ("splade-free", "SPLADE (inference-free)")):
        if {sparse, "bm25"} <= set(figures):
            goals.append(goal(f"{label} nDCG@10 minus BM25's (points)",
                              100 * (score(sparse, "ndcg_at_10") - score("bm25", "ndcg_at_10")), 0.0))
        if f"dense+{sparse}" in figures:
            goals.append(goal(f"dense + {label} fusion nDCG@10 minus dense's (points)",
                              100 * (score(f"dense+{sparse}", "ndcg_at_10") - score("dense", "ndcg_at_10")), 1.0))
    goals += [goal(f"{name}: largest |our query vector - sentence-transformers'|",
                   figures[name]["interop_max_abs_diff"], 1e-4, at_most=True)
              for name in ("dense", "colbert", *SPARSE) if name in figures]
    return goals


if __name__ == "__main__":
    main()
