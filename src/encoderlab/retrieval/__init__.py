"""Search a corpus end to end: corpus readers (corpus), the index of vector shards and its exact search (index), BM25
(lexical), rank fusion (fusion) and the metrics (metrics). `encoderlab index`, `search` and `evaluate retrieval` call
it, and `encoderlab.Index` is its Python API; see docs/retrieval.md.

This package file imports nothing: the command line reads corpora with encoderlab.retrieval.corpus (and index
folders with encoderlab.retrieval.meta) before torch loads."""
