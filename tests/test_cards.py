"""One card per capability (encoderlab.cards): the table loads no torch, every reference resolves to the task's own
spec and pipeline, the flags are the options dataclasses' fields, and a toy capability added as one card row appears
in the CLI, the server and pipeline()."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from toy_capability import TOY_CARD, Shout

from encoderlab import choices
from encoderlab.cards import (CARDS, Card, ClassifyOptions, FusionOptions, SearchOptions, WindowOptions, bounds, card,
                              field_docs, flags, given, load, served, table, trainable)
from encoderlab.cli import build_parser, main
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
from encoderlab.retrieval.fusion import NORMALISATIONS
from encoderlab.retrieval.index import Index
from encoderlab.retrieval.multivector import MultiVectorIndex
from encoderlab.retrieval.serving import search_request
from encoderlab.tasks.pipeline import Pipeline
from encoderlab.tasks.spec import TaskSpec, task_spec

ROOT = Path(__file__).resolve().parents[1]


def subparser(*path: str):
    """The argparse parser of `encoderlab PATH...`."""
    parser = build_parser()
    for name in path:
        parser = parser._subparsers._group_actions[0].choices[name]  # noqa: SLF001 (argparse has no public getter)
    return parser


def help_of(parser, flag: str) -> str:
    return next(action.help for action in parser._actions if flag in action.option_strings)  # noqa: SLF001


# ---- the table --------------------------------------------------------------------------------------------------
def test_the_cards_and_the_parser_load_no_torch():
    code = ("import sys, encoderlab.cards\nfrom encoderlab.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('encoderlab.tasks')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT / "src")}).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("name", sorted(CARDS))
def test_each_reference_is_the_capabilitys_own(name):
    row = card(name)
    specs = [load(reference) for reference in row.spec]
    assert all(isinstance(spec, TaskSpec) and spec.name == name for spec in specs)
    assert len({spec.variant for spec in specs}) == len(specs)  # one spec per variant
    if row.pipeline:
        kind = load(row.pipeline)
        assert issubclass(kind, Pipeline) and kind.task == name


def test_a_variant_is_picked_by_the_options():
    assert task_spec("classify", ClassifyOptions(task_type="multilabel").variant).variant == "multilabel"
    assert task_spec("classify", ClassifyOptions().variant).variant is None  # classification: the default spec


def test_a_second_card_of_one_name_and_a_bad_reference_are_refused():
    with pytest.raises(ConfigError, match="'rerank' has two cards"):
        table(CARDS["rerank"], CARDS["rerank"])
    with pytest.raises(ConfigError, match="encoderlab.tasks.rerank:NOPE"):
        load("encoderlab.tasks.rerank:NOPE")
    with pytest.raises(InputError, match="expected one of"):
        card("nope")


# ---- flags from fields ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", [c for c in CARDS.values()], ids=lambda c: c.name)
def test_every_option_has_its_help(row):
    for options in (row.options, row.command and row.command.options):
        if options:
            docs = field_docs(options)
            assert all(docs.get(f.name) for f in fields(options)), f"{options.__name__}: a field without a docstring"


@pytest.mark.parametrize("name", [c.name for c in trainable()])
def test_finetune_defaults_are_the_options_defaults(name, tmp_path):
    """Nothing given on the command line gives the options dataclass's own defaults: no default written twice."""
    args = build_parser().parse_args(["finetune", name, "--model", "m", "--train", "t", "--out", str(tmp_path)])
    assert given(card(name).options, vars(args)) == card(name).options()


def test_a_flag_parses_to_its_fields_type(tmp_path):
    args = build_parser().parse_args(["finetune", "embed", "--model", "m", "--train", "t", "--out", str(tmp_path),
                                      "--matryoshka", "64,32", "--scale", "10", "--loss", "cosent"])
    options = given(card("embed").options, vars(args))
    assert (options.matryoshka, options.scale, options.loss) == ((64, 32), 10.0, "cosent")


def test_a_shared_option_means_the_same_on_every_command():
    helps = {help_of(subparser(*path), "--stride") for path in
             (("finetune", "classify"), ("evaluate",), ("classify",), ("embed",))}
    assert helps == {field_docs(WindowOptions)["stride"]}


# ---- a new capability: one module (tests/toy_capability.py) and one card row ------------------------------------
@pytest.fixture
def toy(monkeypatch) -> Card:
    monkeypatch.setitem(CARDS, TOY_CARD.name, TOY_CARD)
    return TOY_CARD


def test_a_toy_card_gives_a_command(toy, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "shout texts back" in capsys.readouterr().out
    assert main(["shout", "--model", str(tmp_path), "hi", "yo", "--marks", "2"]) == 0
    assert capsys.readouterr().out.split() == ["HI!!", "YO!!"]
    assert help_of(subparser("shout"), "--marks") == "exclamation marks after each text (default: 1)"


def test_a_toy_card_gives_pipeline_and_an_endpoint(toy):
    assert pipeline("shout")(["a"]) == [{"text": "A!"}]  # the card's default model
    loaded, reasons = load_pipelines("anything", tasks=["shout"])
    assert isinstance(loaded["shout"], Shout) and "shout" not in reasons
    app = create_app(loaded, Limits(), model="toy")
    assert "/shout" in {route.path for route in app.routes}
    assert [c.name for c in served()][-1] == "shout"
    subparser("serve").parse_args(["--tasks", "shout"])  # serve --tasks offers it


# ---- searching: one dataclass of options on every surface that searches -------------------------------------------
SEARCHERS = {"search": (("search",), ["--index", "i"], SearchOptions),  # parser, the rest of argv, options
             "evaluate retrieval": (("evaluate",), ["retrieval", "--data", "d"], SearchOptions),
             "benchmark beir": (("benchmark", "beir"), ["--model", "m", "--data", "d", "--out", "o"], FusionOptions)}


@pytest.mark.parametrize("command", list(SEARCHERS))
def test_the_search_commands_defaults_and_help_are_the_options(command):
    path, rest, options = SEARCHERS[command]
    args = build_parser().parse_args([*path, *rest])
    assert given(options, vars(args)) == options()
    for flag in flags(options):
        assert help_of(subparser(*path), f"--{flag.name.replace('_', '-')}").startswith(flag.help)


def test_the_servers_search_body_and_index_search_take_the_same_defaults_and_bounds():
    body = search_request(str, Limits()).model_fields
    for flag in flags(SearchOptions):
        assert (body[flag.name].default, body[flag.name].description) == (flag.default, flag.help)
        limits = {k: getattr(m, k) for m in body[flag.name].metadata for k in ("ge", "le") if hasattr(m, k)}
        assert bounds(flag).items() <= limits.items(), flag.name
    for method in (Index.search, Index.rank, MultiVectorIndex.rank):
        parameters = inspect.signature(method).parameters
        for flag in flags(SearchOptions):
            name = "fusion_name" if flag.name == "fusion" and "fusion_name" in parameters else flag.name
            if name in parameters:
                assert parameters[name].default == flag.default, (method.__qualname__, name)
    assert set(NORMALISATIONS) == set(choices.NORMALISATIONS)  # fusion's functions, the command line's names


@pytest.mark.parametrize("argv, reason", [(["--alpha", "1.5"], "--alpha: 1.5: expected a number from 0 to 1"),
                                          (["--rrf-k", "-1"], "--rrf-k: -1: expected 0 or more"),
                                          (["--rerank-top", "0"], "--rerank-top: 0: expected 1 or more")])
def test_a_search_option_out_of_its_bounds_is_refused_in_one_line(argv, reason, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["search", "--index", "nowhere", *argv, "a query"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and reason in err and len(err.strip().splitlines()) == 1
