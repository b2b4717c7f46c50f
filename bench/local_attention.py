"""ModernBERT's local layers on long inputs (src/encoderlab/nn/window.py): the encoder's forward with the window as a
dense band mask, in blocks (banded), as chosen automatically, and transformers' ModernBertModel (its default
attention) on the same weights and inputs.

Random modernbert-base weights, random token ids, full rows (no padding), TOKENS tokens a batch at every length,
one thread. Each mode runs ROUNDS times interleaved with the others (the machine is shared) and keeps its best time.

    python bench/local_attention.py            # 22 layers; lengths 128 to 2048
    python bench/local_attention.py --quick    # 6 layers; lengths 256 to 2048
    python bench/local_attention.py --smoke    # seconds: 2 layers of 32, window 8 (make test)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import goal, write_results  # noqa: E402

from encoderlab import EncoderConfig, EncoderModel, save_pretrained  # noqa: E402
from encoderlab.nn import window  # noqa: E402

SMOKE = {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "local_attention": 8}
SIZES = {"smoke": (SMOKE, (16, 32, 64), 128, 1), "quick": ({"num_layers": 6}, (256, 512, 1024, 2048), 2048, 2),
         "full": ({}, (128, 256, 384, 512, 1024, 2048), 4096, 3)}  # overrides, lengths, tokens a batch, rounds
MODES = {"dense": 10**9, "banded": 0, "auto": window.BANDED_FROM}  # BANDED_FROM of each


@torch.inference_mode()
def best_times(ours: torch.nn.Module, theirs: torch.nn.Module, ids: torch.Tensor, rounds: int) -> dict[str, float]:
    """Best seconds of one forward of each mode over `rounds` interleaved rounds (and the outputs' agreement)."""
    best = dict.fromkeys([*MODES, "transformers"], float("inf"))
    for _ in range(rounds):
        for mode in best:
            window.BANDED_FROM = MODES.get(mode, MODES["auto"])
            started = time.perf_counter()
            (theirs if mode == "transformers" else ours)(ids)
            best[mode] = min(best[mode], time.perf_counter() - started)
    window.BANDED_FROM = MODES["auto"]
    return best


def main() -> None:
    args = common.parser(__doc__, quick="6 layers, lengths 256 to 2048 (about a minute)").parse_args()
    import transformers  # the reference, on the same weights

    torch.set_num_threads(1)
    overrides, lengths, tokens, rounds = SIZES[common.size(args)]
    torch.manual_seed(0)
    config = EncoderConfig.from_preset("modernbert-base", **overrides)
    ours = EncoderModel(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(ours, folder)
        theirs = transformers.ModernBertModel.from_pretrained(folder).eval()
    figures = {"layers": config.num_layers, "window": config.local_attention,
               "banded_from": window.BANDED_FROM * (config.local_attention // 2),
               "hf_attention": theirs.config._attn_implementation}
    for length in lengths:
        ids = torch.randint(5, config.vocab_size, (max(1, tokens // length), length), generator=torch.Generator())
        with torch.inference_mode():
            difference = float((ours(ids).last_hidden_state - theirs(ids).last_hidden_state).abs().max())
        times = best_times(ours, theirs, ids, rounds)
        figures[str(length)] = {"batch": ids.shape[0], "max_abs_difference": difference,
                                **{f"{m}_ms": round(t * 1e3, 1) for m, t in times.items()},
                                "banded_speedup": round(times["dense"] / times["banded"], 2),
                                "auto_vs_transformers": round(times["transformers"] / times["auto"], 2)}
        print(length, figures[str(length)], flush=True)
    goals = [goal(f"auto within 10% of the faster of dense and banded at length {n}",
                  round(min(f["dense_ms"], f["banded_ms"]) / f["auto_ms"], 2), 0.9)
             for n, f in ((n, figures[str(n)]) for n in lengths)]
    print(f"wrote {write_results(args, 'local_attention', figures, goals)}")


if __name__ == "__main__":
    main()
