"""Late interaction (encoderlab.tasks.colbert, encoderlab.retrieval.multivector): MaxSim against numpy, query
expansion, the document-only skiplist, a loss that falls, the multi-vector index against brute-force MaxSim, bad
input and the kind refusal, and the saved folder in sentence-transformers' MultiVectorEncoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from test_tasks_finetune import CITIES, FILLER, NAMES, write_tiny_encoder

from encoderlab.cli import main
from encoderlab.checkpoint import load_model, save_pretrained
from encoderlab.errors import InputError
from encoderlab.folder import settings
from encoderlab.infer.pipelines import pipeline
from encoderlab.tasks.colbert import (QUERY_LENGTH, ColbertModel, ColbertTask, TokenEncoder, load_colbert, marker_id,
                                      maxsim, query_ids, score_texts)
from encoderlab.tasks.readers import TextExample
from encoderlab.tokenizer import Tokenizer
from encoderlab.retrieval.multivector import (BUCKETS, MultiVectorIndex, byte_values, centroid_maxsim, compress_shards,
                                             decompress, kmeans, nearest, pack_residuals, partitions, pool_tokens,
                                             residual_buckets, sample_rows)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def write_tiny_encoder_with_markers(folder: Path) -> Path:
    """A random 2-layer, 32-wide encoder whose vocabulary has ColBERT's markers."""
    words = FILLER + NAMES + CITIES + ["lives", "in", "where", "does", "?", ".", ",", "[unused0]", "[unused1]"]
    return write_tiny_encoder(folder, words)


def write_tiny_colbert(encoder: Path, folder: Path) -> Path:
    """The encoder under a fresh 16-wide projection (seed 0), saved as a ColBERT folder."""
    torch.manual_seed(0)
    ColbertModel(load_model(encoder, kind="base"), 16).save_folder(
        folder, Tokenizer.from_pretrained(encoder), {"task": "colbert", "max_length": 32})
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_tiny_encoder_with_markers(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tiny_colbert(tiny, tmp_path_factory) -> Path:
    return write_tiny_colbert(tiny, tmp_path_factory.mktemp("colbert"))


CORPUS = [f"{name} lives in {city} , {filler} ." for name in NAMES for city in CITIES for filler in FILLER[:2]]


def test_maxsim_equals_numpy():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(3, 5, 4)), rng.normal(size=(4, 6, 4))
    qm, dm = rng.random((3, 5)) > 0.3, rng.random((4, 6)) > 0.3
    qm[:, 0] = dm[:, 0] = True
    want = np.array([[sum(max(q[a, s] @ d[b, t] for t in range(6) if dm[b, t]) for s in range(5) if qm[a, s])
                      for b in range(4)] for a in range(3)])
    got = maxsim(*(torch.from_numpy(x) for x in (q, qm, d, dm)))
    assert_close(got, torch.from_numpy(want))


def test_query_expansion_pads_with_mask_and_cuts(tiny):
    tokenizer = Tokenizer.from_pretrained(tiny)
    short, long = query_ids(tokenizer, ["where does anna live ?", " ".join(["paris"] * 60)])
    assert len(short) == len(long) == QUERY_LENGTH
    assert short[:2] == [tokenizer.cls_id, marker_id(tokenizer, "query")]
    real = len(tokenizer.encode("where does anna live ?")) + 1  # and the marker
    assert short[real:] == [tokenizer.mask_id] * (QUERY_LENGTH - real) and tokenizer.mask_id not in short[:real]
    assert long[-1] == tokenizer.sep_id and tokenizer.mask_id not in long


def test_skiplist_drops_punctuation_of_documents_only(tiny):
    tokenizer = Tokenizer.from_pretrained(tiny)
    encoder = TokenEncoder(load_colbert(tiny), tokenizer, 32)
    with_marks, without = encoder.encode(["anna lives in paris , it ?", "anna lives in paris it"], "document")
    assert len(with_marks) == len(without) == len(tokenizer.encode("anna lives in paris it")) + 1
    (query,) = encoder.encode(["anna lives in paris , it ?"], "query")
    assert len(query) == QUERY_LENGTH  # a query keeps its punctuation and its [MASK]s
    assert_close(with_marks.norm(dim=-1), torch.ones(len(with_marks)))


@pytest.mark.slow
def test_training_lowers_the_contrastive_loss(tiny):
    torch.manual_seed(0)
    tokenizer = Tokenizer.from_pretrained(tiny)
    rows = [TextExample((f"where does {n} live ?", f"{n} lives in {c} .", f"{m} lives in {c} ."), None, f"row {i}")
            for i, (n, c, m) in enumerate(zip(NAMES, CITIES, NAMES[1:] + NAMES[:1]))]
    task = ColbertTask(tokenizer, 32, dim=16)
    batch = task.collate(task.features(rows))
    model = ColbertModel(load_model(tiny, kind="base"), 16).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        [term] = task.loss(model, batch).values()  # the contrastive term alone (no teacher)
        loss = term.total / term.count
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_pooling_shrinks_and_keeps_unit_vectors():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(10, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    pooled = pool_tokens(vectors, 2)
    assert pooled.shape == (5, 8)
    assert np.allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)


def test_index_search_equals_brute_force_maxsim(tiny_colbert, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS)))
    index = MultiVectorIndex.build(tiny_colbert, corpus, tmp_path / "index", shard_size=10, progress=False)
    assert len(index.shards) == 4 and index.meta["kind"] == "multivector" and index.meta["bytes_per_document"] > 0
    queries = ["where does anna live ?", "who lives in oslo ?"]
    brute = score_texts(index.embedder.tokens, queries, CORPUS)  # (2, 32)
    for exact in (True, False):
        hits = index.search(queries, top_k=5, exact=exact)
        for row, ranked in zip(brute, hits):
            want = row.topk(5)
            # the best 5 scores, each the brute-force score of the hit's document (near ties may swap: float16)
            got = torch.tensor([h["score"] for h in ranked])
            assert_close(got, want.values, atol=1e-2, rtol=0)
            assert_close(got, row[[int(h["id"][1:]) for h in ranked]], atol=1e-2, rtol=0)


def test_centroid_interaction_is_maxsim_with_each_token_as_its_centroid():
    """PLAID's stage 2 over a pool of documents (one of them without tokens) equals MaxSim computed the long way with
    every document token replaced by its centroid."""
    rng = np.random.default_rng(0)
    unit = lambda a: (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)  # noqa: E731
    tokens, centroids = unit(rng.normal(size=(40, 8))), unit(rng.normal(size=(6, 8)))
    query = unit(rng.normal(size=(5, 8)))
    offsets = np.array([0, 7, 7, 19, 30, 40])  # document 1 has no tokens
    codes = nearest(tokens, centroids)
    assert (codes == (tokens @ centroids.T).argmax(1)).all()
    pool = np.array([0, 1, 3, 4])
    got = centroid_maxsim(query @ centroids.T, codes, offsets, pool)
    for score, d in zip(got, pool):
        replaced = centroids[codes[offsets[d]:offsets[d + 1]]]
        want = (query @ replaced.T).max(1).sum() if len(replaced) else -np.inf
        assert np.isclose(score, want, atol=1e-5), (d, score, want)
    assert partitions(161_298) == 4096 and partitions(3) == 3  # PLAID's count, at most one a token


def test_kmeans_sample_reads_the_chosen_rows_across_shards():
    """The k-means sample: rows numbered across the shards one after another, read shard by shard, as float32."""
    rng = np.random.default_rng(1)
    shards = [rng.normal(size=(n, 4)).astype(np.float16) for n in (5, 0, 7, 3)]
    chosen = np.array([0, 4, 5, 9, 11, 12, 14])
    got = sample_rows(shards, chosen)
    assert got.dtype == np.float32 and np.array_equal(got, np.concatenate(shards)[chosen].astype(np.float32))


def test_an_index_of_the_first_layout_is_refused_naming_the_fix(tiny_colbert, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS[:8])))
    index = MultiVectorIndex.build(tiny_colbert, corpus, tmp_path / "index", progress=False)
    assert index.meta["centroids"] == partitions(index.meta["tokens"])
    (tmp_path / "index" / "centroids.npy").rename(tmp_path / "index" / "tokens.faiss")
    with pytest.raises(InputError, match="an earlier encoderlab.*--overwrite"):
        MultiVectorIndex(tmp_path / "index").search(["where does anna live ?"], top_k=2)


def test_index_max_length_is_the_documents_window(tiny_colbert, tmp_path, capsys):
    """`index --max-length T` reads each document in T tokens (it was ignored for a ColBERT model); --add keeps the
    index's window and refuses another."""
    corpus = tmp_path / "corpus.jsonl"
    long = " ".join(CORPUS[:6])
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": f"{t} {long}"}) + "\n"
                              for i, t in enumerate(CORPUS[:6])))
    command = ["index", "--model", str(tiny_colbert), "--corpus", str(corpus), "--no-progress", "--json"]
    assert main([*command, "--out", str(tmp_path / "short"), "--max-length", "12"]) == 0
    assert main([*command, "--out", str(tmp_path / "long")]) == 0
    short, default = MultiVectorIndex(tmp_path / "short"), MultiVectorIndex(tmp_path / "long")
    assert short.meta["max_length"] == 12 and default.meta["max_length"] == settings(tiny_colbert).max_length
    assert np.diff(short.offsets).max() <= 12 < np.diff(default.offsets).max()
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "new", "text": long}) + "\n")
    capsys.readouterr()
    assert main([*command[:3], "--corpus", str(more), "--out", str(tmp_path / "short"), "--add",
                 "--max-length", "20"]) == 2
    assert "read with --max-length 12; --add reads the new ones the same way" in capsys.readouterr().err


def test_index_stride_keeps_every_window_of_a_long_document(tiny_colbert, tmp_path, capsys):
    """`index --stride N` reads a document longer than the window whole: its vectors are those of each marked window
    (encoded alone), in order; without it the document is cut to one window. --add refuses another stride."""
    corpus = tmp_path / "corpus.jsonl"
    texts = [" ".join(CORPUS[i:i + 3]) for i in range(4)] + ["anna ."]
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    command = ["index", "--model", str(tiny_colbert), "--corpus", str(corpus), "--max-length", "12", "--no-progress",
               "--json"]
    assert main([*command, "--out", str(tmp_path / "whole"), "--stride", "3"]) == 0
    whole = MultiVectorIndex(tmp_path / "whole")
    encoder = TokenEncoder(load_colbert(tiny_colbert), Tokenizer.from_pretrained(tiny_colbert), 12)
    tokenizer, mark = encoder.tokenizer, marker_id(encoder.tokenizer, "document")
    stored = whole.rows(np.arange(whole.offsets[-1])).astype(np.float32)
    for i, text in enumerate(texts):
        ids = tokenizer.encode(" " + text, max_length=None, truncation=False)  # the index reads title + " " + text
        content, starts = ids[1:-1], [0]  # a window: [CLS], the marker, 9 content ids at most, [SEP]
        while starts[-1] + 9 < len(content):
            starts.append(starts[-1] + 9 - 3)  # 3 ids shared with the next window
        windows = [[ids[0], mark, *content[s:s + 9], ids[-1]] for s in starts]
        expected = torch.cat([vectors[0][counted[0]] for w in windows
                              for _, vectors, counted in encoder.batches([w], "document")])
        assert_close(torch.from_numpy(stored[whole.offsets[i]:whole.offsets[i + 1]]), expected, atol=2e-3, rtol=0)
    assert np.diff(whole.offsets)[:4].min() > 12 and whole.meta["stride"] == 3
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "new", "text": texts[0]}) + "\n")
    capsys.readouterr()
    assert main([*command[:3], "--corpus", str(more), "--out", str(tmp_path / "whole"), "--add", "--stride",
                 "4"]) == 2
    assert "read with --stride 3" in capsys.readouterr().err
    assert main([*command, "--out", str(tmp_path / "wide"), "--stride", "9"]) == 2  # 12 - [CLS], marker, [SEP]
    assert "--stride 9: expected 0 to 8" in capsys.readouterr().err and not (tmp_path / "wide").exists()


def test_add_and_resume_give_the_index_one_build_gives(tiny_colbert, tmp_path, capsys):
    """`index --add` appends shards to a multivector index and `index --resume` finishes a cut-off build: each then
    searches as the index built in one go does (the centroids and codes are made again over every shard)."""
    def corpus(name: str, rows: range) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"_id": f"d{i}", "text": CORPUS[i]}) + "\n" for i in rows))
        return path

    whole, first, second = corpus("all.jsonl", range(32)), corpus("a.jsonl", range(20)), corpus("b.jsonl",
                                                                                                  range(20, 32))
    command = ["index", "--model", str(tiny_colbert), "--shard-size", "10", "--no-progress", "--json"]
    assert main([*command, "--corpus", str(whole), "--out", str(tmp_path / "one")]) == 0
    assert main([*command, "--corpus", str(first), "--out", str(tmp_path / "two")]) == 0
    assert main([*command, "--corpus", str(second), "--out", str(tmp_path / "two"), "--add"]) == 0
    assert main([*command, "--corpus", str(whole), "--out", str(tmp_path / "cut")]) == 0
    capsys.readouterr()
    cut = tmp_path / "cut"  # as a build stopped while writing its fourth shard: no centroids, not complete
    (cut / "shards" / "00003.npy").unlink()
    (cut / "centroids.npy").unlink()
    (cut / "codes.npy").unlink()
    meta = json.loads((cut / "index.json").read_text())
    (cut / "index.json").write_text(json.dumps(meta | {"complete": False}))
    assert main([*command, "--corpus", str(whole), "--out", str(cut)]) == 2  # not without --resume
    assert "--resume" in capsys.readouterr().err
    assert main([*command, "--corpus", str(whole), "--out", str(cut), "--resume", "--token-pooling", "2"]) == 2
    assert "token_pooling differ" in capsys.readouterr().err  # a resume keeps the settings the build began with
    assert main([*command, "--corpus", str(whole), "--out", str(cut), "--resume"]) == 0
    queries = ["where does anna live ?", "who lives in oslo ?"]
    want = MultiVectorIndex(tmp_path / "one").search(queries, top_k=5)
    for folder in ("two", "cut"):
        opened = MultiVectorIndex(tmp_path / folder)
        assert len(opened) == 32 and len(opened.shards) == 4
        got = opened.search(queries, top_k=5)
        for mine, theirs in zip(got, want):
            assert_close(torch.tensor([h["score"] for h in mine]), torch.tensor([h["score"] for h in theirs]),
                         atol=1e-3, rtol=0)


def test_packed_residuals_unpack_to_their_buckets_values():
    """pack_residuals then byte_values' table gives each dimension the value of the bucket its residual falls in,
    found here by comparing with every cutoff; more bits, a closer value."""
    rng = np.random.default_rng(0)
    residuals = rng.normal(scale=0.1, size=(50, 16)).astype(np.float32)
    errors = []
    for bits in (1, 2, 4):
        buckets = residual_buckets(residuals, bits)
        assert buckets.shape == (2, 2 ** bits) and np.all(np.diff(buckets[0]) > 0) and np.all(np.diff(buckets[1]) > 0)
        packed = pack_residuals(residuals, buckets[0, :-1], bits)
        assert packed.shape == (50, 16 * bits // 8) and packed.dtype == np.uint8
        unpacked = byte_values(buckets[1], bits)[packed].reshape(50, 16)
        want = buckets[1][(residuals[..., None] > buckets[0, :-1]).sum(-1)]
        np.testing.assert_array_equal(unpacked, want)
        errors.append(np.abs(unpacked - residuals).mean())
    assert errors[0] > errors[1] > errors[2]


def test_compressed_tokens_come_back_closer_with_more_bits(tmp_path):
    """Shards of unit vectors around 8 centroids, compressed at 1, 2 and 4 bits a dimension, decompress to unit
    vectors nearer the originals than their centroids are, and nearer with more bits."""
    rng = np.random.default_rng(0)
    shards = [rng.normal(size=(n, 16)).astype(np.float32) for n in (300, 212)]
    shards = [s / np.linalg.norm(s, axis=1, keepdims=True) for s in shards]
    centroids = kmeans(shards, 8)
    codes = np.concatenate([nearest(s, centroids) for s in shards])
    originals = np.concatenate(shards)
    baseline = (originals * centroids[codes]).sum(1).mean()
    cosines = []
    for bits in (1, 2, 4):
        folder = tmp_path / str(bits)
        (folder / "shards").mkdir(parents=True)
        for name, shard in zip(("00000", "00001"), shards):
            np.save(folder / "shards" / f"{name}.npy", shard.astype(np.float16))
        compress_shards(folder, ["00000", "00001"], centroids, codes, bits)
        packed = np.concatenate([np.load(folder / "shards" / f"{n}.npy") for n in ("00000", "00001")])
        assert packed.dtype == np.uint8 and packed.shape == (512, 2 * bits)
        back = decompress(packed, centroids[codes], byte_values(np.load(folder / BUCKETS)[1], bits))
        assert np.allclose(np.linalg.norm(back, axis=1), 1, atol=1e-5)
        cosines.append((originals * back).sum(1).mean())
    assert baseline < cosines[0] < cosines[1] < cosines[2] and cosines[2] > 0.97


def test_residual_compression_shrinks_the_index_and_keeps_its_ranking(tiny, tiny_colbert, tmp_path, capsys):
    """`index --residual-bits B` stores each token as its centroid's code and B bits a dimension: the shards shrink
    16/B times, a compressed token is close to the vector it stands for, and the search ranks first what the full
    index does; an --add to a float16 index refuses the flag, and a dense model's index takes no --residual-bits
    (exit 2, nothing written)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS)))
    command = ["index", "--model", str(tiny_colbert), "--corpus", str(corpus), "--shard-size", "10", "--no-progress",
               "--json"]
    assert main([*command, "--out", str(tmp_path / "full")]) == 0
    assert main([*command, "--out", str(tmp_path / "four"), "--residual-bits", "4"]) == 0
    summary = json.loads(capsys.readouterr().out.split("\n}\n")[-2] + "}")
    assert summary["residual_bits"] == 4
    full, four = MultiVectorIndex(tmp_path / "full"), MultiVectorIndex(tmp_path / "four")
    for name in full.shards:
        shard, packed = (np.load(f / "shards" / f"{name}.npy") for f in (full.folder, four.folder))
        assert packed.dtype == np.uint8 and packed.shape == (len(shard), 16 * 4 // 8)
    assert four.meta["bytes_per_document"] < full.meta["bytes_per_document"]
    positions = np.arange(full.offsets[-1])
    assert (full.rows(positions) * four.rows(positions)).sum(1).min() > 0.9
    queries = ["where does anna live ?", "who lives in oslo ?"]
    for want, got in zip(full.search(queries, top_k=3, exact=True), four.search(queries, top_k=3, exact=True)):
        assert got[0]["id"] == want[0]["id"]
    assert main(["search", "--index", str(tmp_path / "four"), queries[0], "--top-k", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hits"][0]["id"] == full.search(queries[0], top_k=1)[0][0]["id"]
    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"_id": "new", "text": CORPUS[0]}) + "\n")
    assert main([*command[:3], "--corpus", str(more), "--out", str(tmp_path / "full"), "--add", "--residual-bits",
                 "2"]) == 2  # an --add keeps the index's float16 vectors: the flag is refused, not ignored
    assert "--add keeps the index's storage" in capsys.readouterr().err and len(MultiVectorIndex(full.folder)) == 32
    assert main([*command, "--out", str(tmp_path / "three"), "--residual-bits", "3"]) == 2
    assert "--residual-bits 3" in capsys.readouterr().err and not (tmp_path / "three" / "index.json").exists()
    assert main(["index", "--model", str(tiny), "--corpus", str(corpus), "--out", str(tmp_path / "dense"),
                 "--residual-bits", "2", "--no-progress"]) == 2
    assert "ColBERT" in capsys.readouterr().err and not (tmp_path / "dense" / "index.json").exists()


def test_a_compressed_search_scores_tokens_by_their_norms_as_the_decompressed_vectors_score(tiny_colbert, tmp_path):
    """A packed shard keeps its tokens' inverse norms beside it: (q . centroid + q . residual) * inverse norm is the
    product with the decompressed, normalised vector. The centroids are kept in float16 and the codes in uint16; an
    index of the earlier layout (no .norms files, float32 centroids, int32 codes) searches the slower way to the same
    hits."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS)))
    index = MultiVectorIndex.build(tiny_colbert, corpus, tmp_path / "two", shard_size=10, progress=False,
                                   residual_bits=2)
    norms = [index.folder / "shards" / f"{name}.norms" for name in index.shards]
    assert all(np.load(path).dtype == np.float16 for path in norms)
    query = torch.nn.functional.normalize(torch.randn(5, index.meta["dimensions"], generator=torch.Generator()
                                                      .manual_seed(0)), dim=1)
    sims = query.numpy() @ index.structures()[0].T
    rows = np.arange(index.offsets[-1])
    slow = (query @ torch.from_numpy(index.rows(rows)).T).numpy()
    assert_close(index.scorer(query, sims)(rows), slow, rtol=2e-3, atol=2e-3)  # float16 inverse norms
    queries = ["where does anna live ?", "who lives in oslo ?"]
    fast = index.search(queries, top_k=3)
    centroids, codes = np.load(index.folder / "centroids.npy"), np.load(index.folder / "codes.npy")
    assert centroids.dtype == np.float16 and codes.dtype == np.uint16
    for path in norms:
        path.unlink()
    np.save(index.folder / "centroids.npy", centroids.astype(np.float32))
    np.save(index.folder / "codes.npy", codes.astype(np.int32))
    old = MultiVectorIndex(index.folder)
    assert old.inverse_norms() is None
    for want, got in zip(fast, old.search(queries, top_k=3)):
        assert [h["id"] for h in got][:1] == [h["id"] for h in want][:1]
        assert_close([h["score"] for h in got], [h["score"] for h in want], rtol=2e-3, atol=2e-3)


def test_add_to_a_compressed_index_codes_the_new_tokens_against_its_centroids(tiny_colbert, tmp_path, capsys):
    """`index --add` on a 4-bit index compresses the new documents against the centroids and buckets it has: the
    shards it held are left as they were, every shard is bytes, each token has a code, a new document's tokens come
    back close to their float16 vectors, and an exact search reaches every document, the new ones too."""
    def corpus(name: str, rows: range) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps({"_id": f"d{i}", "text": CORPUS[i]}) + "\n" for i in rows))
        return path

    command = ["index", "--model", str(tiny_colbert), "--shard-size", "10", "--no-progress"]
    assert main([*command, "--corpus", str(corpus("all.jsonl", range(32))), "--out", str(tmp_path / "full")]) == 0
    assert main([*command, "--corpus", str(corpus("a.jsonl", range(20))), "--out", str(tmp_path / "two"),
                 "--residual-bits", "4"]) == 0
    two = tmp_path / "two"
    before = {name: (two / name).read_bytes() for name in ("centroids.npy", "buckets.npy", "shards/00000.npy",
                                                           "shards/00001.npy")}
    codes = np.load(two / "codes.npy")
    assert main([*command, "--corpus", str(corpus("b.jsonl", range(20, 32))), "--out", str(two), "--add"]) == 0
    assert all((two / name).read_bytes() == data for name, data in before.items())
    full, added = MultiVectorIndex(tmp_path / "full"), MultiVectorIndex(two)
    assert len(added) == 32 and added.ids == full.ids and added.meta["complete"]
    assert all(np.load(two / "shards" / f"{name}.npy").dtype == np.uint8 for name in added.shards)
    assert len(added.inverse_norms()) == added.offsets[-1]  # the new shards' norms beside the old ones'
    new_codes = np.load(two / "codes.npy")
    assert len(new_codes) == added.offsets[-1] and (new_codes[:len(codes)] == codes).all()
    new = np.arange(full.offsets[20], full.offsets[-1])  # the added documents' tokens
    assert (added.rows(new) * full.rows(new)).sum(1).min() > 0.85  # the random model's tokens are all alike, so
    # the gain over the centroids alone is measured on clustered vectors (the next test)
    capsys.readouterr()
    assert main(["search", "--index", str(two), CORPUS[25], "--top-k", "32", "--exact", "--json"]) == 0
    assert {hit["id"] for hit in json.loads(capsys.readouterr().out)[0]["hits"]} == set(full.ids)


def test_tokens_added_to_a_compressed_index_come_back_closer_than_their_centroids(tmp_path):
    """build_structures after an --add's new float16 shard: the compressed shards and the buckets are kept, the new
    tokens get their nearest centroids' codes, and their residuals bring them back nearer their originals than those
    centroids are (the residuals of vectors the centroids were not fit to, packed with buckets placed before)."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(8, 16))
    shards = [centres[rng.integers(0, 8, n)] + rng.normal(scale=0.4, size=(n, 16)) for n in (300, 212, 150)]
    shards = [(s / np.linalg.norm(s, axis=1, keepdims=True)).astype(np.float32) for s in shards]
    (tmp_path / "shards").mkdir()
    for name in ("00000", "00001", "00002"):  # the third shard's vectors written after the first build
        (tmp_path / "shards" / f"{name}.offsets").write_bytes(b"")  # (only their sizes are read here)
    for name, shard in zip(("00000", "00001"), shards):
        np.save(tmp_path / "shards" / f"{name}.npy", shard.astype(np.float16))
    meta = {"residual_bits": 2, "count": 20}
    MultiVectorIndex.build_structures(tmp_path, meta, ["00000", "00001"])
    kept = {name: (tmp_path / name).read_bytes() for name in ("centroids.npy", "buckets.npy", "shards/00000.npy")}
    np.save(tmp_path / "shards" / "00002.npy", shards[2].astype(np.float16))  # an --add's shard, float16 as written
    meta["count"] = 30
    MultiVectorIndex.build_structures(tmp_path, meta, ["00000", "00001", "00002"])
    assert all((tmp_path / name).read_bytes() == data for name, data in kept.items())
    centroids, codes = np.load(tmp_path / "centroids.npy"), np.load(tmp_path / "codes.npy")
    assert len(codes) == 662 and (codes[512:] == nearest(shards[2], centroids)).all() and meta["tokens"] == 662
    packed = np.load(tmp_path / "shards" / "00002.npy")
    assert packed.dtype == np.uint8 and packed.shape == (150, 4)
    back = decompress(packed, centroids[codes[512:]], byte_values(np.load(tmp_path / BUCKETS)[1], 2))
    alone = (shards[2] * centroids[codes[512:]]).sum(1).mean()
    assert 1 - (shards[2] * back).sum(1).mean() < 0.5 * (1 - alone)  # under half the cosine distance left
    np.save(tmp_path / "codes.npy", codes[:600])  # codes that end inside a shard are refused, not extended wrongly
    with pytest.raises(InputError, match="600 codes for 662 token vectors"):
        MultiVectorIndex.build_structures(tmp_path, meta, ["00000", "00001", "00002"])


def test_a_cut_off_compression_finishes_with_its_first_buckets(tiny_colbert, tmp_path, capsys):
    """A build stopped while rewriting its shards as residuals (one shard still float16) finishes under --resume
    with the same codes and buckets: the shard is packed as it was the first time."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS)))
    command = ["index", "--model", str(tiny_colbert), "--corpus", str(corpus), "--shard-size", "10", "--no-progress",
               "--residual-bits", "2"]
    assert main([*command, "--out", str(tmp_path / "cut")]) == 0
    cut = tmp_path / "cut"
    packed = np.load(cut / "shards" / "00002.npy")
    full = MultiVectorIndex.build(tiny_colbert, corpus, tmp_path / "plain", shard_size=10, progress=False)
    np.save(cut / "shards" / "00002.npy", np.load(full.folder / "shards" / "00002.npy"))  # not rewritten yet
    buckets, codes = np.load(cut / BUCKETS), np.load(cut / "codes.npy")
    meta = json.loads((cut / "index.json").read_text())
    (cut / "index.json").write_text(json.dumps(meta | {"complete": False}))
    assert main([*command, "--out", str(cut), "--resume"]) == 0
    np.testing.assert_array_equal(np.load(cut / "shards" / "00002.npy"), packed)
    np.testing.assert_array_equal(np.load(cut / BUCKETS), buckets)
    np.testing.assert_array_equal(np.load(cut / "codes.npy"), codes)


def test_bad_dim_and_kind_mismatch_exit_2(tiny, tiny_colbert, tmp_path, capsys):
    train = tmp_path / "train.tsv"
    train.write_text("query\tpositive\tnegative\nwhere does anna live ?\tanna lives in rome .\tjohn lives in lima .\n")
    assert main(["finetune", "colbert", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o"),
                 "--dim", "0", "--no-progress"]) == 2
    assert "--dim 0" in capsys.readouterr().err and not (tmp_path / "o").exists()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "a", "text": "anna lives in rome ."}) + "\n")
    assert main(["index", "--model", str(tiny_colbert), "--corpus", str(corpus), "--out", str(tmp_path / "ix"),
                 "--no-progress"]) == 0
    assert main(["search", "--index", str(tmp_path / "ix"), "--model", str(tiny), "anna"]) == 2
    err = capsys.readouterr().err
    assert "multivector index" in err and "dense model" in err


@pytest.mark.slow
def test_multivector_encoder_loads_the_folder(minilm_path, tmp_path):
    from sentence_transformers import MultiVectorEncoder  # the oracle: sentence-transformers 6.2

    torch.manual_seed(0)
    tokenizer = Tokenizer.from_pretrained(minilm_path)
    ColbertModel(load_model(minilm_path, kind="base"), 128).save_folder(tmp_path, tokenizer,
                                                                       {"task": "colbert", "max_length": 64})
    ours = TokenEncoder(load_colbert(tmp_path), tokenizer, 64)
    theirs = MultiVectorEncoder(str(tmp_path), device="cpu")
    queries = ["who wrote the theory of relativity?", "what is a cat"]
    documents = ["Albert Einstein published it in 1905; then (1915) general relativity!", "A cat, a dog."]
    for side, texts, encode in (("query", queries, theirs.encode_query), ("document", documents,
                                                                         theirs.encode_document)):
        for mine, other in zip(ours.encode(texts, side), encode(texts)):
            assert_close(mine, torch.as_tensor(other).float(), atol=1e-4, rtol=0)


def test_teacher_scores_add_a_kl_term(tiny, tmp_path):
    torch.manual_seed(0)
    tokenizer = Tokenizer.from_pretrained(tiny)
    teacher = tmp_path / "teacher"
    save_pretrained(load_model(tiny, kind="classify", num_labels=1, multilabel=True), teacher, tokenizer,
                    {"task": "rerank", "max_length": 32})
    rows = [TextExample((f"where does {n} live ?", f"{n} lives in {c} .", f"{m} lives in {c} ."), None, f"row {i}")
            for i, (n, c, m) in enumerate(zip(NAMES, CITIES, NAMES[1:] + NAMES[:1]))]
    plain, taught = ColbertTask(tokenizer, 32, dim=16), ColbertTask(tokenizer, 32, dim=16, teacher=str(teacher))
    batch = taught.collate(taught.features(rows))
    assert batch["teacher"].shape == (len(rows), 2)
    model = ColbertModel(load_model(tiny, kind="base"), 16).eval()
    with torch.no_grad():
        taught_terms, plain_terms = taught.loss(model, batch), plain.loss(model, plain.collate(plain.features(rows)))
    assert set(plain_terms) == {"contrastive"} and set(taught_terms) == {"contrastive", "distill"}
    assert_close(taught_terms["contrastive"].total, plain_terms["contrastive"].total)  # the same batch's MaxSim
    assert taught_terms["distill"].total > 0 and taught_terms["distill"].unit == "sequences"


def test_pipeline_gives_the_token_vectors(tiny, tiny_colbert):
    colbert = pipeline("colbert", tiny_colbert)
    texts = ["anna lives in rome .", "where does john live ?"]
    ours = TokenEncoder(load_colbert(tiny_colbert), Tokenizer.from_pretrained(tiny_colbert), 32)
    for query in (False, True):
        results = colbert(texts, query=query)
        for result, want in zip(results, ours.encode(texts, "query" if query else "document")):
            assert result["tokens"] == len(want) == (QUERY_LENGTH if query else len(want))
            assert_close(torch.tensor(result["vectors"]), want)
    with pytest.raises(InputError, match="task.json names no colbert task"):
        pipeline("colbert", tiny)


def test_bm25_beside_the_token_vectors_gives_bm25_and_hybrid_modes(tiny, tiny_colbert, tmp_path, capsys):
    """`index --bm25` on a ColBERT model: mode bm25 ranks as a dense index's BM25 over the same corpus, and hybrid
    is fusion.fuse of the MaxSim and BM25 rankings; without --bm25 those modes are refused naming the flag."""
    from encoderlab.retrieval import fusion
    from encoderlab.retrieval.index import Index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(CORPUS)))
    common = ["--corpus", str(corpus), "--shard-size", "10", "--no-progress", "--json"]
    assert main(["index", "--model", str(tiny_colbert), *common, "--out", str(tmp_path / "mv"), "--bm25"]) == 0
    assert json.loads(capsys.readouterr().out)["bm25"] is True
    assert main(["index", "--model", str(tiny), *common, "--out", str(tmp_path / "dense"), "--bm25"]) == 0
    assert main(["index", "--model", str(tiny_colbert), *common, "--out", str(tmp_path / "ann"), "--ann", "hnsw"]) == 2
    err = capsys.readouterr().err
    assert "neither --ann nor --quantize" in err and "--residual-bits" in err
    index, dense = MultiVectorIndex(tmp_path / "mv"), Index(tmp_path / "dense")
    queries = ["where does anna live ?", "oslo"]
    assert index.rank(queries, 5, "bm25") == dense.rank(queries, 5, "bm25")
    maxsim_, bm25 = index.rank(queries, 100, "dense"), index.rank(queries, 100, "bm25")
    for got, a, b in zip(index.rank(queries, 5, "hybrid", "weighted", 0.5), maxsim_, bm25):
        want = fusion.fuse(a, b, "weighted", 0.5)[:5]
        assert [i for i, _ in got] == [i for i, _ in want]
        assert_close(torch.tensor([s for _, s in got]), torch.tensor([s for _, s in want]))
    assert main(["index", "--model", str(tiny_colbert), *common, "--out", str(tmp_path / "plain")]) == 0
    with pytest.raises(InputError, match="no BM25 index: build it with `encoderlab index --bm25`"):
        MultiVectorIndex(tmp_path / "plain").search(queries, mode="hybrid")
