"""Unpadding on CPU (src/encoderlab/nn/packing.py): the encoder's forward with padding kept, with the real tokens packed,
and as chosen automatically, on batches of real sentence lengths.

Setups, batch 32, random weights, minilm's vocabulary and tokenizer for the lengths:
- shuffled: SST-2 train sentences in random order, as fine-tuning draws them (much padding);
- sorted:   the same sentences sorted by length, as the inference engine batches them (little padding).
Each forward runs `ROUNDS` times interleaved with the others (the machine is shared) and keeps its best time.

    python bench/unpadding.py            # bert-base and modernbert-base, 12 layers, 16 batches
    python bench/unpadding.py --quick    # 4 layers, 6 batches
    python bench/unpadding.py --smoke    # seconds: 2 layers of 32 on synthetic sentences (make test)
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import goal, smoke_data, write_results  # noqa: E402

from encoderlab import EncoderConfig  # noqa: E402
from encoderlab.nn import packing  # noqa: E402
from encoderlab.nn.model import EncoderModel  # noqa: E402
from encoderlab.tokenizer import Tokenizer  # noqa: E402

SST2 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "sst2" / "train.tsv"
SIZES = {"smoke": ({"num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}, 2),
         "quick": ({"num_layers": 4}, 6), "full": ({"num_layers": 12}, 16)}  # model overrides, batches
ROUNDS = 3
BATCH = 32
MODES = {"padded": (10**12, 0.0), "packed": (0, 1.0), "auto": (packing.MIN_TOKENS, packing.MAX_REAL)}


def batches(sentences: list[str], tokenizer: Tokenizer, count: int, shuffled: bool) -> list[dict[str, torch.Tensor]]:
    """`count` padded batches of BATCH sentences, in random order or sorted by length."""
    order = random.Random(0).sample(sentences, count * BATCH)
    if not shuffled:
        order.sort(key=len)
    encoded = [tokenizer.encode_batch(order[i:i + BATCH], max_length=128) for i in range(0, len(order), BATCH)]
    return [{"input_ids": b.input_ids, "attention_mask": b.attention_mask} for b in encoded]


def best_times(model: torch.nn.Module, data: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Best seconds per batch of each mode over ROUNDS interleaved rounds."""
    best = dict.fromkeys(MODES, float("inf"))
    with torch.inference_mode():
        for _ in range(ROUNDS):
            for mode, (min_tokens, max_real) in MODES.items():
                packing.MIN_TOKENS, packing.MAX_REAL = min_tokens, max_real
                started = time.perf_counter()
                for batch in data:
                    model(**batch)
                best[mode] = min(best[mode], (time.perf_counter() - started) / len(data))
    packing.MIN_TOKENS, packing.MAX_REAL = MODES["auto"]
    return best


def main() -> None:
    args = common.parser(__doc__, quick="4 layers, 6 batches (a minute or two)").parse_args()
    torch.set_num_threads(1)
    overrides, count = SIZES[common.size(args)]
    with tempfile.TemporaryDirectory() as tmp:
        source = smoke_data(Path(tmp)) / "sst2" / "train.tsv" if args.smoke else SST2
        if not source.is_file():
            sys.exit(f"skipped: {source} is absent (SST-2 lives in ../shared/data)")
        sentences = [line.split("\t")[0] for line in source.read_text(encoding="utf-8").splitlines()[1:]]
    sentences = (sentences * (count * BATCH // len(sentences) + 1))[:max(len(sentences), count * BATCH)]
    tokenizer = Tokenizer.from_pretrained("minilm")
    figures, goals = {}, []
    for preset in ("bert-base", "modernbert-base"):
        torch.manual_seed(0)
        config = EncoderConfig.from_preset(preset, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id,
                                           **overrides)
        model = EncoderModel(config).eval()
        for setup in ("shuffled", "sorted"):
            data = batches(sentences, tokenizer, count, setup == "shuffled")
            real = sum(int(b["attention_mask"].sum()) for b in data) / sum(b["attention_mask"].numel() for b in data)
            times = best_times(model, data)
            figures[f"{preset}/{setup}"] = {"real_share": round(real, 3), "layers": config.num_layers,
                                            **{f"{m}_ms": round(t * 1e3, 2) for m, t in times.items()},
                                            "packed_speedup": round(times["padded"] / times["packed"], 2),
                                            "auto_speedup": round(times["padded"] / times["auto"], 2)}
            print(preset, setup, figures[f"{preset}/{setup}"], flush=True)
        shuffled = figures[f"{preset}/shuffled"]
        goals.append(goal(f"{preset}: padded / packed time on shuffled SST-2 batches", shuffled["packed_speedup"],
                          1.2))
    path = write_results(args, "unpadding", figures, goals)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
