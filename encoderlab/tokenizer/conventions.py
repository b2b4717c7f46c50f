"""Tokenizer kinds and their special-token conventions, and how the convention of a vocabulary is recognised.

Three kinds, named by the tokenizers model type: "wordpiece" (BERT, DistilBERT, ELECTRA), "bpe" (RoBERTa's
byte-level BPE) and "unigram" (SentencePiece-style, ALBERT and DeBERTa-v3). Special tokens come from the
folder's special_tokens_map.json / tokenizer_config.json where they name them, else from the first convention
of the kind (SPECIAL_TOKENS, then OTHER_CONVENTIONS) the vocabulary holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from encoderlab.errors import InputError

DEFAULT_MODEL_MAX_LENGTH = 512
ROLES = ("pad", "unk", "cls", "sep", "mask")


@dataclass(frozen=True)
class SpecialTokens:
    """The special token strings of one tokenizer convention, by role."""

    pad: str
    unk: str
    cls: str
    sep: str
    mask: str
    order: tuple[str, ...]  # the order a trainer gives them ids 0, 1, 2, ...; a role not listed gets the last id

    def by_role(self) -> dict[str, str]:
        """{"pad_token": "[PAD]", ...}: the keys transformers' special_tokens_map.json uses."""
        return {f"{role}_token": getattr(self, role) for role in ROLES}


# Keyed by the tokenizers model type, lowercased: the convention a tokenizer of that kind is trained with.
SPECIAL_TOKENS = {
    # BERT (Devlin et al., 2019): bert-base-uncased's vocab.txt starts [PAD], then [unused*], [UNK], [CLS], ...
    "wordpiece": SpecialTokens(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                               order=("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")),
    # RoBERTa (Liu et al., 2019): roberta-base's vocab.json has <s>=0 <pad>=1 </s>=2 <unk>=3 and <mask> last.
    "bpe": SpecialTokens(pad="<pad>", unk="<unk>", cls="<s>", sep="</s>", mask="<mask>",
                         order=("<s>", "<pad>", "</s>", "<unk>")),
    # ALBERT (Lan et al., 2019): albert-base-v2's spiece.model has <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.
    "unigram": SpecialTokens(pad="<pad>", unk="<unk>", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                             order=("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")),
}
KINDS = tuple(SPECIAL_TOKENS)
# Other conventions a loaded tokenizer of a kind may follow, tried in turn when no config file names its tokens.
OTHER_CONVENTIONS = {
    # DeBERTa-v3 (He et al., 2021): [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, [MASK] after the pieces (id 128000).
    "unigram": (SpecialTokens(pad="[PAD]", unk="[UNK]", cls="[CLS]", sep="[SEP]", mask="[MASK]",
                              order=("[PAD]", "[CLS]", "[SEP]", "[UNK]")),),
}
# The transformers class a saved folder names, per kind; its pipeline is the one we build for that kind.
HF_CLASSES = {"wordpiece": "BertTokenizer", "bpe": "RobertaTokenizer", "unigram": "AlbertTokenizer"}
# BERT and ALBERT were released uncased first; RoBERTa's byte-level BPE is always cased.
DEFAULT_LOWERCASE = {"wordpiece": True, "bpe": False, "unigram": True}


def require_kind(kind: str, source: str) -> None:
    """Refuse a tokenizers model type that is not one of KINDS, naming where it came from."""
    if kind not in SPECIAL_TOKENS:
        raise InputError(f"{source}: {kind} tokenizers are not supported (supported: {', '.join(KINDS)})")


def require_specials(vocab: dict[str, int], specials: SpecialTokens, source: str) -> None:
    """Refuse a vocabulary that lacks one of the kind's special tokens, naming them."""
    missing = [token for token in specials.by_role().values() if token not in vocab]
    if missing:
        raise InputError(f"{source}: the vocabulary lacks the special tokens {', '.join(missing)}")


def configured_specials(token_map: dict, config: dict) -> dict[str, str]:
    """The special tokens that special_tokens_map.json (first) and tokenizer_config.json name, by role."""
    given = {}
    for role in ROLES:
        value = token_map.get(f"{role}_token", config.get(f"{role}_token"))
        value = value.get("content") if isinstance(value, dict) else value  # transformers' AddedToken form
        if isinstance(value, str) and value:
            given[role] = value
    return given


def choose_specials(vocab: dict[str, int], kind: str, given: dict[str, str], source: str) -> SpecialTokens:
    """The first convention of the kind whose tokens (after those the config names) are all in the vocabulary."""
    candidates = [replace(c, **given) for c in (SPECIAL_TOKENS[kind], *OTHER_CONVENTIONS.get(kind, ()))]
    for candidate in candidates:
        if all(token in vocab for token in candidate.by_role().values()):
            return candidate
    require_specials(vocab, candidates[0], source)  # raises, naming the missing tokens
    return candidates[0]
