"""Helpers shared by every bench script: the options every bench takes (--quick, --smoke, --results-dir), what
machine and versions a figure came from, the matmul peak, one results format (NAME.json with machine, versions,
command, figures, goals), and the tiny stand-ins --smoke runs on (synthetic data, a tiny random model).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from encoderlab import EncoderConfig, EncoderModel, MaskedLMModel, SequenceClassifier, save_pretrained
from encoderlab.checkpoint import resolve_model_path
from encoderlab.cli import main as encoderlab_main
from encoderlab.compare import cpu_name
from encoderlab.data.prepare import prepare
from encoderlab.data.tokenizer_training import train_tokenizer
from encoderlab.infer.precision import bf16_supported

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE_RESULTS = Path(tempfile.gettempdir()) / "encoderlab-bench-smoke"
# The x86 flags that decide matmul speed: fp32 (AVX2/FMA, AVX-512), int8 (VNNI, AMX-INT8), bf16 (AVX512-BF16, AMX).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")


def _cpu_flags() -> dict[str, bool]:
    """Which of ISA_FLAGS this CPU has (all False where /proc/cpuinfo is unreadable, e.g. off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return {flag: flag in flags for flag in ISA_FLAGS}


def _memory_gib() -> float | None:
    """Total RAM in GiB (Linux), or None where /proc/meminfo is unavailable."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """CPU model, cores, threads torch uses, memory, and the GPU if there is one."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_name(), "cpu_flags": _cpu_flags(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "memory_gib": _memory_gib(), "gpu": gpu,
            "platform": platform.platform()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """Versions of python and of the packages a figure depends on (None where one is not installed)."""
    import encoderlab

    return {"python": platform.python_version(), "torch": torch.__version__, "encoderlab": encoderlab.__version__,
            "transformers": _version("transformers"), "tokenizers": _version("tokenizers"),
            "numpy": _version("numpy")}


def peak_rate(product: Callable[[int], Callable[[], object]], most: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of `product(n)()`, an (n, n) x (n, n) matmul, over `reps` timed runs. n doubles from 256 while
    one run takes under 0.1 s, up to `most`: an emulated dtype (bf16 without AVX512-BF16, int8 without VNNI)
    then takes seconds, not minutes, and a fast one still gets a matrix big enough to reach its peak."""
    n = 256
    while True:
        run = product(n)
        started = time.perf_counter()
        run()
        best = time.perf_counter() - started
        if best > 0.1 or n >= most:
            break
        n *= 2
    for _ in range(reps):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 5) -> float:
    """Best FLOP/s of a square torch.matmul in `dtype` (up to n x n; see peak_rate)."""

    def product(size: int) -> Callable[[], object]:
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        return lambda: torch.matmul(a, b)

    return peak_rate(product, n, reps)


def training_precision() -> str:
    """bf16 where the CPU computes it natively, else fp32: emulated bf16 (AVX2 only) is many times slower."""
    return "bf16" if bf16_supported() else "fp32"


def goal(what: str, value: float, target: float, at_most: bool = False) -> dict[str, Any]:
    """One goal line: met when value >= target (at_most: when value <= target, for times and sizes)."""
    met = value <= target if at_most else value >= target
    return {"what": what, "value": round(value, 3), "target": target, "met": bool(met)}


def parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """An ArgumentParser described by the first paragraph of `doc`, with the options every bench takes."""
    out = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    size = out.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=quick)
    size.add_argument("--smoke", action="store_true",
                      help="tiny random model and synthetic data, a few seconds: checks that the bench still runs "
                           "(its figures mean nothing); make test runs it")
    out.add_argument("--results-dir", type=Path, default=None,
                     help=f"where NAME.json goes (default: bench/results; with --smoke: {SMOKE_RESULTS})")
    return out


def size(args: argparse.Namespace) -> str:
    """"smoke", "quick" or "full": how big a run the options ask for."""
    return "smoke" if args.smoke else "quick" if args.quick else "full"


def results_path(args: argparse.Namespace, name: str) -> Path:
    """NAME.json (NAME_quick.json, NAME_smoke.json) in --results-dir; smoke runs never land in bench/results."""
    suffix = "_smoke" if args.smoke else "_quick" if args.quick else ""
    folder = args.results_dir or (SMOKE_RESULTS if args.smoke else RESULTS)
    return folder / f"{name}{suffix}.json"


def write_results(args: argparse.Namespace, name: str, figures: dict[str, Any], goals: list[dict[str, Any]]) -> Path:
    """Write results_path(args, name) (machine, versions, command, figures, goals) atomically; return its path."""
    path = results_path(args, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "versions": versions(), "command": command_line(), "figures": figures,
               "goals": goals}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def encoderlab(*argv: Any) -> None:
    """Run an `encoderlab` command in this process (no interpreter start-up per run); exit if it fails."""
    print("$ encoderlab", " ".join(map(str, argv)), file=sys.stderr, flush=True)
    code = encoderlab_main([str(a) for a in argv])
    if code:
        raise SystemExit(f"encoderlab {argv[0]} exited {code}")


def command_line() -> str:
    """The command that ran this script, as it could be typed again from the repository root."""
    return " ".join(["python", *sys.argv])


# ---- what --smoke runs on ----------------------------------------------------------------------------------------
WORDS = {"pos": ["good", "great", "fine", "charming"], "neg": ["bad", "awful", "dull", "bleak"],
         "filler": "the a movie film was is very quite plot acting story and but it of".split(),
         "names": ["Paris", "France", "London", "Anna", "Peter"]}


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS["filler"] + WORDS["names"], k=words)).capitalize() + "."


def _sst2(rng: random.Random, rows: int) -> str:
    lines = [f"{_sentence(rng, rng.randint(3, 12))[:-1]} {rng.choice(WORDS['pos' if i % 2 else 'neg'])} \t{i % 2}"
             for i in range(rows)]
    return "sentence\tlabel\n" + "\n".join(lines) + "\n"


def _stsb(rng: random.Random, rows: int) -> str:
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    return head + "".join(f"{i}\tmain\tsmoke\t2012\t{i:04d}\tnone\tnone\t{_sentence(rng, 6)}\t{_sentence(rng, 6)}"
                          f"\t{rng.uniform(0, 5):.3f}\n" for i in range(rows))


def _conll(rng: random.Random, sentences: int) -> str:
    blocks = ["-DOCSTART- -X- -X- O\n"]
    for _ in range(sentences):
        words = [(w, "B-LOC" if w in WORDS["names"] else "O") for w in _sentence(rng, rng.randint(3, 9))[:-1].split()]
        blocks.append("".join(f"{w} NN B-NP {tag}\n" for w, tag in words))
    return "\n".join(blocks)


def _squad(rng: random.Random, articles: int) -> str:
    data = []
    for i in range(articles):
        answer = rng.choice(WORDS["names"])
        context = f"{_sentence(rng, 10)} The answer is {answer}. {_sentence(rng, 10)}"
        qas = [{"id": f"q{i}", "question": "What is the answer?",
                "answers": [{"answer_start": context.index(f"is {answer}") + 3, "text": answer}]}]
        data.append({"title": f"Article {i}", "paragraphs": [{"context": context, "qas": qas}]})
    return json.dumps({"version": "1.1", "data": data})


def _wiki(rng: random.Random, start: int, docs: int) -> str:
    out = []
    for i in range(start, start + docs):
        paragraphs = "\n".join(" ".join(_sentence(rng, rng.randint(5, 15)) for _ in range(6)) for _ in range(4))
        out.append(f'<doc id="{i}" url="https://example.org/?curid={i}" title="Doc {i}">\nDoc {i}\n\n{paragraphs}\n</doc>\n')
    return "".join(out)


def smoke_data(folder: Path) -> Path:
    """Synthetic stand-ins for ../shared/data, in its layout and file formats (sst2, stsb, conll2003,
    squad_v1.1, wikipedia/AA): a few dozen examples each, so a --smoke run needs no real data."""
    rng = random.Random(0)
    files = {"sst2/train.tsv": _sst2(rng, 64), "sst2/dev.tsv": _sst2(rng, 32), "stsb/train.tsv": _stsb(rng, 32),
             "stsb/dev.tsv": _stsb(rng, 16), "conll2003/train.txt": _conll(rng, 32),
             "conll2003/valid.txt": _conll(rng, 16), "squad_v1.1/dev-v1.1.part-a.json": _squad(rng, 10)}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "wikipedia/AA").mkdir(parents=True, exist_ok=True)
    for n in range(2):
        with gzip.open(folder / f"wikipedia/AA/wiki_0{n}.gz", "wt", encoding="utf-8") as f:
            f.write(_wiki(rng, 10 * n, 10))
    return folder


def tiny_model(folder: Path, masked_lm: bool = False, cross_encoder: bool = False) -> Path:
    """A random BERT of 2 layers x 32 (BertModel, BertForMaskedLM, or a one-logit cross-encoder for the rerank
    pipeline) in Hugging Face's layout, with minilm's tokenizer and sentence-transformers files: what every contender
    can load, in a fraction of a second."""
    minilm = resolve_model_path("minilm")
    vocab_size = json.loads((minilm / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    config = EncoderConfig.from_preset("bert-tiny", vocab_size=vocab_size, hidden_size=32, num_heads=2,
                                       intermediate_size=64)
    torch.manual_seed(0)
    model = SequenceClassifier(config, num_labels=1, multilabel=True) if cross_encoder else \
        (MaskedLMModel if masked_lm else EncoderModel)(config)
    save_pretrained(model, folder)
    for item in minilm.iterdir():
        if item.name in ("config.json", "model.safetensors", "README.md"):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy)(item, folder / item.name)
    pooling = folder / "1_Pooling" / "config.json"
    if pooling.is_file():  # sentence-transformers checks the width it pools
        settings = json.loads(pooling.read_text(encoding="utf-8"))
        pooling.write_text(json.dumps(settings | {"word_embedding_dimension": config.hidden_size}), encoding="utf-8")
    return folder


def smoke_shards(folder: Path) -> Path:
    """`encoderlab prepare` shards (train and valid, a 200-word WordPiece vocabulary) of smoke_data's Wikipedia
    stand-in, in `folder`/shards: what a pretraining recipe's `data` names."""
    wiki = sorted((smoke_data(folder / "data") / "wikipedia" / "AA").glob("wiki_*.gz"))
    train_tokenizer([str(f) for f in wiki], vocab_size=200, out_dir=folder / "tokenizer")
    prepare([str(f) for f in wiki], folder / "tokenizer", folder / "shards", holdout=0.2, workers=1, progress=False)
    return folder / "shards"


# What --smoke shrinks every pretraining recipe to (`--set` overrides): 2 layers x 32, 4 sequences of 32 tokens.
SMOKE_RECIPE = ["model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64", "model.num_layers=2",
                "max_length=32", "batch_size=4", "precision=fp32"]
