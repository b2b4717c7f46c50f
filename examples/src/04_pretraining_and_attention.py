# Lesson 4 of 5: pretrain a small BERT on Wikipedia, then look at attention. Source of
# examples/04_pretraining_and_attention.ipynb (python scripts/build_notebooks.py rebuilds the notebook).
# needs-data: wikipedia

# %% [markdown]
# # 4. Pretraining a small BERT on real text, and looking at attention
#
# Pretraining is masked-LM training (lesson 3's blanks) over a lot of text. We do a small run of it on a slice of
# English Wikipedia, the whole path as `encoderlab` runs it at scale: train a WordPiece vocabulary, tokenize the text
# into memory-mapped shards with a held-out part, train bert-tiny with masked LM, and plot the loss. Real text matters:
# on random tokens nothing can be predicted, so a loss curve there cannot fall below the uniform guess and teaches
# nothing about what pretraining learns. Then we look inside a trained model at its attention.
#
# This lesson reads the Wikipedia corpus from `../shared/data/wikipedia` (WikiExtractor output, one of the standard
# pretraining corpora; set `ENCODERLAB_DATA` if your copy lives elsewhere).

# %%
# Sizes of this lesson: ENCODERLAB_NOTEBOOK_SMALL=1 shrinks them so the tests run every notebook in seconds.
import os

SMALL = os.environ.get("ENCODERLAB_NOTEBOOK_SMALL") == "1"
WIKI_FILES = 1 if SMALL else 3  # files of about 80 articles (1 MB of text) each
VOCAB_SIZE = 2000 if SMALL else 4000  # pieces in our own WordPiece vocabulary
STEPS = 20 if SMALL else 300  # optimizer steps of 32 sequences of 64 tokens

# %%
import csv
import math
import shutil
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Image, display

import encoderlab
from encoderlab.data.corpus import corpus_files
from encoderlab.data.prepare import prepare
from encoderlab.data.shards import TokenShards
from encoderlab.data.tokenizer_training import train_tokenizer
from encoderlab.infer.pipelines import pipeline
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.config import from_flat
from encoderlab.train.pretrain import pretrain
from encoderlab.viz.attention import attention_maps, head_entropy, plot_attention

ROOT = Path.cwd().parent if Path.cwd().name == "examples" else Path.cwd()  # Jupyter starts in examples/
DATA = Path(os.environ.get("ENCODERLAB_DATA", ROOT.parent / "shared" / "data"))  # as the tests find it
OUT = Path(os.environ.get("ENCODERLAB_NOTEBOOK_OUT", ROOT / "out" / "notebooks")) / "04_pretraining"
shutil.rmtree(OUT, ignore_errors=True)  # this lesson's own folder: a fresh run each time


wikipedia = DATA / "wikipedia"
if not wikipedia.is_dir():
    raise FileNotFoundError(f"{wikipedia} is absent: this lesson pretrains on the Wikipedia corpus of ../shared/data "
                            "(or set ENCODERLAB_DATA to the folder that holds wikipedia/)")
files = corpus_files([wikipedia])[:WIKI_FILES]
print(f"{len(files)} file(s), {sum(f.stat().st_size for f in files) / 1e6:.1f} MB compressed: "
      f"{', '.join(str(f.relative_to(wikipedia)) for f in files)}")

# %% [markdown]
# ## 1. A vocabulary of our own
#
# `train_tokenizer` streams the paragraphs of the corpus (never WikiExtractor's `<doc>` tags) into the `tokenizers`
# library's WordPiece trainer. A small vocabulary keeps the model's embedding table and output layer small; on this
# little text it also learns whole words only for the frequent ones.

# %%
tokenizer = train_tokenizer(files, kind="wordpiece", vocab_size=VOCAB_SIZE, out_dir=OUT / "tokenizer")
minilm = Tokenizer.from_pretrained("minilm")
sentence = "The philosopher argued that societies could organise themselves without a state."
print(f"ours ({tokenizer.vocab_size:,} pieces):  ", [tokenizer.id_to_token(i) for i in tokenizer.encode(sentence)])
print(f"minilm's ({minilm.vocab_size:,} pieces):", [minilm.id_to_token(i) for i in minilm.encode(sentence)])

# %% [markdown]
# ## 2. Shards
#
# `prepare` splits the text into sentences, tokenizes it and writes memory-mapped token files with sentence and
# document boundaries (`encoderlab prepare` on the command line). `holdout=4` keeps four whole documents out of
# training, so the held-out loss is measured on articles the model never saw.

# %%
stats = prepare(files, OUT / "tokenizer", OUT / "data", holdout=4, workers=1, progress=False)
print(f"{stats['documents']} documents, {stats['sentences']:,} sentences, {stats['tokens']:,} tokens "
      f"({stats['valid_documents']} documents and {stats['valid_tokens']:,} tokens held out)")

# %% [markdown]
# Two yardsticks before training. A model that knows nothing spreads its guess evenly over the vocabulary and scores
# ln V nats per masked token; on random tokens that is the best any model can do. A model that only learned how
# often each piece occurs (no context at all) scores the unigram cross-entropy. Learning from context means going
# below that.

# %%
def token_counts(split: str) -> np.ndarray:
    """How often each id occurs in a prepared split."""
    ids = np.concatenate([shard.tokens for shard in TokenShards(OUT / "data", split).shards])
    return np.bincount(ids, minlength=tokenizer.vocab_size)


train_counts, valid_counts = token_counts("train"), token_counts("valid")
unigram = (train_counts + 1) / (train_counts + 1).sum()  # add-one: a piece unseen in training is not impossible
uniform_loss = math.log(tokenizer.vocab_size)
unigram_loss = float(-(valid_counts * np.log(unigram)).sum() / valid_counts.sum())
print(f"uniform guess: {uniform_loss:.2f} nats; word frequencies only (held-out): {unigram_loss:.2f} nats")

# %% [markdown]
# ## 3. Pretraining
#
# A `PretrainConfig` is the recipe, built by `from_flat` from the flat keys the YAML files in `configs/` hold:
# bert-tiny (2 layers, hidden size 128), sequences of whole sentences packed up to 64 tokens, masked LM with fresh
# masks every batch, AdamW with warmup and linear decay. `pretrain` writes the run folder: `metrics.csv`,
# `curves.png`, checkpoints, and at the end `model/`, a Hugging Face folder.

# %%
config = from_flat(dict(data=str(OUT / "data"), preset="bert-tiny", objective="mlm", max_length=64, batch_size=32,
                        max_steps=STEPS, lr=2e-3, warmup_steps=max(1, STEPS // 10), precision="fp32", device="cpu",
                        log_every=max(1, STEPS // 30), eval_every=max(1, STEPS // 6), eval_batches=8,
                        save_every=0))
result = pretrain(config, OUT / "run", progress=False)
print({key: round(value, 3) if isinstance(value, float) else value for key, value in result.items()})

# %%
with (OUT / "run" / "metrics.csv").open() as handle:
    rows = list(csv.DictReader(handle))


def column(name: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows of metrics.csv that logged `name`."""
    points = [(int(r["step"]), float(r[name])) for r in rows if r.get(name)]
    return [s for s, _ in points], [v for _, v in points]


fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
left.plot(*column("mlm_loss"), label="training MLM loss")
left.plot(*column("eval_mlm_loss"), "o-", label="held-out MLM loss")
left.axhline(uniform_loss, color="gray", linestyle="--", label=f"uniform guess, ln V = {uniform_loss:.2f}")
left.axhline(unigram_loss, color="gray", linestyle=":", label=f"word frequencies only = {unigram_loss:.2f}")
left.set(xlabel="step", ylabel="nats per masked token", title="bert-tiny, masked LM on Wikipedia")
right.plot(*column("mlm_accuracy"), label="training")
right.plot(*column("eval_mlm_accuracy"), "o-", label="held-out")
right.set(xlabel="step", ylabel="accuracy", title="masked tokens predicted exactly")
for axis in (left, right):
    axis.grid(alpha=0.3)
    axis.legend()
plt.show()

# %% [markdown]
# The loss drops below the uniform guess within a few dozen steps: the model learns which pieces are common. Going
# below the word-frequency line means it has started to use context; in the full-size run (300 steps) that happens
# about halfway, and the held-out loss ends a little under the line. Much more needs much more text and compute: the
# README's bert-mini run took 1,000 steps of 64 x 128 tokens to reach a held-out accuracy of 0.14. The run also drew
# its own figure, `curves.png`, with `encoderlab.viz.curves.plot_metrics`:

# %%
display(Image(filename=str(OUT / "run" / "curves.png"), width=700))

# %% [markdown]
# What does such a model guess? It has seen well under a million tokens; the shipped `encoderlab-fill-mask` (lesson
# 3) started from minilm, which saw billions, and was adapted on millions more. The gap is the point of pretraining
# at scale.

# %%
ours = pipeline("fill-mask", OUT / "run" / "model")
shipped = pipeline("fill-mask")
for text in ["Paris is the [MASK] of France.", "The cat [MASK] on the mat.", "He was born in [MASK]."]:
    print(f"{text:<32} ours: {[g['token'] for g in ours([text])[0]['masks'][0]['predictions']]}")
    print(f"{'':<32} shipped: {[g['token'] for g in shipped([text])[0]['masks'][0]['predictions']]}")

# %% [markdown]
# ## 4. Attention maps
#
# Each layer's heads mix the token vectors with weights computed from query-key products: row *i* of a head's map
# says how much token *i* takes from every token (rows sum to 1). `attention_maps` runs a model once and returns every
# layer's probabilities, `(layers, heads, tokens, tokens)`; they equal transformers' `output_attentions=True`.
# Here minilm, a fully trained model, reading one sentence:

# %%
model = encoderlab.load_model("minilm")
text = "The cat sat on the mat because it was tired."
maps = attention_maps(model, minilm, text)
print(f"{len(maps.tokens)} tokens: {maps.tokens}")
print(f"probabilities {tuple(maps.probs.shape)}: layers, heads, queries, keys")

# %% [markdown]
# Heads specialise (Clark et al. 2019, "What Does BERT Look At?"): some look at one neighbour, some spread their
# attention wide, many park it on `[CLS]` or `[SEP]` when they have nothing to do. The mean entropy of a head's rows
# measures how spread it is: 0 nats when each token looks at exactly one other, ln T when it looks at all of them
# evenly.

# %%
entropy = head_entropy(maps.probs)  # (layers, heads)
fig, axis = plt.subplots(figsize=(7, 3.2))
image = axis.imshow(entropy.numpy(), cmap="magma")
axis.set(xlabel="head", ylabel="layer", title=f"mean row entropy (nats; uniform = ln {len(maps.tokens)} = "
                                               f"{math.log(len(maps.tokens)):.2f})")
axis.set_xticks(range(entropy.shape[1]))
fig.colorbar(image, ax=axis)
plt.show()

# %% [markdown]
# Three heads up close: layer 2's head 11, which takes from the previous token (the diagonal just below the main
# one), and the most focused and the most spread heads of the table above.

# %%
heads = entropy.shape[1]
picks = {"layer 2, head 11": (2, 11)}
for name, index in [("most focused", int(entropy.argmin())), ("most spread", int(entropy.argmax()))]:
    layer, head = divmod(index, heads)
    picks[f"{name}: layer {layer}, head {head}"] = (layer, head)
fig, axes = plt.subplots(1, len(picks), figsize=(14, 4.4))
for axis, (title, (layer, head)) in zip(axes, picks.items()):
    image = axis.imshow(maps.select(layer, head).numpy(), cmap="viridis", vmin=0)
    axis.set_xticks(range(len(maps.tokens)), maps.tokens, rotation=90, fontsize=8)
    axis.set_yticks(range(len(maps.tokens)), maps.tokens, fontsize=8)
    axis.set_title(f"{title} ({entropy[layer, head]:.2f} nats)", fontsize=10)
fig.colorbar(image, ax=axes, shrink=0.8, label="attention probability")
plt.show()

# %% [markdown]
# `plot_attention` (the `encoderlab attention` command) draws one head or all the heads of a layer into a PNG, on one
# colour scale so heads compare. Our bert-tiny has 2 layers of 2 heads; after a few hundred steps its heads are
# still finding their roles:

# %%
tiny = encoderlab.load_model(OUT / "run" / "model")
tiny_maps = attention_maps(tiny, Tokenizer.from_pretrained(OUT / "run" / "model"), text)
for name, drawn, layer in [("minilm", maps, 2), ("bert-tiny", tiny_maps, -1)]:
    path = plot_attention(drawn, OUT / f"attention-{name}.png", layer=layer)
    print(f"{name}: layer {drawn.layers[drawn.layer_index(layer)]}, all {drawn.num_heads} heads ({path.name})")
    display(Image(filename=str(path), width=520 if name == "minilm" else 360))

# %% [markdown]
# **Next:** lesson 5 is the exercise: fine-tune on SST-2 and compare with a BiLSTM trained from scratch.
