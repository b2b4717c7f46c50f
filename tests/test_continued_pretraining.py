"""Continued pretraining (`init_from`, `encoderlab pretrain --init-from`): a run starts from any family's
checkpoint. For every family, from a tiny random transformers masked LM saved with its tokenizer: the data is
prepared with the checkpoint folder as tokenizer, the first step's loss equals transformers' MLM loss on the
same batch, resume is exact, and the exported model loads in transformers with the same logits. A checkpoint
without the MLM head (minilm's kind) starts its head fresh and says so; a tokenizer mismatch is refused.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
import transformers
from torch.testing import assert_close

from hf_oracle import TOL, randomize
from test_family import HF_CONFIGS, hf_class

from encoderlab import load_model
from encoderlab.cli import main
from encoderlab.data.prepare import prepare
from encoderlab.errors import CheckpointError, ConfigError
from encoderlab.models import FAMILIES
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import load_recipe
from encoderlab.train.pretrain import Batches, PretrainingData, build_objective, masking_collator, pretrain
from encoderlab.data.examples import PretrainingExamples
from encoderlab.data.shards import TokenShards

WORDS = ("the a cat dog sat ran on under mat table house river city paris france capital king queen "
         "small large red blue quickly slowly because when where music guitar player plays sings").split()
# No dropout, so that our step and transformers' eval-mode forward see the same network.
RUN = ["max_length=32", "batch_size=8", "max_steps=3", "warmup_steps=1", "lr=0.001", "precision=fp32",
       "log_every=1", "eval_batches=1", "eval_every=0", "save_every=1", "model.hidden_dropout=0",
       "model.attention_dropout=0"]
FAMILY_LIST = sorted(f for f in HF_CONFIGS if "mlm" in FAMILIES[f].architectures)


def _corpus(path: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                      for _ in range(rng.randint(3, 8))) for _ in range(40)]
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def _checkpoint(family: str, kind: str, folder: Path, corpus: Path, vocab: int = 320) -> Path:
    """A tiny random transformers model of the family, sized to a tokenizer of the family's kind saved beside it."""
    tokenizer = Tokenizer.train(FAMILIES[family].tokenizer_kind, [corpus], vocab_size=vocab)
    torch.manual_seed(0)
    config = HF_CONFIGS[family]()
    config.vocab_size, config.pad_token_id = tokenizer.vocab_size, tokenizer.pad_id
    model = hf_class(family, kind)(config)
    randomize(model, 0)
    model.save_pretrained(folder)
    tokenizer.save(folder)
    return folder


@pytest.fixture(scope="module", params=FAMILY_LIST)
def family_run(request, tmp_path_factory) -> tuple[str, Path, Path]:
    """(family, checkpoint, data) with the data prepared by the checkpoint folder's tokenizer."""
    root = tmp_path_factory.mktemp(request.param)
    corpus = _corpus(root / "corpus.txt")
    folder = _checkpoint(request.param, "mlm", root / "hf", corpus)
    prepare([str(corpus)], folder, root / "data", holdout=0.1, workers=1, progress=False)
    return request.param, folder, root / "data"


def _recipe(data: Path, folder: Path, *extra: str):
    return load_recipe(None, [f"data={data}", f"init_from={folder}", *RUN, *extra])


def _losses(run: Path) -> list[float]:
    return [float(r["loss"]) for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if r["loss"]]


def _first_batch(cfg, tokenizer: Tokenizer) -> dict[str, torch.Tensor]:
    """The batch the run's first step trains on, from the same data code (its masks seeded by position)."""
    examples = PretrainingExamples(TokenShards(cfg.data, "train"), "mlm", cfg.max_length, cfg.seed, cfg.short_seq_prob)
    batches = Batches(examples, masking_collator(cfg, tokenizer), cfg.seed)
    return PretrainingData(batches, cfg.batch_size, cfg.batch_size).next_step(0, 1, 1)[0]


def test_first_step_loss_equals_transformers_mlm_loss(family_run, tmp_path):
    family, folder, data = family_run
    pretrain(_recipe(data, folder), tmp_path / "run", progress=False)
    batch = _first_batch(_recipe(data, folder), Tokenizer.from_pretrained(data / "tokenizer"))
    hf = hf_class(family, "mlm").from_pretrained(folder).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    if hf.config.to_dict().get("type_vocab_size", 0) > 1:
        inputs["token_type_ids"] = batch["token_type_ids"]
    with torch.no_grad():
        expected = hf(**inputs, labels=batch["labels"]).loss
    assert_close(torch.tensor(_losses(tmp_path / "run")[0]), expected.float(), **TOL)
    assert json.loads((tmp_path / "run" / "init_from.json").read_text())["new_tensors"] == []


@pytest.mark.slow
def test_resume_is_exact_and_the_export_loads_in_transformers(family_run, tmp_path):
    family, folder, data = family_run
    pretrain(_recipe(data, folder), tmp_path / "straight", progress=False)
    pretrain(_recipe(data, folder), tmp_path / "split", stop_after=2, progress=False)
    pretrain(_recipe(data, folder), tmp_path / "split", resume=True, progress=False)
    assert _losses(tmp_path / "split") == _losses(tmp_path / "straight")
    exported = tmp_path / "split" / "model"
    hf, info = hf_class(family, "mlm").from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    ours = load_model(exported)
    ids = torch.tensor([[2, 5, 9, 11, 7, 3]])
    with torch.no_grad():
        assert_close(ours(ids).logits, hf.eval()(ids).logits, **TOL)
    before = load_model(folder)
    assert any(not torch.equal(a, b) for a, b in zip(ours.state_dict().values(), before.state_dict().values()))


def test_a_checkpoint_without_the_mlm_head_starts_it_fresh(tmp_path, capsys):
    corpus = _corpus(tmp_path / "corpus.txt")
    folder = _checkpoint("bert", "base", tmp_path / "base", corpus)
    prepare([str(corpus)], folder, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    cfg = _recipe(tmp_path / "data", folder)
    objective = build_objective(cfg, Tokenizer.from_pretrained(tmp_path / "data" / "tokenizer"))
    assert sorted(objective.new_tensors) == sorted(k for k in objective.model.state_dict() if k.startswith("mlm."))
    hf = transformers.BertModel.from_pretrained(folder)
    assert torch.equal(objective.model.encoder.embeddings.word.weight, hf.embeddings.word_embeddings.weight)
    assert torch.equal(objective.model.mlm.norm.weight, torch.ones_like(objective.model.mlm.norm.weight))
    main(["pretrain", "--init-from", str(folder), "--out", str(tmp_path / "run"),
          *[a for item in [f"data={tmp_path / 'data'}", *RUN] for a in ("--set", item)]])
    err = capsys.readouterr().err
    assert "new (initialised as from scratch): mlm." in err
    assert "mlm.transform.weight" in json.loads((tmp_path / "run" / "init_from.json").read_text())["new_tensors"]
    assert transformers.BertForMaskedLM.from_pretrained(tmp_path / "run" / "model", output_loading_info=True)[1][
        "missing_keys"] == set()


def test_electra_discriminator_starts_rtd_with_a_fresh_generator(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    folder = _checkpoint("electra", "rtd", tmp_path / "disc", corpus)
    prepare([str(corpus)], folder, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    cfg = _recipe(tmp_path / "data", folder, "objective=rtd", "generator_size=0.5")
    objective = build_objective(cfg, Tokenizer.from_pretrained(tmp_path / "data" / "tokenizer"))
    assert objective.new_tensors and all(k.startswith("generator.") for k in objective.new_tensors)
    hf = transformers.ElectraForPreTraining.from_pretrained(folder)
    assert torch.equal(objective.discriminator.rtd.prediction.weight.flatten(),
                       hf.discriminator_predictions.dense_prediction.weight.flatten())


def test_tokenizer_mismatch_is_refused_naming_both(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    folder = _checkpoint("bert", "mlm", tmp_path / "hf", corpus)
    other = tmp_path / "other-tokenizer"
    Tokenizer.train("wordpiece", [_corpus(tmp_path / "other.txt", seed=5)], vocab_size=120).save(other)
    prepare([str(corpus)], other, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    with pytest.raises(ConfigError, match=f"{folder}.*tokenizer.*{tmp_path / 'data'}"):
        build_objective(_recipe(tmp_path / "data", folder), Tokenizer.from_pretrained(tmp_path / "data" / "tokenizer"))


def test_unknown_or_foreign_checkpoints_are_refused(tmp_path):
    with pytest.raises((CheckpointError, ConfigError), match="nowhere"):
        load_recipe(None, [f"data={tmp_path}", f"init_from={tmp_path / 'nowhere'}"])
    corpus = _corpus(tmp_path / "corpus.txt")
    folder = _checkpoint("roberta", "mlm", tmp_path / "roberta", corpus)
    with pytest.raises(ConfigError, match="distill"):
        load_recipe(None, [f"data={tmp_path}", f"init_from={folder}", "objective=distill", f"teacher={folder}"])


# ---- anchor: a frozen encoder the adapted model's last hidden states are kept near ----------------------------

def _anchor_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(a tiny masked LM, another random BERT encoder of the same widths and tokenizer, data prepared with both)."""
    corpus = _corpus(tmp_path / "corpus.txt")
    folder = _checkpoint("bert", "mlm", tmp_path / "hf", corpus)
    tokenizer = Tokenizer.from_pretrained(folder)
    config = HF_CONFIGS["bert"]()
    config.vocab_size, config.pad_token_id = tokenizer.vocab_size, tokenizer.pad_id
    anchor = transformers.BertModel(config)
    randomize(anchor, 1)  # not the masked LM's weights: the cosine term is far from 0
    anchor.save_pretrained(tmp_path / "anchor")
    tokenizer.save(tmp_path / "anchor")
    prepare([str(corpus)], folder, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    return folder, tmp_path / "anchor", tmp_path / "data"


def _anchored_loss(folder: Path, anchor: Path, batch: dict[str, torch.Tensor], weight: float,
                   layers: str = "last") -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' MLM loss of `folder` on the batch, and the mean 1 - cos between its last hidden states (all:
    each of its hidden states, averaged) and `anchor`'s over the real tokens not selected for prediction."""
    mlm = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    base = transformers.BertModel.from_pretrained(anchor).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = mlm(**inputs, labels=batch["labels"], output_hidden_states=True)
        target = base(**inputs, output_hidden_states=True).hidden_states
    kept = batch["attention_mask"].bool() & (batch["labels"] == -100)
    pairs = list(zip(out.hidden_states, target)) if layers == "all" else [(out.hidden_states[-1], target[-1])]
    cos = torch.stack([(1 - torch.nn.functional.cosine_similarity(ours[kept], theirs[kept], dim=-1)).mean()
                       for ours, theirs in pairs]).mean()
    return out.loss + weight * cos, cos


def _column(run: Path, name: str) -> list[float]:
    return [float(r[name]) for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if r[name]]


def test_an_anchor_adds_its_weighted_cosine_to_transformers_mlm_loss(tmp_path):
    folder, anchor, data = _anchor_pair(tmp_path)
    cfg = _recipe(data, folder, f"anchor={anchor}", "anchor_weight=0.5")
    pretrain(cfg, tmp_path / "run", progress=False)
    expected, cos = _anchored_loss(folder, anchor, _first_batch(cfg, Tokenizer.from_pretrained(data / "tokenizer")), 0.5)
    assert cos > 0.1  # two unrelated encoders: the term is not negligible
    assert_close(torch.tensor(_column(tmp_path / "run", "cos_loss")[0]), cos.float(), **TOL)
    assert_close(torch.tensor(_losses(tmp_path / "run")[0]), expected.float(), **TOL)
    assert "eval_cos_loss" in next(csv.DictReader((tmp_path / "run" / "metrics.csv").open(encoding="utf-8")))


def test_an_anchor_on_all_layers_averages_the_cosine_of_every_hidden_state(tmp_path):
    folder, anchor, data = _anchor_pair(tmp_path)
    cfg = _recipe(data, folder, f"anchor={anchor}", "anchor_weight=2", "anchor_layers=all")
    pretrain(cfg, tmp_path / "run", progress=False)
    batch = _first_batch(cfg, Tokenizer.from_pretrained(data / "tokenizer"))
    expected, cos = _anchored_loss(folder, anchor, batch, 2.0, layers="all")
    assert abs(float(cos) - float(_anchored_loss(folder, anchor, batch, 2.0)[1])) > 1e-3  # not the last layer's
    assert_close(torch.tensor(_column(tmp_path / "run", "cos_loss")[0]), cos.float(), **TOL)
    assert_close(torch.tensor(_losses(tmp_path / "run")[0]), expected.float(), **TOL)


def test_anchored_at_its_own_start_the_first_step_is_plain_mlm(tmp_path):
    folder, _, data = _anchor_pair(tmp_path)
    pretrain(_recipe(data, folder, f"anchor={folder}", "anchor_weight=3"), tmp_path / "run", progress=False)
    batch = _first_batch(_recipe(data, folder), Tokenizer.from_pretrained(data / "tokenizer"))
    expected, _ = _anchored_loss(folder, folder, batch, 0.0)
    assert abs(_column(tmp_path / "run", "cos_loss")[0]) < 1e-5
    assert_close(torch.tensor(_losses(tmp_path / "run")[0]), expected.float(), **TOL)
    assert _column(tmp_path / "run", "cos_loss")[-1] > 1e-5  # then the model moves away and the term pulls back


@pytest.mark.slow
def test_anchored_resume_is_exact_and_leaves_the_anchor_alone(tmp_path):
    folder, anchor, data = _anchor_pair(tmp_path)
    before = transformers.BertModel.from_pretrained(anchor).state_dict()
    extra = (f"anchor={anchor}", "anchor_weight=2")
    pretrain(_recipe(data, folder, *extra), tmp_path / "straight", progress=False)
    pretrain(_recipe(data, folder, *extra), tmp_path / "split", stop_after=2, progress=False)
    pretrain(_recipe(data, folder, *extra), tmp_path / "split", resume=True, progress=False)
    assert _losses(tmp_path / "split") == _losses(tmp_path / "straight")
    after = transformers.BertModel.from_pretrained(anchor).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    hf, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "split" / "model", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info  # the anchor is not saved with the model


def test_bad_anchors_are_refused_by_name(tmp_path):
    folder, anchor, data = _anchor_pair(tmp_path)
    with pytest.raises(ConfigError, match="anchor_weight must be positive"):
        _recipe(data, folder, f"anchor={anchor}", "anchor_weight=0")
    with pytest.raises(ConfigError, match="anchor applies to the mlm objectives"):
        _recipe(data, folder, f"anchor={anchor}", "objective=rtd")
    tokenizer = Tokenizer.from_pretrained(data / "tokenizer")
    with pytest.raises(ConfigError, match="anchor: cannot load"):
        build_objective(_recipe(data, folder, f"anchor={tmp_path / 'nowhere'}"), tokenizer)
    wide = transformers.BertModel(transformers.BertConfig(**{**HF_CONFIGS["bert"]().to_dict(), "hidden_size": 48,
                                                             "vocab_size": tokenizer.vocab_size}))
    wide.save_pretrained(tmp_path / "wide")
    with pytest.raises(ConfigError, match="48 wide, the model's 32"):
        build_objective(_recipe(data, folder, f"anchor={tmp_path / 'wide'}"), tokenizer)
    small = transformers.BertModel(transformers.BertConfig(**{**HF_CONFIGS["bert"]().to_dict(), "vocab_size": 10}))
    small.save_pretrained(tmp_path / "small")  # no tokenizer files: only the embedding rows can be checked
    with pytest.raises(ConfigError, match="10 token embeddings, fewer than"):
        build_objective(_recipe(data, folder, f"anchor={tmp_path / 'small'}"), tokenizer)
    with pytest.raises(ConfigError, match="anchor_layers must be one of"):
        _recipe(data, folder, f"anchor={anchor}", "anchor_layers=middle")
    deep = transformers.BertModel(transformers.BertConfig(**{**HF_CONFIGS["bert"]().to_dict(), "num_hidden_layers": 3,
                                                             "vocab_size": tokenizer.vocab_size}))
    deep.save_pretrained(tmp_path / "deep")
    build_objective(_recipe(data, folder, f"anchor={tmp_path / 'deep'}"), tokenizer)  # last layers pair whatever the depth
    with pytest.raises(ConfigError, match="has 3 layers and the model 2"):
        build_objective(_recipe(data, folder, f"anchor={tmp_path / 'deep'}", "anchor_layers=all"), tokenizer)
