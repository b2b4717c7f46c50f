"""What the command line says is what it does (issue 46, item 3): the commands, tasks and objectives that `--help`
names are those the registries hold; counts print whole and agree with their nouns; every command refuses a bad
count in one wording; `tokenizer train` prints its one line and nothing before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from encoderlab import choices
from encoderlab.cli import COMMAND_GROUPS, COMMAND_MODULES, TAGLINE, build_parser, main
from encoderlab.cli.finetune import _print_summary
from encoderlab.cards import served, trainable
from encoderlab.io import count_text, number_text
from encoderlab.objectives import OBJECTIVES
from encoderlab.tasks.readers import TextExample
from encoderlab.tasks.rerank import RerankTask
from encoderlab.tasks.spec import task_spec

ROOT = Path(__file__).resolve().parents[1]


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


def listed(capsys, *argv: str) -> list[str]:
    """The sub-commands a --help lists under its positional argument (COMMAND, TASK, ...)."""
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    text = capsys.readouterr().out.split("positional arguments:")[1].split("options:")[0]
    return re.findall(r"^    (\S+)", text, re.M)


def subcommands(parser) -> list[str]:
    return list(parser._subparsers._group_actions[0].choices)  # noqa: SLF001 (argparse has no public getter)


# ---- the registries and the words -------------------------------------------------------------------------------
def test_help_lists_every_command_and_every_pipeline_has_one(capsys):
    commands = listed(capsys)
    assert commands == subcommands(build_parser())
    assert {c.name for c in served() if c.command} <= set(commands), "a card's command missing"


def test_the_tagline_names_each_group_of_commands(capsys):
    text = help_of(capsys)
    assert TAGLINE in text
    assert [module for module, _ in COMMAND_GROUPS] == list(COMMAND_MODULES)
    for word in ("pretrain", "fine-tune", "evaluate", "benchmark", "pipelines", "export", "serve"):
        assert word in TAGLINE, f"the tagline leaves out {word}: {TAGLINE}"


def test_the_tasks_named_are_the_registered_tasks(capsys):
    registered = {card.name for card in trainable()}
    assert all(task_spec(name).name == name for name in registered)  # each card's spec is its task's
    assert set(listed(capsys, "finetune")) == registered
    line = re.search(r" finetune fine-tune on (.+?) evaluate ", help_of(capsys))  # the next command follows
    named = set(re.split(r", | or ", line.group(1)))
    assert named == registered, f"encoderlab --help names {named} for finetune"
    evaluate = build_parser()._subparsers._group_actions[0].choices["evaluate"]  # noqa: SLF001
    evaluated = set(next(a.choices for a in evaluate._actions if a.dest == "task"))  # noqa: SLF001
    assert evaluated == registered | {"retrieval"}  # a search index is evaluated, never fine-tuned


def test_the_objectives_named_are_the_registered_objectives(capsys):
    assert choices.PRETRAIN_OBJECTIVES == tuple(OBJECTIVES)
    main_help = help_of(capsys)
    assert f"pretrain an encoder: {choices.names_text(tuple(OBJECTIVES))}" in main_help
    pretrain_help = help_of(capsys, "pretrain")
    for name in OBJECTIVES:
        assert f"{name}: " in pretrain_help, f"pretrain --help does not describe objective {name}"


def test_the_infer_docstring_names_each_of_its_modules():
    import encoderlab.infer as infer

    modules = [p.stem for p in Path(infer.__file__).parent.glob("*.py") if p.stem != "__init__"]
    assert [m for m in modules if f"{m}.py" not in infer.__doc__] == []
    assert "later" not in infer.__doc__


# ---- numbers as they print -------------------------------------------------------------------------------------
def test_counts_print_whole_and_measures_to_four_decimals():
    assert number_text(5) == "5" and number_text(12_345) == "12,345"
    assert number_text(0.5) == "0.5000" and number_text(1.0) == "1.0000"
    assert [count_text(n, "step") for n in (0, 1, 2, 1000)] == ["0 steps", "1 step", "2 steps", "1,000 steps"]
    assert count_text(1, "query", "queries") == "1 query" and count_text(3, "query", "queries") == "3 queries"


def test_rerank_counts_its_queries_as_a_whole_number():
    rows = [TextExample(("q1", "a"), 1.0, "x:1"), TextExample(("q1", "b"), 0.0, "x:2"),
            TextExample(("q2", "c"), 1.0, "x:3")]
    metrics = RerankTask.score(None, rows, [0.9, 0.1, 0.5])
    assert metrics["queries"] == 2 and isinstance(metrics["queries"], int)


def test_finetune_summary_says_1_step_and_prints_a_count_whole(capsys):
    summary = {"out": "runs/r", "task": "rerank", "steps": 1, "seconds": 1.2, "metric": "mrr_at_10",
               "best": {"epoch": 1.0, "eval_mrr_at_10": 0.75, "eval_queries": 5}}
    _print_summary(summary, as_json=False)
    assert capsys.readouterr().out.splitlines() == [
        "wrote runs/r: rerank, 1 step in 1 s", "best at epoch 1 (by mrr_at_10): mrr_at_10 0.7500, queries 5"]
    _print_summary(summary | {"steps": 2}, as_json=False)
    assert "rerank, 2 steps in 1 s" in capsys.readouterr().out


def test_seed_summary_keeps_a_count_whole(capsys):
    from encoderlab.tasks.finetune import seed_spread

    assert seed_spread([5, 5]) == {"median": 5, "min": 5, "max": 5, "std": 0.0, "values": [5, 5]}
    assert isinstance(seed_spread([5, 5])["median"], int) and isinstance(seed_spread([0.5, 0.7])["median"], float)
    summary = {"task": "rerank", "seeds": [42], "metrics": {"eval_queries": seed_spread([5])}}
    _print_summary(summary, as_json=False)
    assert capsys.readouterr().out.splitlines() == [
        "rerank: 1 seed [42]", "  queries      median 5  min 5  max 5  std 0.0000"]


# ---- one wording for a bad count --------------------------------------------------------------------------------
BATCH_COMMANDS = {
    "embed": ["embed", "--model", "minilm", "--input", "examples/sentences.txt", "--out", "{tmp}/x.npy"],
    "similarity": ["similarity", "--model", "minilm", "a", "b"],
    "fill-mask": ["fill-mask", "Paris is the [MASK] of France."],
    "rerank": ["rerank", "--model", "minilm", "--query", "q", "a"],
    "finetune": ["finetune", "classify", "--model", "minilm", "--train", "examples/sentences.txt", "--out",
                 "{tmp}/run"],
    "evaluate": ["evaluate", "classify", "--model", "minilm", "--data", "examples/sentences.txt"],
    "benchmark": ["benchmark", "sts", "--model", "minilm", "--data", "{tmp}", "--out", "{tmp}/out"],
    "serve": ["serve", "--model", "minilm"],
}


@pytest.mark.parametrize("value", ["0", "-3"])
@pytest.mark.parametrize("command", sorted(BATCH_COMMANDS))
def test_every_command_refuses_a_bad_batch_size_in_one_wording(command, value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = [a.format(tmp=tmp_path) for a in BATCH_COMMANDS[command]] + ["--batch-size", value]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: --batch-size {value}: expected a positive number\n"
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_the_training_options_speak_the_same_wording():
    from encoderlab.errors import ConfigError
    from encoderlab.tasks.objective import TrainOptions

    with pytest.raises(ConfigError, match=r"^--batch-size 0: expected a positive number$"):
        TrainOptions(batch_size=0).validate()


# ---- tokenizer train --------------------------------------------------------------------------------------------
def test_tokenizer_train_prints_its_line_and_nothing_before_it(tmp_path, capfd):
    """The tokenizers library ends each progress bar with a newline on stdout (three blank lines before ours)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\n\na dog ran in the park.\n", encoding="utf-8")
    assert main(["tokenizer", "train", "--corpus", str(corpus), "--vocab-size", "60", "--out", str(tmp_path / "t")]) == 0
    out = capfd.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 't'}: wordpiece vocabulary of ") and out.count("\n") == 1, repr(out)
