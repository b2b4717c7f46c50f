"""The three kinds, named by the tokenizers model type: "wordpiece" (BERT, DistilBERT, ELECTRA), "bpe" (RoBERTa's
byte-level BPE), "unigram" (SentencePiece-style: ALBERT, DeBERTa-v3). Per kind: its special-token conventions (the
tokens a folder's config files name, else the first convention the vocabulary holds) and its pipeline around a
vocabulary, as transformers' BertTokenizer, RobertaTokenizer or AlbertTokenizer builds it: both give the same ids."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, Unigram, WordPiece

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
METASPACE = "\u2581"  # "▁": SentencePiece's mark for a preceding space (Kudo & Richardson, 2018)


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


def front(kind: str, lowercase: bool, strip_accents: bool | None = None, chinese_chars: bool = True,
          ) -> tuple[normalizers.Normalizer | None, pre_tokenizers.PreTokenizer]:
    """The kind's normalizer and pre-tokenizer: how a text is cleaned and split into words, in training and in use."""
    if kind == "wordpiece":
        return (normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                           strip_accents=strip_accents, lowercase=lowercase),
                pre_tokenizers.BertPreTokenizer())
    if kind == "bpe":  # byte-level BPE is cased: RoBERTa has no normalizer
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False)
    # ALBERT's: `` and '' to ", accents stripped and lowercase when uncased (kept when cased); words split on
    # whitespace, each word's leading space marked with ▁ as SentencePiece does.
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if lowercase:
        steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
    return normalizers.Sequence(steps), pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always")])


def trained_pipeline(kind: str, model: dict, specials: SpecialTokens, lowercase: bool) -> RustTokenizer:
    """The kind's pipeline around a trained model (its tokenizer.json "model" object)."""
    if kind == "wordpiece":
        return wordpiece_pipeline(model["vocab"], lowercase, specials)
    return _bpe_pipeline(model, specials) if kind == "bpe" else _unigram_pipeline(model, specials, lowercase)


def wordpiece_pipeline(vocab: dict[str, int], lowercase: bool, specials: SpecialTokens,
                       strip_accents: bool | None = None, chinese_chars: bool = True) -> RustTokenizer:
    """The BERT pipeline around a vocabulary: what BertTokenizerFast builds from a vocab.txt."""
    backend = RustTokenizer(WordPiece(vocab, unk_token=specials.unk, continuing_subword_prefix="##",
                                      max_input_chars_per_word=100))
    backend.normalizer, backend.pre_tokenizer = front("wordpiece", lowercase, strip_accents, chinese_chars)
    backend.post_processor = _bert_template(specials, vocab)
    backend.decoder = decoders.WordPiece(prefix="##")
    _register_specials(backend, specials, vocab)
    return backend


def _bpe_pipeline(model: dict, specials: SpecialTokens) -> RustTokenizer:
    """RoBERTa's pipeline around a BPE vocab and merges; roles the trainer did not place (<mask>) take the last ids."""
    vocab = dict(model["vocab"])
    for token in specials.by_role().values():
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    backend = RustTokenizer(BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
    backend.normalizer, backend.pre_tokenizer = front("bpe", False)
    backend.decoder = decoders.ByteLevel()
    # `<s> A </s>` and `<s> A </s></s> B </s>`, every type id 0 (RoBERTa has one token type).
    backend.post_processor = processors.RobertaProcessing((specials.sep, vocab[specials.sep]),
                                                          (specials.cls, vocab[specials.cls]),
                                                          trim_offsets=True, add_prefix_space=False)
    # roberta-base's <mask> takes the space before it (lstrip), so "the <mask>" masks the word " capital".
    _register_specials(backend, specials, vocab, mask_takes_space=True)
    return backend


def _unigram_pipeline(model: dict, specials: SpecialTokens, lowercase: bool) -> RustTokenizer:
    """ALBERT's pipeline around a Unigram model's pieces and scores."""
    pieces = [(piece, float(score)) for piece, score in model["vocab"]]
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    backend = RustTokenizer(Unigram(pieces, unk_id=vocab[specials.unk], byte_fallback=False))
    backend.normalizer, backend.pre_tokenizer = front("unigram", lowercase)
    backend.decoder = decoders.Metaspace(replacement=METASPACE, prepend_scheme="always")
    backend.post_processor = _bert_template(specials, vocab)
    _register_specials(backend, specials, vocab)
    return backend


def _bert_template(specials: SpecialTokens, vocab: dict[str, int]) -> processors.TemplateProcessing:
    """`[CLS] A [SEP]` and `[CLS] A [SEP] B [SEP]` with B's type id 1: BERT's layout, which ALBERT keeps."""
    cls_token, sep_token = specials.cls, specials.sep
    return processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, vocab[cls_token]), (sep_token, vocab[sep_token])])


def _register_specials(backend: RustTokenizer, specials: SpecialTokens, vocab: dict[str, int],
                       mask_takes_space: bool = False) -> None:
    """Mark the special tokens so one in a text is one token ("[MASK]", not "[", "mask", "]")."""
    tokens = [t for t in dict.fromkeys((*specials.order, *specials.by_role().values())) if t in vocab]
    backend.add_special_tokens([AddedToken(t, lstrip=mask_takes_space and t == specials.mask, special=True)
                                for t in tokens])
