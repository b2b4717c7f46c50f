"""The pretraining loop: recipes, optimizer rules, exact resume, DDP equivalence, logs and exports."""

from __future__ import annotations

import csv
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from encoderlab import load_model
from encoderlab.cli import main
from encoderlab.data.prepare import prepare
from encoderlab.errors import ConfigError, TrainingDiverged
from encoderlab.nn.model import MaskedLMModel
from encoderlab.objectives.mlm import MaskedLanguageModeling
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import load_recipe, recipe_keys
from encoderlab.train.optim import linear_schedule, lr_schedule, param_groups, wsd_schedule
from encoderlab.train.pretrain import pretrain

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the a cat dog sat ran on under mat table house river city paris france capital king queen "
         "small large red blue quickly slowly because when where music guitar player plays sings").split()

# A tiny model that trains in well under a second per step on 2 cores; no dropout so runs are comparable.
TINY = ["preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.num_layers=2", "model.max_position_embeddings=64", "max_length=32", "batch_size=8",
        "warmup_steps=2", "lr=0.003", "precision=fp32", "log_every=1", "eval_batches=2"]


def _write_corpus(path: Path, documents: int = 60, seed: int = 0) -> None:
    """Plain text: documents of a few sentences each, separated by blank lines."""
    rng = random.Random(seed)
    docs = []
    for _ in range(documents):
        sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + "."
                     for _ in range(rng.randint(3, 8))]
        docs.append("\n".join(sentences))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A prepared corpus with a held-out split and its own small WordPiece vocabulary."""
    root = tmp_path_factory.mktemp("corpus")
    corpus = root / "corpus.txt"
    _write_corpus(corpus)
    Tokenizer.train("wordpiece", [corpus], vocab_size=120).save(root / "tokenizer")
    prepare([str(corpus)], root / "tokenizer", root / "data", holdout=0.1, workers=1)
    return root / "data"


def _recipe(prepared: Path, *extra: str):
    return load_recipe(None, [f"data={prepared}", *TINY, *extra])


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
    return [(int(r["step"]), float(r["loss"])) for r in rows if r["loss"]]


# ---- recipes ------------------------------------------------------------------------------------
def test_shipped_recipes_load():
    for recipe in sorted((ROOT / "configs").glob("*.yaml")):
        cfg = load_recipe(recipe)
        assert cfg.model.preset.startswith(("bert-", "modernbert-")) and cfg.loop.max_steps > 0


def test_every_recipe_loads_to_the_run_it_describes(tmp_path):
    """Every configs/ recipe loads; its flat keys hold each value it sets, every known key is recorded, and the
    record (a run's recipe.yaml) loads back to the same recipe."""
    recipes = sorted((ROOT / "configs").rglob("*.yaml"))
    assert len(recipes) >= 15
    for path in recipes:
        cfg = load_recipe(path)
        flat = cfg.flat()
        assert set(flat) == set(recipe_keys()), path
        for key, value in yaml.safe_load(path.read_text(encoding="utf-8")).items():
            assert flat[key] == (float(value) if isinstance(flat[key], float) else value), (path, key)
        record = tmp_path / "recipe.yaml"
        record.write_text(yaml.safe_dump(flat, sort_keys=False), encoding="utf-8")
        assert load_recipe(record) == cfg, path


def test_unknown_yaml_key_names_the_key_and_the_file(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("preset: bert-tiny\nclip_norms: 0.5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unknown key 'clip_norms' in \S*r\.yaml; did you mean: clip_norm\?$"):
        load_recipe(recipe)


@pytest.mark.parametrize("key, hint", [("lr_rate", "did you mean: lr?"), ("warmup", "did you mean: warmup_steps"),
                                       ("zzzz", "see docs/pretraining.md")])
def test_unknown_key_names_the_closest_keys_not_all_of_them(key, hint):
    with pytest.raises(ConfigError, match=re.escape(hint)) as caught:
        load_recipe(None, [f"{key}=1"])
    assert "max_steps" not in str(caught.value)  # not the whole list


def test_unknown_yaml_key_is_named(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("preset: bert-tiny\nlearning_rate: 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="learning_rate"):
        load_recipe(recipe)


@pytest.mark.parametrize("override, name", [("max_stepz=3", "max_stepz"), ("model.hidden_sise=8", "hidden_sise"),
                                            ("lr=fast", "lr"), ("precision=fp16", "precision")])
def test_bad_set_overrides_are_named(override, name):
    with pytest.raises(ConfigError, match=name):
        load_recipe(None, ["data=x", override])


def test_yaml_is_data_not_code(tmp_path):
    recipe = tmp_path / "evil.yaml"
    marker = tmp_path / "ran"
    recipe.write_text(f"data: !!python/object/apply:os.system ['touch {marker}']\n", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_recipe(recipe)
    assert not marker.exists()


def test_batch_must_split_over_accumulation_and_ranks(prepared):
    with pytest.raises(ConfigError, match="divisible"):
        _recipe(prepared, "batch_size=10", "grad_accum=3").micro_batch(1)


# ---- optimizer ----------------------------------------------------------------------------------
def test_no_weight_decay_on_biases_and_layernorm():
    from encoderlab import EncoderConfig

    model = MaskedLMModel(EncoderConfig.from_preset("bert-tiny", vocab_size=50))
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and "norm" not in names[id(p)] for p in decay["params"])
    assert all(names[id(p)].endswith("bias") or "norm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_schedule_warms_up_then_decays_to_zero():
    factor = linear_schedule(warmup_steps=10, total_steps=100)
    values = [factor(s) for s in range(101)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(values[:10], values[1:10]))
    assert all(a >= b for a, b in zip(values[10:], values[11:]))
    assert values[100] == 0.0


@pytest.mark.parametrize("sqrt", [False, True])
def test_wsd_warms_up_holds_the_peak_then_decays_over_the_last_fraction(sqrt):
    factor = wsd_schedule(warmup_steps=10, total_steps=100, decay_fraction=0.2, sqrt=sqrt)
    values = [factor(s) for s in range(101)]
    assert values[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert values[10:81] == [1.0] * 71  # stable: the peak from the end of warmup to the decay's start at step 80
    assert all(a > b for a, b in zip(values[80:], values[81:])) and values[100] == 0.0
    halfway = 1 - 0.5 ** 0.5 if sqrt else 0.5  # 1 - sqrt(t) falls fastest at the start of the decay
    assert values[90] == pytest.approx(halfway)


def test_schedule_names_are_checked_and_linear_is_the_default(prepared):
    assert lr_schedule("linear", 10, 100, 0.2)(50) == linear_schedule(10, 100)(50)
    assert _recipe(prepared).optim.schedule == "linear"
    with pytest.raises(ConfigError, match="schedule must be one of"):
        _recipe(prepared, "schedule=cosine")
    with pytest.raises(ConfigError, match="decay_fraction"):
        _recipe(prepared, "schedule=wsd", "decay_fraction=0")


def test_resume_across_the_stable_to_decay_boundary_is_exact(prepared, tmp_path):
    """Stopped in the stable phase (step 3 of 8, decay from step 4), resumed: the same losses, lrs and weights."""
    extra = ("max_steps=8", "save_every=0", "eval_every=0", "schedule=wsd-sqrt", "decay_fraction=0.5")
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    pretrain(_recipe(prepared, *extra), straight, progress=False)
    pretrain(_recipe(prepared, *extra), broken, stop_after=3, progress=False)
    pretrain(_recipe(prepared, *extra), broken, resume=True, progress=False)
    assert _losses(broken) == _losses(straight)
    rates = [float(r["lr"]) for r in csv.DictReader((straight / "metrics.csv").open()) if r["lr"]]
    assert rates == [float(r["lr"]) for r in csv.DictReader((broken / "metrics.csv").open()) if r["lr"]]
    assert rates[2:4] == [0.003, 0.003] and rates[4] < 0.003 and rates[-1] == 0.0, rates  # held, then decayed
    for (name, a), b in zip(load_model(straight / "model").state_dict().items(),
                            load_model(broken / "model").state_dict().values()):
        assert torch.equal(a, b), name


# ---- the loop -----------------------------------------------------------------------------------
def test_loss_falls_and_outputs_are_written(prepared, tmp_path):
    run = tmp_path / "run"
    result = pretrain(_recipe(prepared, "max_steps=30", "eval_every=10", "save_every=10"), run, progress=False)
    losses = [loss for _, loss in _losses(run)]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    assert 0.0 <= result["eval_mlm_accuracy"] <= 1.0 and result["eval_perplexity"] > 1.0
    assert (run / "curves.png").stat().st_size > 1000
    assert any((run / "tensorboard").iterdir())
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000030"
    assert len(list((run / "checkpoints").glob("step-*"))) == 2  # keep_checkpoints
    assert not list(run.rglob("*.tmp"))
    model = load_model(run / "model")  # the final export is a Hugging Face folder with its tokenizer
    assert isinstance(model, MaskedLMModel)
    assert Tokenizer.from_pretrained(run / "model").vocab_size == model.config.vocab_size


@pytest.mark.slow
def test_pad_vocab_multiple_rounds_the_model_vocabulary_up(prepared, tmp_path):
    from transformers import AutoModelForMaskedLM

    tokens = Tokenizer.from_pretrained(prepared / "tokenizer").vocab_size
    result = pretrain(_recipe(prepared, "max_steps=4", "eval_every=4", "pad_vocab_multiple=64"), tmp_path / "run",
                      progress=False)
    model = load_model(tmp_path / "run" / "model")
    assert model.config.vocab_size % 64 == 0 and 0 <= model.config.vocab_size - tokens < 64
    assert 0.0 <= result["eval_mlm_accuracy"] <= 1.0
    theirs = AutoModelForMaskedLM.from_pretrained(tmp_path / "run" / "model")  # the padded rows export and load
    ids = torch.tensor([[2, 5, 9, 3]])
    torch.testing.assert_close(model(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)
    assert theirs.get_output_embeddings().weight.shape[0] == model.config.vocab_size
    with pytest.raises(ConfigError, match="pad_vocab_multiple"):
        _recipe(prepared, "pad_vocab_multiple=0")


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp", "mlm+sop"])
def test_resume_gives_the_same_losses_as_an_uninterrupted_run(prepared, tmp_path, objective):
    extra = ("max_steps=8", "save_every=0", "eval_every=0", f"objective={objective}", "grad_accum=2")
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    pretrain(_recipe(prepared, *extra), straight, progress=False)
    pretrain(_recipe(prepared, *extra), broken, stop_after=3, progress=False)
    assert max(step for step, _ in _losses(broken)) == 3
    pretrain(_recipe(prepared, *extra), broken, resume=True, progress=False)
    assert _losses(broken) == _losses(straight)
    final_a, final_b = load_model(straight / "model"), load_model(broken / "model")
    for (name, a), b in zip(final_a.state_dict().items(), final_b.state_dict().values()):
        assert torch.equal(a, b), name


def test_whole_word_masking_and_bf16_run(prepared, tmp_path):
    result = pretrain(_recipe(prepared, "max_steps=3", "whole_word=true", "precision=bf16"), tmp_path / "run",
                      progress=False)
    assert result["step"] == 3


def test_cli_pretrain_reports_unknown_key(prepared, tmp_path, capsys):
    code = main(["pretrain", "--set", f"data={prepared}", "--set", "bogus=1", "--out", str(tmp_path / "r")])
    assert code == 2 and "bogus" in capsys.readouterr().err


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(prepared, tmp_path):
    """torchrun with 2 CPU ranks (gloo) and the same global batch ends where one process ends."""
    sets = [f"data={prepared}", *TINY, "max_steps=4", "save_every=0", "eval_every=0",
            "model.hidden_dropout=0", "model.attention_dropout=0"]
    args = [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    single, double = tmp_path / "single", tmp_path / "double"
    assert main(["pretrain", *args, "--out", str(single)]) == 0  # the reference, in this process (one thread)
    launched = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               "-m", "encoderlab", "pretrain", *args, "--out", str(double)],
                              env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    for (step_a, loss_a), (step_b, loss_b) in zip(_losses(single), _losses(double), strict=True):
        assert step_a == step_b and loss_a == pytest.approx(loss_b, rel=1e-4, abs=1e-5)
    a, b = load_model(single / "model"), load_model(double / "model")
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=name)


def test_a_non_finite_loss_stops_the_run_naming_the_step_and_saving_nothing_after_it(prepared, tmp_path, monkeypatch,
                                                                                     capsys):
    """A NaN injected into step 5's loss (its gradients follow) is caught at the next read, step 6's checkpoint:
    one error line names step 5 and the last good checkpoint (step 4); nothing is saved or exported after it."""
    real_forward, calls = MaskedLanguageModeling.forward, iter(range(1, 10**6))

    def poisoned(self, batch, counts):
        loss, sums = real_forward(self, batch, counts)
        return (loss * float("nan"), sums) if self.training and next(calls) == 5 else (loss, sums)

    monkeypatch.setattr(MaskedLanguageModeling, "forward", poisoned)
    run = tmp_path / "run"
    sets = [f"data={prepared}", *TINY, "max_steps=10", "save_every=2", "log_every=3", "eval_every=0",
            "keep_checkpoints=5"]
    code = main(["pretrain", *[a for s in sets for a in ("--set", s)], "--out", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: step 5: the loss or gradient norm is not finite"), err
    assert "the last finite loss read was" in err[-1] and "at step 4" in err[-1]
    assert str(run / "checkpoints" / "step-000004") in err[-1]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000004"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-000002", "step-000004"]
    assert not (run / "model").exists()
    assert max(step for step, _ in _losses(run)) == 3  # logged at 3; step 6's row was never written


def test_an_overflowing_learning_rate_is_caught_without_injection(prepared, tmp_path):
    """A real divergence: lr 1e30 sends the weights to inf within a step or two."""
    with pytest.raises(TrainingDiverged, match=r"^step \d+: the loss or gradient norm is not finite"):
        pretrain(_recipe(prepared, "max_steps=6", "lr=1e30", "warmup_steps=1", "clip_norm=0", "save_every=0",
                         "eval_every=0", "log_every=1"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run" / "model").exists() and not (tmp_path / "run" / "checkpoints" / "latest").exists()
