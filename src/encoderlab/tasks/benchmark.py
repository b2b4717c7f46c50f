"""Score an encoder on a standard suite with one command: GLUE, CoNLL-2003, SQuAD, STS-B, IMDB.

Each task of a suite is `finetune` (the best checkpoint by the task's first metric on its first eval split) and then
`evaluate` of that checkpoint on every eval split, one run per seed: every figure is what those two commands give,
and each records the two commands. OUT/TASK/seed-S/result.json is written when a seed is done and OUT/TASK/result.json
(median and spread over the seeds) when the task is: a rerun skips both, and an interrupted seed continues through
finetune's resume. OUT/TASK/job.json pins the recipe, so a rerun with another one is refused, not mixed in.
"""

from __future__ import annotations

import json
import shlex
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from encoderlab.cards import card, given
from encoderlab.choices import BENCHMARK_QUICK as QUICK
from encoderlab.errors import ConfigError, InputError
from encoderlab.hub_data import is_hub_data, parse_hub_dataset
from encoderlab.io import atomic_write_text
from encoderlab.tasks.finetune import EvaluateJob, FinetuneJob, Reading, evaluate, finetune, seed_spread
from encoderlab.tasks.objective import TrainOptions
from encoderlab.viz.curves import plot_spread

SMOKE_NOTE = (f"--quick: a smoke run ({QUICK['max_train']} training and {QUICK['max_eval']} eval examples, one "
              "epoch) that checks the suite runs end to end; its figures are not scores")


@dataclass(frozen=True)
class Spec:
    """One task of a suite: where its files are, how to read them, what it reports."""

    name: str
    """Its name in --tasks and its folder in OUT."""
    folder: str
    """Its folder under --data ("" for --data itself)."""
    train: tuple[str, ...]
    """Training file (or folder) names: the first found is used."""
    evals: tuple[tuple[str, tuple[str, ...]], ...]
    """(split, file names): the first split chooses the best checkpoint and must exist; a later absent one is listed."""
    metrics: tuple[str, ...]
    """Reported on every split; the first chooses the best checkpoint; the task's score is the mean of all."""
    task: str = "classify"
    reading: Reading = Reading()
    regression: bool = False
    labels: tuple[str, ...] | None = None
    """classify: the classes (for a folder of class folders: which subfolders)."""
    recipe: dict[str, float] = field(default_factory=dict)
    """TrainOptions that differ from the suite's default recipe (the paper's for that task)."""
    percent: bool = False
    """The metrics are percentages already (SQuAD's), not fractions."""


def _glue(name: str, folder: str, text: str, label: str, metrics: tuple[str, ...], **more: Any) -> Spec:
    """A GLUE task: FOLDER/train.tsv and FOLDER/dev.tsv in the task's official columns."""
    header = more.pop("header", True)
    return Spec(name, folder, ("train.tsv",), (("dev", ("dev.tsv",)),), metrics,
                reading=Reading(text, label, header=header), **more)


NLI = ("sentence1,sentence2", "label", ("accuracy",))
# Each GLUE task's official files and metrics (Wang et al. 2018, table 1); MRPC's F1 and QQP's are on class 1.
GLUE = (_glue("cola", "CoLA", "3", "1", ("mcc",), header=False),  # no header: source, label, original label, sentence
        _glue("sst2", "SST-2", "sentence", "label", ("accuracy",)),
        _glue("mrpc", "MRPC", "#1 String,#2 String", "Quality", ("f1", "accuracy")),
        _glue("stsb", "STS-B", "sentence1,sentence2", "score", ("pearson", "spearman"), regression=True),
        _glue("qqp", "QQP", "question1,question2", "is_duplicate", ("f1", "accuracy")),
        Spec("mnli", "MNLI", ("train.tsv",), (("dev_matched", ("dev_matched.tsv",)),
                                              ("dev_mismatched", ("dev_mismatched.tsv",))), ("accuracy",),
             reading=Reading("sentence1,sentence2", "gold_label")),
        _glue("qnli", "QNLI", "question,sentence", "label", ("accuracy",)),
        _glue("rte", "RTE", *NLI), _glue("wnli", "WNLI", *NLI))
# BERT's SQuAD v1.1 recipe (Devlin et al. 2019, section 4.2: lr 5e-5, batch 32, 3 epochs; v2.0: 2 epochs, batch 48).
SQUAD = {"lr": 5e-5}
SUITES: dict[str, tuple[Spec, ...]] = {
    "glue": GLUE,
    "conll": (Spec("conll2003", "", ("train.txt", "eng.train"), (("valid", ("valid.txt", "eng.testa")),
                                                                 ("test", ("test.txt", "eng.testb"))),
                   ("f1",), task="ner", recipe={"lr": 5e-5}),),
    "squad": (Spec("squad-v1.1", "", ("train-v1.1.json",), (("dev", ("dev-v1.1.json",)),), ("f1", "exact_match"),
                   task="qa", recipe=SQUAD, percent=True),
              Spec("squad-v2.0", "", ("train-v2.0.json",), (("dev", ("dev-v2.0.json",)),), ("f1", "exact_match"),
                   task="qa", recipe=SQUAD | {"epochs": 2.0, "batch_size": 48}, percent=True),
              Spec("squad", "", ("train.json",), (("dev", ("dev.json",)),), ("f1", "exact_match"), task="qa",
                   recipe=SQUAD, percent=True)),
    "sts": (Spec("stsb", "", ("train.tsv",), (("dev", ("dev.tsv",)),), ("pearson", "spearman"),
                 reading=Reading("sentence1,sentence2", "score"), regression=True),
            # The SemEval STS benchmark (Cer et al. 2017): tab-separated sts-*.csv, no header, genre, file, year, id,
            # score, sentence 1, sentence 2, then on some rows source fields.
            Spec("stsb-semeval", "", ("sts-train.csv",), (("dev", ("sts-dev.csv",)), ("test", ("sts-test.csv",))),
                 ("pearson", "spearman"), reading=Reading("5,6", "4", header=False), regression=True)),
    "imdb": (Spec("imdb", "", ("train",), (("test", ("test",)),), ("accuracy",), labels=("neg", "pos")),
             Spec("imdb-tsv", "", ("train.tsv",), (("test", ("test.tsv",)),), ("accuracy",),
                  reading=Reading("text", "label"))),
}


# --data hf:NAME[/CONFIG]: each suite's task on the Hub, (train split, eval splits), read by its columns' names (the
# Hub's files are Parquet, not the TSV layouts above). GLUE's configs are its task names (hf:nyu-mll/glue: all nine;
# hf:nyu-mll/glue/sst2: that one); the other suites are one dataset (hf:stanfordnlp/imdb, hf:rajpurkar/squad, ...).
HUB_SPLITS: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "glue": {spec.name: ("train", ("validation_matched", "validation_mismatched") if spec.name == "mnli"
                         else ("validation",)) for spec in GLUE},
    "conll": {"conll2003": ("train", ("validation", "test"))},
    "squad": {"squad-v1.1": ("train", ("validation",))},
    "sts": {"stsb": ("train", ("validation", "test"))},
    "imdb": {"imdb": ("train", ("test",))},
}


@dataclass
class BenchJob:
    """One `benchmark` job: a model scored on the tasks of a suite found under `data`."""

    suite: str
    model: str
    data: str | Path
    out: str | Path
    tasks: list[str] | None = None
    seeds: int = 1
    seed: int = 42
    lr: float | None = None
    epochs: float | None = None
    batch_size: int | None = None
    max_length: int | None = None
    max_train: int | None = None
    max_eval: int | None = None
    quick: bool = False
    keep_state: bool = False
    precision: str = "fp32"
    device: str | None = None
    progress: bool = True
    plot: bool = False
    command_line: str = ""
    machine: str = ""


@dataclass
class Found:
    """A task's files under --data: training, the eval splits there are, and the splits that are not."""

    spec: Spec
    train: Path | str
    evals: list[tuple[str, Path | str]]
    missing: list[str]


# ---- finding the tasks ---------------------------------------------------------------------------------------
def _first(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / name for name in names if (folder / name).exists()), None)


def find_tasks(job: BenchJob) -> tuple[list[Found], list[str]]:
    """The asked-for tasks whose files are under --data, and why each of the others is absent."""
    if job.suite not in SUITES:
        raise ConfigError(f"no suite {job.suite!r}: expected one of {', '.join(SUITES)}")
    specs = SUITES[job.suite]
    unknown = sorted(set(job.tasks or []) - {s.name for s in specs})
    if unknown:
        raise ConfigError(f"--tasks {','.join(unknown)}: {job.suite} has {', '.join(s.name for s in specs)}")
    if is_hub_data(job.data):
        return _hub_tasks(job, specs), []
    data = Path(job.data)
    if not data.is_dir():
        raise InputError(f"--data {data}: not a folder")
    found, absent = [], []
    for spec in (s for s in specs if not job.tasks or s.name in job.tasks):
        folder = data / spec.folder
        train, first = _first(folder, spec.train), _first(folder, spec.evals[0][1])
        if train is None or first is None:
            absent.append(f"{spec.name} (no {folder / (spec.train if train is None else spec.evals[0][1])[0]})")
            continue
        evals = [(split, _first(folder, names)) for split, names in spec.evals]
        found.append(Found(spec, train, [(s, p) for s, p in evals if p], [s for s, p in evals if p is None]))
    if not found:
        raise InputError(f"--data {data}: none of the {job.suite} tasks is there: {'; '.join(absent)}")
    # GLUE's absent tasks are worth a line; the other suites' other layouts (SemEval vs GLUE STS) only when asked for
    return found, absent if job.suite == "glue" or job.tasks else []


def _hub_tasks(job: BenchJob, specs: tuple[Spec, ...]) -> list[Found]:
    """The asked-for tasks of a suite as splits of the Hub dataset --data names (HUB_SPLITS)."""
    hub = parse_hub_dataset(str(job.data), split=False)
    found = []
    for spec in specs:
        if spec.name not in HUB_SPLITS[job.suite] or (job.tasks and spec.name not in job.tasks):
            continue
        if job.suite == "glue" and hub.config not in (None, spec.name):
            continue
        config = hub.config or (spec.name if job.suite == "glue" else None)
        name = f"hf:{hub.name}{'/' + config if config else ''}"
        train, evals = HUB_SPLITS[job.suite][spec.name]
        found.append(Found(replace(spec, reading=Reading(), labels=None), f"{name}:{train}",
                           [(split, f"{name}:{split}") for split in evals], []))
    if not found:
        raise InputError(f"--data {job.data}: none of the asked-for {job.suite} tasks is there")
    return found


# ---- the recipe ------------------------------------------------------------------------------------------------
def recipe(job: BenchJob, spec: Spec) -> dict[str, Any]:
    """The run's recipe: the command line's options, else --quick's, else the task's paper's, else BERT's GLUE one."""
    quick = QUICK if job.quick else {}

    def pick(name: str, default: Any) -> Any:
        given = getattr(job, name)
        return given if given is not None else quick.get(name, spec.recipe.get(name, default))

    options = TrainOptions(lr=pick("lr", 2e-5), epochs=pick("epochs", 3.0), batch_size=pick("batch_size", 32),
                           warmup_ratio=0.1, seed=job.seed, precision=job.precision, progress=job.progress)
    return {"model": job.model, "options": options, "max_length": job.max_length or card(spec.task).max_length,
            "max_train": pick("max_train", None), "max_eval": pick("max_eval", None)}


def _pinned(run: dict[str, Any], found: Found) -> dict[str, Any]:
    """What a task's results depend on, besides the seeds: the files and the recipe (JSON-ready)."""
    options = {k: v for k, v in asdict(run["options"]).items() if k not in ("seed", "progress")}
    return {"model": run["model"], "train": str(found.train), "evals": {s: str(p) for s, p in found.evals},
            "options": options} | {k: run[k] for k in ("max_length", "max_train", "max_eval")}


# ---- running a task ------------------------------------------------------------------------------------------
def run_seed(job: BenchJob, found: Found, run: dict[str, Any], seed: int, out: Path) -> dict[str, Any]:
    """finetune one seed into `out`, then evaluate its best checkpoint on each eval split; seed-S/result.json."""
    if (out / "result.json").is_file():
        return json.loads((out / "result.json").read_text(encoding="utf-8"))
    spec, started = found.spec, time.time()
    head = given(card(spec.task).options, {"labels": list(spec.labels) if spec.labels else None,
                                           "task_type": "regression" if spec.regression else "classification"})
    tuned = finetune(FinetuneJob(spec.task, job.model, str(found.train), out, replace(run["options"], seed=seed),
                                 eval=str(found.evals[0][1]), reading=spec.reading, head=head,
                                 max_length=run["max_length"], metric=spec.metrics[0], device=job.device,
                                 resume=True, max_train=run["max_train"], max_eval=run["max_eval"],
                                 keep_state=job.keep_state))
    scores, commands = {}, [finetune_command(found, run, seed, out)]
    for split, path in found.evals:
        scored = evaluate(EvaluateJob(spec.task, str(out), str(path), spec.reading, max_length=run["max_length"],
                                      batch_size=run["options"].batch_size, precision=job.precision,
                                      max_eval=run["max_eval"], device=job.device))
        scores[split] = {"examples": scored["examples"], **{m: scored["metrics"][m] for m in spec.metrics}}
        commands.append(evaluate_command(found, run, out, path))
    result = {"seed": seed, "seconds": round(time.time() - started, 1), "best_epoch": tuned["best"]["epoch"],
              "scores": scores, "commands": commands, **{k: v for k, v in tuned.items() if k == "f1_of"}}
    atomic_write_text(out / "result.json", json.dumps(result, indent=2) + "\n")
    return result


def run_task(job: BenchJob, found: Found) -> dict[str, Any]:
    """Every seed of a task, then the median and spread of each split's metrics; OUT/TASK/result.json."""
    spec, folder = found.spec, Path(job.out) / found.spec.name
    run = recipe(job, spec)
    pinned, seeds = _pinned(run, found), [job.seed + k for k in range(job.seeds)]
    _pin(folder / "job.json", pinned)
    done = folder / "result.json"
    if done.is_file():
        result = json.loads(done.read_text(encoding="utf-8"))
        if result["seeds"] == seeds:
            return result | {"skipped": True}
    runs = [run_seed(job, found, run, seed, folder / f"seed-{seed}") for seed in seeds]
    scale = 1.0 if spec.percent else 100.0  # figures in percent, as GLUE reports them
    metrics = {split: {m: seed_spread([r["scores"][split][m] * scale for r in runs]) for m in spec.metrics}
               for split, _ in found.evals}
    result = {"task": spec.name, "suite": job.suite, "seeds": seeds, "metrics": metrics,
              "score": statistics.mean(s["median"] for split in metrics.values() for s in split.values()),
              "seconds": round(sum(r["seconds"] for r in runs), 1), "missing_splits": found.missing,
              "machine": job.machine, **{k: runs[0][k] for k in ("f1_of",) if k in runs[0]}, "recipe": pinned,
              "runs": runs}
    atomic_write_text(done, json.dumps(result, indent=2) + "\n")
    return result


def _pin(path: Path, pinned: dict[str, Any]) -> None:
    """Write OUT/TASK/job.json, or refuse a rerun whose files or recipe differ from the ones it holds."""
    if path.is_file():
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(k for k in pinned.keys() | before.keys() if pinned.get(k) != before.get(k))
        if changed:
            raise ConfigError(f"{path.parent} holds results of another {', '.join(changed)}: choose another --out "
                              f"or remove that folder")
        return
    atomic_write_text(path, json.dumps(pinned, indent=2) + "\n")


# ---- the commands behind each figure ----------------------------------------------------------------------------
def _reading_args(spec: Spec) -> list[str]:
    reading = spec.reading
    return ((["--text-cols", reading.text_cols] if reading.text_cols else [])
            + (["--label-col", reading.label_col] if reading.label_col else [])
            + ([] if reading.header else ["--no-header"]))


def _limits(run: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    return [arg for name in names if run[name] is not None for arg in (f"--{name.replace('_', '-')}", str(run[name]))]


def finetune_command(found: Found, run: dict[str, Any], seed: int, out: Path) -> str:
    """The `encoderlab finetune` command that trains one seed as the benchmark does."""
    spec, options = found.spec, run["options"]
    args = ["encoderlab", "finetune", spec.task, "--model", run["model"], "--train", str(found.train),
            "--eval", str(found.evals[0][1]), "--out", str(out), *_reading_args(spec)]
    args += (["--task-type", "regression"] if spec.regression else []) + \
        (["--labels", ",".join(spec.labels)] if spec.labels else [])
    args += ["--lr", f"{options.lr:g}", "--epochs", f"{options.epochs:g}", "--batch-size", str(options.batch_size),
             "--warmup-ratio", f"{options.warmup_ratio:g}", "--precision", options.precision,
             "--seed", str(seed), "--metric", spec.metrics[0], *_limits(run, ("max_length", "max_train", "max_eval"))]
    return shlex.join(args)


def evaluate_command(found: Found, run: dict[str, Any], model: Path, data: Path) -> str:
    """The `encoderlab evaluate` command that scores one split as the benchmark does."""
    args = ["encoderlab", "evaluate", found.spec.task, "--model", str(model), "--data", str(data),
            *_reading_args(found.spec), "--batch-size", str(run["options"].batch_size),
            "--precision", run["options"].precision, *_limits(run, ("max_length", "max_eval"))]
    return shlex.join(args)


# ---- the suite -------------------------------------------------------------------------------------------------
def glue_score(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The GLUE score as Wang et al. (2018, section 4) define it: the unweighted mean over the tasks of each task's
    score, itself the unweighted mean of its metrics (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman).
    MNLI counts as one task scored by the mean of its matched and mismatched accuracies, as the GLUE leaderboard does
    (BERT-base's 78.3 there). Over fewer than the nine tasks it is marked partial."""
    scored = [r for r in results if r["suite"] == "glue"]
    if not scored:
        return None
    return {"score": statistics.mean(r["score"] for r in scored), "tasks": [r["task"] for r in scored],
            "complete": len(scored) == len(GLUE)}


def benchmark(job: BenchJob) -> dict[str, Any]:
    """Run (or resume) every task of the suite found under --data; write OUT/results.json and OUT/results.md."""
    if job.seeds < 1:
        raise ConfigError(f"--seeds {job.seeds}: expected a positive number")
    found, absent = find_tasks(job)
    started = time.time()
    results = [run_task(job, task) for task in found]
    summary = {"suite": job.suite, "model": job.model, "data": str(job.data), "command": job.command_line,
               "machine": job.machine, "smoke_run": job.quick, **({"note": SMOKE_NOTE} if job.quick else {}),
               "seconds": round(time.time() - started, 1), "absent": absent,
               "glue": glue_score(results) if job.suite == "glue" else None, "tasks": results}
    out = Path(job.out)
    atomic_write_text(out / "results.json", json.dumps(summary, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown(summary))
    if job.plot:
        plot_spread({f"{r['task']} {split} {m}": s["values"] for r in results for split, ms in r["metrics"].items()
                     for m, s in ms.items()}, out / "spread.png", f"{job.suite}: {job.model}, per seed")
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """One table of every figure (median, spread over the seeds, time), the GLUE score, absent tasks, commands."""
    lines = [f"# encoderlab benchmark {summary['suite']}: {summary['model']}", "",
             f"`{summary['command']}` on {summary['machine']}", "",
             *([f"**{SMOKE_NOTE}**", ""] if summary.get("smoke_run") else []),
             "| task | split | metric | median | min | max | std | seeds | time (all seeds) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for result in summary["tasks"]:
        for split, metrics in result["metrics"].items():
            for name, s in metrics.items():
                lines.append(f"| {result['task']} | {split} | {name} | {s['median']:.2f} | {s['min']:.2f} | "
                             f"{s['max']:.2f} | {s['std']:.2f} | {','.join(map(str, result['seeds']))} | "
                             f"{result['seconds']:.0f} s |")
    glue = summary.get("glue")
    if glue:
        lines += ["", f"GLUE score (Wang et al. 2018): {glue['score']:.2f}"
                  + ("" if glue["complete"] else f", partial: {len(glue['tasks'])} of {len(GLUE)} tasks")]
    notes = [f"{r['task']}: F1 of {r['f1_of']}" for r in summary["tasks"]
             if "f1_of" in r and any("f1" in metrics for metrics in r["metrics"].values())]
    notes += [f"{r['task']}: no {', '.join(r['missing_splits'])} split" for r in summary["tasks"]
              if r["missing_splits"]]
    lines += ["", *[f"- {note}" for note in notes]] if notes else []
    lines += ["", f"Absent: {'; '.join(summary['absent'])}"] if summary["absent"] else []
    lines += ["", "## Commands", ""] + [f"- {r['task']} seed {run['seed']}: `{c}`" for r in summary["tasks"]
                                        for run in r["runs"] for c in run["commands"]]
    return "\n".join(lines) + "\n"
