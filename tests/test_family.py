"""The BERT family (RoBERTa, DistilBERT, ALBERT, ELECTRA, ...): parameter counts of the presets and output
parity with transformers in both directions, for the encoder and every head the family has.

Each family's tiny random transformers model is built from a config, every parameter redrawn, saved with
save_pretrained and loaded by `encoderlab.load_model`; our own tiny models are exported and read back by
transformers. transformers is a test oracle only.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from torch.testing import assert_close

from hf_oracle import TOL, VOCAB, randomize

from encoderlab import EncoderConfig, load_model, save_pretrained
from encoderlab.errors import ConfigError
from encoderlab.models import FAMILIES
from encoderlab.nn.model import MODEL_CLASSES, EncoderModel

TINY = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 37, "max_position_embeddings": 64}
# One tiny transformers config per family; the feed-forward width 37 cannot be confused with 4H, and the
# factorized families get an embedding width (16) that differs from hidden.
HF_CONFIGS = {
    "bert": lambda: transformers.BertConfig(**TINY),
    "roberta": lambda: transformers.RobertaConfig(**TINY, pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5),
    "distilbert": lambda: transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                                        max_position_embeddings=64),
    "albert": lambda: transformers.AlbertConfig(**TINY, embedding_size=16),
    "electra": lambda: transformers.ElectraConfig(**TINY, embedding_size=16),
    # 8 buckets: distances past 4 are log-bucketed already in the 11-token batch.
    "deberta-v2": lambda: transformers.DebertaV2Config(**TINY, relative_attention=True, position_buckets=8,
                                                       pos_att_type=["p2c", "c2p"], share_att_key=True,
                                                       norm_rel_ebd="layer_norm", position_biased_input=False,
                                                       type_vocab_size=0),
    # A window of 4 (2 each side) in layer 1 (local; layer 0 is global): the 11- and 7-token rows reach past it.
    "modernbert": lambda: transformers.ModernBertConfig(**TINY, local_attention=4, pad_token_id=0, bos_token_id=1,
                                                        eos_token_id=2, cls_token_id=1, sep_token_id=2),
}
FAMILY_KINDS = [(family, kind) for family in HF_CONFIGS for kind in FAMILIES[family].architectures]

# The issue's table: transformers' counts for the base configs built with the same hyperparameters.
PUBLISHED = {"roberta-base": 124_645_632, "distilbert-base": 66_362_880, "albert-base": 11_683_584,
             "electra-small": 13_483_008, "electra-base": 108_891_648, "deberta-v3-base": 183_831_552,
             "modernbert-base": 149_014_272, "modernbert-large": 394_781_696}


def hf_class(family: str, kind: str) -> type:
    """The transformers class our `kind` of this family mirrors."""
    return getattr(transformers, FAMILIES[family].architectures[kind])


def save_tiny_hf(family: str, kind: str, folder: Path, seed: int = 0, **changes) -> Path:
    """A random tiny transformers model of the family and kind, saved into `folder`."""
    torch.manual_seed(seed)
    config = HF_CONFIGS[family]()
    for key, value in changes.items():
        setattr(config, key, value)
    model = hf_class(family, kind)(config)
    randomize(model, seed)
    model.save_pretrained(folder)
    return folder


def family_batch(config: EncoderConfig, lengths: tuple[int, ...] = (11, 7, 4), seed: int = 0) -> dict[str, torch.Tensor]:
    """Token ids padded with the family's pad id; two segments where the family has them."""
    gen = torch.Generator().manual_seed(seed)
    T, pad = max(lengths), config.pad_token_id
    real = torch.arange(T) < torch.tensor(lengths)[:, None]  # (B, T)
    ids = torch.randint(0, VOCAB - 1, (len(lengths), T), generator=gen)
    ids = torch.where(ids >= pad, ids + 1, ids)  # never the pad id inside a row
    batch = {"input_ids": torch.where(real, ids, pad), "attention_mask": real.long()}
    if config.type_vocab_size > 1:
        batch["token_type_ids"] = ((torch.arange(T) >= torch.tensor(lengths)[:, None] // 2) & real).long()
    return batch


def hf_forward(model: torch.nn.Module, batch: dict, **kwargs):
    """transformers' outputs on the same batch."""
    with torch.no_grad():
        return model(**batch, **kwargs)


# ---- presets -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_base_preset_has_the_published_parameter_count(preset: str) -> None:
    config = EncoderConfig.from_preset(preset)
    architecture = FAMILIES[config.model_type].architectures["base"]
    with torch.device("meta"):
        ours = EncoderModel(config).num_parameters()
        theirs = getattr(transformers, architecture)(
            transformers.AutoConfig.for_model(**config.to_hf_dict(architecture))).num_parameters()
    assert ours == theirs == PUBLISHED[preset]


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_every_family_has_a_small_preset_for_tests(family: str) -> None:
    presets = FAMILIES[family].presets
    small = [name for name in presets if EncoderConfig.from_preset(name).hidden_size <= 256]
    assert small, f"{family} has no preset of hidden size <= 256"


# ---- Hugging Face -> encoderlab --------------------------------------------------------------------------
@pytest.mark.parametrize("family, kind", FAMILY_KINDS)
def test_loaded_model_matches_transformers(tmp_path: Path, family: str, kind: str) -> None:
    folder = save_tiny_hf(family, kind, tmp_path)
    ours = load_model(folder)
    assert type(ours) is MODEL_CLASSES[kind] and ours.config.model_type == family
    hf = hf_class(family, kind).from_pretrained(folder).eval()
    batch = family_batch(ours.config)
    with torch.no_grad():
        out = ours(**batch)
    ref = hf_forward(hf, batch, output_hidden_states=True)
    if kind == "base":
        assert_close(out.last_hidden_state, ref.last_hidden_state, **TOL)  # padding positions included
        if FAMILIES[family].pooler:
            assert_close(out.pooled, ref.pooler_output, **TOL)
    elif kind == "mlm":
        assert_close(out.logits, ref.logits, **TOL)
        assert_close(out.last_hidden_state, ref.hidden_states[-1], **TOL)
    elif kind == "pretraining":
        assert_close(out.logits, ref.prediction_logits, **TOL)
        assert_close(out.nsp_logits, getattr(ref, "sop_logits", getattr(ref, "seq_relationship_logits", None)), **TOL)
    else:  # rtd
        assert_close(out.logits, ref.logits, **TOL)


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_hidden_states_and_attentions_match_eager_transformers(tmp_path: Path, family: str) -> None:
    folder = save_tiny_hf(family, "base", tmp_path)
    ours = load_model(folder)
    hf = hf_class(family, "base").from_pretrained(folder, attn_implementation="eager").eval()
    batch = family_batch(ours.config)
    with torch.no_grad():
        out = ours(**batch, output_hidden_states=True, output_attentions=True)
    ref = hf_forward(hf, batch, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(ref.hidden_states) == 3
    for mine, theirs in zip(out.hidden_states, ref.hidden_states):
        assert_close(mine, theirs, **TOL)
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert_close(mine, theirs, **TOL)


@pytest.mark.parametrize("family", [f for f in sorted(HF_CONFIGS) if "mlm" in FAMILIES[f].architectures])
def test_mlm_loss_on_labelled_positions_matches(tmp_path: Path, family: str) -> None:
    folder = save_tiny_hf(family, "mlm", tmp_path)
    ours = load_model(folder)
    hf = hf_class(family, "mlm").from_pretrained(folder).eval()
    batch = family_batch(ours.config)
    gen = torch.Generator().manual_seed(1)
    chosen = (torch.rand(batch["input_ids"].shape, generator=gen) < 0.4) & batch["attention_mask"].bool()
    labels = torch.where(chosen, torch.randint(0, VOCAB, chosen.shape, generator=gen), -100)
    with torch.no_grad():
        out = ours(**batch, labels=labels)
    ref = hf_forward(hf, batch, labels=labels)
    assert_close(out.logits, ref.logits[chosen], **TOL)
    assert_close(out.loss, ref.loss, **TOL)


def test_rtd_loss_matches_electra_for_pretraining(tmp_path: Path) -> None:
    folder = save_tiny_hf("electra", "rtd", tmp_path)
    ours = load_model(folder)
    hf = hf_class("electra", "rtd").from_pretrained(folder).eval()
    batch = family_batch(ours.config)
    replaced = (torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(2)) < 0.3).long()
    ours_labels = torch.where(batch["attention_mask"].bool(), replaced, -100)
    with torch.no_grad():
        out = ours(**batch, labels=ours_labels)
    ref = hf_forward(hf, batch, labels=replaced)  # transformers averages over attention_mask == 1
    assert_close(out.loss, ref.loss, **TOL)


def test_electra_without_factorized_embeddings_has_no_projection(tmp_path: Path) -> None:
    folder = save_tiny_hf("electra", "base", tmp_path, embedding_size=32)
    ours = load_model(folder)
    assert ours.encoder.project is None
    hf = hf_class("electra", "base").from_pretrained(folder).eval()
    batch = family_batch(ours.config)
    with torch.no_grad():
        assert_close(ours(**batch).last_hidden_state, hf_forward(hf, batch).last_hidden_state, **TOL)


def test_albert_shares_one_block_among_its_layers(tmp_path: Path) -> None:
    ours = load_model(save_tiny_hf("albert", "base", tmp_path))
    assert len(ours.encoder.layers) == 1 and ours.config.num_layers == 2
    batch = family_batch(ours.config)
    with torch.no_grad():
        two = ours(**batch).last_hidden_state
        ours.config.num_layers = 3  # the same block once more must change the output
        three = ours(**batch).last_hidden_state
    assert not torch.allclose(two, three)


def test_roberta_positions_skip_padding(tmp_path: Path) -> None:
    """A left-padded row gives its real tokens the same vectors as the unpadded row (fairseq positions)."""
    ours = load_model(save_tiny_hf("roberta", "base", tmp_path))
    pad = ours.config.pad_token_id
    row = family_batch(ours.config, lengths=(6,))["input_ids"]
    left = torch.cat([torch.full((1, 3), pad), row], dim=1)
    with torch.no_grad():
        plain = ours(row).last_hidden_state
        padded = ours(left, attention_mask=(left != pad).long()).last_hidden_state
    assert_close(padded[:, 3:], plain, **TOL)


# ---- encoderlab -> Hugging Face --------------------------------------------------------------------------
def tiny_config(family: str) -> EncoderConfig:
    """Our own tiny config of a family, from its small preset."""
    small = next(name for name in FAMILIES[family].presets if EncoderConfig.from_preset(name).hidden_size <= 256)
    preset = EncoderConfig.from_preset(small)
    return EncoderConfig.from_preset(small, vocab_size=VOCAB, hidden_size=32, num_heads=4, intermediate_size=37,
                                     num_layers=2, max_position_embeddings=64,
                                     pad_token_id=preset.pad_token_id if preset.pad_token_id < VOCAB else 0,
                                     **({"embedding_size": 16} if preset.embedding_size else {}),
                                     **({"local_attention": 4} if preset.local_attention else {}))


@pytest.mark.parametrize("family, kind", FAMILY_KINDS)
def test_export_is_loaded_by_transformers_with_the_same_outputs(tmp_path: Path, family: str, kind: str) -> None:
    torch.manual_seed(0)
    ours = MODEL_CLASSES[kind](tiny_config(family)).eval()
    randomize(ours, seed=3)
    save_pretrained(ours, tmp_path)
    hf, info = hf_class(family, kind).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    batch = family_batch(ours.config)
    with torch.no_grad():
        out = ours(**batch)
    ref = hf_forward(hf.eval(), batch)
    mine, theirs = {"base": ("last_hidden_state", "last_hidden_state"), "mlm": ("logits", "logits"),
                    "pretraining": ("logits", "prediction_logits"), "rtd": ("logits", "logits")}[kind]
    assert_close(getattr(out, mine), getattr(ref, theirs), **TOL)
    again = load_model(tmp_path)  # and back: the round trip is exact
    for (name, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("family", sorted(HF_CONFIGS))
def test_config_round_trips_through_config_json(family: str) -> None:
    config = tiny_config(family)
    architecture = FAMILIES[family].architectures["base"]
    assert EncoderConfig.from_hf_dict({"model_type": family, **config.to_hf_dict(architecture)}) == config


def test_distilbert_config_with_token_types_is_refused_on_export() -> None:
    config = tiny_config("distilbert").replace(type_vocab_size=2)
    with pytest.raises(ConfigError, match="type_vocab_size"):
        config.to_hf_dict("DistilBertModel")


# (family, switch, a value the family's transformers class cannot compute, what the model then has)
SWITCHES = [
    ("albert", "shared_layers", False, lambda m: len(m.encoder.layers) == 2),
    ("bert", "always_project", True, lambda m: m.encoder.project is not None),
    ("bert", "positions_after_pad", True, lambda m: m.encoder.embeddings.pad_id == 0),
    ("distilbert", "pooler", True, lambda m: m.pooler is not None),
    ("electra", "pooler", True, lambda m: m.pooler is not None),
    ("bert", "pooler", False, lambda m: m.pooler is None),
]


@pytest.mark.parametrize("family, switch, value, built", SWITCHES)
def test_any_switch_builds_but_only_its_family_value_is_saved(family: str, switch: str, value, built) -> None:
    config = tiny_config(family).replace(**{switch: value})  # the config describes the model: no lock to model_type
    assert built(EncoderModel(config))
    with pytest.raises(ConfigError, match=f"{switch}={value!r} cannot be saved in a transformers {family}"):
        config.to_hf_dict(FAMILIES[family].architectures["base"])


@pytest.mark.parametrize("family, activation", [("bert", "relu"), ("roberta", "silu"), ("electra", None)])
def test_mlm_head_activation_is_read_from_the_config(family: str, activation: str | None) -> None:
    config = tiny_config(family).replace(head_activation=activation)
    expected = {"relu": torch.relu, "silu": torch.nn.functional.silu, None: torch.nn.functional.gelu}[activation]
    x = torch.linspace(-3, 3, 7)
    assert_close(MODEL_CLASSES["mlm"](config).mlm.act(x), expected(x))
    with pytest.raises(ConfigError, match="head_activation"):
        config.to_hf_dict(FAMILIES[family].architectures["mlm"])


def test_unsupported_albert_layer_groups_are_refused() -> None:
    data = {"model_type": "albert", **tiny_config("albert").to_hf_dict("AlbertModel"), "num_hidden_groups": 2}
    with pytest.raises(ConfigError, match="num_hidden_groups"):
        EncoderConfig.from_hf_dict(data)


def test_discriminator_learns_replacements_it_can_see() -> None:
    """Replaced tokens drawn from ids the text never uses: the detector must learn them from identity alone
    (a check that the head, labels and loss are wired so that learning is possible at all)."""
    torch.manual_seed(0)
    config = tiny_config("electra").replace(hidden_dropout=0.0, attention_dropout=0.0)
    model = MODEL_CLASSES["rtd"](config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    text_ids, foreign_ids = (2, VOCAB // 2), (VOCAB // 2, VOCAB)
    for _ in range(80):
        ids = torch.randint(*text_ids, (16, 24))
        replaced = torch.rand(ids.shape) < 0.15
        ids = torch.where(replaced, torch.randint(*foreign_ids, ids.shape), ids)
        out = model(ids, torch.ones_like(ids), labels=replaced.long())
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    assert ((out.logits > 0) == replaced).float().mean() > 0.97
