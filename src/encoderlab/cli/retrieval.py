"""`encoderlab index`, `search` and `evaluate retrieval` (docs/retrieval.md): the command line of
encoderlab.retrieval. The corpus, the output folder, the index's model and the queries are checked here, torch-free,
before any model loads; a bad input exits 2 with one line and writes nothing."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from encoderlab.cards import FusionOptions, SearchOptions, given
from encoderlab.cli.options import (PROGRESS, add_fields, add_inference_options, add_json, add_model, add_options,
                                    add_overwrite, load_pipeline)
from encoderlab.errors import InputError
from encoderlab.io import check_out_folder
from encoderlab.retrieval.corpus import read_documents, read_qrels, read_queries, scan
from encoderlab.retrieval.fusion import fuse
from encoderlab.retrieval.meta import (EF_CONSTRUCTION, EF_SEARCH, HNSW_M, INDEX_FILE, MULTIVECTOR, OWN,
                                       PIPELINE_OF_KIND, SHARDS, check_model, index_bytes, index_kind,
                                       model_index_kind, own_model, query_settings, read_meta, require_complete)

ANN_KINDS = ("hnsw",)  # encoderlab.retrieval.ann's, which loads faiss
QUANTIZE = ("int8", "binary")

SNIPPET = 160  # characters of a hit's text shown


# ---- index ------------------------------------------------------------------------------------------------------
def cmd_index(args: argparse.Namespace) -> dict[str, Any] | None:
    """Embed a corpus into an index folder of vector shards (and a BM25 index with --bm25, an HNSW index with --ann
    hnsw, quantised vectors with --quantize); without --corpus, add --ann/--quantize to the index at --out. Under
    torchrun, each rank its share of the shards, rank 0 printing the summary."""
    if args.corpus is None:
        return cmd_index_ann(args)
    if args.dimensions is not None and args.dimensions < 1:
        raise InputError(f"--dimensions {args.dimensions}: expected a positive number")
    if args.shard_size < 1:
        raise InputError(f"--shard-size {args.shard_size}: expected a positive number")
    if args.stride is not None and args.stride < 0:
        raise InputError(f"--stride {args.stride}: expected 0 or more tokens shared by neighbouring windows")
    if args.add:
        meta = read_meta(args.out)
        require_complete(args.out, meta)
        check_model(args.out, meta, args.model)
        check_new_ids(args.corpus, Path(args.out))
        read_as_built(args, meta)
    else:
        if (Path(args.out) / INDEX_FILE).is_file() and not (args.overwrite or args.resume):
            raise InputError(f"--out {args.out} holds an index: pass --add to append the corpus's documents, "
                             f"--resume to finish a build that was cut off, or --overwrite to build it again")
        check_out_folder(args.out, args.overwrite, args.resume, own=OWN if args.resume else (),
                         inputs=[args.corpus, args.model])
    if args.ann or args.quantize:  # checked before the model loads (binary's dimensions: once it has)
        ann_settings(args, 8)
    if args.token_pooling < 1:
        raise InputError(f"--token-pooling {args.token_pooling}: expected a positive factor (1: no pooling)")
    count = scan(args.corpus)  # a bad line, a duplicate id or an empty corpus: refused before the model loads
    if model_index_kind(args.model) == MULTIVECTOR:
        return index_multivector(args, count)
    if args.residual_bits is not None:
        raise InputError(f"--residual-bits {args.residual_bits}: --model {args.model} makes one vector a document; "
                         f"residual compression is a ColBERT model's index's (--quantize int8 or binary for this one)")
    from encoderlab.engine import check_stride
    from encoderlab.retrieval.distributed import join
    from encoderlab.retrieval.index import Index
    from encoderlab.train.distributed import teardown

    ranks = join(args.device)  # after the checks: every rank ran them on the same files
    args.device = str(ranks.device) if ranks.world_size > 1 else args.device
    embedder = document_encoder(args)
    check_stride(args.stride, embedder.max_length, embedder.tokenizer.num_special_tokens())  # before any file
    started = time.perf_counter()
    if args.add:
        index = Index(args.out, embedder)
        if args.ann or args.quantize:  # the add rebuilds the structure over every vector, as now asked
            index.meta["ann"] = ann_settings(args, index.meta["dimensions"])
        index.add(args.corpus, progress=not args.no_progress, ranks=ranks)
    else:
        index = Index.build(args.model, args.corpus, args.out, embedder=embedder, bm25=args.bm25,
                            shard_size=args.shard_size, overwrite=args.overwrite, resume=args.resume,
                            progress=not args.no_progress, ann_kind=args.ann, quantize=args.quantize,
                            hnsw=hnsw_options(args), ranks=ranks)
    seconds = time.perf_counter() - started
    teardown()
    if not ranks.is_main:  # rank 0 reports
        return None
    meta = index.meta
    summary = {"index": str(args.out), "kind": meta["kind"], "documents": len(index), "added": count,
               "shards": len(index.shards), "dimensions": meta["dimensions"], "similarity": meta["similarity"],
               "bm25": meta["bm25"], "ann": meta.get("ann"), "max_length": meta["max_length"],
               "stride": meta.get("stride"), "bytes": index_bytes(args.out),
               "seconds": round(seconds, 2), "documents_per_second": round(count / seconds, 1),
               "ranks": ranks.world_size}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        made = f"{meta['pooling']} pooling, " if meta["kind"] == "dense" else "sparse: an inverted index, "
        print(f"wrote {args.out}: {len(index)} documents in {len(index.shards)} shard(s), {meta['dimensions']} "
              f"dimensions ({made}{meta['similarity']}), {summary['bytes'] / 1e6:.2f} MB of vectors"
              f"{', BM25' if meta['bm25'] else ''}; {count} embedded at {summary['documents_per_second']} "
              f"documents/s{ann_text(meta.get('ann'))}{stride_text(meta)}")
    return summary


def index_multivector(args: argparse.Namespace, count: int) -> dict[str, Any]:
    """`index` with a ColBERT folder: a multi-vector index (encoderlab.retrieval.multivector)."""
    if args.ann or args.quantize:
        raise InputError(f"--model {args.model} is a ColBERT model: its multivector index takes neither --ann nor "
                         f"--quantize (it always builds its own candidate stage: PLAID's centroids and a code per "
                         f"token; --residual-bits 1, 2 or 4 compresses its vectors)")
    from encoderlab.retrieval.multivector import Encoder, MultiVectorIndex

    started = time.perf_counter()
    # --add: the new shards, then the centroids and codes again over every shard (a compressed index keeps its
    # centroids: the new tokens are coded and their residuals packed against them)
    if args.add:
        meta = read_meta(args.out)
        if args.residual_bits is not None:
            raise InputError(f"--residual-bits {args.residual_bits}: --add keeps the index's storage (leave it out)")
        index = MultiVectorIndex(args.out, Encoder(args.model, meta["token_pooling"], args.batch_size or 32,
                                                   args.device, args.max_length, args.stride))
        index.add(args.corpus, progress=not args.no_progress)
    else:
        index = MultiVectorIndex.build(args.model, args.corpus, args.out, token_pooling=args.token_pooling,
                                       shard_size=args.shard_size, overwrite=args.overwrite, resume=args.resume,
                                       progress=not args.no_progress, batch_size=args.batch_size or 32,
                                       device=args.device, bm25=args.bm25, max_length=args.max_length,
                                       stride=args.stride, residual_bits=args.residual_bits)
    seconds = time.perf_counter() - started
    meta = index.meta
    summary = {"index": str(args.out), "kind": MULTIVECTOR, "documents": len(index), "added": count,
               "tokens": meta["tokens"], "centroids": meta["centroids"], "bm25": meta["bm25"],
               "max_length": meta["max_length"], "stride": meta.get("stride"),
               "dimensions": meta["dimensions"], "token_pooling": meta["token_pooling"],
               "residual_bits": meta.get("residual_bits"), "bytes_per_document": meta["bytes_per_document"],
               "seconds": round(seconds, 2)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"wrote {args.out}: {len(index)} documents, {meta['tokens']} token vectors of {meta['dimensions']} "
              f"dimensions ({stored_as(meta)}, token pooling {meta['token_pooling']}, {meta['centroids']} centroids), "
              f"{meta['bytes_per_document']:.0f} bytes per document{', BM25' if meta['bm25'] else ''}, in "
              f"{seconds:.1f} s{stride_text(meta)}")
    return summary


def stored_as(meta: dict[str, Any]) -> str:
    """How the summary names a multivector index's storage of its token vectors."""
    bits = meta.get("residual_bits")
    return f"{bits}-bit residuals of their centroids" if bits else meta["dtype"]


def stride_text(meta: dict[str, Any]) -> str:
    """The summary's note of how long documents were read (nothing where they were truncated)."""
    stride = meta.get("stride")
    return "" if stride is None else (f"; documents longer than {meta['max_length']} tokens read whole, in windows "
                                      f"sharing {stride}")


def read_as_built(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    """--add: the new documents are read in the index's window and stride (args take them); InputError where
    --max-length or --stride asks for others."""
    for flag, key in (("--max-length", "max_length"), ("--stride", "stride")):
        built, given = meta.get(key), getattr(args, key)
        if given is not None and given != built:
            read = f"with {flag} {built}" if built is not None else f"without {flag}"
            raise InputError(f"{flag} {given}: --out {args.out} holds documents read {read}; --add reads the new "
                             f"ones the same way (leave it out)")
        setattr(args, key, built)


def document_encoder(args: argparse.Namespace) -> Any:
    """The pipeline that encodes --model's documents: Embed (with --dimensions, --normalize, --pooling), or Splade
    for a SPLADE folder (which takes none of them)."""
    kind = model_index_kind(args.model)
    if kind != "dense":
        given = [flag for flag, value in (("--dimensions", args.dimensions), ("--pooling", args.pooling),
                                          ("--normalize", args.normalize)) if value]
        if given:
            raise InputError(f"{', '.join(given)}: --model {args.model} makes {kind} vectors, which take none")
        return load_pipeline(PIPELINE_OF_KIND[kind], args, stride=args.stride)
    return load_pipeline("embed", args, dimensions=args.dimensions, normalize=args.normalize, stride=args.stride,
                         **({"pooling": args.pooling} if args.pooling else {}))


def ann_settings(args: argparse.Namespace, dimensions: int) -> dict[str, Any]:
    """index.json's "ann" record from --ann, --quantize, --hnsw-m, --ef-construction and --ef-search, checked."""
    from encoderlab.retrieval import ann

    return ann.settings(args.ann, args.quantize, dimensions, **hnsw_options(args))


def hnsw_options(args: argparse.Namespace) -> dict[str, int]:
    """--hnsw-m, --ef-construction and --ef-search as ann.settings takes them."""
    return {"m": args.hnsw_m, "ef_construction": args.ef_construction, "ef_search": args.ef_search}


def ann_text(settings: dict[str, Any] | None) -> str:
    """How the summary line names the ann structure ("" without one)."""
    if not settings:
        return ""
    quantized = f" over {settings['quantize']} vectors, candidates rescored" if settings["quantize"] else ""
    graph = f"HNSW (M {settings['m']}, ef_search {settings['ef_search']})" if settings["kind"] == "hnsw" else \
        "exact search"
    return f"; {graph}{quantized}"


def cmd_index_ann(args: argparse.Namespace) -> dict[str, Any]:
    """Build --ann/--quantize's structure over the vectors of the finished index at --out (no --corpus)."""
    if not (args.ann or args.quantize):
        raise InputError("--corpus FILE is required, unless --ann or --quantize adds a search structure to the "
                         "finished index at --out")
    if not (Path(args.out) / INDEX_FILE).is_file():
        raise InputError(f"--out {args.out}: no {INDEX_FILE} there: --ann/--quantize without --corpus adds a search "
                         f"structure to a finished index (build one with --corpus FILE)")
    meta = read_meta(args.out)
    require_complete(args.out, meta)
    check_model(args.out, meta, args.model)
    ann_settings(args, meta["dimensions"])  # checked before torch loads
    from encoderlab.retrieval.index import Index

    started = time.perf_counter()
    index = Index(args.out)
    index.build_ann(args.ann, args.quantize, **hnsw_options(args))
    summary = {"index": str(args.out), "documents": len(index), "ann": index.meta["ann"],
               "seconds": round(time.perf_counter() - started, 2)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"wrote {args.out}/ann: {len(index)} documents{ann_text(index.meta['ann'])}, built in "
              f"{summary['seconds']} s")
    return summary


def check_new_ids(corpus: str, folder: Path) -> None:
    """InputError for a document of `corpus` whose id the index at `folder` holds already (--add)."""
    known = {i for path in sorted((folder / SHARDS).glob("*.ids.json"))
             for i in json.loads(path.read_text(encoding="utf-8"))}
    for document in read_documents(corpus):
        if document.id in known:
            raise InputError(f"{document.where}: id {document.id!r} is in the index {folder} already (--add appends "
                             f"new documents only)")


# ---- search -----------------------------------------------------------------------------------------------------
def fusion_options(args: argparse.Namespace) -> dict[str, Any]:
    """Hybrid's fusion options from the command line (add_fusion_options; their bounds checked as it parsed)."""
    return asdict(given(FusionOptions, vars(args)))


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """search()'s options from the command line (add_search_options; --top-k by cli.options.check_counts)."""
    return asdict(given(SearchOptions, vars(args)))


def open_index(args: argparse.Namespace, folder: str) -> Any:
    """The index at `folder`, its query encoder loaded as the command line asks (the index's model unless --model,
    which must be the same model), the reranker given as args.rerank."""
    from encoderlab.retrieval.index import Index

    meta = read_meta(folder)
    if index_kind(meta) == MULTIVECTOR:
        from encoderlab.retrieval.multivector import MultiVectorIndex

        return MultiVectorIndex(folder)
    embedder = None
    if args.mode != "bm25":
        given = argparse.Namespace(**{**vars(args), "model": args.model or meta["model"]["path"]})
        kind = index_kind(meta)
        embedder = load_pipeline("embed", given, **query_settings(meta)) if kind == "dense" else \
            load_pipeline(PIPELINE_OF_KIND[kind], given, **({} if args.max_length else {"max_length": meta["max_length"]}))
    return Index(folder, embedder)


def check_index(args: argparse.Namespace, folder: str) -> None:
    """A finished index, searched with its own model, with BM25 where the mode needs it; before torch loads."""
    meta = read_meta(folder)
    require_complete(folder, meta)
    check_model(folder, meta, args.model)
    if args.model is None and args.mode != "bm25":
        own_model(folder, meta)  # its queries go through the model at its recorded path: unchanged since the build
    if args.mode != "dense" and not meta["bm25"]:
        raise InputError(f"--mode {args.mode}: --index {folder} has no BM25 index (build it with `encoderlab index "
                         f"--bm25`)")


def cmd_search(args: argparse.Namespace) -> list[list[dict[str, Any]]]:
    """Search an index for queries (arguments, or --queries FILE): dense, BM25 or hybrid, optionally reranked."""
    options = search_options(args)
    check_index(args, args.index)
    if args.texts and args.queries:
        raise InputError("give queries as arguments or with --queries FILE, not both")
    if args.out and not args.queries:
        raise InputError("--out writes a TREC run of --queries FILE: pass --queries")
    queries = read_queries(args.queries) if args.queries else {str(n): q for n, q in enumerate(args.texts, 1)}
    if not queries or any(not q.strip() for q in queries.values()):
        raise InputError("no query: pass one or more QUERY arguments (not empty), or --queries FILE")
    index = open_index(args, args.index)
    reranker = load_pipeline("rerank", argparse.Namespace(**{**vars(args), "model": args.rerank})) \
        if args.rerank else None
    results = index.search(list(queries.values()), args.top_k, rerank=reranker, **options)
    if args.out:
        from encoderlab.retrieval.metrics import write_run

        write_run(args.out, {q: {h["id"]: h["score"] for h in hits} for q, hits in zip(queries, results)}, args.tag)
        print(f"wrote {args.out}: {len(queries)} queries x {args.top_k} hits (TREC run format)", file=sys.stderr)
    elif args.json:
        print(json.dumps([{"query_id": q, "query": text, "hits": hits}
                          for (q, text), hits in zip(queries.items(), results)], indent=2, ensure_ascii=False))
    else:
        for (q, text), hits in zip(queries.items(), results):
            print(f"query {q}: {text}")
            for rank, hit in enumerate(hits, 1):
                title = f"{hit['title']}: " if hit["title"] else ""
                snippet = " ".join(hit["text"].split())
                snippet = snippet[:SNIPPET] + ("..." if len(snippet) > SNIPPET else "")
                print(f"{rank:3d}. {hit['score']:.4f}  [{hit['id']}] {title}{snippet}")
    return results


# ---- evaluate retrieval -----------------------------------------------------------------------------------------
def cmd_evaluate_retrieval(args: argparse.Namespace) -> dict[str, Any]:
    """Score an index (or --model, indexed on the fly) on a BEIR folder: nDCG@10, MRR@10, Recall@10/100, MAP@100."""
    options = search_options(args)
    if args.fuse:
        return evaluate_fused(args, options)
    args.batch_size = args.batch_size or 32  # evaluate's default is the task's; retrieval's is embed's
    if not (args.index or args.model):
        raise InputError("evaluate retrieval needs --index DIR (an index of the data's corpus), or --model M to "
                         "index --data's corpus.jsonl on the fly")
    from encoderlab.retrieval.evaluation import BeirFolder

    data = BeirFolder.of(args.data, args.split)
    if args.index:
        check_index(args, args.index)
    else:
        scan(data.corpus)
    read_queries(data.queries)
    with tempfile.TemporaryDirectory(prefix="encoderlab-index-") as scratch:
        folder = args.index or str(Path(scratch) / "index")
        if not args.index and model_index_kind(args.model) == MULTIVECTOR:
            from encoderlab.retrieval.multivector import MultiVectorIndex

            MultiVectorIndex.build(args.model, data.corpus, folder, progress=not args.no_progress,
                                   batch_size=args.batch_size, device=args.device, bm25=args.mode != "dense")
        elif not args.index:
            from encoderlab.retrieval.index import Index

            args.dimensions = args.normalize = None  # evaluate's embedder: the model's own vectors
            embedder = document_encoder(args)
            Index.build(args.model, data.corpus, folder, embedder=embedder, bm25=args.mode != "dense",
                        progress=not args.no_progress)
        result = evaluate_folder(args, folder, data, options)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"retrieval on {args.data} ({result['queries']} queries, {result['documents']} documents, "
              f"{args.mode}): " + ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))
    return result


def evaluate_fused(args: argparse.Namespace, options: dict[str, Any]) -> dict[str, Any]:
    """Score the fusion of two TREC runs (--fuse A B, e.g. a dense and a BM25 run of `search --out`) on --data's
    qrels, by the hybrid options; no model loads."""
    from encoderlab.retrieval.evaluation import BeirFolder
    from encoderlab.retrieval.metrics import evaluate, read_run, write_run

    qrels = read_qrels(BeirFolder.of(args.data, args.split).qrels)
    first, second = (read_run(path) for path in args.fuse)
    ranked = lambda hits: sorted(hits.items(), key=lambda item: -item[1])[:max(100, args.top_k)]  # noqa: E731
    fused = {q: dict(fuse(ranked(first.get(q, {})), ranked(second.get(q, {})), options["fusion"], options["alpha"],
                          options["rrf_k"], options["normalisation"])[:max(100, args.top_k)])
             for q in {**first, **second}}
    if args.run:
        write_run(args.run, fused, args.tag)
    result = {"data": str(args.data), "split": args.split, "fused": [str(p) for p in args.fuse],
              "fusion": {k: options[k] for k in ("fusion", "alpha", "rrf_k", "normalisation")},
              "metrics": evaluate(qrels, fused, not args.keep_identical_ids), "queries": len(qrels)}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"fusion of {' and '.join(result['fused'])} on {args.data} ({len(qrels)} queries, {options['fusion']}): "
              + ", ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))
    return result


def evaluate_folder(args: argparse.Namespace, folder: str, data: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The metrics of the index at `folder`; the run written to --run if asked."""
    from encoderlab.retrieval.evaluation import evaluate_index
    from encoderlab.retrieval.metrics import write_run

    index = open_index(args, folder)
    reranker = load_pipeline("rerank", argparse.Namespace(**{**vars(args), "model": args.rerank})) \
        if args.rerank else None
    result, run = evaluate_index(index, data, max(100, args.top_k), not args.keep_identical_ids, rerank=reranker,
                                 **options)
    if args.run:
        write_run(args.run, run, args.tag)
    return {"data": str(args.data), "split": args.split, "mode": args.mode, "model": index.meta["model"]["name"]} | \
        result


# ---- parser -----------------------------------------------------------------------------------------------------
def add_search_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, top_k: int) -> None:
    """--mode, --exact, the fusion's, --rerank, --rerank-top (SearchOptions' fields), --top-k, --tag."""
    add_fields(parser, SearchOptions, ("mode", "exact"))
    add_fusion_options(parser)
    add_options(parser, (
        ("--rerank", None, None, "M", "reorder the best hits with this cross-encoder (encoderlab finetune rerank)"),))
    add_fields(parser, SearchOptions, ("rerank_top",))
    add_options(parser, (
        ("--top-k", int, top_k, "K", f"hits per query (default: {top_k})"),
        ("--tag", None, "encoderlab", "TAG", "the run's tag, its last column (default: encoderlab)")))


def add_fusion_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--fusion, --normalisation, --alpha, --rrf-k (FusionOptions' fields): how hybrid fuses its two rankings."""
    add_fields(parser, FusionOptions)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `index` and `search` (`evaluate retrieval` joins `evaluate`: add_evaluate_options)."""
    index = subparsers.add_parser("index", help="embed a corpus into a searchable index folder",
                                  description=cmd_index.__doc__)
    add_model(index)
    index.add_argument("--corpus", metavar="FILE", help="BEIR corpus.jsonl (_id, title, text), a TSV/CSV with id and "
                       "text columns, Parquet, or one text per line (ids: line numbers); left out with --ann or "
                       "--quantize: build that structure for the finished index at --out")
    index.add_argument("--out", required=True, metavar="DIR", help="the index folder")
    index.add_argument("--pooling", choices=("mean", "cls"), default=None, help="default: the model's")
    index.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="L2-normalise the vectors (default: as the model says)")
    add_options(index, (
        ("--dimensions", int, None, "D", "keep each vector's first D dimensions, normalised again (a Matryoshka "
         "model) (default: all)"),
        ("--bm25", bool, None, None, "also build a BM25 index (bm25s) for --mode bm25 and hybrid"),
        ("--shard-size", int, 10_000, "N", "documents per shard, the unit of resuming (default: 10000)"),
        ("--stride", int, None, "N", "read a document longer than --max-length whole, in windows sharing N tokens: "
         "a dense vector is their vectors' mean, SPLADE weights their max, ColBERT every window's token vectors "
         "(default: truncate it)"),
        ("--token-pooling", int, 1, "F", "a ColBERT model's index: cluster each document's token vectors into 1/F "
         "as many (hierarchical, as PyLate's token pooling) (default: 1, none)"),
        ("--residual-bits", int, None, "B", "a ColBERT model's index: store each token vector as its centroid's "
         "code and its residual in B bits a dimension (1, 2 or 4; ColBERTv2's compression; about 16/B times "
         "smaller) (default: float16 vectors)"),
        ("--add", bool, None, None, "append the corpus's documents to the index at --out (their ids must be new)"),
        ("--resume", bool, None, None, "finish an index whose build was cut off, from its first unfinished shard"),
        PROGRESS))
    index.add_argument("--ann", choices=ANN_KINDS, default=None, help="also build an approximate index over the "
                       "vectors, which search then uses (--exact skips it): hnsw, faiss's HNSW graph")
    index.add_argument("--quantize", choices=QUANTIZE, default=None, help="search int8 (a byte a dimension) or "
                       "binary (a bit) codes of the vectors, candidates rescored by the float32 vectors; with --ann "
                       "hnsw the graph holds the codes")
    add_options(index, (
        ("--hnsw-m", int, HNSW_M, "M", f"--ann hnsw: links per node (default: {HNSW_M})"),
        ("--ef-construction", int, EF_CONSTRUCTION, "N", f"--ann hnsw: candidates kept while linking (default: "
         f"{EF_CONSTRUCTION})"),
        ("--ef-search", int, EF_SEARCH, "N", f"--ann hnsw: candidates kept while searching, recorded in index.json "
         f"(default: {EF_SEARCH})")))
    add_overwrite(index)
    add_inference_options(index)
    add_json(index, "print a summary as JSON")
    index.set_defaults(func=cmd_index)

    search = subparsers.add_parser("search", help="search an index: dense, BM25 or hybrid, optionally reranked",
                                   description=cmd_search.__doc__)
    search.add_argument("texts", nargs="*", metavar="QUERY", help="queries (or --queries FILE)")
    search.add_argument("--index", required=True, metavar="DIR", help="an index folder (encoderlab index)")
    search.add_argument("--model", default=None, metavar="M", help="the query encoder: must be the index's model "
                        "(default: the index's model)")
    add_options(search, (
        ("--queries", None, None, "FILE", "BEIR queries.jsonl, a TSV of id and text, or one query a line"),
        ("--out", None, None, "RUN", "write a TREC run (qid Q0 docid rank score tag) of --queries to RUN")))
    add_search_options(search, 10)
    add_inference_options(search, progress=True)
    add_json(search, "print the hits as JSON")
    search.set_defaults(func=cmd_search)


def add_evaluate_options(parser: argparse.ArgumentParser) -> None:
    """`evaluate retrieval`'s own options, on the evaluate parser (encoderlab.cli.finetune)."""
    group = parser.add_argument_group("retrieval (evaluate retrieval --data BEIR_DIR)")
    group.add_argument("--index", default=None, metavar="DIR", help="the index of --data's corpus (or --model: "
                       "indexed on the fly)")
    group.add_argument("--fuse", nargs=2, default=None, metavar="RUN", help="score the fusion of two TREC runs "
                       "(e.g. `search --out` of a dense and a BM25 search) by --fusion and its options; no model")
    add_options(group, (
        ("--split", None, "test", "NAME", "the qrels file, qrels/NAME.tsv (default: test)"),
        ("--run", None, None, "FILE", "also write the run (TREC format), e.g. for fusion with other runs"),
        ("--keep-identical-ids", bool, None, None, "count hits whose doc id equals the query id (BEIR drops them)"),
        PROGRESS))
    add_search_options(group, 100)
    parser.set_defaults(engine="torch", engine_cache=None, compile=False)
