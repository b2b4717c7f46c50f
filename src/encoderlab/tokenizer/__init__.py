"""One tokenizer over the `tokenizers` library, ids equal to transformers': WordPiece (BERT), byte-level BPE
(RoBERTa), Unigram (ALBERT, DeBERTa); kinds.py, training.py, hf_files.py (load and save), wrapper.py (Tokenizer)."""

from encoderlab.tokenizer.kinds import KINDS, SPECIAL_TOKENS, SpecialTokens
from encoderlab.tokenizer.wrapper import Batch, Encoded, Tokenizer

__all__ = ["KINDS", "SPECIAL_TOKENS", "Batch", "Encoded", "SpecialTokens", "Tokenizer"]
