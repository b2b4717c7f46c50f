"""ModernBERT against transformers and against BERT (issue 17's measured goals), on CPU, in one run.

(a) Inference on mixed-length text: one random-weight modernbert-base (22 layers; minilm's WordPiece ids, so
    vocab and padding id aside from the preset's) run by encoderlab and, with the same weights, by transformers'
    ModernBertModel with its default attention. Two sets, in batches of 32 in their given order (not sorted by
    length: the mix is the point): the SST-2 dev sentences, and 256-token Wikipedia passages shuffled among short
    SST-2 sentences (one passage in four texts). Sentences/s, the sides interleaved batch by batch; goal >= 2x.
(b) Pretraining tokens/s of modernbert-mini on Wikipedia (bench/pretrain_speed.py's batches of 32 x 128
    tokens, masked 30% as ModernBERT is): encoderlab's optimizer_step against transformers'
    ModernBertForMaskedLM, from the same weights, in the standard loop, same AdamW, schedule and precision;
    goal >= 2x.
(c) A short pretraining run of modernbert-mini (configs/modernbert-mini-wiki.yaml: 30% MLM, warmup-stable-decay)
    beside bert-mini (configs/family/compare-bert-mini.yaml) at the same training FLOPs (encoderlab.train.flops),
    both at 32 x 128 tokens on the prepared Wikipedia shards, then both fine-tuned on SST-2 with the same small
    budget; the loss curves against FLOPs go to a picture. The two MLM losses are not comparable as numbers
    (30% against 15% masked), the SST-2 accuracies are.

    python bench/modernbert.py --shards runs/wiki-data   # about 20 minutes on 2 busy cores (2 threads)
    python bench/modernbert.py --quick    # 4 layers of base, few sentences, 6 + 6 pretraining steps: a minute or two
    python bench/modernbert.py --smoke    # seconds: 2 x 32 models, synthetic data (make test)
    python bench/modernbert.py --parts inference --results-dir DIR   # (a) alone: no shards needed
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
import pretrain_speed as speed  # noqa: E402
from common import SMOKE_RECIPE, encoderlab, goal, smoke_data, smoke_shards, training_precision  # noqa: E402
from electra_vs_mlm import sst2  # noqa: E402
from finetune import DATA  # noqa: E402

from encoderlab import EncoderConfig, EncoderModel, MaskedLMModel, save_pretrained  # noqa: E402
from encoderlab.io import atomic_write  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train.config import PretrainConfig, load_recipe  # noqa: E402
from encoderlab.train.flops import mlm_flops_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BATCH, PASSAGE = 32, 256
TINY = {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "local_attention": 8}
# size: (model overrides, SST-2 sentences, mixed texts) for (a); pretraining steps of bert-mini for (c)
INFERENCE = {"smoke": (TINY, 64, 32), "quick": ({"num_layers": 4}, 128, 64), "full": ({}, 872, 128)}
RECIPES = {"bert-mini": ROOT / "configs/family/compare-bert-mini.yaml",
           "modernbert-mini": ROOT / "configs/modernbert-mini-wiki.yaml"}


# ---- (a) inference -------------------------------------------------------------------------------------------
def mixed_texts(sentences: list[list[int]], passages: list[list[int]], count: int) -> list[list[int]]:
    """`count` id lists, one in four a Wikipedia passage and the rest SST-2 sentences, shuffled (seed 0)."""
    texts = passages[:count // 4] + sentences[:count - count // 4]
    random.Random(0).shuffle(texts)
    return texts


def passages_from(texts: list[str], tokenizer: Tokenizer, count: int, length: int) -> list[list[int]]:
    """`count` passages [CLS] w [SEP] of `length` tokens, consecutive windows of the articles."""
    rows = []
    for ids in tokenizer.encode_words(texts)[0]:
        rows += [[tokenizer.cls_id, *ids[i:i + length - 2], tokenizer.sep_id]
                 for i in range(0, len(ids) - length + 2, length - 2)]
    if len(rows) < count:
        raise SystemExit(f"only {len(rows)} passages of {length} tokens in the Wikipedia text, {count} needed")
    return rows[:count]


def padded(rows: list[list[int]], pad_id: int) -> list[dict[str, torch.Tensor]]:
    """Batches of BATCH rows in their order: input_ids and attention_mask (B, T), right-padded."""
    out = []
    for i in range(0, len(rows), BATCH):
        part = rows[i:i + BATCH]
        ids = torch.full((len(part), max(map(len, part))), pad_id)
        for row, tokens in enumerate(part):
            ids[row, :len(tokens)] = torch.tensor(tokens)
        out.append({"input_ids": ids, "attention_mask": (ids != pad_id).long()})
    return out


@torch.inference_mode()
def inference(sets: dict[str, list[list[int]]], overrides: dict, pad_id: int, vocab: int) -> dict:
    """Sentences/s of encoderlab and transformers on each set, with the largest output difference."""
    import transformers

    torch.manual_seed(0)
    config = EncoderConfig.from_preset("modernbert-base", pad_token_id=pad_id, vocab_size=max(vocab, 50368),
                                       **overrides)
    ours = EncoderModel(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(ours, folder)
        theirs = transformers.ModernBertModel.from_pretrained(folder).eval()
    figures = {"layers": config.num_layers, "parameters": ours.num_parameters(),
               "hf_attention": theirs.config._attn_implementation}
    for name, rows in sets.items():
        batches = padded(rows, pad_id)
        for batch in batches[:1]:  # warm-up, and the check that both compute the same thing
            real = batch["attention_mask"].bool()
            difference = (ours(**batch).last_hidden_state - theirs(**batch).last_hidden_state)[real].abs().max()
        seconds = {"encoderlab": 0.0, "transformers": 0.0}
        for index, batch in enumerate(batches):
            for side in (("encoderlab", "transformers") if index % 2 else ("transformers", "encoderlab")):
                started = time.perf_counter()
                (ours if side == "encoderlab" else theirs)(**batch)
                seconds[side] += time.perf_counter() - started
        mask = torch.cat([b["attention_mask"].flatten() for b in batches])
        figures[name] = {"texts": len(rows), "real_share": round(float(mask.float().mean()), 3),
                         "max_abs_difference": float(difference),
                         **{f"{side}_sentences_per_s": round(len(rows) / s, 2) for side, s in seconds.items()},
                         "speedup": round(seconds["transformers"] / seconds["encoderlab"], 3)}
        print("inference", name, figures[name], flush=True)
    return figures


def inference_sets(size: str, data: Path, tokenizer: Tokenizer, count: int | None,
                   mixed: int | None) -> dict[str, list[list[int]]]:
    """SST-2 dev sentences and the mixed set, as id lists (counts: the size's unless given)."""
    count, mixed = count or INFERENCE[size][1], mixed or INFERENCE[size][2]
    lines = (data / "sst2/dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    sentences = [tokenizer.encode(line.split("\t")[0]) for line in lines]
    sentences = (sentences * (count // len(sentences) + 1))[:count]
    wiki = speed.wiki_texts(data / "wikipedia/AA", max_chars=mixed * PASSAGE * 8)
    length = 64 if size == "smoke" else PASSAGE
    return {"sst2_dev": sentences, "mixed": mixed_texts(sentences, passages_from(wiki, tokenizer, mixed // 4, length),
                                                       mixed)}


# ---- (b) pretraining speed -------------------------------------------------------------------------------------
def hf_modernbert_mode(name: str, precision: str, total: int, shape: speed.Shape) -> speed.Mode:
    """transformers' ModernBertForMaskedLM from the weights encoderlab's mode starts from, in the standard loop."""
    import transformers

    torch.manual_seed(speed.SEED)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(MaskedLMModel(shape.config()), folder)
        model = transformers.ModernBertForMaskedLM.from_pretrained(folder).train()
    optimizer = torch.optim.AdamW(speed._distinct(speed.param_groups(model, speed.WEIGHT_DECAY)), lr=speed.LR,
                                  betas=speed.BETAS, eps=speed.EPS)
    scheduler = speed.schedule(optimizer, total)

    def step(batch: dict[str, torch.Tensor]) -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**{k: v for k, v in batch.items() if k != "token_type_ids"}).loss  # ModernBERT has none
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), speed.CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return speed.Mode(f"{name} ({model.config._attn_implementation})", step)


def pretraining_speed(size: str) -> dict:
    """Median tokens/s of each side over interleaved rounds on the same masked Wikipedia batches."""
    overrides = (("vocab_size", 30522), ("pad_token_id", 0))
    shape = (speed.Shape("modernbert-mini", batch=4, seq=32, real_data=False, overrides=overrides + tuple(
        (k, v) for k, v in TINY.items() if k != "num_layers")) if size == "smoke"
        else speed.Shape("modernbert-mini", overrides=overrides))
    batches, source = speed.masked_batches(2 if size == "smoke" else 4, shape, mlm_probability=0.3)
    warmup, rounds = (1, 2) if size != "full" else (2, 6)
    precision = training_precision()
    modes = [speed.encoderlab_mode(f"encoderlab {precision}", precision, False, warmup + rounds + 1, shape),
             hf_modernbert_mode(f"transformers {precision}", precision, warmup + rounds + 1, shape)]
    speed.run(modes, batches, warmup, rounds, time.perf_counter() + (30 if size != "full" else 150))
    rates = {m.name: sorted(m.rates)[len(m.rates) // 2] for m in modes}
    return {**source, "preset": shape.preset, "batch": shape.batch, "seq": shape.seq, "precision": precision,
            "tokens_per_s": {k: round(v, 1) for k, v in rates.items()},
            "last_loss": {m.name: round(m.loss, 4) for m in modes}, "rounds": len(modes[0].rates),
            "speedup": round(rates[modes[0].name] / rates[modes[1].name], 3)}


# ---- (c) the same compute as bert-mini ----------------------------------------------------------------------------
def step_flops(recipe: PretrainConfig, tokenizer: Tokenizer) -> float:
    """Training FLOPs of one optimizer step of full packed sequences, at the shards' vocabulary size."""
    config = recipe.model.encoder_config(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    return mlm_flops_per_token(config, recipe.max_length, recipe.mlm_probability) * recipe.batch_size * recipe.max_length


def losses(run: Path) -> list[tuple[int, float]]:
    rows = csv.DictReader((run / "metrics.csv").open(encoding="utf-8"))
    return [(int(r["step"]), float(r["loss"])) for r in rows if r.get("loss")]


def equal_compute(opts: argparse.Namespace, extra: list[str], work: Path) -> dict:
    """Pretrain bert-mini for opts.steps and modernbert-mini for the same FLOPs, fine-tune both on SST-2."""
    same = ["max_length=128", "batch_size=32", *extra]
    recipes = {name: load_recipe(path, same) for name, path in RECIPES.items()}
    tokenizer = Tokenizer.from_pretrained(opts.shards / "tokenizer")
    flops = {name: step_flops(recipe, tokenizer) for name, recipe in recipes.items()}
    budget = opts.steps * flops["bert-mini"]
    figures: dict = {"training_flops_budget": budget, "recipe_overrides": same, "sst2_max_train": opts.max_train}
    for name, recipe in recipes.items():
        steps = max(1, round(budget / flops[name]))
        run = work / name
        overrides = [*same, f"max_steps={steps}", f"warmup_steps={max(1, steps // 10)}", f"eval_every={steps}",
                     f"save_every={steps}", "eval_batches=4", f"log_every={max(1, min(5, steps // 4))}"]
        encoderlab("pretrain", "--config", RECIPES[name], "--out", run, *[x for o in overrides for x in ("--set", o)])
        table = list(csv.DictReader((run / "metrics.csv").open(encoding="utf-8")))
        figures[name] = {"steps": steps, "flops_per_step": flops[name], "mlm_probability": recipe.mlm_probability,
                         "schedule": recipe.optim.schedule, "pretrain_seconds": float(table[-1]["elapsed_s"]),
                         "curve": [(s, round(v, 4)) for s, v in losses(run)],
                         **{k: round(float(v), 4) for k, v in table[-1].items() if k.startswith("eval_") and v},
                         "sst2": sst2(run / "model", opts, work / "sst2")}
        print(name, {k: v for k, v in figures[name].items() if k != "curve"}, file=sys.stderr, flush=True)
    return figures


def plot(figures: dict, out: Path) -> None:
    """Training loss against training FLOPs, both runs on one axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6.4, 4))
    for name in RECIPES:
        run = figures[name]
        axis.plot([s * run["flops_per_step"] for s, _ in run["curve"]], [v for _, v in run["curve"]],
                  label=f"{name} ({run['mlm_probability']:.0%} masked, {run['schedule']}; "
                        f"SST-2 {run['sst2']['accuracy']:.3f})")
    axis.set_xlabel("training FLOPs")
    axis.set_ylabel("training MLM loss")
    axis.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


# ---- main ----------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = common.parser(__doc__, quick="4 layers of base, 128 + 64 texts, 6 pretraining steps: a minute or two")
    parser.add_argument("--shards", type=Path, default=ROOT / "runs/wiki-data",
                        help="prepared Wikipedia shards for (c) (default: runs/wiki-data)")
    parser.add_argument("--steps", type=int, default=60, help="bert-mini pretraining steps in (c) (default: 60)")
    parser.add_argument("--max-train", type=int, default=2000, help="SST-2 training sentences (default: 2000)")
    parser.add_argument("--lr", type=float, default=1e-4, help="SST-2 fine-tuning learning rate (default: 1e-4)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: 2; 1 with --smoke, which make test runs beside another worker)")
    parser.add_argument("--sentences", type=int, help="SST-2 dev sentences in (a) (default: all 872)")
    parser.add_argument("--mixed", type=int, help="texts of the mixed set in (a) (default: 128)")
    parser.add_argument("--parts", default="inference,pretraining,compute",
                        help="which of (a) inference, (b) pretraining speed, (c) equal compute to run, comma-separated "
                             "(default: all three; (c) needs --shards)")
    opts = parser.parse_args()
    size = common.size(opts)
    opts.threads = opts.threads or (1 if size == "smoke" else 2)
    torch.set_num_threads(opts.threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="encoderlab-modernbert-") as tmp:
        work = Path(tmp)
        if size == "smoke":
            opts.steps, opts.max_train, opts.shards = 2, 16, smoke_shards(work / "smoke")
            data = work / "smoke" / "data"
        else:
            data = DATA
            if size == "quick":
                opts.steps, opts.max_train = 6, 128
        opts.data, opts.quick, opts.smoke = data, opts.quick, opts.smoke
        parts = set(opts.parts.split(","))
        if parts - {"inference", "pretraining", "compute"}:
            sys.exit(f"--parts {opts.parts}: expected some of inference, pretraining, compute")
        needs_shards = "compute" in parts
        if not (data / "sst2/dev.tsv").is_file() or (needs_shards and not (opts.shards / "meta.json").is_file()):
            sys.exit(f"skipped: needs {data}/sst2 and prepared Wikipedia shards ({opts.shards}; "
                     "configs/bert-mini-wiki.yaml says how to make them)")
        tokenizer = Tokenizer.from_pretrained("minilm")
        extra = [*(SMOKE_RECIPE if size == "smoke" else [f"precision={training_precision()}"]), f"data={opts.shards}"]
        figures = {"threads": opts.threads, "parts": sorted(parts)}
        if "inference" in parts:
            figures["inference"] = inference(inference_sets(size, data, tokenizer, opts.sentences, opts.mixed),
                                             INFERENCE[size][0], tokenizer.pad_id, tokenizer.vocab_size)
        if "pretraining" in parts:
            figures["pretraining_speed"] = pretraining_speed(size)
        if "compute" in parts:
            figures["equal_compute"] = equal_compute(opts, extra, work)
    report(opts, figures, started)


def report(opts: argparse.Namespace, figures: dict, started: float) -> None:
    """The goals of the parts that ran, the picture and the results file."""
    goals = []
    if "inference" in figures:
        goals += [goal(f"inference, {name}: encoderlab / transformers sentences/s",
                       figures["inference"][name]["speedup"], 2.0) for name in ("sst2_dev", "mixed")]
    if "pretraining_speed" in figures:
        goals.append(goal("pretraining: encoderlab / transformers tokens/s", figures["pretraining_speed"]["speedup"],
                          2.0))
    if "equal_compute" in figures:
        compute = figures["equal_compute"]
        picture = common.results_path(opts, "modernbert").with_name(
            {"smoke": "modernbert-curves-smoke.png", "quick": "modernbert-curves-quick.png",
             "full": "modernbert-curves.png"}[common.size(opts)])
        plot(compute, picture)
        compute["curves"] = picture.name
        goals.append(goal("SST-2 dev accuracy, modernbert-mini minus bert-mini at equal pretraining FLOPs (reported)",
                          compute["modernbert-mini"]["sst2"]["accuracy"] - compute["bert-mini"]["sst2"]["accuracy"],
                          0.0))
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    for g in goals:
        print(f"goal {g['what']}: {g['value']} (target {g['target']}) {'met' if g['met'] else 'NOT met'}")
    print(f"wrote {common.write_results(opts, 'modernbert', figures, goals)}")


if __name__ == "__main__":
    main()
