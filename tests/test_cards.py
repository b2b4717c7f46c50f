"""One card per capability (encoderlab.cards): the table loads no torch, every reference resolves to the task's own
spec and pipeline, the flags are the options dataclasses' fields, and a toy capability added as one card row appears
in the CLI, the server and pipeline()."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from toy_capability import TOY_CARD, Shout

from encoderlab.cards import (CARDS, Card, ClassifyOptions, WindowOptions, card, field_docs, given, load, served,
                              table, trainable)
from encoderlab.cli import build_parser, main
from encoderlab.errors import ConfigError, InputError
from encoderlab.infer.pipelines import pipeline
from encoderlab.infer.server import Limits, create_app, load_pipelines
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
