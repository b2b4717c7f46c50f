"""One tokenizer over the `tokenizers` library, ids equal to transformers': WordPiece (BERT), byte-level BPE
(RoBERTa), Unigram (ALBERT, DeBERTa).

kinds.py     the three kinds: special-token conventions, how a vocabulary's is recognised, each kind's pipeline
training.py  training each kind on files or a stream of texts
hf_files.py  loading (a folder, file or alias) and saving the files transformers reads
wrapper.py   Tokenizer (encode, encode_batch with offsets and word ids, pairs, decode) and Batch
"""

from encoderlab.tokenizer.kinds import KINDS, SPECIAL_TOKENS, SpecialTokens
from encoderlab.tokenizer.wrapper import Batch, Tokenizer

__all__ = ["KINDS", "SPECIAL_TOKENS", "Batch", "SpecialTokens", "Tokenizer"]
