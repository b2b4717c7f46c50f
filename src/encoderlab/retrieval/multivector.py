"""A multi-vector (ColBERT) index: every document's token vectors, searched by MaxSim (encoderlab.tasks.colbert).

It is an Index (encoderlab.retrieval.index: the same shards, streaming, documents, ids and search API; index.json's
"kind" is "multivector") whose shards hold token vectors:
    shards/NNNNN.npy          (tokens, dim) float16 token vectors of the shard's documents, one after another
    shards/NNNNN.offsets  (documents + 1,) int64: document i's tokens are rows offsets[i]:offsets[i+1]
    centroids.npy             (C, dim) float16 unit k-means centroids of every token vector (float32 in indexes
                              built before 2026-11-29: read either way)
    codes.npy                 (tokens,) each token's nearest centroid, every shard's tokens in order (uint16 up to
                              65,536 centroids, an index of under 67M tokens; int32 above, and before 2026-11-29)
A search is PLAID's three stages in a simple form (Santhanam et al. 2022, "PLAID: An Efficient Engine for Late
Interaction Retrieval", arXiv:2205.09707, section 4): (1) candidate generation: the documents owning a token of
each query token's `probe` nearest centroids; (2) centroid interaction: each candidate scored by MaxSim with every
token replaced by its centroid (one (query tokens, C) product, gathered by the codes); (3) the best `rescore` of
those ranked by exact MaxSim over their stored vectors. C is PLAID's 2^floor(log2(16 sqrt(tokens))) (the released
ColBERT's num_partitions); the centroids and codes take a few per cent of the vectors' bytes. exact=True scores every
document by exact MaxSim (the reference the approximate search is measured against).

Token pooling (`token_pooling=F`): each document's token vectors are clustered hierarchically (Ward linkage) into
about len/F clusters and each cluster is replaced by its mean, re-normalised: the index shrinks by F with little loss
(Clavié, Chaffin and Adams 2024, "Reducing the Footprint of Multi-Vector Retrieval with Minimal Performance Impact via
Token Pooling", arXiv:2409.14683; PyLate's and sentence-transformers' HierarchicalTokenPooling).

Residual compression (`residual_bits=B`, ColBERTv2's: Santhanam et al. 2022, "ColBERTv2: Effective and Efficient
Retrieval via Lightweight Late Interaction", arXiv:2112.01488, section 3.3): once the centroids are made, each token
vector is stored as its centroid's code (codes.npy) plus its residual (the vector minus that centroid) with every
dimension cut to one of 2^B buckets, B bits a dimension instead of float16's 16. The buckets are ColBERTv2's: cutoffs
at the residuals' 1/2^B, ..., (2^B-1)/2^B quantiles and each bucket's value the quantile at its middle, over every
dimension of a sample of residuals together (buckets.npy). A shard then holds (tokens, dim * B / 8) bytes; exact
MaxSim reads a token as its centroid plus its buckets' values, normalised again. Beside each packed shard,
NNNNN.norms holds (tokens,) float16 the inverse norms of those sums, so that a search scores a token as
(q . centroid + q . residual) / norm: the query's products with the centroids (computed once for its candidates)
gathered by the codes, plus one product with the residuals, never making the vectors themselves (an index packed
before the norms were kept is read the slower way). An --add codes and compresses the new
documents' tokens against the centroids and buckets the index has: a float16 index makes its centroids again over
every token, but a compressed one has kept no float vectors to make them from. Centroids fit to the first documents
serve text like them; after adding much unlike text, build again (--overwrite)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
from scipy.cluster.hierarchy import fcluster, linkage

from encoderlab.cards import CARDS, SEARCH
from encoderlab.engine import check_stride, window
from encoderlab.errors import InputError
from encoderlab.folder import settings
from encoderlab.io import atomic_write, check_out_folder
from encoderlab.paths import resolve_model_path
from encoderlab.retrieval.corpus import Document, scan
from encoderlab.retrieval.distributed import join
from encoderlab.retrieval.index import (DEPTH, SHARD_SIZE, VECTOR_KINDS, Index, check_resumable,
                                        write_shard)
from encoderlab.retrieval.meta import (FORMAT, INDEX_FILE, MULTIVECTOR as KIND, OWN, SHARDS, model_record, own_model,
                                       model_index_kind, read_meta, source, write_meta)
from encoderlab.tasks.colbert import QUERY_LENGTH, TokenEncoder, load_colbert, padded
from encoderlab.tokenizer import Tokenizer

CENTROIDS, CODES, BUCKETS = "centroids.npy", "codes.npy", "buckets.npy"
NORMS = ".norms"  # a packed shard's (tokens,) float16 inverse norms of its decompressed vectors (before normalising)
RESIDUAL_BITS = (1, 2, 4)  # ColBERTv2's choices of bits a dimension
RESIDUAL_SAMPLE = 65536  # token vectors whose residuals place the buckets
OLD_GRAPH = "tokens.faiss"  # what the first multivector indexes searched (an HNSW graph over every token)
KMEANS_ITERATIONS = 4  # the released ColBERT's kmeans_niters (ColBERTConfig): the codes only pick candidates
KMEANS_SAMPLE = 256  # training vectors a centroid at most (faiss's max_points_per_centroid default)
PROBE = 2  # centroids each query token probes (PLAID's ncells: 1 for k=10, 2 for k=100, 4 for k=1000)
RESCORE = 256  # candidates rescored exactly at the least (PLAID's ndocs for k=10); 4k for a larger k


def save_array(path: Path, array: np.ndarray) -> None:
    """One array as an .npy file (the path atomic_write hands over)."""
    with open(path, "wb") as handle:
        np.save(handle, array)


def pool_tokens(vectors: np.ndarray, factor: int) -> np.ndarray:
    """(n, D) unit token vectors -> (max(n // factor, 1), D): Ward clusters' means, re-normalised (factor 1: as is)."""
    if factor <= 1 or len(vectors) < 3:
        return vectors
    clusters = fcluster(linkage(vectors.astype(np.float64), method="ward"), t=max(len(vectors) // factor, 1),
                        criterion="maxclust")  # (n,) cluster of each token, numbered from 1
    means = np.stack([vectors[clusters == c].mean(0) for c in np.unique(clusters)])
    return (means / np.linalg.norm(means, axis=1, keepdims=True)).astype(vectors.dtype)


def partitions(tokens: int) -> int:
    """PLAID's number of centroids for an index of `tokens` vectors, at most one a token."""
    return max(1, min(tokens, 2 ** int(np.floor(np.log2(16 * np.sqrt(max(tokens, 1)))))))


def kmeans(shards: list[np.ndarray], count: int, seed: int = 0) -> np.ndarray:
    """(count, dim) unit centroids of the (n_i, dim) unit vectors of `shards` (memory-mapped): spherical k-means
    (faiss) on a random sample of at most KMEANS_SAMPLE vectors a centroid, so memory stays bounded by the sample."""
    total = sum(len(m) for m in shards)
    chosen = np.sort(np.random.default_rng(seed).choice(total, min(total, KMEANS_SAMPLE * count), replace=False))
    sample = sample_rows(shards, chosen)
    clustering = faiss.Kmeans(sample.shape[1], count, niter=KMEANS_ITERATIONS, seed=seed, spherical=True,
                              min_points_per_centroid=1, max_points_per_centroid=KMEANS_SAMPLE)
    clustering.train(sample)
    return clustering.centroids.astype(np.float32)


def sample_rows(shards: list[np.ndarray], chosen: np.ndarray) -> np.ndarray:
    """float32 rows `chosen` (ascending) of the shards' rows one after another, read shard by shard."""
    starts = np.cumsum([0] + [len(m) for m in shards])
    return np.concatenate([np.asarray(m[chosen[(chosen >= a) & (chosen < b)] - a], np.float32)
                           for m, a, b in zip(shards, starts[:-1], starts[1:])])


def code_type(count: int) -> type:
    """The type of the codes of `count` centroids: uint16 where it holds them, else int32."""
    return np.uint16 if count <= 2 ** 16 else np.int32


def nearest(vectors: np.ndarray, centroids: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Each vector's centroid of the largest inner product, a chunk of (memory-mapped) vectors at a time."""
    return np.concatenate([(np.asarray(vectors[i:i + chunk], np.float32) @ centroids.T).argmax(1)
                           for i in range(0, len(vectors), chunk)] or [np.zeros(0, np.int64)])


def residual_buckets(residuals: np.ndarray, bits: int) -> np.ndarray:
    """(2, 2^bits) float32 from a sample of residuals (any shape): row 0 the cutoffs between neighbouring buckets
    (+inf last), row 1 each bucket's value (ColBERTv2's quantiles, over every dimension at once)."""
    levels = 2 ** bits
    cutoffs = np.quantile(residuals, np.arange(1, levels) / levels)
    values = np.quantile(residuals, (np.arange(levels) + 0.5) / levels)
    return np.stack([np.append(cutoffs, np.inf), values]).astype(np.float32)


def pack_residuals(residuals: np.ndarray, cutoffs: np.ndarray, bits: int) -> np.ndarray:
    """(n, dim) residuals -> (n, dim * bits / 8) uint8: each dimension's bucket (below the first cutoff: 0), its bits
    in order, a byte holding 8 / bits dimensions."""
    buckets = np.searchsorted(cutoffs, residuals).astype(np.uint8)  # (n, dim), cutoffs without the last +inf
    planes = (buckets[..., None] >> np.arange(bits, dtype=np.uint8)) & 1  # (n, dim, bits), low bit first
    return np.packbits(planes.reshape(len(residuals), -1), axis=1)


def byte_values(values: np.ndarray, bits: int) -> np.ndarray:
    """(256, 8 / bits): the bucket values of the dimensions each byte of pack_residuals holds, so that
    byte_values(...)[packed].reshape(n, dim) unpacks a shard's rows in one gather."""
    planes = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).reshape(256, 8 // bits, bits)
    return values[(planes << np.arange(bits, dtype=np.uint8)).sum(2)].astype(np.float32)


def unpack(packed: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n, bytes) packed residuals -> (n, dim) float32 bucket values, values being byte_values' table (np.take: 4x
    numpy's values[packed])."""
    return np.take(values, packed, axis=0).reshape(len(packed), -1)


def decompress(packed: np.ndarray, centroids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n, bytes) packed residuals of tokens whose centroids are (n, dim) -> (n, dim) unit float32 vectors, values
    being byte_values' table; centroids (a fresh array) becomes the result."""
    vectors = torch.from_numpy(centroids)
    vectors += torch.from_numpy(unpack(packed, values))
    vectors /= torch.linalg.vector_norm(vectors, dim=1, keepdim=True)
    return vectors.numpy()


def inverse_norms(packed: np.ndarray, centroids: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n,) float16: 1 / the norm of each packed token's centroid (n, dim) plus its residual's bucket values."""
    vectors = centroids + unpack(packed, values)
    return (1.0 / np.linalg.norm(vectors, axis=1)).astype(np.float16)


def compress_shards(folder: Path, names: list[str], centroids: np.ndarray, codes: np.ndarray, bits: int) -> None:
    """Rewrite every shard still of float vectors as its tokens' packed residuals from their centroids. The buckets
    are placed once, from a sample, and kept in buckets.npy, so that a compression cut off finishes with the same
    ones (a shard already of bytes is left as it is)."""
    shards = [np.load(folder / SHARDS / f"{name}.npy", mmap_mode="r") for name in names]
    starts = np.cumsum([0] + [len(m) for m in shards])
    if not (folder / BUCKETS).is_file():
        chosen = np.sort(np.random.default_rng(0).choice(starts[-1], min(starts[-1], RESIDUAL_SAMPLE), replace=False))
        residuals = sample_rows(shards, chosen) - centroids[codes[chosen]]
        atomic_write(folder / BUCKETS, lambda tmp: save_array(tmp, residual_buckets(residuals, bits)))
    buckets = np.load(folder / BUCKETS)
    cutoffs, values = buckets[0, :-1], byte_values(buckets[1], bits)
    for name, shard, start in zip(names, shards, starts):
        if shard.dtype == np.uint8:
            continue
        pieces, norms = [], []
        for i in range(0, len(shard), RESIDUAL_SAMPLE):
            rows = np.asarray(shard[i:i + RESIDUAL_SAMPLE], np.float32)
            bases = centroids[codes[start + i:start + i + len(rows)]]
            pieces.append(pack_residuals(rows - bases, cutoffs, bits))
            norms.append(inverse_norms(pieces[-1], bases, values))
        packed = np.concatenate(pieces) if pieces else np.zeros((0, shard.shape[1] * bits // 8), np.uint8)
        inverse = np.concatenate(norms) if norms else np.zeros(0, np.float16)
        atomic_write(folder / SHARDS / f"{name}{NORMS}", lambda tmp, rows=inverse: save_array(tmp, rows))  # first:
        # a shard of bytes always has its norms
        atomic_write(folder / SHARDS / f"{name}.npy", lambda tmp, rows=packed: save_array(tmp, rows))


def pooled_maxsim(products, offsets: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """MaxSim of one query with the documents `pool` (positions, ascending), the token rows of document i being
    offsets[i]:offsets[i+1]: products(rows) gives the query tokens' (S, len(rows)) products with those rows. One
    product over the pool's tokens, then each document's best per query token (no padding)."""
    out = np.full(len(pool), -np.inf, np.float32)  # a document of no tokens (none is made so) ranks last
    kept = np.flatnonzero(offsets[pool + 1] > offsets[pool])
    starts, counts = offsets[pool[kept]], np.diff(offsets)[pool[kept]]
    bounds = np.concatenate([[0], np.cumsum(counts)[:-1]])  # each document's first column below
    rows = np.repeat(starts - bounds, counts) + np.arange(counts.sum())  # the pool's token rows, in order
    if len(rows):
        out[kept] = np.maximum.reduceat(products(rows), bounds, axis=1).sum(0)
    return out


def centroid_maxsim(sims: np.ndarray, codes: np.ndarray, offsets: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """pooled_maxsim with every document token replaced by its centroid: sims (S, C) the query tokens' products with
    the centroids, codes (tokens,) each token's centroid (PLAID's centroid interaction)."""
    return pooled_maxsim(lambda rows: sims[:, codes[rows]], offsets, pool)


def check_residual_bits(bits: int | None, dim: int) -> None:
    """InputError unless bits is None or one of RESIDUAL_BITS that packs a dim-wide vector into whole bytes."""
    if bits is not None and (bits not in RESIDUAL_BITS or dim * bits % 8):
        raise InputError(f"--residual-bits {bits}: expected one of {', '.join(map(str, RESIDUAL_BITS))}, with the "
                         f"token vectors' {dim} dimensions times the bits a multiple of 8")


class Encoder:
    """A ColBERT folder's token encoder with the index's settings: documents (pooled) and queries."""

    def __init__(self, model: str | os.PathLike, token_pooling: int = 1, batch_size: int = 32,
                 device: str | None = None, max_length: int | None = None, stride: int | None = None) -> None:
        """max_length: the documents' window (default: the folder's, else the colbert card's 180), within the
        model's; stride: read a longer document whole, in windows sharing `stride` tokens, its vectors every
        window's (None: truncate it)."""
        folder = resolve_model_path(model)
        if model_index_kind(folder) != KIND:
            raise InputError(f"--model {model}: not a ColBERT folder (its task.json names no colbert task)")
        colbert = load_colbert(folder).to(device or "cpu")
        tokenizer = Tokenizer.from_pretrained(folder)
        length = window(colbert.backbone.config, tokenizer, max_length, settings(folder).max_length,
                        CARDS["colbert"].max_length)
        check_stride(stride, length - 1, tokenizer.num_special_tokens())  # the marker takes one id of each window
        self.tokens = TokenEncoder(colbert, tokenizer, length, batch_size)
        self.dim, self.token_pooling, self.stride = colbert.dim, token_pooling, stride

    def documents(self, texts: list[str]) -> list[np.ndarray]:
        """Each document's (n_i, dim) float32 token vectors, pooled by token_pooling."""
        return [pool_tokens(v.numpy(), self.token_pooling)
                for v in self.tokens.encode(texts, "document", self.stride)]

    def queries(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(Q, QUERY_LENGTH, dim) query token vectors and their mask."""
        return padded(self.tokens.encode(texts, "query"))


class TokenVectors:
    """How a multi-vector index stores its shards: (tokens, dim) .npy files of the dtype index.json names (its
    offsets beside them, written by MultiVectorIndex.write_chunk); MultiVectorIndex does the encoding and scoring."""

    kind, suffix = KIND, ".npy"

    @staticmethod
    def made_by(embedder: Any) -> bool:
        """Index.build never makes one: MultiVectorIndex.build writes its own index.json."""
        return False

    @staticmethod
    def save(path: Path, vectors: np.ndarray) -> None:
        save_array(path, np.ascontiguousarray(vectors))

    @staticmethod
    def load(path: Path) -> np.ndarray:
        return np.load(path)


VECTOR_KINDS[KIND] = TokenVectors  # Index(folder) of a multivector folder: its shards' suffix and storage


class MultiVectorIndex(Index):
    """An index of token vectors, searched by exact MaxSim over candidates from its centroids (PLAID's stages)."""

    def __init__(self, folder: str | os.PathLike, embedder: Encoder | None = None) -> None:
        super().__init__(folder, embedder)
        counts = [np.diff(np.load(self._path(name, ".offsets"))) for name in self.shards]
        self.offsets = np.concatenate([[0], np.cumsum(np.concatenate(counts))]) if counts else np.zeros(1, np.int64)
        self._structures = None
        self._values: np.ndarray | None = None  # a compressed index's byte -> bucket values table (byte_values)
        self._inverse: np.ndarray | None | bool = False  # its tokens' inverse norms (None: not kept; False: unread)

    @classmethod
    def build(cls, model: str | os.PathLike, corpus: str | os.PathLike, folder: str | os.PathLike, *,
              token_pooling: int = 1, shard_size: int = SHARD_SIZE, overwrite: bool = False, resume: bool = False,
              progress: bool = True, dtype: str = "float16", batch_size: int = 32, device: str | None = None,
              bm25: bool = False, max_length: int | None = None, stride: int | None = None,
              residual_bits: int | None = None, **_: Any) -> MultiVectorIndex:
        """Index a corpus with a ColBERT folder's token vectors (float16 or float32), pooled by token_pooling, and
        a BM25 index beside them if asked (for modes bm25 and hybrid); max_length, stride: the documents' window
        and how a longer one is read (Encoder's); residual_bits: store each token as its centroid's code and its
        residual in that many bits a dimension (ColBERTv2's compression; None: the vectors as they are); resume:
        finish a build of the same model, corpus and settings that was cut off (as Index.build's)."""
        folder = Path(folder)
        check_out_folder(folder, overwrite, resume, own=OWN if resume else (), inputs=[corpus])
        if token_pooling < 1 or shard_size < 1 or dtype not in ("float16", "float32"):
            raise InputError(f"--token-pooling {token_pooling}, --shard-size {shard_size}, dtype {dtype}: expected "
                             f"positive numbers and float16 or float32")
        count = scan(corpus)
        encoder = Encoder(model, token_pooling, batch_size, device, max_length, stride)
        check_residual_bits(residual_bits, encoder.dim)
        meta = {"format": FORMAT, "kind": KIND, "complete": False,
                "model": model_record(model),
                "dimensions": encoder.dim, "max_length": encoder.tokens.max_length, "stride": stride,
                "query_length": QUERY_LENGTH,
                "similarity": "maxsim", "dtype": dtype, "token_pooling": token_pooling, "shard_size": shard_size,
                "residual_bits": residual_bits,
                "bm25": bm25, "ann": None, "count": 0, "sources": [source(corpus, 0) | {"documents": count}],
                "text": "title + ' ' + text"}
        if resume and (folder / INDEX_FILE).is_file():
            meta = check_resumable(folder, read_meta(folder), meta)  # its shards on disk are kept
        elif overwrite and folder.exists():
            shutil.rmtree(folder)  # only now, with the corpus and the model checked
        folder.mkdir(parents=True, exist_ok=True)
        write_meta(folder, meta)
        return cls._finish(folder, meta, encoder, progress, join(device))

    @classmethod
    def write_chunk(cls, folder: Path, name: str, chunk: list[Document], embedder: Encoder, kind: Any) -> None:
        """The shard's documents, ids and token offsets, then its token vectors (the mark of a finished shard)."""
        vectors = embedder.documents([d.joined for d in chunk])
        offsets = np.concatenate([[0], np.cumsum([len(v) for v in vectors])]).astype(np.int64)
        atomic_write(folder / SHARDS / f"{name}.offsets", lambda tmp: save_array(tmp, offsets))
        write_shard(folder, name, chunk, np.concatenate(vectors).astype(read_meta(folder)["dtype"]), TokenVectors)

    @classmethod
    def build_structures(cls, folder: Path, meta: dict[str, Any], names: list[str]) -> None:
        """The k-means centroids of every token vector and each token's code (a compressed index keeps its centroids
        and codes the tokens an --add brings against them); index.json records them and the bytes the index takes
        per document (vectors, offsets, centroids, codes and buckets)."""
        shards = [np.load(folder / SHARDS / f"{name}.npy", mmap_mode="r") for name in names]
        starts = np.cumsum([0] + [len(m) for m in shards])
        tokens = int(starts[-1])
        if (folder / BUCKETS).is_file():  # compressed (or cut off compressing): its centroids and buckets are final
            centroids, codes = np.load(folder / CENTROIDS).astype(np.float32), np.load(folder / CODES)
            if len(codes) < tokens:  # an --add: the new shards' tokens are coded against them
                codes = np.concatenate([codes] + [nearest(m, centroids).astype(codes.dtype)
                                                  for m, start in zip(shards, starts) if start >= len(codes)])
                if len(codes) != tokens:  # the codes end inside a shard: not an index that build and add wrote
                    raise InputError(f"{folder}: {CODES} holds {len(codes)} codes for {tokens} token vectors, not "
                                     f"whole shards: build the index again (encoderlab index ... --overwrite)")
                atomic_write(folder / CODES, lambda tmp: save_array(tmp, codes))
        else:
            centroids = kmeans(shards, partitions(tokens)).astype(np.float16).astype(np.float32)  # kept at half
            # width (half the centroids' bytes; residuals and norms are taken against these rounded values)
            codes = np.concatenate([nearest(m, centroids) for m in shards]).astype(code_type(len(centroids)))
            atomic_write(folder / CENTROIDS, lambda tmp: save_array(tmp, centroids.astype(np.float16)))
            atomic_write(folder / CODES, lambda tmp: save_array(tmp, codes))
        if meta.get("residual_bits"):
            compress_shards(folder, names, centroids, codes, meta["residual_bits"])
        (folder / OLD_GRAPH).unlink(missing_ok=True)  # an --add or --resume of an index of the first layout
        stored = sum(path.stat().st_size for n in names for s in (".npy", ".offsets", NORMS)
                     if (path := folder / SHARDS / f"{n}{s}").is_file())
        stored += sum(path.stat().st_size for path in (folder / CENTROIDS, folder / CODES, folder / BUCKETS)
                      if path.is_file())
        meta["tokens"], meta["centroids"] = tokens, len(centroids)
        meta["bytes_per_document"] = round(stored / max(meta["count"], 1), 1)

    @property
    def embedder(self) -> Encoder:
        """The query encoder: the index's ColBERT model."""
        if self._embedder is None:
            self._embedder = Encoder(own_model(self.folder, self.meta), self.meta["token_pooling"])
        return self._embedder

    def structures(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The centroids (C, dim), the codes (tokens,) and each centroid's documents (positions), loaded once."""
        if self._structures is None:
            if not (self.folder / CENTROIDS).is_file():
                old = (self.folder / OLD_GRAPH).is_file()
                raise InputError(f"{self.folder}: no {CENTROIDS}: "
                                 + ("an index of an earlier encoderlab (an HNSW token graph): build it again"
                                    if old else "the build did not finish") + " (encoderlab index ... --overwrite)")
            centroids, codes = np.load(self.folder / CENTROIDS).astype(np.float32), np.load(self.folder / CODES)
            owner = np.repeat(np.arange(len(self.ids)), np.diff(self.offsets))  # (tokens,) each token's document
            order = np.argsort(codes, kind="stable")
            starts = np.searchsorted(codes[order], np.arange(len(centroids) + 1))
            lists = [np.unique(owner[order[a:b]]) for a, b in zip(starts[:-1], starts[1:])]
            self._structures = centroids, codes, lists
        return self._structures

    def values(self) -> np.ndarray:
        """A compressed index's byte -> bucket values table (byte_values), read once."""
        if self._values is None:
            self._values = byte_values(np.load(self.folder / BUCKETS)[1], self.meta["residual_bits"])
        return self._values

    def inverse_norms(self) -> np.ndarray | None:
        """A compressed index's (tokens,) float32 inverse norms of its decompressed tokens, read once; None when a
        shard has none (packed before they were kept) or the index is not compressed."""
        if self._inverse is False:
            paths = [self._path(name, NORMS) for name in self.shards]
            self._inverse = (np.concatenate([np.load(p) for p in paths]).astype(np.float32) if
                             self.meta.get("residual_bits") and all(p.is_file() for p in paths) else None)
        return self._inverse

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The float32 token vectors at index positions (n,): as stored, or, in a compressed index, each its
        centroid plus its residual's bucket values, normalised again."""
        if not self.meta.get("residual_bits"):
            return super().rows(positions)
        centroids, codes, _ = self.structures()
        return decompress(self.gather(positions, np.asarray), np.take(centroids, codes[positions], axis=0),
                          self.values())

    def scorer(self, query: torch.Tensor, sims: np.ndarray | None) -> Any:
        """rows -> the (S, dim) query's (S, len(rows)) products with the token vectors at those index positions;
        sims (S, C): its products with the centroids. A compressed index with its norms scores a token as
        (q . centroid + q . residual) * inverse norm, never making the vector."""
        inverse = self.inverse_norms()
        if inverse is None:
            return lambda rows: (query @ torch.from_numpy(self.rows(rows)).T).numpy()
        codes, values = self.structures()[1], self.values()

        def products(rows: np.ndarray) -> np.ndarray:
            residuals = unpack(self.gather(rows, np.asarray), values)
            out = (query @ torch.from_numpy(residuals).T).numpy()
            out += np.take(sims, codes[rows], axis=1)
            out *= inverse[rows]
            return out

        return products

    def candidates(self, sims: np.ndarray, probe: int, keep: int) -> np.ndarray:
        """A query's candidates (positions, ascending), sims (S, C) the products of its S tokens with the centroids:
        the documents owning a token of each query token's `probe` nearest centroids, cut to the best `keep` by
        centroid interaction (PLAID's stages 1 and 2)."""
        _, codes, lists = self.structures()
        probed = np.argpartition(-sims, min(probe, sims.shape[1]) - 1, axis=1)[:, :probe]
        pool = np.unique(np.concatenate([lists[c] for c in np.unique(probed)]))
        if len(pool) > keep:
            approximate = centroid_maxsim(sims, codes, self.offsets, pool)
            pool = np.sort(pool[np.argsort(-approximate, kind="stable")[:keep]])
        return pool

    def dense(self, queries, k: int, exact: bool = False, probe: int = PROBE, rescore: int = RESCORE
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query's best k documents by exact MaxSim over its best `rescore` (at least 4k) candidates by
        centroid interaction (exact: over every document): scores (Q, k) and positions (Q, k), best first."""
        q, q_mask = self.embedder.queries(list(queries))
        k = min(k, len(self.ids))
        scores = torch.full((len(q), k), float("-inf"))
        positions = torch.zeros((len(q), k), dtype=torch.long)
        for i, (tokens, mask) in enumerate(zip(q, q_mask)):
            query = tokens[mask].float()  # (S, dim): the query's counted tokens
            # (S, C) its products with the centroids; an exact search of float vectors needs none (nor has an index
            # of the first layout, which had no centroids)
            sims = None if exact and self.inverse_norms() is None else query.numpy() @ self.structures()[0].T
            pool = np.arange(len(self.ids)) if exact else self.candidates(sims, probe, max(rescore, 4 * k))
            got = pooled_maxsim(self.scorer(query, sims), self.offsets, pool)
            top = np.argsort(-got, kind="stable")[:k]
            scores[i, :len(top)], positions[i, :len(top)] = torch.from_numpy(got[top]), torch.from_numpy(pool[top])
        return scores, positions

    def rank(self, queries, k: int, mode: str = SEARCH.mode, fusion_name: str = SEARCH.fusion,
             alpha: float = SEARCH.alpha, depth: int = DEPTH, rrf_k: int = SEARCH.rrf_k,
             normalisation: str = SEARCH.normalisation, exact: bool = SEARCH.exact) -> list[list[tuple[str, float]]]:
        """As Index.rank: dense is MaxSim (a query with fewer candidates than k gets fewer hits); bm25 and hybrid
        (MaxSim's ranking fused with BM25's) need an index built with --bm25."""
        if mode != "dense":
            return super().rank(queries, k, mode, fusion_name, alpha, depth, rrf_k, normalisation, exact)
        scores, positions = self.dense(queries, k, exact)
        return [[(self.ids[int(p)], float(s)) for s, p in zip(row_s, row_p) if s != float("-inf")]
                for row_s, row_p in zip(scores.tolist(), positions.tolist())]
