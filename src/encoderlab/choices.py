"""The names and defaults the command line checks and shows before any model loads, in a module that imports
nothing: the modules that act on them import them from here, so that `encoderlab --help`, an argument error or a
bad input answers without loading torch (about 2 s on 2 cores; issue 37, docs/reliability.md#fast-start)."""

from __future__ import annotations

from dataclasses import dataclass

# ---- inference: encoderlab.infer.precision, encoderlab.infer.backends, encoderlab.engine ---------------------
INFERENCE_PRECISIONS = ("fp32", "bf16", "int8", "auto")
ENGINES = ("torch", "onnxruntime", "ctranslate2", "openvino", "auto")
COMBINE = ("logits", "probs")  # how the windows of one long text combine: mean of their logits, or of probabilities
MAX_TOKENS_SHOWN = 64  # attention maps: beyond this, labels on a heat-map are too small to read

# ---- training: encoderlab.train.loop takes its PRECISIONS from here; encoderlab.tokenizer.KINDS (the keys of its
# special-token table, in a module that loads torch) is pinned equal to TOKENIZER_KINDS by tests/test_cli.py
TRAINING_PRECISIONS = ("fp32", "bf16")
TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram")

# ---- pretraining: the objectives a recipe can name, as `pretrain --help` shows them; encoderlab.objectives.OBJECTIVES
# (registered in modules that load torch) is pinned to these names, in this order, by tests/test_help.py
OBJECTIVE_CARDS = {
    "mlm": "masked LM (BERT, RoBERTa)",
    "mlm+nsp": "MLM + next-sentence prediction (BERT)",
    "mlm+sop": "MLM + sentence-order prediction (ALBERT)",
    "rtd": "replaced-token detection (ELECTRA; DeBERTa-v3's gradient-disentangled sharing)",
    "distill": "distillation from a teacher (DistilBERT)",
}
PRETRAIN_OBJECTIVES = tuple(OBJECTIVE_CARDS)

# ---- ONNX export: encoderlab.infer.onnx ----------------------------------------------------------------------
ONNX_KINDS = ("base", "mlm")
DEFAULT_OPSET = 17  # the first with LayerNormalization as one op (fewer nodes than its decomposition)
MIN_OPSET, MAX_OPSET = 14, 20  # SDPA's symbolic needs 14; 20 is the TorchScript exporter's last

# ---- fine-tuning: the tasks' names, data and defaults are their cards' (encoderlab.cards) ---------------------------
BILSTM = "bilstm"  # `finetune classify --model bilstm`: the baseline trained from scratch

# splade's FLOPS peak weights for queries and documents: NAVER's SPLADE-max trained from a plain masked LM
# (distilbert-base-uncased: lambda_q 8e-4, lambda_d 6e-4; europe.naverlabs.com/research/machine-learning-and-
# optimization/splade-models); queries weigh more (SPLADE v2, arXiv:2109.10086, sec. 3), since every search pays for
# each query term. On bench/late_sparse.py's 163 steps from encoderlab-fill-mask at lr 5e-5 they halved the index
# against sentence-transformers 6.2's example weights (5e-5, 3e-5) and lifted nDCG@10 from 0.633 to 0.701 (bench/
# results/late_sparse_5190.json, late_sparse_lr5e-5.json); the inference-free model's index shrank 7.7x, its
# nDCG@10 falling from 0.890 to 0.833 (docs/sparse.md has both trade-offs). NAVER's DistilSPLADE-max weights (1e-2,
# 8e-3) at lr 2e-4 cleared the stopwords from the queries and halved the index, but scored 0.797 against 0.784 at 512
# tokens and 0.757 against 0.783 at 128 (bench/results/late_sparse_distilsplade.json): not a better default; with
# --df-flops 0.1 beside them, 0.800 and 0.766 (docs/sparse.md): not either.
QUERY_FLOPS, DOCUMENT_FLOPS = 8e-4, 6e-4
DF_STEEPNESS = 5.0  # --df-flops: the slope of DF-FLOPS's logistic (its beta; arXiv:2505.15070's value could not be
# read here, so ours: at cutoff 0.1 a token in a quarter of the documents weighs 0.96, one in 2 percent 0.02)
# finetune splade --start-terms: positive logits a token at the start. encoderlab-fill-mask has about 3,000; lowered
# to 8 (a bias shift of 7.10 from the first 16 of bench/late_sparse.py's training documents, 7.27 from 16 spread
# through them) its full SPLADE scored nDCG@10 0.870 against 0.784 at lr 2e-4 (0.877 at 5e-5), and its inference-free
# one 0.889 in 3.8 MB against 0.890 in 73.6 MB (docs/sparse.md). 8 was the one value tried: the shift that a first
# probe (the 99.97th percentile of its logits, ~9 a token) suggested.
START_TERMS = 8
START_SAMPLE = 16  # training documents whose tokens place the MLM head's starting shift
SHOWN_TERMS = 20  # terms `embed --sparse` prints per text (all with --json)

# ---- searching an index: encoderlab.retrieval.index and .fusion; their options are encoderlab.cards.SearchOptions ----
SEARCH_MODES = ("dense", "bm25", "hybrid")
FUSIONS = ("weighted", "rrf")
NORMALISATIONS = ("z-score", "min-max")
RRF_K = 60  # Cormack et al. 2009, section 2: k = 60 was fixed during a pilot investigation and not tuned
# hybrid's default, picked on SQuAD part A's training questions only by bench/retrieval.py's grid (docs/retrieval.md,
# "Tuning the fusion"): a weighted sum of z-scores, dense weighing 0.55, each retriever's best 100; nDCG@10 there
# 0.893 against RRF k=60's 0.856
DEFAULT_FUSION, DEFAULT_ALPHA, DEFAULT_NORMALISATION = "weighted", 0.55, "z-score"

# ---- `encoderlab compare`: encoderlab.compare ----------------------------------------------------------------
REFERENCE = "bert-base"
FAMILY_PRESETS = ("bert-base", "roberta-base", "distilbert-base", "albert-base", "electra-small", "electra-base",
                  "deberta-v3-base", "modernbert-base")
"""One base-sized preset per family (two for ELECTRA): the default rows, kept where PRESETS has them."""


@dataclass(frozen=True)
class CompareSettings:
    """How `encoderlab compare` measures the speed."""

    threads: int = 2
    """torch CPU threads."""
    sequences: int = 128
    """Sequences in the throughput pass (a multiple of batch_size keeps every batch full)."""
    batch_size: int = 32
    """Sequences per forward pass for throughput, length-sorted so little compute goes to padding."""
    latency_sequences: int = 32
    """Sequences timed one at a time (batch 1) for latency; the first ones of the same set."""
    repeats: int = 3
    """Timed passes per model; each figure is the median over them."""
    seed: int = 0
    """Seed of the token ids and their lengths."""


COMPARE_QUICK = CompareSettings(sequences=32, latency_sequences=8, repeats=2)

# ---- `encoderlab benchmark --quick`: encoderlab.tasks.benchmark ----------------------------------------------
BENCHMARK_QUICK = {"max_train": 500, "max_eval": 500, "epochs": 1.0}  # a smoke run: a subset and one epoch


def names_text(names: tuple[str, ...] | list[str], last: str = "or") -> str:
    """("a", "b", "c") -> "a, b or c": a list of names in a help string."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} {last} {names[-1]}"


def split_names(value: str | None) -> list[str] | None:
    """"a, b" -> ["a", "b"]; None or "" -> None."""
    return [part.strip() for part in value.split(",")] if value else None
