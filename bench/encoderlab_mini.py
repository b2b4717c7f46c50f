"""Our own pretrained encoder (models/encoderlab-mini) against the goals of its issue, with transformers beside it.

- held-out MLM accuracy: 15% masking as in training, over the documents `encoderlab prepare` held out of the
  Wikipedia corpus (runs/wiki-data/valid, or --data); the same masked batches as the training-time evaluation,
  more of them;
- fill-mask probes: configs/fill-mask-probes.json, written down before the model was trained; a probe passes when
  one of its answers is among the top 5. transformers' BertForMaskedLM runs the same probes on the same folder,
  and its top 5 must agree with ours (the shipped files are what transformers sees);
- SST-2: the fine-tuned dev accuracy from bench/results/finetune.json (`sst2-encoderlab-mini`), next to minilm and
  the BiLSTM baseline, when bench/finetune.py has measured it.

    python bench/encoderlab_mini.py            # 64 held-out batches of 64 x 128 tokens
    python bench/encoderlab_mini.py --quick    # 4 batches: under a minute
    python bench/encoderlab_mini.py --smoke    # the probes on a tiny random MLM model, no held-out data (make test)
"""

from __future__ import annotations

import json
import tempfile
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402
from common import RESULTS, goal, tiny_model, write_results  # noqa: E402

from encoderlab.checkpoint import load_model, resolve_model_path  # noqa: E402
from encoderlab.errors import CheckpointError  # noqa: E402
from encoderlab.infer.pipelines import pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def probes(name: str) -> dict[str, Any]:
    """Top 5 of each probe from our pipeline and from transformers; which pass; whether the two agree."""
    from transformers import AutoTokenizer, BertForMaskedLM

    spec = json.loads((ROOT / "configs" / "fill-mask-probes.json").read_text(encoding="utf-8"))
    cases = [(c, True) for c in spec["required"]] + [(c, False) for c in spec["probes"]]
    ours = pipeline("fill-mask", name)(texts := [c["text"] for c, _ in cases], top_k=5)
    folder = resolve_model_path(name)
    hf_tokenizer = AutoTokenizer.from_pretrained(folder)
    hf_model = BertForMaskedLM.from_pretrained(folder, dtype=torch.float32).eval()
    results, agree = [], 0
    for (case, required), got, text in zip(cases, ours, texts):
        top5 = [p["token"] for p in got["masks"][0]["predictions"]]
        encoded = hf_tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            logits = hf_model(**encoded).logits[0]
        position = int((encoded["input_ids"][0] == hf_tokenizer.mask_token_id).nonzero()[0])
        hf_top5 = hf_tokenizer.convert_ids_to_tokens(logits[position].topk(5).indices.tolist())
        agree += hf_top5 == top5
        results.append({"text": text, "required": required, "answers": case["answers"], "top5": top5,
                        "transformers_top5": hf_top5, "passed": any(a in top5 for a in case["answers"])})
    required = [r for r in results if r["required"]]
    further = [r for r in results if not r["required"]]
    return {"results": results, "required_passed": sum(r["passed"] for r in required), "required_total": len(required),
            "probes_passed": sum(r["passed"] for r in further), "probes_total": len(further),
            "transformers_agrees_on": f"{agree}/{len(results)}"}


def heldout(name: str, data: Path, batches: int) -> dict[str, Any]:
    """Held-out MLM loss and accuracy with the training recipe's masking and batches."""
    from encoderlab.tokenizer import Tokenizer
    from encoderlab.train.config import load_recipe
    from encoderlab.train.pretrain import evaluate, heldout_batches

    folder = resolve_model_path(name)
    cfg = load_recipe(folder / "recipe.yaml", [f"data={data}", f"eval_batches={batches}"])
    valid = heldout_batches(cfg, Tokenizer.from_pretrained(data / "tokenizer"))
    if valid is None:
        raise SystemExit(f"{data}: no held-out split (valid/) to evaluate on")
    model = load_model(folder, kind="pretraining" if cfg.objective != "mlm" else "mlm")
    figures = evaluate(model, valid, cfg, cfg.batch_size, torch.device("cpu"))
    sequences = min(batches * cfg.batch_size, valid.examples.num_examples(0))
    return {**{k: round(v, 4) for k, v in figures.items()}, "sequences": sequences, "data": str(data)}


def sst2() -> dict[str, Any] | None:
    """SST-2 dev accuracy of our model next to minilm and the BiLSTM, from bench/results/finetune.json."""
    path = RESULTS / "finetune.json"
    figures = json.loads(path.read_text(encoding="utf-8"))["figures"] if path.is_file() else {}
    if "sst2-encoderlab-mini" not in figures:
        return None
    ours = figures["sst2-encoderlab-mini"]
    return {"accuracy": ours["accuracy"], "model": ours.get("model"), "command": ours["command"],
            "minilm": figures.get("sst2", {}).get("accuracy"), "bilstm": figures.get("bilstm", {}).get("accuracy")}


def main() -> None:
    parser = common.parser(__doc__, quick="4 held-out batches instead of 64: under a minute")
    parser.add_argument("--model", default="encoderlab-mini", help="the model to check (default: encoderlab-mini)")
    parser.add_argument("--data", type=Path, default=ROOT / "runs" / "wiki-data",
                        help="the prepared Wikipedia folder with its held-out split (default: runs/wiki-data)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="encoderlab-mini-") as work:
            args.model, args.data = str(tiny_model(Path(work) / "tiny", masked_lm=True)), Path(work) / "no-data"
            report(measure(args), args)
        return
    try:
        resolve_model_path(args.model)
    except CheckpointError as err:  # models/ is not tracked: a fresh clone has no encoderlab-mini until it is made
        print(f"skipped: {err}. Make it as the README's 'Our own model' section says.", file=sys.stderr)
        return
    report(measure(args), args)


def measure(args: Namespace) -> dict[str, Any]:
    """The probes, the held-out figures where the prepared data is there, and the SST-2 figures where measured."""
    figures: dict[str, Any] = {"model": args.model, "probes": probes(args.model)}
    if (args.data / "meta.json").is_file():
        figures["heldout"] = heldout(args.model, args.data, 4 if args.quick else 64)
    else:
        print(f"{args.data}: absent, so held-out accuracy is not measured (prepare it as the README says)",
              file=sys.stderr)
    if not args.smoke and (fine := sst2()) is not None:
        figures["sst2"] = fine
    return figures


def report(figures: dict[str, Any], args: Namespace) -> None:
    """Print the probes; write encoderlab_mini.json with the goals."""
    p = figures["probes"]
    passed = {r["text"]: r["passed"] for r in p["results"]}
    goals = []
    if "heldout" in figures:
        goals.append(goal("held-out Wikipedia MLM accuracy (15% masking)", figures["heldout"]["eval_mlm_accuracy"], 0.5))
    goals += [goal("'capital' in the top 5 for 'Paris is the [MASK] of France.'",
                   float(passed["Paris is the [MASK] of France."]), 1.0),
              goal("'sat' in the top 5 for 'The cat [MASK] on the mat.'", float(passed["The cat [MASK] on the mat."]), 1.0),
              goal("further probes passed (of 10)", float(p["probes_passed"]), 8.0)]
    for r in p["results"]:
        print(f"{'pass' if r['passed'] else 'miss'}  {r['text']:<55} {', '.join(r['top5'])}")
    if "heldout" in figures:
        print(f"held-out MLM accuracy {figures['heldout']['eval_mlm_accuracy']:.4f} over {figures['heldout']['sequences']} sequences")
    path = write_results(args, "encoderlab_mini", figures, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
