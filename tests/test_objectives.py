"""Pretraining objectives beyond BERT's: RoBERTa and ALBERT recipes end to end, ELECTRA's replaced-token
detection (shared embeddings and DeBERTa-v3's GDES), DeBERTa-v3's own (RTD + GDES, a full-width half-depth
generator, the discriminator exported as DebertaV2Model), and DistilBERT's distillation."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from encoderlab import load_model, save_pretrained
from encoderlab.config import EncoderConfig
from encoderlab.data.prepare import prepare
from encoderlab.errors import ConfigError
from encoderlab.nn.model import EncoderModel, MaskedLMModel, ReplacedTokenDetector
from encoderlab.objectives import OBJECTIVES, ModelChoice, ObjectiveSpec, build_objective as build, register_objective
from encoderlab.objectives.mlm import MLMOptions
from encoderlab.objectives.rtd import HEAD_FILE, RTDOptions
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import load_recipe
from encoderlab.train.pretrain import Cursor, build_objective, heldout_batches, pretrain
from encoderlab.train.state import latest_checkpoint
from test_pretrain import _write_corpus

ROOT = Path(__file__).resolve().parents[1]
SIZES = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=2",
         "model.max_position_embeddings=64", "max_length=32", "batch_size=8", "warmup_steps=2", "lr=0.003",
         "precision=fp32", "log_every=1", "eval_batches=2", "model.hidden_dropout=0", "model.attention_dropout=0"]
ELECTRA = ["preset=electra-mini", "objective=rtd", "model.embedding_size=32", *SIZES]
# DeBERTa-v3's recipe: the generator at the discriminator's width (32) and half its depth (1 of 2 layers).
DEBERTA = ["preset=deberta-v3-mini", "objective=rtd", "generator_size=1.0", "generator_layers=0.5",
           "embedding_sharing=gdes", "model.position_buckets=8", *SIZES]
# name -> (data fixture, recipe): the rtd recipes that train, resume and share embeddings alike
RTD_RECIPES = {"shared": ("wordpiece", [*ELECTRA, "embedding_sharing=shared"]),
               "gdes": ("wordpiece", [*ELECTRA, "embedding_sharing=gdes"]),
               "deberta-gdes": ("unigram", DEBERTA)}


def _prepared(root: Path, kind: str, vocab_size: int) -> Path:
    corpus = root / "corpus.txt"
    _write_corpus(corpus)
    Tokenizer.train(kind, [corpus], vocab_size, min_frequency=1).save(root / "tokenizer")
    prepare([str(corpus)], root / "tokenizer", root / "data", holdout=0.1, workers=1)
    return root / "data"


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory) -> Path:
    return _prepared(tmp_path_factory.mktemp("wordpiece"), "wordpiece", 120)


@pytest.fixture(scope="module")
def unigram(tmp_path_factory) -> Path:
    """The corpus under a Unigram vocabulary, DeBERTa-v3's kind."""
    return _prepared(tmp_path_factory.mktemp("unigram"), "unigram", 150)


def _rtd_recipe(request, name: str) -> list[str]:
    data, recipe = RTD_RECIPES[name]
    return [f"data={request.getfixturevalue(data)}", *recipe]


@pytest.fixture(scope="module")
def teacher(wordpiece, tmp_path_factory) -> Path:
    """A 4-layer BERT masked LM pretrained for 40 steps on the corpus: a run's final export, as a recipe names it."""
    run = tmp_path_factory.mktemp("teacher") / "run"
    pretrain(load_recipe(None, [f"data={wordpiece}", "preset=bert-tiny", *SIZES, "model.num_layers=4", "max_steps=40",
                                "eval_every=0", "lr=0.005"]), run, progress=False)
    return run / "model"


def _distill(wordpiece: Path, teacher: Path, *extra: str) -> list[str]:
    return [f"data={wordpiece}", "preset=distilbert-mini", "objective=distill", f"teacher={teacher}",
            *[s for s in SIZES if not s.startswith("model.")], "model.hidden_dropout=0", "model.attention_dropout=0",
            *extra]


def _rows(run: Path) -> list[dict[str, str]]:
    return [r for r in csv.DictReader((run / "metrics.csv").open(encoding="utf-8")) if r["loss"]]


def _falls(values: list[float]) -> bool:
    return sum(values[-5:]) / 5 < sum(values[:5]) / 5 * 0.9


# ---- RoBERTa and ALBERT: existing objectives, their families' tokenizers ---------------------------------
@pytest.mark.parametrize("preset, objective, kind, vocab, hf_class", [
    ("roberta-mini", "mlm", "bpe", 300, "RobertaForMaskedLM"),
    ("albert-mini", "mlm+sop", "unigram", 150, "AlbertForPreTraining"),
    ("modernbert-mini", "mlm", "bpe", 300, "ModernBertForMaskedLM"),
])
def test_family_recipe_runs_and_its_export_loads_in_transformers(tmp_path, preset, objective, kind, vocab, hf_class):
    data = _prepared(tmp_path, kind, vocab)
    run = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pretrain(load_recipe(None, [f"data={data}", f"preset={preset}", f"objective={objective}", *SIZES,
                                    "max_steps=4", "eval_every=0"]), run, progress=False)
    assert not [w for w in caught if "tokenizer" in str(w.message)]  # the family's own tokenizer kind: no warning
    ours = load_model(run / "model")
    theirs = getattr(transformers, hf_class).from_pretrained(run / "model").eval()
    batch = next(iter([heldout_batches(load_recipe(None, [f"data={data}", f"preset={preset}",
                                                          f"objective={objective}", *SIZES]),
                                       Tokenizer.from_pretrained(run / "model")).make([(0, 0), (0, 1)])]))
    segments = {"token_type_ids": batch["token_type_ids"]} if ours.config.type_vocab_size else {}  # not ModernBERT
    with torch.no_grad():
        mine = ours(batch["input_ids"], batch["attention_mask"], **segments)
        hf = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **segments)
    torch.testing.assert_close(getattr(mine, "logits", None) if hasattr(mine, "logits") else mine.mlm_logits,
                               getattr(hf, "logits", None) if hasattr(hf, "logits") else hf.prediction_logits,
                               atol=1e-4, rtol=1e-4)
    if objective == "mlm+sop":
        torch.testing.assert_close(mine.nsp_logits, hf.sop_logits, atol=1e-4, rtol=1e-4)


def test_a_tokenizer_of_another_kind_than_the_family_warns(wordpiece, tmp_path):
    with pytest.warns(UserWarning, match="bpe tokenizer.*wordpiece"):
        pretrain(load_recipe(None, [f"data={wordpiece}", "preset=roberta-mini", *SIZES, "max_steps=1",
                                    "eval_every=0"]), tmp_path / "run", progress=False)


# ---- losses fall ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", RTD_RECIPES)
def test_rtd_losses_fall(request, tmp_path, name):
    run = tmp_path / "run"
    result = pretrain(load_recipe(None, [*_rtd_recipe(request, name), "max_steps=30", "eval_every=0"]),
                      run, progress=False)
    rows = _rows(run)
    for key in ("loss", "mlm_loss", "rtd_loss"):
        assert _falls([float(r[key]) for r in rows]), (key, [r[key] for r in rows])
    assert all(0 < float(r["replaced_fraction"]) <= 1 for r in rows)
    assert 0.5 < result["eval_rtd_accuracy"] <= 1 and 0 <= result["eval_mlm_accuracy"] <= 1


def test_distillation_losses_fall(wordpiece, teacher, tmp_path):
    run = tmp_path / "run"
    result = pretrain(load_recipe(None, _distill(wordpiece, teacher, "max_steps=30", "eval_every=0")), run,
                      progress=False)
    rows = _rows(run)
    for key in ("ce_loss", "cos_loss"):  # the student starts near the teacher and moves closer still
        assert _falls([float(r[key]) for r in rows]), (key, [r[key] for r in rows])
    losses = [float(r["loss"]) for r in rows]  # dominated by the hard MLM term, which moves slowly
    assert sum(losses[-5:]) < sum(losses[:5]), losses
    assert {"eval_ce_loss", "eval_cos_loss", "eval_mlm_loss"} <= set(result)


# ---- exact resume, and the exports in transformers ----------------------------------------------------------
def _straight_and_resumed(recipe: list[str], tmp_path: Path) -> tuple[Path, Path]:
    extra = [*recipe, "max_steps=6", "save_every=0", "eval_every=0", "grad_accum=2"]
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    pretrain(load_recipe(None, extra), straight, progress=False)
    pretrain(load_recipe(None, extra), broken, stop_after=2, progress=False)
    pretrain(load_recipe(None, extra), broken, resume=True, progress=False)
    timeless = [[{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in _rows(run)]
                for run in (straight, broken)]
    assert timeless[0] == timeless[1]
    return straight, broken


def _assert_same_weights(a: Path, b: Path) -> None:
    for (name, x), y in zip(load_model(a).state_dict().items(), load_model(b).state_dict().values(), strict=True):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("sharing", ["shared", "gdes"])
@pytest.mark.slow
def test_rtd_resumes_exactly_and_exports_electra(wordpiece, tmp_path, sharing):
    straight, broken = _straight_and_resumed([f"data={wordpiece}", *ELECTRA, f"embedding_sharing={sharing}"], tmp_path)
    for sub in ("model", "model/generator"):
        _assert_same_weights(straight / sub, broken / sub)
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    discriminator, generator = load_model(straight / "model"), load_model(straight / "model/generator")
    assert isinstance(discriminator, ReplacedTokenDetector) and isinstance(generator, MaskedLMModel)
    assert generator.config.hidden_size == 16 and generator.config.embedding_width == 32
    hf_disc = transformers.ElectraForPreTraining.from_pretrained(straight / "model").eval()
    hf_gen = transformers.ElectraForMaskedLM.from_pretrained(straight / "model/generator").eval()
    with torch.no_grad():
        torch.testing.assert_close(discriminator(ids, mask).logits, hf_disc(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(generator(ids, mask).logits, hf_gen(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-4, rtol=1e-4)
    same = torch.equal(discriminator.encoder.embeddings.word.weight, generator.encoder.embeddings.word.weight)
    assert same == (sharing == "shared")  # gdes: E_D = E_G + E_delta, and E_delta has learned something


def test_deberta_rtd_resumes_exactly_and_exports_its_base_model(unigram, tmp_path):
    recipe = [f"data={unigram}", *DEBERTA]
    straight, broken = _straight_and_resumed(recipe, tmp_path)  # the head comes back from HEAD_FILE exactly
    for sub in ("model", "model/generator"):
        _assert_same_weights(straight / sub, broken / sub)
    checkpoint = latest_checkpoint(straight)
    assert (checkpoint / HEAD_FILE).is_file() and not (straight / "model" / HEAD_FILE).exists()
    _, objective = _objective(recipe)
    objective.load(checkpoint)  # the trained pair, as the run ended
    objective.eval()
    base, generator = load_model(straight / "model"), load_model(straight / "model/generator")
    assert isinstance(base, EncoderModel) and isinstance(generator, MaskedLMModel)
    assert (generator.config.num_layers, generator.config.hidden_size, generator.config.embedding_size) == (1, 32, None)
    hf_base = transformers.DebertaV2Model.from_pretrained(straight / "model").eval()
    hf_gen = transformers.DebertaV2ForMaskedLM.from_pretrained(straight / "model/generator").eval()
    ids = torch.randint(5, base.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        ours = objective.discriminator.encoder(ids, mask).last_hidden_state
        torch.testing.assert_close(ours, hf_base(input_ids=ids, attention_mask=mask).last_hidden_state,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours, base(ids, mask).last_hidden_state, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(objective.generator(ids, mask).logits,
                                   hf_gen(input_ids=ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)


def test_distillation_resumes_exactly_and_exports_distilbert(wordpiece, teacher, tmp_path):
    straight, broken = _straight_and_resumed(_distill(wordpiece, teacher), tmp_path)
    _assert_same_weights(straight / "model", broken / "model")
    student = load_model(straight / "model")
    assert student.config.model_type == "distilbert" and student.config.num_layers == 2
    hf = transformers.DistilBertForMaskedLM.from_pretrained(straight / "model").eval()
    ids = torch.randint(5, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(student(ids).logits, hf(input_ids=ids).logits, atol=1e-4, rtol=1e-4)


# ---- the models an objective builds ---------------------------------------------------------------------------
def _objective(recipe: list[str]):
    cfg = load_recipe(None, recipe)
    torch.manual_seed(0)
    return cfg, build_objective(cfg, Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer"))


def _batch(cfg, objective) -> dict[str, torch.Tensor]:
    tokenizer = Tokenizer.from_pretrained(Path(cfg.data) / "tokenizer")
    batches = heldout_batches(cfg, tokenizer)
    return batches.make(Cursor().take(8, batches.examples))


def _generator_table_grad(objective, batch, rtd: bool) -> torch.Tensor:
    """The gradient on the generator's token table of its MLM loss, plus the discriminator's loss when rtd."""
    objective.zero_grad()
    counts = {k: torch.tensor(1.0) for k in ("masked", "tokens", "sequences")}
    objective.rtd_weight = 50.0 if rtd else 0.0
    torch.manual_seed(0)
    loss, _ = objective(batch, counts)
    loss.backward()
    return objective.generator.encoder.embeddings.word.weight.grad.clone()


@pytest.mark.parametrize("name", RTD_RECIPES)
def test_embedding_sharing(request, name):
    cfg, objective = _objective(_rtd_recipe(request, name))
    sharing = cfg.options.embedding_sharing
    generator, discriminator = objective.generator, objective.discriminator
    batch = _batch(cfg, objective)
    alone, both = (_generator_table_grad(objective, batch, rtd) for rtd in (False, True))
    if sharing == "shared":
        assert generator.encoder.embeddings is discriminator.encoder.embeddings
        assert generator.encoder.project is not discriminator.encoder.project
        assert not torch.allclose(alone, both)  # the discriminator's loss reaches the shared table
    else:
        assert generator.encoder.embeddings is not discriminator.encoder.embeddings
        torch.testing.assert_close(discriminator.encoder.embeddings.word.weight, generator.encoder.embeddings.word.weight,
                                   atol=0, rtol=0)  # E_delta starts at zero
        torch.testing.assert_close(alone, both)  # sg(E_G): the discriminator's loss does not reach E_G
        assert discriminator.encoder.embeddings.word.delta.grad.abs().sum() > 0
    names = {n for n, _ in objective.named_parameters()}
    assert any(n.startswith("discriminator.rtd.") for n in names) and any(n.startswith("generator.mlm.") for n in names)


def test_heldout_batches_are_the_same_whatever_the_recipe_seed(wordpiece):
    """Two cycles of one model (seed 0, then 1) score on the same masked held-out batches."""
    first = load_recipe(None, [f"data={wordpiece}", "preset=bert-mini", "seed=0"])
    later = load_recipe(None, [f"data={wordpiece}", "preset=bert-mini", "seed=1"])
    a, b = _batch(first, None), _batch(later, None)
    assert a.keys() == b.keys() and (a["labels"] != -100).any()
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_generator_is_a_fraction_of_the_discriminator(wordpiece):
    _, objective = _objective([f"data={wordpiece}", "preset=electra-mini", "objective=rtd", "generator_size=0.5"])
    disc, gen = objective.discriminator.config, objective.generator.config
    assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == (disc.hidden_size // 2, disc.num_heads // 2,
                                                                       disc.intermediate_size // 2)
    assert gen.num_layers == disc.num_layers and gen.embedding_width == disc.embedding_width


def test_deberta_generator_has_full_width_and_half_depth(unigram):
    _, objective = _objective([f"data={unigram}", "preset=deberta-v3-mini", "objective=rtd", "generator_size=1",
                               "generator_layers=0.5"])
    disc, gen = objective.discriminator.config, objective.generator.config
    assert (gen.hidden_size, gen.num_heads, gen.intermediate_size) == (disc.hidden_size, disc.num_heads,
                                                                       disc.intermediate_size)
    assert (gen.num_layers, disc.num_layers) == (2, 4) and gen.embedding_size is None
    assert objective.generator.encoder.project is None  # equal widths: nothing that a deberta-v2 config cannot hold
    assert gen.to_hf_dict("DebertaV2ForMaskedLM")["num_hidden_layers"] == 2


def test_student_starts_from_every_other_teacher_layer(wordpiece, teacher):
    _, objective = _objective(_distill(wordpiece, teacher))
    student, teach = objective.student, objective.teacher
    assert student.config.num_layers == 2 and teach.config.num_layers == 4
    for mine, theirs in zip(student.encoder.layers, (teach.encoder.layers[0], teach.encoder.layers[2]), strict=True):
        for (name, a), b in zip(mine.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert torch.equal(a, b), name
    for part in ("word", "position", "norm"):
        assert torch.equal(getattr(student.encoder.embeddings, part).weight, getattr(teach.encoder.embeddings, part).weight)
    assert student.encoder.embeddings.segment is None
    assert all(torch.equal(a, b) for a, b in zip(student.mlm.state_dict().values(), teach.mlm.state_dict().values()))
    assert not any(p.requires_grad for p in teach.parameters())
    objective.train()
    assert student.training and not teach.training


# ---- bad recipes ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sets, key", [
    (["objective=rtd", "preset=bert-mini"], "preset"),
    (["objective=rtd", "preset=electra-mini", "embedding_sharing=tied"], "embedding_sharing"),
    (["objective=rtd", "preset=electra-mini", "generator_size=1.5"], "generator_size"),
    (["objective=rtd", "preset=deberta-v3-mini"], "generator_size 0.25 .*deberta-v2.*embedding_size"),
    (["objective=rtd", "preset=deberta-v3-mini", "generator_size=1", "generator_layers=0"], "generator_layers"),
    (["objective=distill", "preset=distilbert-mini"], "teacher"),
    (["objective=distill", "preset=bert-mini", "teacher=x"], "preset"),
    (["objective=distill", "preset=distilbert-mini", "teacher=x", "temperature=0"], "temperature"),
    (["objective=mlm+sop", "preset=roberta-mini"], "mlm\\+sop"),
])
def test_bad_recipes_name_the_key(sets, key):
    with pytest.raises(ConfigError, match=key):
        load_recipe(None, ["data=x", *sets])


def test_an_option_of_another_objective_is_refused_unless_at_its_default():
    with pytest.raises(ConfigError, match="rtd_weight applies to objective rtd, not mlm"):
        load_recipe(None, ["data=x", "preset=electra-mini", "rtd_weight=10"])
    with pytest.raises(ConfigError, match=r"teacher applies to objective distill, not mlm\+nsp"):
        load_recipe(None, ["data=x", "objective=mlm+nsp", "teacher=somewhere"])
    cfg = load_recipe(None, ["data=x", "preset=electra-mini", "rtd_weight=50", "teacher=", "anchor_weight=1"])
    assert isinstance(cfg.options, MLMOptions)  # a run's recipe.yaml records every objective's keys at defaults


def test_a_name_registered_twice_is_refused():
    before = dict(OBJECTIVES)
    with pytest.raises(ConfigError, match="objective 'rtd' is registered already"):
        register_objective(ObjectiveSpec("rtd", MLMOptions, OBJECTIVES["mlm"].build))
    assert OBJECTIVES == before


def test_an_objective_is_built_from_its_own_typed_options(wordpiece):
    """No recipe: the objective's options, the model and the data are all it takes."""
    sizes = {"hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "num_layers": 2, "embedding_size": 32}
    options, model = RTDOptions(rtd_weight=10.0, generator_size=0.5), ModelChoice("electra-mini", overrides=sizes)
    objective = build("rtd", options, model, Tokenizer.from_pretrained(wordpiece / "tokenizer"), str(wordpiece), 32)
    assert objective.rtd_weight == 10.0 and objective.generator.config.hidden_size == 16
    assert {name: spec.options for name, spec in OBJECTIVES.items()} == {
        "mlm": MLMOptions, "mlm+nsp": MLMOptions, "mlm+sop": MLMOptions, "rtd": RTDOptions,
        "distill": OBJECTIVES["distill"].options}


def test_teacher_must_exist_and_share_the_vocabulary(wordpiece, tmp_path):
    with pytest.raises(ConfigError, match="teacher: cannot load"):
        _objective(_distill(wordpiece, tmp_path / "nowhere"))
    other = tmp_path / "other"
    save_pretrained(MaskedLMModel(EncoderConfig.from_preset("bert-tiny", vocab_size=150, hidden_size=32, num_heads=2,
                                                            intermediate_size=64, num_layers=2)), other)
    with pytest.raises(ConfigError, match="teacher: .*150 tokens"):
        _objective(_distill(wordpiece, other))


def test_family_recipes_load():
    recipes = sorted((ROOT / "configs" / "family").glob("*.yaml"))
    assert len(recipes) >= 5
    for recipe in recipes:
        cfg = load_recipe(recipe)
        assert cfg.loop.max_steps > 0 and Path(cfg.data).name == "wiki-data"
