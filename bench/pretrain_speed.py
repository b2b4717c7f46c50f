"""Pretraining speed: encoderlab against transformers' BertForMaskedLM, training tokens/s on the same batches.

Both sides train bert-mini (4 layers, hidden 256, 4 heads, intermediate 1024, vocab 30522) on 32 x 128-token
sequences of real Wikipedia text, masked once with a fixed seed, with the same AdamW, schedule and clipping.
encoderlab steps with the project's own `optimizer_step`; transformers with the standard
`loss = model(**batch).loss; loss.backward(); clip; step` loop. Every mode keeps its own model and
optimizer; the modes take turns (round robin, the order rotated each round) so that the noise of a shared
machine falls on all of them alike, and each figure is the median over rounds.

    python bench/pretrain_speed.py            # full: all modes including torch.compile (~6 minutes)
    python bench/pretrain_speed.py --quick    # under a minute: fewer rounds, no torch.compile, bf16 only if native
    python bench/pretrain_speed.py --smoke    # seconds: a 2 x 32 model on 4 x 32 random tokens (make test)
"""

from __future__ import annotations

import contextlib
import gzip
import re
import statistics
import sys
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import common  # noqa: E402
from common import goal, matmul_peak, write_results  # noqa: E402

from encoderlab import EncoderConfig, MaskedLMModel  # noqa: E402
from encoderlab.data.collate import MaskingCollator  # noqa: E402
from encoderlab.infer.precision import bf16_supported  # noqa: E402
from encoderlab.nn.model import IGNORE_INDEX  # noqa: E402
from encoderlab.objectives.mlm import MaskedLanguageModeling  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402
from encoderlab.train.distributed import Dist  # noqa: E402
from encoderlab.train.flops import mlm_flops_per_token  # noqa: E402
from encoderlab.train.optim import linear_schedule, make_optimizer, param_groups  # noqa: E402
from encoderlab.train.loop import optimizer_step  # noqa: E402

WIKI = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "wikipedia" / "AA"
SEED = 0
LR, WEIGHT_DECAY, BETAS, EPS, CLIP, WARMUP = 1e-4, 0.01, (0.9, 0.98), 1e-6, 1.0, 10
DOC = re.compile(r"<doc [^>]*>\n(.*?)</doc>", re.DOTALL)


@dataclass(frozen=True)
class Shape:
    """What is trained: a preset (with overrides) on batches of `batch` sequences of `seq` tokens."""

    preset: str = "bert-mini"
    batch: int = 32
    seq: int = 128
    overrides: tuple[tuple[str, int], ...] = ()
    real_data: bool = True  # Wikipedia when present; random token ids otherwise

    def config(self) -> EncoderConfig:
        return EncoderConfig.from_preset(self.preset, **dict(self.overrides))


SMOKE = Shape("bert-tiny", batch=4, seq=32, real_data=False,
              overrides=(("hidden_size", 32), ("num_heads", 2), ("intermediate_size", 64)))


# ---- data -------------------------------------------------------------------------------------------
def wiki_texts(folder: Path, max_chars: int) -> list[str]:
    """Article bodies from WikiExtractor's gzip files (`<doc ...>` ... `</doc>`), the first files first."""
    texts, total = [], 0
    for path in sorted(folder.glob("wiki_0*.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for body in DOC.findall(f.read()):
                body = body.split("\n", 1)[1] if "\n" in body else body  # the first line repeats the title
                texts.append(body.strip())
                total += len(body)
                if total >= max_chars:
                    return texts
    return texts


def pack(token_lists: list[list[int]], cls_id: int, sep_id: int, pad_id: int, count: int,
         seq: int) -> dict[str, torch.Tensor]:
    """`count` sequences [CLS] w [SEP] of each article's consecutive seq-2 token windows; short tails padded."""
    width = seq - 2
    rows = []
    for ids in token_lists:
        for start in range(0, len(ids), width):
            window = ids[start:start + width]
            if len(window) >= width // 2:  # a tail shorter than half a window is dropped, not padded
                rows.append([cls_id, *window, sep_id])
            if len(rows) == count:
                break
        if len(rows) == count:
            break
    if len(rows) < count:
        raise SystemExit(f"{WIKI}: only {len(rows)} sequences of text, {count} needed")
    input_ids = torch.full((count, seq), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, :len(row)] = torch.tensor(row)
    return {"input_ids": input_ids, "attention_mask": (input_ids != pad_id).long()}


def masked_batches(num_batches: int, shape: Shape,
                   mlm_probability: float = 0.15) -> tuple[list[dict[str, torch.Tensor]], dict[str, object]]:
    """num_batches of batch x seq, masked (15%, 80/10/10) once with a fixed seed; plus where the text came from."""
    tokenizer = Tokenizer.from_pretrained("minilm")
    count, seq = num_batches * shape.batch, shape.seq
    if shape.real_data and WIKI.is_dir() and any(WIKI.glob("wiki_0*.gz")):
        texts = wiki_texts(WIKI, max_chars=count * seq * 8)  # ~4 characters a token, twice over for dropped tails
        seqs = pack(tokenizer.encode_words(texts)[0], tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, count, seq)
        source = {"data": f"wikipedia {WIKI.resolve()}/wiki_0*.gz, {len(texts)} articles, MiniLM tokenizer"}
    else:
        generator = torch.Generator().manual_seed(SEED)
        ids = torch.randint(1000, tokenizer.vocab_size, (count, seq), generator=generator)
        ids[:, 0], ids[:, -1] = tokenizer.cls_id, tokenizer.sep_id
        seqs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        source = {"data": "RANDOM token ids" + ("" if not shape.real_data else f": {WIKI} not found")}
    collator = MaskingCollator(tokenizer.vocab_size, tokenizer.mask_id, tokenizer.pad_id, tokenizer.special_ids,
                               mlm_probability=mlm_probability)
    generator = torch.Generator().manual_seed(SEED)
    input_ids, labels = collator.mask(seqs["input_ids"], seqs["attention_mask"],
                                      torch.ones_like(seqs["input_ids"], dtype=torch.bool), generator)
    batches = []
    for i in range(0, count, shape.batch):
        part = slice(i, i + shape.batch)
        batches.append({"input_ids": input_ids[part], "attention_mask": seqs["attention_mask"][part],
                        "token_type_ids": torch.zeros_like(input_ids[part]), "labels": labels[part]})
    real = int(seqs["attention_mask"].sum())
    source.update(sequences=count, non_pad_fraction=round(real / seqs["attention_mask"].numel(), 4),
                  masked_fraction=round(float((labels != IGNORE_INDEX).sum()) / real, 4))
    return batches, source


# ---- the two trainers -------------------------------------------------------------------------------
@dataclass
class Mode:
    """One way of training: a model with its own optimizer, and a step that trains on one batch."""

    name: str
    step: Callable[[dict[str, torch.Tensor]], float]  # returns the batch's MLM loss
    setup_s: float = 0.0
    rates: list[float] = field(default_factory=list)  # tokens/s, one per round
    loss: float = float("nan")  # of the last step: the sides should agree, as they train on the same batches


def _distinct(groups: list[dict]) -> list[dict]:
    """encoderlab's groups (no decay on biases and LayerNorm) with each parameter once: transformers' decoder
    weight is the word-embedding matrix again, which AdamW would otherwise update twice a step."""
    seen: set[int] = set()
    for group in groups:
        group["params"] = [p for p in group["params"] if id(p) not in seen and not seen.add(id(p))]
    return groups


def schedule(optimizer: torch.optim.Optimizer, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(WARMUP, total))


def encoderlab_mode(name: str, precision: str, compile_: bool, total: int, shape: Shape) -> Mode:
    """encoderlab's MaskedLMModel trained by encoderlab.train.loop.optimizer_step."""
    torch.manual_seed(SEED)
    model = MaskedLMModel(shape.config()).train()
    if compile_:
        model.encoder.compile()
    optimizer = make_optimizer(model, LR, WEIGHT_DECAY, BETAS, EPS)
    scheduler, dist, objective = schedule(optimizer, total), Dist(), MaskedLanguageModeling(model)
    return Mode(name, lambda batch: optimizer_step(objective, [batch], optimizer, scheduler, CLIP, precision,
                                                   dist)["loss"])


def hf_mode(name: str, attn: str, precision: str, total: int, shape: Shape) -> Mode:
    """transformers' BertForMaskedLM (same config and optimizer) in the standard training loop."""
    from transformers import BertConfig, BertForMaskedLM

    c = shape.config()
    config = BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
                        num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
                        hidden_act=c.hidden_act, max_position_embeddings=c.max_position_embeddings,
                        attn_implementation=attn)
    torch.manual_seed(SEED)
    model = BertForMaskedLM(config).train()
    if model.config._attn_implementation != attn:
        raise SystemExit(f"transformers gave attention {model.config._attn_implementation!r}, asked for {attn!r}")
    optimizer = torch.optim.AdamW(_distinct(param_groups(model, WEIGHT_DECAY)), lr=LR, betas=BETAS, eps=EPS)
    scheduler = schedule(optimizer, total)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else contextlib.nullcontext

    def step(batch: dict[str, torch.Tensor]) -> float:
        with autocast():
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return Mode(name, step)


# ---- timing -----------------------------------------------------------------------------------------
def run(modes: list[Mode], batches: list[dict[str, torch.Tensor]], warmup: int, rounds: int,
        deadline: float) -> None:
    """Warm every mode up, then up to `rounds` turns of one timed step each (at least 3, then no turn
    starts after `deadline`, a perf_counter time); every mode trains on the same batches in the same order."""
    for mode in modes:
        started = time.perf_counter()
        for i in range(warmup):
            mode.step(batches[i % len(batches)])
        mode.setup_s = time.perf_counter() - started
        print(f"  warmed up {mode.name} in {mode.setup_s:.1f} s", flush=True)
    for r in range(rounds):
        if r >= 3 and time.perf_counter() > deadline:
            print(f"  time is up after {r} rounds", flush=True)
            break
        batch = batches[(warmup + r) % len(batches)]
        tokens = int(batch["attention_mask"].sum())
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:  # who goes first rotates
            started = time.perf_counter()
            mode.loss = mode.step(batch)
            mode.rates.append(tokens / (time.perf_counter() - started))
        print(f"  round {r + 1}: " + ", ".join(f"{m.name} {m.rates[-1]:.0f}" for m in modes), flush=True)


# ---- FLOPs ------------------------------------------------------------------------------------------
def flops_per_token(shape: Shape, masked_fraction: float) -> float:
    """Training FLOPs per (non-pad) token, forward + backward: encoderlab.train.flops (6N + 12 L T H + the MLM
    head on the masked fraction)."""
    return mlm_flops_per_token(shape.config(), shape.seq, masked_fraction)


# ---- main -------------------------------------------------------------------------------------------
MODES = {  # name: (side, precision or attention + precision, compiled)
    "encoderlab fp32": ("encoderlab", "fp32", False),
    "encoderlab bf16": ("encoderlab", "bf16", False),
    "encoderlab compile fp32": ("encoderlab", "fp32", True),
    "encoderlab compile bf16": ("encoderlab", "bf16", True),
    "hf eager fp32": ("hf", "eager fp32", False),
    "hf sdpa fp32": ("hf", "sdpa fp32", False),
    "hf sdpa bf16": ("hf", "sdpa bf16", False),
}


def build(name: str, total: int, shape: Shape) -> Mode:
    side, how, compiled = MODES[name]
    if side == "encoderlab":
        return encoderlab_mode(name, how, compiled, total, shape)
    attn, precision = how.split()
    return hf_mode(name, attn, precision, total, shape)


def main() -> None:
    parser = common.parser(__doc__, quick="under a minute: 2 rounds, no torch.compile")
    parser.add_argument("--rounds", type=int, help="most timed rounds (each mode takes one step a round)")
    parser.add_argument("--budget", type=float, help="seconds after which no new round starts (after 3)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile modes")
    parser.add_argument("--modes", help="comma-separated subset of modes (nothing is written then)")
    args = parser.parse_args()
    started, load_before = time.perf_counter(), _loadavg()
    torch.set_num_threads(1 if args.smoke else 2)  # --smoke runs beside another make-test worker: no second thread
    if load_before and load_before[0] > 2.5:
        print(f"warning: load average {load_before[0]} before starting: other work shares the cores, so every "
              "figure is lower and the ratios are squeezed towards 1", flush=True)
    small = args.quick or args.smoke
    rounds = args.rounds or (2 if small else 20)
    warmup = 1 if small else 3
    budget = args.budget or (30.0 if small else 300.0)
    compiled = not (small or args.no_compile)
    total = warmup + rounds + 1  # the schedule's length: warm-up is linear over its first WARMUP steps
    shape = SMOKE if args.smoke else Shape()

    batches, source = masked_batches(2 if args.smoke else 4 if args.quick else 8, shape)
    print(f"data: {source}", flush=True)
    names = args.modes.split(",") if args.modes else [n for n in MODES if compiled or not MODES[n][2]]
    if args.quick and not args.modes and not bf16_supported():  # emulated bf16 steps take tens of seconds each
        names = [n for n in names if "bf16" not in n]
    modes = [build(name, total, shape) for name in names]
    size = 256 if args.smoke else 2048
    peaks = {"fp32": matmul_peak(torch.float32, size), "bf16": matmul_peak(torch.bfloat16, size)}
    run(modes, batches, warmup, rounds, started + budget)
    peaks = {"fp32": max(peaks["fp32"], matmul_peak(torch.float32, size)),  # best of before and after
             "bf16": max(peaks["bf16"], matmul_peak(torch.bfloat16, size))}
    timing = {"warmup_steps": warmup, "rounds": len(modes[0].rates), "steps_per_round": 1,
              "wall_s": round(time.perf_counter() - started, 1), "load_average_1_5_15_min_before": load_before}
    report(modes, source, peaks, args, timing, shape)


def report(modes: list[Mode], source: dict[str, object], peaks: dict[str, float], args: Namespace,
           timing: dict[str, int], shape: Shape) -> None:
    """Print the table; write pretrain_speed.json (_quick.json with --quick) unless --modes was given."""
    per_token = flops_per_token(shape, float(source["masked_fraction"]))
    median = {m.name: statistics.median(m.rates) for m in modes}
    figures: dict[str, object] = {
        **source, **timing, "preset": shape.preset, "model_overrides": dict(shape.overrides), "batch": shape.batch,
        "seq": shape.seq, "threads": torch.get_num_threads(),
        "step_function": "encoderlab.train.loop.optimizer_step",
        "matmul_peak_gflops": {k: round(v / 1e9, 1) for k, v in peaks.items()},
        "flops_per_token": round(per_token),
        "flops_note": "model FLOPs of flops_per_token() (6N + 12LTH + masked head), the same for both sides: "
                      "transformers' decoder over all positions is not counted as useful work",
        "compile_modes": "left out (--quick or --no-compile)" if not any("compile" in m.name for m in modes) else "run",
        "bf16_modes": "run" if any("bf16" in m.name for m in modes) else "left out (--quick on a CPU without native "
                      "bf16, where every bf16 matmul is emulated)",
        "load_average_1_5_15_min_after": _loadavg(),
        "tokens_per_s": {m.name: round(median[m.name], 1) for m in modes},
        "tokens_per_s_all_rounds": {m.name: [round(r) for r in m.rates] for m in modes},
        "warmup_s": {m.name: round(m.setup_s, 1) for m in modes},
        "last_loss": {m.name: round(m.loss, 3) for m in modes},
        "mfu_of_bf16_peak": {m.name: round(median[m.name] * per_token / peaks["bf16"], 4) for m in modes},
        "mfu_of_fp32_peak": {m.name: round(median[m.name] * per_token / peaks["fp32"], 4) for m in modes},
    }
    ours = {n: v for n, v in median.items() if n.startswith("encoderlab")}
    theirs = {n: v for n, v in median.items() if n.startswith("hf")}
    goals = []
    if ours and theirs:
        best, hf_best = max(ours, key=ours.get), max(theirs, key=theirs.get)
        figures.update(encoderlab_best=best, hf_fastest=hf_best)
        figures["speedup_vs"] = {n: round(ours[best] / v, 3) for n, v in theirs.items()}
        figures["paired_speedup_vs"] = {n: round(_paired(modes, best, n), 3) for n in theirs}
        if "hf eager fp32" in theirs:
            goals.append(goal(f"{best} / hf eager fp32, tokens/s", ours[best] / theirs["hf eager fp32"], 3.0))
        goals.append(goal(f"{best} / {hf_best} (HF's fastest), tokens/s", ours[best] / theirs[hf_best], 2.0))
    for name, value in figures["tokens_per_s"].items():
        peak = "bf16" if "bf16" in name else "fp32"  # each mode against the matmul peak of its own precision
        print(f"{name:>26}: {value:8.0f} tokens/s   MFU {figures[f'mfu_of_{peak}_peak'][name]:.1%} of {peak} peak")
    for g in goals:
        print(f"goal {g['what']}: {g['value']:.2f} (target {g['target']}) {'met' if g['met'] else 'NOT met'}")
    if not args.modes:
        path = write_results(args, "pretrain_speed", figures, goals)
        print(f"wrote {path}")


def _paired(modes: list[Mode], ours: str, theirs: str) -> float:
    """Median over rounds of the ratio within a round (two steps seconds apart, under much the same load)."""
    rates = {m.name: m.rates for m in modes}
    return statistics.median(a / b for a, b in zip(rates[ours], rates[theirs]))


def _loadavg() -> list[float] | None:
    """The machine's load averages: above the 2 threads used here, other work shared the cores."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


if __name__ == "__main__":
    main()
