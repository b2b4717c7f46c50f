"""Task heads: label alignment, QA windows and offsets, losses, save/load, and parity with transformers' BertFor*."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
from transformers import BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config

from encoderlab import (BiLSTMClassifier, CheckpointError, EncoderConfig, SequenceClassifier, SpanExtractor,
                        TokenClassifier, load_model, save_pretrained)
from encoderlab.nn.model import IGNORE_INDEX, ModelOutput
from encoderlab.tasks.embedding import cosent_loss, mnrl_loss
from encoderlab.tasks.qa import QATask, answer_tokens
from encoderlab.tasks.readers import Answer, QAExample, TaggedSentence
from encoderlab.tasks.tagging import TagTask, first_token_of_words
from encoderlab.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(minilm_path) -> Tokenizer:
    return Tokenizer.from_pretrained(minilm_path)


def tiny_config(**changes) -> EncoderConfig:
    return EncoderConfig.from_hf_dict(tiny_hf_config().to_dict() | {"architectures": None} | changes)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows, two padded; segment 1 on the second half of each row."""
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(9) < torch.tensor([[9], [5], [3]])).long()
    ids = torch.randint(1, VOCAB, (3, 9), generator=gen) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(9) >= 4).long() * mask}


# ---- token classification alignment ---------------------------------------------------------------------------
def test_first_sub_token_carries_the_tag(tokenizer):
    sentence = TaggedSentence(["Kilimanjaro", "climbers", "met", "in", "São", "Paulo"],
                              ["B-LOC", "O", "O", "O", "B-LOC", "I-LOC"], "x:1")
    task = TagTask(tokenizer, 64, ["O", "B-LOC", "I-LOC"])
    feature = task.features([sentence])[0]
    tokens = [tokenizer.id_to_token(i) for i in feature["input_ids"]]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    first = feature["first"]
    bounds = first + [len(tokens) - 1]
    pieces = ["".join(t.removeprefix("##") for t in tokens[a:b]) for a, b in zip(bounds, bounds[1:])]
    assert pieces == ["kilimanjaro", "climbers", "met", "in", "sao", "paulo"]
    assert len(tokens) > len(sentence.words) + 2  # some words really are split into several pieces
    labelled = {i: label for i, label in enumerate(feature["labels"]) if label != IGNORE_INDEX}
    assert labelled == {first[w]: task.index[tag] for w, tag in enumerate(sentence.tags)}


def test_words_joined_by_offsets_even_when_punctuation_splits_them():
    # "all-rounder" is one word made of three tokens; "" (no characters) has no token at all.
    words = ["an", "all-rounder", "", "!"]
    offsets = [(0, 0), (0, 2), (3, 6), (6, 7), (7, 14), (16, 17), (0, 0)]
    assert first_token_of_words(words, offsets, [None, 0, 0, 0, 0, 0, None]) == [1, 2, None, 5]


class Constant(nn.Module):
    """A stand-in token classifier that always prefers class `label`."""

    def __init__(self, num_labels: int, label: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_labels))
        self.label = label

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return ModelOutput(F.one_hot(torch.full_like(input_ids, self.label), len(self.weight)).float())


def test_predictions_map_back_to_words_and_truncated_words_are_o(tokenizer):
    task = TagTask(tokenizer, 8, ["O", "B-PER"])
    sentences = [TaggedSentence(["Peter", "Blackburn"], ["B-PER", "B-PER"], "x:1"),
                 TaggedSentence(["a"] * 10, ["O"] * 10, "x:2")]
    predicted = task.predict(Constant(2, 1), sentences)
    assert predicted[0] == ["B-PER", "B-PER"]
    assert predicted[1] == ["B-PER"] * 6 + ["O"] * 4  # 8 tokens = [CLS] + 6 words + [SEP]


# ---- question answering windows ---------------------------------------------------------------------------------
CONTEXT = ("The Normans were the people who in the 10th and 11th centuries gave their name to Normandy, a region "
           "in France. They were descended from Norse raiders and pirates from Denmark, Iceland and Norway who, "
           "under their leader Rollo, agreed to swear fealty to King Charles III of West Francia.")


@pytest.mark.parametrize("answer", ["Normandy", "Rollo", "King Charles III of West Francia", "10th and 11th centuries"])
def test_windows_cover_the_context_and_map_the_answer_back_exactly(tokenizer, answer):
    example = QAExample("q", "T", CONTEXT, "Who?", [Answer(answer, CONTEXT.index(answer))])
    task = QATask(tokenizer, max_length=24, doc_stride=8, max_query_length=8)
    windows = task.windows([example])
    assert len(windows) > 3 and all(len(w.input_ids) <= 24 for w in windows)
    spans = [[s for s in w.spans if s is not None] for w in windows]
    for before, after in zip(spans, spans[1:]):
        assert before[-8:] == after[:8]  # neighbours share doc_stride tokens
    assert spans[0][0][0] == 0 and spans[-1][-1][1] == len(CONTEXT)  # whole context covered
    holding = [w for w in windows if w.start_position]
    assert holding, "some window must hold the answer"
    for window in holding:
        start, end = window.spans[window.start_position][0], window.spans[window.end_position][1]
        assert CONTEXT[start:end] == answer
        assert window.token_type_ids[window.start_position] == 1
        # The decoder finds the same span when the logits point at it.
        start_logits = torch.zeros(len(window.input_ids))
        end_logits = torch.zeros(len(window.input_ids))
        start_logits[window.start_position] = end_logits[window.end_position] = 10.0
        score, char_start, char_end = task.best_span(start_logits, end_logits, window.spans)
        assert CONTEXT[char_start:char_end] == answer
    assert all(w.start_position == w.end_position == 0 for w in windows if w not in holding)


def test_answer_split_across_window_edge_is_not_a_target():
    spans = [None, (0, 3), (4, 9), None]
    assert answer_tokens(spans, 4, 9) == (2, 2)
    assert answer_tokens(spans, 4, 12) is None  # ends past the window
    assert answer_tokens(spans, 0, 9) == (1, 2)


def test_decoder_respects_max_answer_length_and_context(tokenizer):
    task = QATask(tokenizer, max_length=64, doc_stride=16, max_query_length=8, max_answer_length=3)
    spans = [None, None, (0, 3), (4, 8), (9, 12), (13, 20), None]
    start = torch.tensor([50.0, 0, 5, 1, 0, 0, 0])  # [CLS] is never a span
    end = torch.tensor([50.0, 0, 0, 0, 0, 6, 0])
    # Tokens 2..5 would score 11 but are 4 tokens long; the best of at most 3 tokens is 3..5 (score 7).
    assert task.best_span(start, end, spans) == (7.0, 4, 20)


def test_unanswerable_windows_point_at_cls(tokenizer):
    example = QAExample("q", "T", CONTEXT, "Who?", [], is_impossible=True)
    windows = QATask(tokenizer, max_length=48, doc_stride=8, max_query_length=8).windows([example])
    assert all(w.start_position == w.end_position == 0 for w in windows)


# ---- embedding losses -------------------------------------------------------------------------------------------
def test_cosent_by_hand():
    cosines, scores = torch.tensor([0.9, 0.2, 0.5]), torch.tensor([5.0, 1.0, 3.0])
    # Only pairs ordered against the gold order count; here none are: loss = log(1 + sum of small terms).
    expected = math.log(1 + sum(math.exp(20 * (cj - ci)) for ci, si in zip(cosines.tolist(), scores.tolist())
                                for cj, sj in zip(cosines.tolist(), scores.tolist()) if si > sj))
    assert float(cosent_loss(cosines, scores, 20.0)) == pytest.approx(expected, rel=1e-4)
    assert cosent_loss(cosines.flip(0), scores, 20.0) > cosent_loss(cosines, scores, 20.0)


def test_mnrl_is_cross_entropy_over_in_batch_candidates():
    gen = torch.Generator().manual_seed(0)
    anchors, positives = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    scores = F.normalize(anchors, dim=-1) @ F.normalize(positives, dim=-1).T * 20
    assert_close(mnrl_loss(anchors, positives, 20.0), F.cross_entropy(scores, torch.arange(4)))


# ---- transformers parity ------------------------------------------------------------------------------------------
def hf_logits(model: nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        out = model(**inputs)
    return torch.stack([out.start_logits, out.end_logits], -1) if hasattr(out, "start_logits") else out.logits


def our_logits(model: nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits  # QA: (B, T, 2), start and end


HEADS = {
    "classify": (lambda c: SequenceClassifier(c, 3), BertForSequenceClassification),
    "regression": (lambda c: SequenceClassifier(c.replace(problem_type="regression"), 1), BertForSequenceClassification),
    "ner": (lambda c: TokenClassifier(c, 5), BertForTokenClassification),
    "qa": (lambda c: SpanExtractor(c), BertForQuestionAnswering),
}


@pytest.mark.parametrize("kind", list(HEADS))
def test_transformers_loads_what_we_save(tmp_path, kind):
    build, hf_class = HEADS[kind]
    labels = {"classify": ["neg", "neu", "pos"], "ner": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]}.get(kind)
    ours = build(tiny_config(**({"id2label": dict(enumerate(labels))} if labels else {}))).eval()
    randomize(ours, seed=1)
    save_pretrained(ours, tmp_path)
    hf, info = hf_class.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(hf_logits(hf.eval(), batch()), our_logits(ours, batch()), **TOL)
    if labels:
        assert [hf.config.id2label[i] for i in range(len(labels))] == labels
    if kind == "regression":
        assert hf.config.num_labels == 1 and hf.config.problem_type == "regression"


@pytest.mark.parametrize("kind", list(HEADS))
def test_we_load_what_transformers_saves(tmp_path, kind):
    _, hf_class = HEADS[kind]
    torch.manual_seed(0)
    hf = hf_class(tiny_hf_config(num_labels={"regression": 1, "qa": 2}.get(kind, 3))).eval()
    randomize(hf, seed=2)
    hf.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert type(ours).__name__ == type(HEADS[kind][0](tiny_config())).__name__
    assert_close(our_logits(ours, batch(3)), hf_logits(hf, batch(3)), **TOL)


def test_round_trip_with_a_custom_head(tmp_path):
    def head() -> nn.Module:
        return nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4))

    ours = SequenceClassifier(tiny_config(), head=head()).eval()
    randomize(ours, seed=4)
    save_pretrained(ours, tmp_path)
    assert_close(our_logits(load_model(tmp_path, head=head()), batch()), our_logits(ours, batch()))
    with pytest.raises(CheckpointError, match="head does not fit"):
        load_model(tmp_path)  # the saved head is not a single linear layer


def test_bilstm_round_trip(tmp_path):
    model = BiLSTMClassifier(VOCAB, 2, embed_dim=12, hidden_size=8, labels=["neg", "pos"]).eval()
    save_pretrained(model, tmp_path)
    loaded = load_model(tmp_path)
    assert isinstance(loaded, BiLSTMClassifier) and loaded.labels == ["neg", "pos"]
    inputs = batch()
    assert_close(loaded(**inputs).logits, model(**inputs).logits)
    # Padding does not change a row's output: the max runs over real tokens only.
    short = {k: v[2:3, :3] for k, v in inputs.items()}
    assert_close(model(**short).logits, model(**inputs).logits[2:3], **TOL)



def test_backbone_from_mlm_checkpoint_and_from_a_finetuned_folder(tmp_path):
    from encoderlab import MaskedLMModel

    mlm = MaskedLMModel(tiny_config())
    save_pretrained(mlm, tmp_path / "mlm")
    backbone = load_model(tmp_path / "mlm", kind="base")
    assert backbone.pooler is None  # an MLM checkpoint has none ...
    classifier = load_model(tmp_path / "mlm", kind="classify", num_labels=2)
    assert classifier.pooler is not None  # ... so the classifier gets a fresh one
    assert classifier(**batch()).logits.shape == (3, 2)
    save_pretrained(classifier, tmp_path / "cls")
    again = load_model(tmp_path / "cls", kind="base")  # the classifier head is left behind
    assert_close(again.encoder.embeddings.word.weight, mlm.encoder.embeddings.word.weight)
