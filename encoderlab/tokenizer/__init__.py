"""One tokenizer over the `tokenizers` library: WordPiece (BERT), byte-level BPE (RoBERTa), Unigram (ALBERT,
DeBERTa), with ids equal to transformers'.

conventions.py  the three kinds, their special tokens, how a vocabulary's convention is recognised
pipelines.py    each kind's pipeline around a vocabulary, as transformers builds it
training.py     training each kind on files or a stream of texts
loading.py      a folder, file or alias -> pipeline, kind and special tokens
hf_files.py     saving: tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab files
wrapper.py      Tokenizer (encode, encode_batch with offsets and word ids, pairs, decode) and Batch
"""

from encoderlab.tokenizer.conventions import (DEFAULT_MODEL_MAX_LENGTH, HF_CLASSES, KINDS, OTHER_CONVENTIONS, ROLES,
                                              SPECIAL_TOKENS, SpecialTokens)
from encoderlab.tokenizer.wrapper import Batch, Tokenizer

__all__ = ["DEFAULT_MODEL_MAX_LENGTH", "HF_CLASSES", "KINDS", "OTHER_CONVENTIONS", "ROLES", "SPECIAL_TOKENS", "Batch",
           "SpecialTokens", "Tokenizer"]
