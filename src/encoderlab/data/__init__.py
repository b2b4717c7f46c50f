"""Pretraining data: raw corpora (corpus.py) -> token shards (prepare.py, shards.py) -> examples, packed or in
pairs for NSP and SOP (examples.py) -> masked batches (collate.py)."""
