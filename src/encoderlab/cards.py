"""One card per capability, in one table (CARDS): what the command line, the server, `pipeline()`, `finetune`,
`evaluate` and `benchmark` know of a task or pipeline, declared once and torch-free, so that `encoderlab --help`, an
argument error or a bad input answers without loading torch (issue 37; docs/reliability.md#fast-start).

A card names its options dataclasses (each field's type, default and docstring become a flag, its type, default and
help: encoderlab.cli.options.add_fields) and points at the code that loads torch by dotted reference,
"module:attribute", loaded by the one function `load`: its training spec (encoderlab.tasks.spec.TaskSpec) and its
pipeline (encoderlab.tasks.pipeline.Pipeline). A new capability is one module plus one row here
(docs/design.md#adding-a-capability)."""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from encoderlab.choices import (COMBINE, DEFAULT_ALPHA, DEFAULT_FUSION, DEFAULT_NORMALISATION, DOCUMENT_FLOPS, FUSIONS,
                                NORMALISATIONS, QUERY_FLOPS, RRF_K, SEARCH_MODES, START_TERMS)
from encoderlab.errors import ConfigError, InputError
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL


# ---- options: a field per flag; its docstring is the flag's help -------------------------------------------------
@dataclass(frozen=True)
class TaskOptions:
    """What a new task model needs beyond the training data: a task with no options of its own has these (none)."""

    @property
    def variant(self) -> str | None:
        """The registered variant of the task's TaskSpec these options ask for (None: the task's default)."""
        return None


@dataclass(frozen=True)
class WindowOptions:
    """How a text longer than the window is read: shared by `finetune classify`, `evaluate` and the classify and
    embed commands, so that --stride and --combine mean the same on each."""

    stride: int | None = field(default=None, metadata={"metavar": "N"})
    """read a single text longer than --max-length whole, in windows sharing N tokens (default: the model's
    setting, else truncate it)"""
    combine: Literal[COMBINE] | None = None  # type: ignore[valid-type]
    """how a long text's windows combine: the mean of their logits or of their probabilities (default: the
    model's setting, else logits)"""


@dataclass(frozen=True)
class ClassifyOptions(TaskOptions, WindowOptions):
    """classify: the classes, the loss and the BiLSTM baseline's widths."""

    task_type: Literal["classification", "regression", "multilabel"] = "classification"
    """one class (cross-entropy), a score (MSE, e.g. STS-B) or a set of classes per row (multilabel: labels
    separated by '|', sigmoid and binary cross-entropy)"""
    labels: list[str] | None = field(default=None, metadata={"metavar": "A,B,..."})
    """class names in id order (default: those of the training file, numeric or sorted)"""
    embed_dim: int = field(default=300, metadata={"metavar": "N"})
    """BiLSTM baseline: embedding width"""
    lstm_hidden: int = field(default=256, metadata={"metavar": "N"})
    """BiLSTM baseline: hidden width per direction"""

    @property
    def variant(self) -> str | None:
        return self.task_type

    @property
    def regression(self) -> bool:
        """A score (MSE) instead of classes."""
        return self.task_type == "regression"


@dataclass(frozen=True)
class EmbedOptions(TaskOptions):
    """embed: pooling and the contrastive loss."""

    pooling: Literal["mean", "cls"] = "mean"
    """token vectors -> sentence vector"""
    loss: Literal["mnrl", "cosent", "cosine"] | None = None
    """mnrl (in-batch negatives, for pairs), cosent or cosine (for scored pairs) (default: cosent when every pair has
    a score, else mnrl)"""
    scale: float = field(default=20.0, metadata={"metavar": "S"})
    """similarity scale of mnrl and cosent"""
    matryoshka: tuple[int, ...] | None = field(default=None, metadata={"metavar": "D,D,..."})
    """Matryoshka embeddings (Kusupati et al. 2022): sum the loss over the vectors cut to their first D dimensions,
    for each D (e.g. 384,256,128,64, the full width included); then `embed --dimensions D` gives short vectors that
    keep most of the quality"""


@dataclass(frozen=True)
class QAOptions(TaskOptions):
    """qa: the windows of a long context and the decoding (SQuAD's usual settings, as transformers' run_qa)."""

    doc_stride: int = field(default=128, metadata={"metavar": "N"})
    """tokens shared by neighbouring windows of a long context"""
    max_query_length: int = field(default=64, metadata={"metavar": "N"})
    """questions are cut to N tokens"""
    max_answer_length: int = field(default=30, metadata={"metavar": "N"})
    """longest answer considered, in tokens"""
    n_best: int = field(default=20, metadata={"metavar": "N"})
    """start and end candidates per window in decoding"""


@dataclass(frozen=True)
class ColbertOptions(TaskOptions):
    """colbert: the token vectors' width and an optional teacher."""

    dim: int = field(default=128, metadata={"metavar": "D"})
    """dimensions of each token vector, the projection's width (ColBERT's 128)"""
    teacher: str | None = field(default=None, metadata={"metavar": "DIR"})
    """also distil from this cross-encoder (a `finetune rerank` folder): KL from its scores of each row's positive
    and negative (default: none, contrastive only)"""


@dataclass(frozen=True)
class SpladeOptions(TaskOptions):
    """splade: the FLOPS regulariser and the inference-free variant."""

    query_flops: float = field(default=QUERY_FLOPS, metadata={"metavar": "W"})
    """peak weight of the queries' FLOPS regulariser"""
    document_flops: float = field(default=DOCUMENT_FLOPS, metadata={"metavar": "W"})
    """peak weight of the documents' FLOPS regulariser"""
    flops_warmup: int | None = field(default=None, metadata={"metavar": "N"})
    """steps over which the FLOPS weights rise quadratically from 0 (default: a third of the first epoch's steps)"""
    df_flops: float | None = field(default=None, metadata={"metavar": "SHARE"})
    """weigh each token's FLOPS term by its document frequency (DF-FLOPS): one half for a token in SHARE of a
    batch's documents (e.g. 0.1), near 1 for the tokens in most, near 0 for rare ones (default: plain FLOPS)"""
    start_terms: int = field(default=START_TERMS, metadata={"metavar": "K"})
    """before training, lower the masked-LM head's bias by one constant until a token's K largest logits are above
    0 (the median token of a sample of the training documents): a masked LM's softmax leaves where its logits sit free,
    and from thousands of positive logits a token the first vectors are dense (0: leave the bias as it is)"""
    inference_free: bool = False
    """queries are a lookup of learned per-token weights (initialised to the training documents' IDF), documents go
    through the model: no model pass per query"""


# ---- the pipeline commands' own options --------------------------------------------------------------------------
@dataclass(frozen=True)
class TopK:
    """fill-mask's options per call."""

    top_k: int = field(default=5, metadata={"metavar": "K"})
    """predictions per mask"""


@dataclass(frozen=True)
class PairInputs:
    """classify's second texts."""

    pair: list[str] | None = field(default=None, metadata={"nargs": "+", "metavar": "TEXT"})
    """second texts of pairs, one per input text"""


@dataclass(frozen=True)
class QAInputs:
    """qa's inputs: questions about one context, or a JSONL file of them."""

    question: list[str] | None = field(default=None, metadata={"nargs": "+", "metavar": "Q"})
    """one or more questions about the context"""
    context: str | None = field(default=None, metadata={"metavar": "TEXT"})
    """the passage to answer from"""
    context_file: str | None = field(default=None, metadata={"metavar": "FILE"})
    """read the passage from a UTF-8 file"""
    input: str | None = field(default=None, metadata={"metavar": "FILE.jsonl"})
    """one {"question": ..., "context": ...} per line"""
    doc_stride: int | None = field(default=None, metadata={"metavar": "N"})
    """tokens shared by consecutive windows of a long context (default: the model's, else 128)"""


@dataclass(frozen=True)
class RerankInputs:
    """rerank's query and cut-off."""

    query: str = field(default="", metadata={"metavar": "TEXT", "required": True})
    """what the passages are ranked for"""
    top_k: int | None = field(default=None, metadata={"metavar": "K"})
    """show the best K (default: all)"""


@dataclass(frozen=True)
class ColbertInputs:
    """colbert's side."""

    query: bool = False
    """encode the texts as queries (marker, [MASK]-expanded to 32 tokens; default: as documents)"""


@dataclass(frozen=True)
class TermsShown:
    """splade's cut-off."""

    top_k: int | None = field(default=None, metadata={"metavar": "K"})
    """the heaviest K terms (default: all)"""


@dataclass(frozen=True)
class Command:
    """How a pipeline's command reads its inputs: its options, which of them go to the pipeline's constructor
    (`load`) and to each call (`call`), and the function (a dotted reference into encoderlab.cli.pipelines) that turns
    the command line into the pipeline's inputs, checked before the model loads."""

    options: type | None = None
    load: tuple[str, ...] = ()
    call: tuple[str, ...] = ()
    inputs: str = "encoderlab.cli.pipelines:read_inputs"
    texts: bool = True
    """It reads TEXT arguments or --input lines."""
    window: bool = False
    """It reads a long text in windows (--stride, --combine)."""
    description: str = ""
    model_help: str | None = None
    """--model's help where it is not the usual one."""


# ---- searching an index: the same options on every surface that searches -----------------------------------------
@dataclass(frozen=True)
class FusionOptions:
    """How hybrid search fuses the dense and the BM25 ranking (encoderlab.retrieval.fusion): `search`, `evaluate
    retrieval` (--fuse too), `benchmark beir`, POST /search and encoderlab.Index.search take these, with these
    defaults and bounds (a field's "ge" and "le": the command line and the server's schema both enforce them)."""

    fusion: Literal[FUSIONS] = DEFAULT_FUSION  # type: ignore[valid-type]
    """hybrid: a weighted sum of normalised scores, or reciprocal rank fusion (Cormack et al. 2009); the default is
    the one picked on training questions (docs/retrieval.md)"""
    normalisation: Literal[NORMALISATIONS] = DEFAULT_NORMALISATION  # type: ignore[valid-type]
    """fusion weighted: each ranking's scores z-scored or min-max scaled"""
    alpha: float = field(default=DEFAULT_ALPHA, metadata={"metavar": "A", "ge": 0.0, "le": 1.0})
    """fusion weighted: the dense scores' weight, BM25's is 1 - A"""
    rrf_k: int = field(default=RRF_K, metadata={"metavar": "K", "ge": 0})
    """fusion rrf: score = sum of 1 / (K + rank), K as in the paper"""


@dataclass(frozen=True)
class SearchOptions(FusionOptions):
    """How an index is searched, beside the fusion: the first stage's mode, and how many of its hits a
    cross-encoder reorders where one is given (each surface names the cross-encoder its own way: `search --rerank
    M`, `serve --rerank M` and {"rerank": true}, Index.search(rerank=...))."""

    mode: Literal[SEARCH_MODES] = "dense"  # type: ignore[valid-type]
    """dense: the model's index (vectors, a ColBERT model's token vectors or a SPLADE model's weights); bm25: the
    BM25 index (index --bm25); hybrid: both, fused"""
    exact: bool = False
    """dense search compares every float32 vector, ignoring the index's approximate or quantised structure (index
    --ann, --quantize)"""
    rerank_top: int = field(default=100, metadata={"metavar": "N", "ge": 1})
    """hits the cross-encoder reorders"""


SEARCH = SearchOptions()
"""The defaults, as encoderlab.retrieval.index.Index.search's signature reads them."""


# ---- the card ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Card:
    """One capability: its name, its help line, and what each surface needs of it."""

    name: str
    help: str
    """One line, for `finetune --help` and the pipeline command's --help."""
    data: str | None = None
    """The training data's format (None: nothing to fine-tune)."""
    options: type[TaskOptions] = TaskOptions
    """Its `finetune` options (a TaskOptions dataclass); the CLI's flags are its fields."""
    spec: tuple[str, ...] = ()
    """Its training specs, "module:attribute" of an encoderlab.tasks.spec.TaskSpec, the task's default first, then
    the variants its options pick (classify's multilabel)."""
    pipeline: str | None = None
    """"module:attribute" of its Pipeline class (served at POST /name, loaded by pipeline(name))."""
    command: Command | None = None
    """Its inference command `encoderlab NAME` (None: none, or one declared elsewhere: embed's in cli.models)."""
    max_length: int = 128
    """Tokens per input unless --max-length says otherwise."""
    batch_size: int = 32
    """Examples per step (and per forward pass in evaluate) unless --batch-size says otherwise."""
    reads: str = "table"
    """The reader, which decides the reader options the command line offers: table (TSV/CSV/JSONL), conll, squad."""
    default_model: str | None = None
    """What pipeline(name) loads when given no model (a model alias or folder)."""
    hub_tag: str = "feature-extraction"
    """The Hub's pipeline_tag for a model fine-tuned on it (the model card `encoderlab push` writes)."""


def table(*cards: Card) -> dict[str, Card]:
    """The cards by name; a second card of one name is refused (it would silently replace the first)."""
    out: dict[str, Card] = {}
    for row in cards:
        if row.name in out:
            raise ConfigError(f"capability {row.name!r} has two cards")
        out[row.name] = row
    return out


CARDS: dict[str, Card] = table(
    Card("embed", "sentence vectors (a bi-encoder)",
         "TSV/CSV/JSONL of text pairs (anchor, positive[, negative]) or scored pairs (sentence1, sentence2, score)",
         EmbedOptions, ("encoderlab.tasks.embedding:SPEC",), "encoderlab.tasks.embedding:Embed",
         hub_tag="sentence-similarity"),
    Card("classify", "label texts with a fine-tuned classifier",
         "GLUE-style TSV/CSV with a header row (or --no-header), or JSONL", ClassifyOptions,
         ("encoderlab.tasks.classify:SPEC", "encoderlab.tasks.multilabel:SPEC"), "encoderlab.tasks.classify:Classify",
         Command(PairInputs, load=("stride", "combine"), inputs="encoderlab.cli.pipelines:classify_inputs",
                 window=True, description="Label texts (or text pairs) with a fine-tuned classifier."),
         hub_tag="text-classification"),
    Card("fill-mask", "top-k tokens for each [MASK]", pipeline="encoderlab.tasks.fill_mask:FillMask",
         command=Command(TopK, call=("top_k",), description="Predict the tokens behind [MASK] (several per text "
                         "allowed): top-k with probabilities.",
                         model_help="masked-LM checkpoint folder, or the name of a shipped model"),
         default_model=DEFAULT_FILL_MASK_MODEL, hub_tag="fill-mask"),
    Card("ner", "named entities with character offsets",
         "CoNLL column file (blank line between sentences; IOB1/IOB2/BIOES tags), or JSONL with tokens/tags",
         TaskOptions, ("encoderlab.tasks.tagging:SPEC",), "encoderlab.tasks.tagging:NER",
         Command(description="Find named entities: type, text, character offsets and score."), 256, reads="conll",
         hub_tag="token-classification"),
    Card("qa", "extractive question answering", "SQuAD v1.1 or v2.0 JSON", QAOptions, ("encoderlab.tasks.qa:SPEC",),
         "encoderlab.tasks.qa:QA",
         Command(QAInputs, load=("doc_stride",), inputs="encoderlab.cli.pipelines:qa_items", texts=False,
                 description="Answer questions from a context; contexts longer than the window are read in "
                             "overlapping windows."), 384, 16, "squad", hub_tag="question-answering"),
    Card("rerank", "order passages by relevance to a query (a cross-encoder)",
         "TSV/CSV/JSONL of (query, passage, label): label 1 relevant, 0 not, or a score in [0, 1]", TaskOptions,
         ("encoderlab.tasks.rerank:SPEC",), "encoderlab.tasks.rerank:Rerank",
         Command(RerankInputs, call=("top_k",), inputs="encoderlab.cli.pipelines:query_items",
                 description="Order passages (TEXT arguments, or the lines of --input) by a cross-encoder's "
                             "relevance to --query."), 256, hub_tag="text-ranking"),
    Card("colbert", "per-token vectors of a ColBERT model (late interaction)",
         "TSV/CSV/JSONL of (query, positive[, negative]) rows", ColbertOptions, ("encoderlab.tasks.colbert:SPEC",),
         "encoderlab.tasks.colbert:Colbert",
         Command(ColbertInputs, call=("query",), description="Each text's token vectors from a ColBERT folder "
                 "(encoderlab finetune colbert), as a document (marker, punctuation left out) or with --query as a "
                 "query (marker, [MASK]-expanded to 32 tokens)."), 180),
    Card("splade", "a SPLADE model's weighted terms for each text (also: embed --sparse)",
         "TSV with a header query, positive[, negative]: retrieval training rows", SpladeOptions,
         ("encoderlab.tasks.splade:SPEC",), "encoderlab.tasks.splade:Splade",
         Command(TermsShown, call=("top_k",), inputs="encoderlab.cli.pipelines:splade_inputs",
                 description="Print each text's non-zero terms, heaviest first (token and weight; the first 20, all "
                             "with --json): the words a SPLADE model (encoderlab finetune splade) expands the text "
                             "to.", model_help="a SPLADE folder (encoderlab finetune splade)")),
)
"""Every capability by name. The order is the one --help lists, the server offers and `finetune` shows."""

ORDER = ("classify", "ner", "qa", "embed", "rerank")  # `finetune --help`'s order, as before the cards


def card(name: str) -> Card:
    """The card of `name`, or an InputError naming the known ones."""
    if name not in CARDS:
        raise InputError(f"unknown capability {name!r}; expected one of {', '.join(CARDS)}")
    return CARDS[name]


def trainable() -> list[Card]:
    """The cards `finetune`, `evaluate` and `benchmark` offer: those with training data."""
    return sorted((c for c in CARDS.values() if c.spec),
                  key=lambda c: ORDER.index(c.name) if c.name in ORDER else len(ORDER))


def served() -> list[Card]:
    """The cards with a pipeline: `pipeline()`'s names and the server's endpoints, in the table's order."""
    return [c for c in CARDS.values() if c.pipeline]


def load(reference: str) -> Any:
    """The object a "module:attribute" reference names, importing its module: the one way a card reaches code that
    loads torch; ConfigError naming a reference that does not resolve."""
    module, _, attribute = reference.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"card reference {reference!r} does not resolve: {err}") from None


# ---- a dataclass's fields as flags (encoderlab.cli.options.add_fields turns these into argparse arguments) ----------
@dataclass(frozen=True)
class Flag:
    """One option of a dataclass, as the command line offers it."""

    name: str
    kind: Any
    """The field's type, resolved (Optional unwrapped)."""
    default: Any
    help: str
    metadata: dict


def flags(options: type) -> list[Flag]:
    """The fields of an options dataclass (inherited ones first), each with its docstring as help."""
    hints = typing.get_type_hints(options)
    docs = field_docs(options)
    out = []
    for f in fields(options):
        kind = hints[f.name]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, types.UnionType) and len(args) == 1:
            kind = args[0]  # X | None: an X that may be left out
        default = None if f.default is MISSING else f.default
        out.append(Flag(f.name, kind, default, docs.get(f.name, ""), dict(f.metadata)))
    return out


def bounds(flag: Flag) -> dict[str, float]:
    """A field's bounds, {"ge": low, "le": high} (either may be absent), as its metadata gives them: pydantic's
    Field keywords, and what the command line checks (encoderlab.cli.options.add_fields)."""
    return {k: flag.metadata[k] for k in ("ge", "le") if k in flag.metadata}


def bounds_text(limits: dict[str, float]) -> str:
    """"a number from 0 to 1", "0 or more", "1 or less": what a value within `limits` is."""
    low, high = limits.get("ge"), limits.get("le")
    if low is not None and high is not None:
        return f"a number from {low:g} to {high:g}"
    return f"{low:g} or more" if low is not None else f"{high:g} or less"


def field_docs(options: type) -> dict[str, str]:
    """{field: the string literal under it} of a dataclass and its bases: field docstrings, as the house style writes
    them, read from the source (Python keeps no attribute docstrings at run time)."""
    docs: dict[str, str] = {}
    for cls in reversed(options.__mro__[:-1]):
        docs |= class_docs(cls.__module__).get(cls.__qualname__, {})
    return docs


@functools.cache
def class_docs(module: str) -> dict[str, dict[str, str]]:
    """The field docstrings of every top-level class of a module, by class name: its source parsed once (asking
    inspect for each class's source parsed the module again per class, 0.14 s of `--help`)."""
    path = getattr(sys.modules[module], "__file__", None)
    if path is None:
        return {}
    out: dict[str, dict[str, str]] = {}
    for node in ast.parse(Path(path).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {before.target.id: " ".join(str(doc.value.value).split())
                              for before, doc in zip(node.body, node.body[1:])
                              if isinstance(before, ast.AnnAssign) and isinstance(doc, ast.Expr)
                              and isinstance(doc.value, ast.Constant)}
    return out


def choices_of(kind: Any) -> tuple | None:
    """The values of a Literal type, else None."""
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else None


def given(options: type, values: dict[str, Any]) -> Any:
    """An options dataclass from the values that name its fields (the rest: other options of the command)."""
    names = {f.name for f in fields(options)}
    return options(**{k: v for k, v in values.items() if k in names and v is not None})
