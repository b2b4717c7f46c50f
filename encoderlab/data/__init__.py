"""Pretraining data: raw corpora -> token shards -> examples (packed, NSP, SOP) -> masked batches.

corpus.py             read plain text, JSONL, WikiExtractor output (.gz too) as documents
sentences.py          split paragraphs into sentences
tokenizer_training.py train a vocabulary on a corpus
prepare.py            tokenize a corpus into memory-mapped shards (parallel, streaming)
shards.py             the shard format: writer and memory-mapped reader (TokenShards)
examples.py           deterministic pretraining examples from shards (PretrainingExamples)
collate.py            padding and dynamic MLM masking (MaskingCollator)
"""
