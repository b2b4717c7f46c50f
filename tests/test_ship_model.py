"""scripts/ship_model.py turns a pretraining run, finished or stopped part way, into a model folder with its card.

A tiny continued-pretraining run from a transformers BertModel (no MLM head) is stopped after 2 of 3 steps and
shipped: the folder holds bf16 weights equal to the checkpoint's (rounded), the data's tokenizer and the run's
records cut at the shipped step, transformers loads it as BertForMaskedLM, and the card states where it started,
which tensors were new and the steps it saw.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

from test_continued_pretraining import RUN, _checkpoint, _corpus

from encoderlab import load_model
from encoderlab.data.prepare import prepare
from encoderlab.merge import merge_to_folder, weights_sha256
from encoderlab.train.config import load_recipe
from encoderlab.train.pretrain import pretrain

ROOT = Path(__file__).resolve().parents[1]


def _ship_module():
    return _module("ship_model", ROOT / "scripts" / "ship_model.py")


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_stopped_continued_run_ships_with_its_card(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    start = _checkpoint("bert", "base", tmp_path / "start", corpus)
    prepare([str(corpus)], start, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    run = tmp_path / "run"
    pretrain(load_recipe(None, [f"data={tmp_path / 'data'}", f"init_from={start}", *RUN]), run, stop_after=2,
             progress=False)
    _ship_module().main([str(run), "--name", "tiny-fill", "--models", str(tmp_path / "models")])
    folder = tmp_path / "models" / "tiny-fill"
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "metrics.csv", "recipe.yaml",
            "init_from.json"} <= {p.name for p in folder.iterdir()}
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.bfloat16}
    steps = [int(r["step"]) for r in csv.DictReader((folder / "metrics.csv").open(encoding="utf-8"))]
    assert max(steps) == 2  # cut at the shipped checkpoint
    checkpoint = load_model(run / "checkpoints" / "step-000002", kind="mlm")
    shipped = load_model(folder)
    for (name, a), (_, b) in zip(checkpoint.state_dict().items(), shipped.state_dict().items()):
        assert_close(b, a.to(torch.bfloat16).float(), rtol=0, atol=0, msg=name)
    hf, info = transformers.BertForMaskedLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    card = (folder / "README.md").read_text(encoding="utf-8")
    new = json.loads((run / "init_from.json").read_text(encoding="utf-8"))["new_tensors"]
    assert f"the checkpoint `{start}`" in card and all(f"`{t}`" in card for t in new) and new
    assert "| steps | 2 of batch 8 x 32 tokens, of a 3-step schedule" in card
    assert "in 1 sitting(s)" in card


def test_a_run_continuing_a_shipped_model_ships_with_the_whole_lineage(tmp_path):
    """Cycle 1 starts from a transformers checkpoint and is shipped; cycle 2 continues the shipped folder and is
    shipped over it: the folder that is replaced leaves its history in lineage.json, metrics.csv counts steps from
    cycle 1's start, and the card states both cycles and their totals, and the anchor cycle 2 was kept near."""
    corpus = _corpus(tmp_path / "corpus.txt")
    start = _checkpoint("bert", "base", tmp_path / "start", corpus)
    prepare([str(corpus)], start, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    ship, models = _ship_module(), tmp_path / "models"
    folder = models / "tiny-fill"
    common = [f"data={tmp_path / 'data'}", *RUN, "eval_every=1"]
    pretrain(load_recipe(None, [f"init_from={start}", *common]), tmp_path / "run1", stop_after=2, progress=False)
    ship.main([str(tmp_path / "run1"), "--name", "tiny-fill", "--models", str(models)])
    assert not (folder / "lineage.json").exists()  # one run: nothing to chain
    first_card = (folder / "README.md").read_text(encoding="utf-8")
    pretrain(load_recipe(None, [f"init_from={folder}", *common, "seed=1", f"anchor={start}", "anchor_weight=0.5"]),
             tmp_path / "run2", progress=False)  # cycle 2 anchored to where cycle 1 started
    ship.main([str(tmp_path / "run2"), "--name", "tiny-fill", "--models", str(models)])

    lineage = json.loads((folder / "lineage.json").read_text(encoding="utf-8"))
    assert [c["init_from"] for c in lineage] == [str(start), str(folder)]
    assert [c["steps"] for c in lineage] == [2, 3] and [c["tokens"] for c in lineage] == [2 * 8 * 32, 3 * 8 * 32]
    assert lineage[0]["start"]["new_tensors"] and lineage[1]["start"]["new_tensors"] == []
    rows = list(csv.DictReader((folder / "metrics.csv").open(encoding="utf-8")))
    evals = [int(r["step"]) for r in rows if r["eval_mlm_accuracy"]]
    assert evals == [1, 2, 3, 4, 5]  # cycle 2's steps 1-3 follow cycle 1's 2
    assert float(rows[-1]["eval_mlm_accuracy"]) == lineage[1]["final_eval_accuracy"]
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert f"the checkpoint `{start}`" in card  # where the weights first came from, not the folder cycle 2 read
    assert "| steps | 5 of batch 8 x 32 tokens in 2 cycles" in card and f"{5 * 8 * 32 / 1e6:.1f}M" in card
    assert "in 2 sitting(s)" in card and f"`{folder}` as cycle 1 shipped it" in card
    assert "RUN1" in card and "RUN2" in card and first_card != card
    assert card.count("anchored to") == 1 and f"anchored to `{start}` (cosine weight 0.5)" in card
    ship.main([str(tmp_path / "run2"), "--name", "tiny-fill", "--models", str(models)])  # the same run again
    assert json.loads((folder / "lineage.json").read_text(encoding="utf-8")) == lineage  # not chained to itself
    assert (folder / "README.md").read_text(encoding="utf-8") == card

    # The bench's figures reach the card only for the weights they measured (ship, bench, ship again).
    results = {"command": "python bench/fill_mask_model.py", "goals": [
        {"what": "held-out accuracy", "value": 0.123, "target": 0.5, "met": False}],
        "figures": {"model": "tiny-fill", "weights": {"sha256": weights_sha256(folder)}}}
    ship.RESULTS = tmp_path / "fill_mask_model.json"
    ship.RESULTS.write_text(json.dumps(results), encoding="utf-8")
    ship.main([str(tmp_path / "run2"), "--name", "tiny-fill", "--models", str(models)])
    assert "| held-out accuracy | 0.123 | 0.500 | False |" in (folder / "README.md").read_text(encoding="utf-8")
    results["figures"]["weights"]["sha256"] = {"model.safetensors": "0" * 64}  # other weights
    ship.RESULTS.write_text(json.dumps(results), encoding="utf-8")
    ship.main([str(tmp_path / "run2"), "--name", "tiny-fill", "--models", str(models)])
    assert "has not measured this model yet" in (folder / "README.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_a_merge_ships_with_the_trunks_cycles_and_its_members(tmp_path):
    """Cycle 1 is shipped and a copy kept; two runs continue it (one stopped part way) and are averaged with the copy,
    that average again with the start (nested merges). Shipping the merge keeps cycle 1 and adds one merge cycle:
    each model's share of the final average, its SHA-256 and its run's own cycle, the runs' steps and tokens summed.
    The card lists the members and the commands that make them. A member whose weights changed since it was merged,
    and the folder the shipping replaces, are refused; a later cycle continues the merge's lineage."""
    corpus = _corpus(tmp_path / "corpus.txt")
    start = _checkpoint("bert", "base", tmp_path / "start", corpus)
    prepare([str(corpus)], start, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    ship, models = _ship_module(), tmp_path / "models"
    folder, trunk = models / "tiny-fill", tmp_path / "cycle1"
    common = [f"data={tmp_path / 'data'}", *RUN, "eval_every=1"]
    pretrain(load_recipe(None, [f"init_from={start}", *common]), tmp_path / "run1", progress=False)
    ship.main([str(tmp_path / "run1"), "--name", "tiny-fill", "--models", str(models)])
    shutil.copytree(folder, trunk)
    pretrain(load_recipe(None, [f"init_from={folder}", *common, "seed=1"]), tmp_path / "run2", stop_after=2,
             progress=False)
    pretrain(load_recipe(None, [f"init_from={folder}", *common, "seed=2", "lr=0.002"]), tmp_path / "run3",
             progress=False)
    members = [trunk, tmp_path / "run2" / "checkpoints" / "step-000002", tmp_path / "run3" / "model"]
    merge_to_folder(members, tmp_path / "soup")
    merge_to_folder([tmp_path / "soup", start], tmp_path / "wise", weights=[4, 1])
    ship.main([str(tmp_path / "wise"), "--name", "tiny-fill", "--models", str(models)])

    lineage = json.loads((folder / "lineage.json").read_text(encoding="utf-8"))
    assert [c["init_from"] for c in lineage] == [str(start), ""] and lineage[0]["steps"] == 3
    merged = lineage[1]["merge"]["members"]
    assert [m["folder"] for m in merged] == [str(f.resolve()) for f in [*members, start]]
    assert [m["weight"] for m in merged] == pytest.approx([0.8 / 3] * 3 + [0.2], abs=1e-6)
    assert [m["sha256"] for m in merged] == [weights_sha256(f) for f in [*members, start]]
    assert [m.get("step") for m in merged] == [None, 2, 3, None]  # the trunk is a shipped copy, not a run
    assert [c["recipe"]["seed"] for m in merged[1:3] for c in m["cycles"]] == [1, 2]  # each run's own cycle only
    assert lineage[1]["steps"] == 5 and lineage[1]["tokens"] == 5 * 8 * 32
    assert len(lineage[1]["merge"]["merges"]) == 2  # the inner merge first
    shipped, made = load_model(folder), load_model(tmp_path / "wise")
    for (name, a), (_, b) in zip(made.state_dict().items(), shipped.state_dict().items()):
        assert_close(b, a, rtol=0, atol=0, msg=name)  # bf16 both: the merge wrote the trunk's dtype
    hf, info = transformers.BertForMaskedLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    rows = list(csv.DictReader((folder / "metrics.csv").open(encoding="utf-8")))
    assert max(int(r["step"]) for r in rows) == 3  # the trunk's rows
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "`encoderlab pretrain`, then `encoderlab merge`" in card and "| 2 | a weighted average of 4 models" in card
    assert "in 2 cycles" in card and f"{(3 + 5) * 8 * 32 / 1e6:.1f}M" in card
    assert f"| `{members[1]}` | 0.267 | step 2 of 3 of a run from `{folder}`" in card
    assert f"encoderlab merge CYCLE1 RUN2.1/checkpoints/step-000002 RUN2.2/model --out MERGE1" in card
    assert f"encoderlab merge MERGE1 {start} --weights 0.8 0.2 --out MERGE2" in card
    assert " --out RUN2.1 --stop-at 2" in card and "python scripts/ship_model.py MERGE2 --name tiny-fill" in card
    ship.main([str(tmp_path / "wise"), "--name", "tiny-fill", "--models", str(models)])  # the same merge again
    assert json.loads((folder / "lineage.json").read_text(encoding="utf-8")) == lineage
    bench = _module("fill_mask_model", ROOT / "bench" / "fill_mask_model.py")  # its curve: the trunk's, and the merge
    curve = bench.learning_curve(folder, bench.model_recipe(folder, None))
    assert curve["steps"] == 3 and curve["tokens"] == 8 * 8 * 32 and curve["merge"]["models"] == 4
    assert curve["merge"]["steps"] == 5

    pretrain(load_recipe(None, [f"init_from={folder}", *common, "seed=3"]), tmp_path / "run4", progress=False)
    ship.main([str(tmp_path / "run4"), "--name", "tiny-fill", "--models", str(models)])  # a cycle after the merge
    later = json.loads((folder / "lineage.json").read_text(encoding="utf-8"))
    assert later[:2] == lineage and later[2]["init_from"] == str(folder) and later[2]["steps"] == 3
    assert "| 2 | a weighted average of 4 models" in (folder / "README.md").read_text(encoding="utf-8")

    merge_to_folder([folder, tmp_path / "run3" / "model"], tmp_path / "over")
    with pytest.raises(SystemExit, match="this shipping replaces it"):
        ship.main([str(tmp_path / "over"), "--name", "tiny-fill", "--models", str(models)])
    weights = load_file(trunk / "model.safetensors")
    weights = {k: v + 1 if v.is_floating_point() else v for k, v in weights.items()}
    save_file(weights, trunk / "model.safetensors", metadata={"format": "pt"})  # the trunk copy changed since
    with pytest.raises(SystemExit, match="SHA-256 differs"):
        ship.main([str(tmp_path / "wise"), "--name", "tiny-fill", "--models", str(models)])


def test_lineage_paths_inside_the_repository_are_relative(tmp_path, monkeypatch):
    """lineage.json records the runs and models inside the repository relative to it, so it reads the same in every
    clone; one written with absolute paths (before) reads back relative, and shipping again gives the same file."""
    corpus = _corpus(tmp_path / "corpus.txt")
    start = _checkpoint("bert", "base", tmp_path / "start", corpus)
    prepare([str(corpus)], start, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    ship, models = _ship_module(), tmp_path / "models"
    monkeypatch.setattr(ship, "ROOT", tmp_path.resolve())  # the repository, for this test
    folder, trunk = models / "tiny-fill", tmp_path / "cycle1"
    common = [f"data={tmp_path / 'data'}", *RUN]
    pretrain(load_recipe(None, [f"init_from={start}", *common]), tmp_path / "run1", progress=False)
    ship.main([str(tmp_path / "run1"), "--name", "tiny-fill", "--models", str(models)])
    shutil.copytree(folder, trunk)
    pretrain(load_recipe(None, [f"init_from={folder}", *common, "seed=1"]), tmp_path / "run2", stop_after=2,
             progress=False)
    merge_to_folder([trunk, tmp_path / "run2" / "checkpoints" / "step-000002"], tmp_path / "soup")
    ship.main([str(tmp_path / "soup"), "--name", "tiny-fill", "--models", str(models)])

    text = (folder / "lineage.json").read_text(encoding="utf-8")
    assert str(tmp_path.resolve()) not in text and str(tmp_path) not in text
    lineage = json.loads(text)
    merge = lineage[1]["merge"]
    assert [m["folder"] for m in merge["members"]] == ["cycle1", "run2/checkpoints/step-000002"]
    assert merge["members"][1]["run"] == "run2" and lineage[1]["run"] == "soup"
    assert merge["merges"] == [{"out": "soup", "inputs": ["cycle1", "run2/checkpoints/step-000002"],
                                "weights": [0.5, 0.5]}]
    assert lineage[0]["start"]["folder"] == "start" and lineage[0]["recipe"]["data"] == "data"
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert "| `run2/checkpoints/step-000002` | 0.500 |" in card
    absolute = text.replace('"cycle1"', f'"{tmp_path.resolve() / "cycle1"}"').replace(
        '"run2', f'"{tmp_path.resolve()}/run2')
    assert absolute != text
    (folder / "lineage.json").write_text(absolute, encoding="utf-8")  # as an older ship_model wrote it
    assert ship.shipped_cycles(folder)[0] == lineage
    ship.main([str(tmp_path / "soup"), "--name", "tiny-fill-2", "--models", str(models)])
    assert (models / "tiny-fill-2" / "lineage.json").read_text(encoding="utf-8") == text


def test_a_recipe_is_shown_as_the_closest_config_and_its_changes():
    """The reproduce commands name the configs/ file a run's recipe differs least from, with the rest as --set."""
    ship = _ship_module()
    config = ROOT / "configs" / "fill-mask-minilm-anchored.yaml"
    recipe = load_recipe(config, ["max_steps=400", "seed=4", "anchor_layers=all"]).flat()
    shown = ship.pretrain_options(recipe).split(" --set ")
    assert shown[0] == "--config configs/fill-mask-minilm-anchored.yaml"
    assert sorted(shown[1:]) == ["anchor_layers=all", "max_steps=400", "seed=4"]
    assert ship.pretrain_options(load_recipe(config).flat()) == "--config configs/fill-mask-minilm-anchored.yaml"
    far = load_recipe(None, ["data=elsewhere", *RUN]).flat()
    assert ship.pretrain_options(far) == "--config RECIPE.yaml"


def test_gpu_mfu_reads_a_runs_tokens_per_second(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    start = _checkpoint("bert", "mlm", tmp_path / "start", corpus)
    prepare([str(corpus)], start, tmp_path / "data", holdout=0.1, workers=1, progress=False)
    pretrain(load_recipe(None, [f"data={tmp_path / 'data'}", f"init_from={start}", *RUN]), tmp_path / "run",
             progress=False)
    gpu_mfu = _module("gpu_mfu", ROOT / "scripts" / "gpu_mfu.py")
    assert gpu_mfu.gpu_peak("NVIDIA H100 80GB HBM3") == 989.4e12 and gpu_mfu.gpu_peak("NVIDIA H100 PCIe") == 756e12
    gpu_mfu.main(tmp_path / "run")
    result = json.loads((tmp_path / "run" / "mfu.json").read_text(encoding="utf-8"))
    assert result["tokens_per_s"] > 0 and result["flops_per_token"] > 0
    assert (result["mfu"] is None) == (gpu_mfu.gpu_peak(result["device"]) is None)
