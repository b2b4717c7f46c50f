"""Model numerics: parameter counts and output parity with transformers (the test oracle) in fp32.

Tiny random Hugging Face models are built from a config, every parameter redrawn (so a swapped bias
or LayerNorm cannot hide behind zeros and ones), saved with save_pretrained and loaded with
`encoderlab.load_model`; the real all-MiniLM-L6-v2 weights check the same on real sentences.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.testing import assert_close
import transformers
from transformers import AutoConfig, BertForMaskedLM, BertForPreTraining, BertModel, BertTokenizerFast

from hf_oracle import TOL, VOCAB, randomize, tiny_hf_config

from encoderlab import EncoderConfig, EncoderModel, MaskedLMModel, PreTrainingModel, load_model
from encoderlab.models import FAMILIES, PRESETS

ACTIVATIONS = ["gelu", "gelu_new"]


# ---- tiny Hugging Face models -----------------------------------------------------------------------
def save_tiny_hf(cls: type, folder: Path, seed: int = 0, **changes) -> Path:
    """A random tiny `cls` (BertModel, BertForMaskedLM, BertForPreTraining) saved into `folder`."""
    torch.manual_seed(seed)
    model = cls(tiny_hf_config(**changes))
    randomize(model, seed)
    model.save_pretrained(folder)
    return folder


def load_hf(cls: type, folder: Path, eager: bool = False) -> nn.Module:
    """The transformers model of a folder in eval mode; eager attention when probabilities are wanted."""
    kwargs = {"attn_implementation": "eager"} if eager else {}
    return cls.from_pretrained(folder, **kwargs).eval()


def tiny_batch(lengths: tuple[int, ...] = (11, 7, 4), seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids padded at the end of the shorter rows; segment 1 on the second half of each real row."""
    gen = torch.Generator().manual_seed(seed)
    T = max(lengths)
    lengths_ = torch.tensor(lengths)[:, None]
    attention_mask = (torch.arange(T) < lengths_).long()  # (B, T)
    input_ids = torch.randint(1, VOCAB, (len(lengths), T), generator=gen) * attention_mask  # pad id 0
    token_type_ids = ((torch.arange(T) >= lengths_ // 2) & attention_mask.bool()).long()
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def mlm_labels(batch: dict[str, torch.Tensor], seed: int = 1) -> torch.Tensor:
    """Random targets on about a third of the real tokens (at least one per row), -100 elsewhere."""
    gen = torch.Generator().manual_seed(seed)
    real = batch["attention_mask"].bool()
    chosen = (torch.rand(real.shape, generator=gen) < 0.35) & real
    chosen[:, 1] = True
    targets = torch.randint(0, VOCAB, real.shape, generator=gen)
    labels = torch.where(chosen, targets, torch.full_like(targets, -100))
    assert (labels == -100).any() and (labels != -100).sum() > len(labels)
    return labels


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Three rows, two of them padded, with both segment ids present."""
    out = tiny_batch()
    assert (out["attention_mask"] == 0).any() and set(out["token_type_ids"].unique().tolist()) == {0, 1}
    return out


# ---- parameter counts ---------------------------------------------------------------------------------
def hf_config_of(config: EncoderConfig, architecture: str = "BertModel"):
    """transformers' view of one of our configs, through the config.json dict we write."""
    return AutoConfig.for_model(**config.to_hf_dict(architecture))


def count_on_meta(config: EncoderConfig) -> tuple[int, int]:
    """(our EncoderModel count, the family's transformers base model count), built without allocating weights."""
    architecture = FAMILIES[config.model_type].architectures["base"]
    with torch.device("meta"):
        theirs = getattr(transformers, architecture)(hf_config_of(config, architecture))
        return EncoderModel(config).num_parameters(), theirs.num_parameters()


@pytest.mark.parametrize("preset, expected", [("bert-base", 109_482_240), ("bert-large", 335_141_888)])
def test_parameter_count_matches_transformers_and_the_published_number(preset: str, expected: int) -> None:
    ours, theirs = count_on_meta(EncoderConfig.from_preset(preset))
    assert ours == theirs == expected


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_has_as_many_parameters_as_transformers(preset: str) -> None:
    ours, theirs = count_on_meta(EncoderConfig.from_preset(preset))
    assert ours == theirs


@pytest.mark.parametrize("ours_cls, hf_cls", [(MaskedLMModel, BertForMaskedLM), (PreTrainingModel, BertForPreTraining)])
def test_head_models_count_tied_weights_once_like_transformers(ours_cls: type, hf_cls: type) -> None:
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=VOCAB, max_position_embeddings=64)
    with torch.device("meta"):
        assert ours_cls(config).num_parameters() == hf_cls(hf_config_of(config)).num_parameters()


# ---- parity on tiny random models -----------------------------------------------------------------------
@pytest.mark.parametrize("act", ACTIVATIONS)
def test_encoder_matches_bert_model(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertModel, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertModel, folder)
    assert isinstance(ours, EncoderModel) and ours.config.hidden_act == act
    with torch.no_grad():
        out, ref = ours(**batch), hf(**batch)
    real = batch["attention_mask"].bool()
    assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], **TOL)
    assert_close(out.last_hidden_state, ref.last_hidden_state, **TOL)
    assert_close(out.pooled, ref.pooler_output, **TOL)


def test_encoder_matches_bert_model_without_mask_or_segments(tmp_path: Path, batch: dict) -> None:
    folder = save_tiny_hf(BertModel, tmp_path)
    ours, hf = load_model(folder), load_hf(BertModel, folder)
    with torch.no_grad():
        out, ref = ours(batch["input_ids"]), hf(input_ids=batch["input_ids"])
    assert_close(out.last_hidden_state, ref.last_hidden_state, **TOL)
    assert_close(out.pooled, ref.pooler_output, **TOL)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_hidden_states_and_attentions_match_eager_bert_model(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertModel, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertModel, folder, eager=True)
    with torch.no_grad():
        out = ours(**batch, output_hidden_states=True, output_attentions=True)
        ref = hf(**batch, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3  # embeddings + 2 layers
    for layer, (mine, theirs) in enumerate(zip(out.hidden_states, ref.hidden_states)):
        assert_close(mine, theirs, **TOL, msg=lambda m: f"hidden state {layer}: {m}")
    assert len(out.attentions) == len(ref.attentions) == 2
    for layer, (mine, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        assert mine.shape == (3, 4, 11, 11)
        assert_close(mine, theirs, **TOL, msg=lambda m: f"attention {layer}: {m}")
    pad_keys = ~batch["attention_mask"].bool()[:, None, None, :].expand_as(out.attentions[0])
    assert torch.all(out.attentions[0][pad_keys] == 0)  # padding is never attended to
    assert_close(out.last_hidden_state, ref.last_hidden_state, **TOL)


def test_sdpa_path_equals_eager_path(tmp_path: Path) -> None:
    ours = load_model(save_tiny_hf(BertModel, tmp_path))
    for batch in (tiny_batch(), tiny_batch(lengths=(5, 5)), tiny_batch(lengths=(1, 8, 3), seed=3)):
        with torch.no_grad():
            fast = ours(**batch, output_hidden_states=True)
            eager = ours(**batch, output_hidden_states=True, output_attentions=True)
        assert fast.attentions is None and eager.attentions is not None
        for mine, theirs in zip(fast.hidden_states, eager.hidden_states):
            assert_close(mine, theirs, **TOL)
        assert_close(fast.pooled, eager.pooled, **TOL)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_masked_lm_matches_bert_for_masked_lm(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertForMaskedLM, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertForMaskedLM, folder)
    assert isinstance(ours, MaskedLMModel)
    with torch.no_grad():
        out, ref = ours(**batch), hf(**batch, output_hidden_states=True)
    assert out.logits.shape == (3, 11, VOCAB) and out.loss is None
    assert_close(out.logits, ref.logits, **TOL)
    assert_close(out.last_hidden_state, ref.hidden_states[-1], **TOL)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_pretraining_matches_bert_for_pretraining(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertForPreTraining, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertForPreTraining, folder)
    assert isinstance(ours, PreTrainingModel)
    with torch.no_grad():
        out, ref = ours(**batch), hf(**batch)
    real = batch["attention_mask"].bool()
    assert_close(out.logits[real], ref.prediction_logits[real], **TOL)
    assert_close(out.logits, ref.prediction_logits, **TOL)
    assert_close(out.nsp_logits, ref.seq_relationship_logits, **TOL)
    assert out.loss is None


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_masked_lm_loss_and_labelled_logits_match(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertForMaskedLM, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertForMaskedLM, folder)
    labels = mlm_labels(batch)
    with torch.no_grad():
        out, ref = ours(**batch, labels=labels), hf(**batch, labels=labels)
    labelled = labels != -100
    assert out.logits.shape == (int(labelled.sum()), VOCAB)
    assert_close(out.logits, ref.logits[labelled], **TOL)
    assert_close(out.loss, ref.loss, **TOL)


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_pretraining_loss_matches(tmp_path: Path, batch: dict, act: str) -> None:
    folder = save_tiny_hf(BertForPreTraining, tmp_path, hidden_act=act)
    ours, hf = load_model(folder), load_hf(BertForPreTraining, folder)
    labels, next_sentence = mlm_labels(batch), torch.tensor([0, 1, 1])
    with torch.no_grad():
        out = ours(**batch, labels=labels, next_sentence_label=next_sentence)
        ref = hf(**batch, labels=labels, next_sentence_label=next_sentence)
    assert_close(out.loss, ref.loss, **TOL)
    assert_close(out.losses["mlm"] + out.losses["nsp"], out.loss)
    assert_close(out.logits, ref.prediction_logits[labels != -100], **TOL)
    assert_close(out.nsp_logits, ref.seq_relationship_logits, **TOL)


# ---- real weights -------------------------------------------------------------------------------------------
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A sentence embedding model maps text to vectors.",
    "Short one.",
    "Padding must not change what the real tokens see, even in a batch of very different lengths.",
]


def test_minilm_matches_transformers_on_real_sentences(minilm_path: Path) -> None:
    tokenizer = BertTokenizerFast.from_pretrained(minilm_path)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    assert (batch["attention_mask"] == 0).any()
    ours, hf = load_model("minilm"), load_hf(BertModel, minilm_path)
    assert (ours.config.num_layers, ours.config.hidden_size) == (6, 384)
    with torch.no_grad():
        out, ref = ours(**batch), hf(**batch)
    real = batch["attention_mask"].bool()
    assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], **TOL)
    assert_close(out.pooled, ref.pooler_output, **TOL)
