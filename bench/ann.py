"""Approximate and quantised search (encoderlab.retrieval.ann) on minilm vectors of Wikipedia passages: faiss-cpu
and usearch side by side, and what encoderlab's index gives with the library it picked.

Data: 100-word passages cut from ../shared/data/wikipedia (WikiExtractor output; recipe: prepare() below), indexed once
with `encoderlab index`'s Index (minilm, max_length 128, ONNX Runtime int8 engine: 1.6x torch fp32's speed on this
CPU, cosine 0.99 to it, docs/inference.md), cached in $ANN_BENCH_CACHE (/work/cache/ann) so reruns and bigger runs
reuse the vectors.
The recipe (prepare()): the articles in sorted file order; each article's lines of 8 words or more (section
headings and list stubs dropped) joined and cut into consecutive 100-word passages (a last piece under 50 words
dropped), id "ARTICLE-N", the article's title as title; the corpus is the first N passages, in blocks of 10,000 so a
bigger run adds blocks to the index a smaller run built. Queries: the first sentence (at most 40 words) of each of
the 1,000 articles after the corpus's last (none of them indexed), encoded by the same pipeline. "Exact" is brute
force over the float32 vectors; recall@10 is the share of the exact top 10 that a search returns. Figures, all at
one thread (torch, faiss.omp_set_num_threads(1), usearch threads=1), per query (one vector at a time, the query's
encoding not included: it is the same for every structure):
- faiss IndexHNSWFlat and usearch Index (f32, inner product), M (connectivity) 16 and 32, ef_construction
  (expansion_add) 200, ef_search (expansion) 16..128: recall@10, p50/p99 latency, build time, size;
- int8 codes (faiss SQ8, usearch i8) and binary codes (sign bits, Hamming) without rescoring;
- encoderlab's Index with --ann hnsw and the defaults, and --quantize int8/binary (flat and HNSW, rescored): recall@10
  and latency through Index.nearest, structure size next to the float32 vectors';
- nDCG@10 on SQuAD part A as BEIR (scripts/squad_beir.py, the held-out questions) for exact and each structure.
Goals (issue 43): recall@10 >= 0.98 at p50 <= 2 ms for the default HNSW.

    python bench/ann.py                     # 200,000 passages (encoding them takes hours on 2 busy cores: cached)
    python bench/ann.py --quick             # 10,000 passages
    python bench/ann.py --smoke             # 600 random clustered vectors: that it runs (make test)
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import faiss
import numpy as np
import torch
import usearch.index as usearch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from common import goal, parser, size, write_results  # noqa: E402
from rerank import SQUAD  # noqa: E402
from squad_beir import squad_to_beir  # noqa: E402

from encoderlab.infer.pipelines import pipeline  # noqa: E402
from encoderlab.retrieval import ann  # noqa: E402
from encoderlab.retrieval.corpus import read_qrels, read_queries  # noqa: E402
from encoderlab.retrieval.index import Index  # noqa: E402
from encoderlab.retrieval.meta import EF_CONSTRUCTION, EF_SEARCH, HNSW_M, read_meta  # noqa: E402
from encoderlab.retrieval.metrics import evaluate  # noqa: E402

CACHE = Path(os.environ.get("ANN_BENCH_CACHE", "/work/cache/ann"))  # vectors kept between runs, outside git
WIKIPEDIA = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikipedia"
BLOCK = 10_000  # passages per corpus block: the unit a run adds to the cached index
WORDS = 100  # words per passage: ~140 WordPiece tokens with the title, so max_length 128 cuts 3 in 4 of them a little
QUERIES = 1_000
DOC = re.compile(r'<doc id="(\d+)"[^>]*title="([^"]*)">')

PASSAGES = {"full": 200_000, "quick": 10_000}
K = 10
GRID = {"full": ((16, 32), (16, 32, 64, 128)), "quick": ((16, 32), (16, 32, 64, 128)), "smoke": ((16,), (32,))}
ENGINE = {"engine": "onnxruntime", "precision": "int8", "engine_cache": str(CACHE / "engines")}


# ---- the passages (cut once, encoded once) ----------------------------------------------------------------------
def articles(folder: Path) -> Iterator[tuple[str, str, list[str]]]:
    """(id, title, body lines) of every article of a WikiExtractor folder, in file order."""
    for path in sorted(folder.glob("*/wiki_*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            ident, title, lines = None, "", []
            for line in handle:
                if match := DOC.match(line):
                    ident, title, lines = match.group(1), match.group(2), []
                elif line.startswith("</doc>"):
                    yield ident, title, lines[1:]  # WikiExtractor repeats the title as the body's first line
                elif ident is not None:
                    lines.append(line.strip())


def cut(body: list[str]) -> list[str]:
    """An article body's 100-word passages."""
    words = " ".join(line for line in body if len(line.split()) >= 8).split()
    pieces = [words[start:start + WORDS] for start in range(0, len(words), WORDS)]
    return [" ".join(p) for p in pieces if len(p) >= WORDS // 2]


def first_sentence(body: list[str]) -> str:
    """The first sentence of an article's first paragraph, at most 40 words."""
    text = next((line for line in body if len(line.split()) >= 8), "")
    return " ".join(text.split(". ")[0].split()[:40])


def prepare(folder: Path, passages: int) -> tuple[list[Path], Path]:
    """Corpus blocks (BEIR jsonl) of the first `passages` passages and the held-out queries (queries-N.jsonl),
    written under `folder` unless there already."""
    folder.mkdir(parents=True, exist_ok=True)
    blocks = [folder / f"corpus-{b:03d}.jsonl" for b in range(-(-passages // BLOCK))]
    queries = folder / f"queries-{passages}.jsonl"
    if all(p.is_file() for p in blocks) and queries.is_file():
        return blocks, queries
    stream = articles(WIKIPEDIA)
    rows: list[str] = []
    for ident, title, body in stream:
        rows += [json.dumps({"_id": f"{ident}-{n}", "title": title, "text": t}) for n, t in enumerate(cut(body))]
        if len(rows) >= passages:
            break
    rows = rows[:passages]  # the rest of the last article is neither indexed nor asked about
    for number, path in enumerate(blocks):
        if path.is_file():
            continue  # never rewritten: the cached index records each block's size and time
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(rows[number * BLOCK:(number + 1) * BLOCK]) + "\n", encoding="utf-8")
        tmp.replace(path)
    asked = [{"_id": f"q{ident}", "text": first_sentence(body)} for ident, _, body in itertools.islice(
        ((i, t, b) for i, t, b in stream if first_sentence(b)), QUERIES)]
    queries.write_text("".join(json.dumps(q) + "\n" for q in asked), encoding="utf-8")
    return blocks, queries


def encode(blocks: list[Path], folder: Path, max_length: int = 128, **options: object) -> Index:
    """The index of `blocks` at `folder` (minilm): built, resumed or extended block by block, so a run that was cut
    off, or a smaller run before it, leaves work the next run keeps."""
    embedder = pipeline("embed", "minilm", max_length=max_length, **options)
    for block in blocks:
        meta = read_meta(folder) if (folder / "index.json").is_file() else None
        done = [Path(s["path"]).name for s in meta["sources"]] if meta else []
        if meta is None or (not meta["complete"] and done[-1] == block.name):
            Index.build("minilm", block, folder, embedder=embedder, resume=meta is not None, shard_size=2_000)
        elif block.name not in done:
            Index(folder, embedder).add(block)
    return Index(folder, embedder)


# ---- measuring ----------------------------------------------------------------------------------------------------
def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each row of truth (Q, k) that the row of found holds."""
    return round(float(np.mean([len(set(f.tolist()) & set(t.tolist())) / truth.shape[1]
                                for f, t in zip(found, truth)])), 4)


def latency(search_one: Callable[[np.ndarray], object], queries: np.ndarray) -> dict[str, float]:
    """p50 and p99 milliseconds of searching one (1, D) query at a time, after one warm-up."""
    search_one(queries[:1])
    times = []
    for row in range(len(queries)):
        started = time.perf_counter()
        search_one(queries[row:row + 1])
        times.append(time.perf_counter() - started)
    return {"p50_ms": round(1e3 * float(np.percentile(times, 50)), 3),
            "p99_ms": round(1e3 * float(np.percentile(times, 99)), 3)}


def timed(build: Callable[[], object]) -> tuple[object, float]:
    """build()'s result and its seconds."""
    started = time.perf_counter()
    made = build()
    return made, round(time.perf_counter() - started, 2)


def faiss_hnsw(vectors: np.ndarray, m: int) -> tuple[object, float, int]:
    """faiss IndexHNSWFlat (inner product), built at one thread: index, seconds, bytes serialised."""
    def build() -> object:
        index = faiss.IndexHNSWFlat(vectors.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = EF_CONSTRUCTION
        index.add(vectors)
        return index

    index, seconds = timed(build)
    return index, seconds, len(faiss.serialize_index(index))


def usearch_hnsw(vectors: np.ndarray, m: int, dtype: str = "f32") -> tuple[object, float, int]:
    """usearch Index (inner product; b1: Hamming over packed sign bits), built at one thread."""
    def build() -> object:
        bits = dtype == "b1"
        index = usearch.Index(ndim=vectors.shape[1], metric="hamming" if bits else "ip", dtype=dtype,
                              connectivity=m, expansion_add=EF_CONSTRUCTION)
        index.add(np.arange(len(vectors)), np.packbits(vectors > 0, axis=1) if bits else vectors, threads=1)
        return index

    index, seconds = timed(build)
    return index, seconds, index.serialized_length


def libraries(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray, mode: str) -> dict:
    """faiss and usearch HNSW over the same float32 vectors, on GRID[mode]'s M and ef_search."""
    rows = []
    ms, efs = GRID[mode]
    for m in ms:
        for library, make in (("faiss", faiss_hnsw), ("usearch", usearch_hnsw)):
            index, seconds, size_ = make(vectors, m)
            for ef in efs:
                if library == "faiss":
                    index.hnsw.efSearch = ef
                    search = lambda q: index.search(q, K)[1]  # noqa: E731
                else:
                    index.expansion_search = ef
                    search = lambda q: index.search(q, K, threads=1).keys  # noqa: E731
                rows.append({"library": library, "m": m, "ef_search": ef,
                             "recall_at_10": recall(search(queries), truth), **latency(search, queries),
                             "build_seconds": seconds, "megabytes": round(size_ / 2**20, 1)})
                print(rows[-1], file=sys.stderr, flush=True)
    return {"hnsw": rows, "codes_without_rescoring": raw_codes(vectors, queries, truth)}


def raw_codes(vectors: np.ndarray, queries: np.ndarray, truth: np.ndarray) -> dict:
    """Recall@10 of int8 and binary codes searched whole, as each library quantises, before any rescoring."""
    sq8 = faiss.IndexScalarQuantizer(vectors.shape[1], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq8.train(vectors)
    sq8.add(vectors)
    bits = faiss.IndexBinaryFlat(vectors.shape[1])
    bits.add(np.packbits(vectors > 0, axis=1))
    i8 = usearch.search(vectors, queries, K, metric="ip", exact=True, threads=1)  # f32 baseline check
    out = {"faiss_int8_sq8": recall(sq8.search(queries, K)[1], truth),
           "binary_hamming": recall(bits.search(np.packbits(queries > 0, axis=1), K)[1], truth),
           "usearch_exact_f32": recall(i8.keys, truth)}
    index = usearch.Index(ndim=vectors.shape[1], metric="ip", dtype="i8")  # usearch casts f32 to i8 itself
    index.add(np.arange(len(vectors)), vectors, threads=1)
    index.expansion_search = 128
    out["usearch_int8_hnsw_ef128"] = recall(index.search(queries, K, threads=1).keys, truth)
    return out


def ours(index: Index, queries: np.ndarray, truth: np.ndarray) -> list[dict]:
    """encoderlab's Index.nearest with each structure: recall@10, latency, build seconds and size."""
    rows = []
    exact = lambda q: index.nearest(q, K, exact=True)  # noqa: E731
    rows.append({"structure": "exact (float32 shards)", "recall_at_10": recall(exact(queries)[1].numpy(), truth),
                 **latency(exact, queries), "megabytes": round(index.vectors().nbytes / 2**20, 1)})
    for kind, quantize in (("hnsw", None), ("hnsw", "int8"), ("hnsw", "binary"), (None, "int8"), (None, "binary")):
        _, seconds = timed(lambda: index.build_ann(kind, quantize))
        search = lambda q: index.nearest(q, K)  # noqa: E731
        rows.append({"structure": f"{kind or 'flat'} {quantize or 'float32'}", "settings": dict(index.meta["ann"]),
                     "recall_at_10": recall(search(queries)[1].numpy(), truth), **latency(search, queries),
                     "build_seconds": seconds,
                     "megabytes": round((index.folder / "ann" / ann.FILE).stat().st_size / 2**20, 1)})
        if quantize:  # the codes alone: candidates = k, so rescoring only reorders them
            index.meta["ann"]["rescore"] = 1
            rows[-1]["recall_at_10_without_rescoring"] = recall(search(queries)[1].numpy(), truth)
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def squad(folder: Path) -> dict:
    """nDCG@10 on SQuAD part A's held-out questions (BEIR), exactly and with each structure (minilm, the engine
    above)."""
    data = folder / "squad"
    if not (data / "qrels" / "test.tsv").is_file():
        squad_to_beir(SQUAD, data)
    index_folder = folder / "squad-index"
    blocks = [data / "corpus.jsonl"]
    index = encode(blocks, index_folder, max_length=256, **ENGINE)  # SQuAD paragraphs: 256 keeps them whole
    qrels, queries = read_qrels(data / "qrels" / "test.tsv"), read_queries(data / "queries.jsonl")
    qids = list(qrels)
    vectors = cached(folder / "squad-queries.npy", lambda: index.embedder.embed([queries[q] for q in qids]))
    out = {}
    for kind, quantize in ((None, None), ("hnsw", None), ("hnsw", "int8"), ("hnsw", "binary"), (None, "int8"),
                           (None, "binary")):
        if kind or quantize:
            index.build_ann(kind, quantize)
        name = f"{kind or 'flat'} {quantize or 'float32'}"
        out[name] = ndcg(index, qrels, qids, vectors, exact=not (kind or quantize))
        if quantize:  # the codes' own top 10, reordered by the float32 vectors only
            index.meta["ann"]["rescore"] = 1
            out[f"{name} without rescoring"] = ndcg(index, qrels, qids, vectors)
    return {"documents": len(index), "queries": len(qids), "ndcg_at_10": out}


def ndcg(index: Index, qrels: dict, qids: list[str], vectors: np.ndarray, exact: bool = False) -> float:
    """nDCG@10 of the index's best 10 per query (10, not 100: more candidates would hide the codes' loss)."""
    scores, positions = index.nearest(vectors, K, exact=exact)
    run = {q: {index.ids[int(p)]: float(s) for s, p in zip(row_s, row_p)}
           for q, row_s, row_p in zip(qids, scores.tolist(), positions.tolist())}
    return round(evaluate(qrels, run)["ndcg_at_10"], 4)


def cached(path: Path, make: Callable[[], np.ndarray]) -> np.ndarray:
    """The array saved at `path`, else make() saved there (query vectors: encoding them is most of a rerun)."""
    if not path.is_file():
        np.save(path, make())
    return np.load(path)


def smoke(folder: Path) -> tuple[Index, np.ndarray]:
    """An index of 600 clustered random vectors (no model: its embedder is never asked) and 50 queries."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(20, 32))
    vectors = (centres[rng.integers(0, 20, 600)] + 0.5 * rng.normal(size=(600, 32))).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    (folder / "shards").mkdir(parents=True)
    np.save(folder / "shards" / "00000.npy", vectors)
    (folder / "shards" / "00000.ids.json").write_text(str([f"d{i}" for i in range(600)]).replace("'", '"'))
    (folder / "index.json").write_text('{"format": 1, "complete": true, "dimensions": 32, "ann": null}')
    return Index(folder), vectors[:50] + 0.01


def main() -> None:
    cli = parser(__doc__, "10,000 passages (encoded once, then cached: under a minute after that)")
    cli.add_argument("--no-squad", action="store_true", help="skip the SQuAD nDCG@10 part")
    args = cli.parse_args()
    mode = size(args)
    figures: dict = {"threads": 1, "k": K, "defaults": {"m": HNSW_M, "ef_construction": EF_CONSTRUCTION,
                                                       "ef_search": EF_SEARCH}}
    with tempfile.TemporaryDirectory() as scratch:
        if mode == "smoke":
            index, queries = smoke(Path(scratch) / "index")
        else:
            blocks, query_file = prepare(CACHE / "data", PASSAGES[mode])
            index = encode(blocks, CACHE / "index", **ENGINE)
            index = index.save(CACHE / f"run-{mode}", overwrite=True)  # the structures below stay out of the cache
            queries = cached(CACHE / f"queries-{len(index)}.npy",
                             lambda: index.embedder.embed(list(read_queries(query_file).values())))
        torch.set_num_threads(1)  # measured at one thread; the encoding above (cached, not timed) uses every core
        faiss.omp_set_num_threads(1)
        vectors = index.vectors()
        truth = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :K]  # (Q, K) exact
        figures |= {"passages": len(vectors), "queries": len(queries), "dimensions": vectors.shape[1],
                    "data": "synthetic clusters" if mode == "smoke" else "bench/ann.py prepare(): Wikipedia passages, "
                    "minilm max_length 128, onnxruntime int8 engine; queries: held-out articles' first sentences"}
        figures["libraries"] = libraries(vectors, queries, truth, mode)
        figures["encoderlab"] = ours(index, queries, truth)
        figures["peak_rss_megabytes"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        default = figures["encoderlab"][1]
        goals = [goal("recall@10 against exact, --ann hnsw defaults", default["recall_at_10"], 0.98),
                 goal("query search latency p50 at one thread, --ann hnsw defaults (ms)", default["p50_ms"], 2.0,
                      at_most=True)]
        path = write_results(args, "ann", figures, goals)  # written again with SQuAD's part: a long run keeps this
        if mode != "smoke" and not args.no_squad and SQUAD.is_file():
            figures["squad"] = squad(CACHE)
            path = write_results(args, "ann", figures, goals)
    for row in figures["encoderlab"]:
        print(f"{row['structure']:<24} recall@10 {row['recall_at_10']:.4f}  p50 {row['p50_ms']:.3f} ms  p99 "
              f"{row['p99_ms']:.3f} ms  {row['megabytes']} MB")
    for row in goals:
        print(f"{'met ' if row['met'] else 'MISS'} {row['what']}: {row['value']} (target {row['target']})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
