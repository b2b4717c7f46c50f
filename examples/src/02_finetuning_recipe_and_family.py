# Lesson 2 of 5: the fine-tuning recipe, and the BERT family side by side. Source of
# examples/02_finetuning_recipe_and_family.ipynb (python scripts/build_notebooks.py rebuilds the notebook).

# %% [markdown]
# # 2. The fine-tuning recipe, and the family at a glance
#
# Fine-tuning a pretrained encoder is forgiving about most things and unforgiving about a few: the learning rate,
# where weight decay applies, and a warmup at the start. This lesson takes the standard recipe apart (AdamW, decay
# on the weight matrices only, linear warmup then linear decay, gradient clipping), plots it, and runs it on minilm.
# Then it sizes up the BERT family: parameter counts for every preset, and `compare` measuring CPU speed side by side.

# %%
# Sizes of this lesson: ENCODERLAB_NOTEBOOK_SMALL=1 shrinks them so the tests run every notebook in seconds.
import os

SMALL = os.environ.get("ENCODERLAB_NOTEBOOK_SMALL") == "1"
TRAIN_STEPS = 6 if SMALL else 40  # optimizer steps of the demonstration run
COMPARE_PRESETS = ["electra-mini"] if SMALL else ["distilbert-base", "albert-base", "electra-small"]
COMPARE_REFERENCE = "bert-mini" if SMALL else "bert-base"  # the row every other is measured against

# %%
import dataclasses
from collections import defaultdict

import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display

import encoderlab
from encoderlab.compare import QUICK, Settings, claim_sentences, compare, markdown_table
from encoderlab.models import PRESETS
from encoderlab.tasks.objective import TrainOptions
from encoderlab.tokenizer import Tokenizer
from encoderlab.train.optim import linear_schedule, make_optimizer, param_groups

torch.manual_seed(0)


# %% [markdown]
# ## The recipe
#
# `encoderlab finetune` defaults to the recipe of the BERT paper and its code (Devlin et al. 2019, appendix A.2 for
# the optimizer, A.3 for the fine-tuning grid; `run_classifier.py` warms up over 10% of the steps).
# `TrainOptions` holds it:

# %%
recipe = TrainOptions()
for field in ("lr", "weight_decay", "warmup_ratio", "epochs", "batch_size", "max_grad_norm"):
    print(f"{field:>14}: {getattr(recipe, field)}")

# %% [markdown]
# ## Weight decay, but not everywhere
#
# AdamW (Loshchilov and Hutter 2019) applies weight decay directly to the weights rather than through the gradient,
# so it does not interact with Adam's per-parameter scaling. BERT's `optimization.py` decays the weight matrices and
# embeddings and leaves biases and LayerNorm weights alone: pulling a LayerNorm gain towards 0 would shrink every
# activation it scales. `param_groups` makes the two groups:

# %%
tokenizer = Tokenizer.from_pretrained("minilm")
model = encoderlab.load_model("minilm", kind="classify", num_labels=2)
names = {id(p): n for n, p in model.named_parameters()}
for group in param_groups(model, weight_decay=recipe.weight_decay):
    params = group["params"]
    print(f"weight_decay={group['weight_decay']}: {len(params)} tensors, {sum(p.numel() for p in params):,} values,"
          f" e.g. {', '.join(names[id(p)] for p in params[:3])}")

# %% [markdown]
# ## Warmup, then linear decay
#
# The learning rate climbs linearly from 0 to its peak over the first 10% of steps, then falls linearly to 0 at the
# last step. Why warm up: Adam divides by a running estimate of each gradient's square, and over the first steps that
# estimate rests on a handful of samples; large steps taken on it can throw a pretrained model out of its basin
# (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond"). `linear_schedule` gives the
# multiplier of the peak rate at each step; the loop hands it to torch's `LambdaLR`.

# %%
total, peak = 1000, recipe.lr
fig, axis = plt.subplots(figsize=(7, 3.2))
for ratio in (0.0, 0.06, 0.1):
    factor = linear_schedule(int(ratio * total), total)
    axis.plot(range(total), [peak * factor(step) for step in range(total)], label=f"warmup_ratio {ratio}")
axis.set(xlabel="optimizer step", ylabel="learning rate", title=f"linear warmup and decay, peak {peak:g}")
axis.legend()
axis.grid(alpha=0.3)
plt.show()

# %% [markdown]
# ## The recipe at work
#
# The same pieces that `encoderlab finetune` puts together (its loop is `src/encoderlab/train/loop.py`), written out:
# AdamW over the two groups, the schedule, and gradients clipped to norm 1 so one odd batch cannot take a huge step.
# Here minilm with a new head learns a dozen labelled sentences; lesson 5 does it for real on SST-2.

# %%
reviews = [("a warm, funny and moving film", 1), ("the best thing I have seen all year", 1),
           ("beautifully acted and shot", 1), ("I smiled from start to finish", 1), ("clever, tender and bright", 1),
           ("a joy to watch", 1), ("dull, slow and far too long", 0), ("the worst script in years", 0),
           ("I walked out after an hour", 0), ("flat characters and a silly plot", 0), ("a tedious mess", 0),
           ("nothing here works at all", 0)]
inputs = tokenizer.encode_batch([text for text, _ in reviews])
targets = torch.tensor([label for _, label in reviews])

lr = 1e-4  # small BERTs take larger rates (google-research/bert's grid for them: 3e-4 to 3e-5); few steps here
optimizer = make_optimizer(model, lr=lr, weight_decay=recipe.weight_decay, betas=(0.9, 0.999), eps=1e-8)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(max(1, TRAIN_STEPS // 10), TRAIN_STEPS))
history = defaultdict(list)
model.train()
for step in range(TRAIN_STEPS):
    loss = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids, labels=targets).loss
    optimizer.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
    history["lr"].append(scheduler.get_last_lr()[0])
    optimizer.step()
    scheduler.step()
    history["loss"].append(loss.item())
    history["grad_norm"].append(norm.item())
model.eval()
print(f"loss {history['loss'][0]:.3f} -> {history['loss'][-1]:.3f}; gradient norm before clipping: "
      f"max {max(history['grad_norm']):.2f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
left.plot(history["loss"], label="training loss")
left.set(xlabel="step", ylabel="cross-entropy", title="minilm fine-tuned on 12 sentences")
right.plot(history["lr"], color="tab:orange")
right.set(xlabel="step", ylabel="learning rate", title="the schedule it followed")
for axis in (left, right):
    axis.grid(alpha=0.3)
plt.show()

# %% [markdown]
# ## The BERT family by size
#
# Each variant is BERT with a few switches (see the README's family table). Building a model on PyTorch's `meta`
# device allocates no memory and draws no random weights, so counting the parameters of every preset, even the
# large ones, takes a moment. The count is that of the bare encoder (`EncoderModel`), as `encoderlab info` reports
# it; the embedding share is what the vocabulary costs.

# %%
rows = []
with torch.device("meta"):
    for name in PRESETS:
        config = encoderlab.EncoderConfig.from_preset(name)
        counted = encoderlab.EncoderModel(config)
        embeddings = sum(p.numel() for n, p in counted.named_parameters() if ".embeddings." in n)
        rows.append((name, config.model_type, config.num_layers, config.hidden_size, counted.num_parameters(),
                     embeddings))
lines = ["| preset | family | layers | hidden | parameters | of which embeddings |", "|---|---|---|---|---|---|"]
lines += [f"| {n} | {t} | {layers} | {h} | {p:,} | {e / p:.0%} |" for n, t, layers, h, p, e in rows]
display(Markdown("\n".join(lines)))

# %%
fig, axis = plt.subplots(figsize=(9, 4.5))
colours = {t: f"C{i}" for i, t in enumerate(dict.fromkeys(r[1] for r in rows))}
axis.barh([r[0] for r in rows], [r[4] / 1e6 for r in rows], color=[colours[r[1]] for r in rows])
axis.barh([r[0] for r in rows], [r[5] / 1e6 for r in rows], color="none", edgecolor="black", hatch="//",
          label="embeddings")
axis.set(xlabel="parameters (millions)", title="every preset: the encoder's parameters (hatched: embeddings)")
axis.invert_yaxis()
axis.legend()
axis.grid(alpha=0.3, axis="x")
plt.show()

# %% [markdown]
# ALBERT shares one block across its layers and factorises its embeddings, so albert-base has a tenth of
# bert-base's parameters at the same depth and width (its compute is not smaller: every layer still runs). DeBERTa-v3's
# 128K-piece vocabulary puts more than half of its base model in the embedding table.
#
# ## Speed: `compare`
#
# `encoderlab.compare.compare` (the `encoderlab compare` command) builds each preset with random weights (speed does
# not depend on them), runs the same token ids through every model in turn, and reports batch-1 latency and batched
# throughput as ratios to a reference, with the papers' claims beside the measurements. These are rough figures
# (`QUICK` settings, on however many threads this kernel has); `encoderlab compare --out docs/family-compare.md`
# takes the careful ones.

# %%
settings = dataclasses.replace(QUICK, threads=torch.get_num_threads())
if SMALL:
    settings = Settings(threads=torch.get_num_threads(), sequences=8, batch_size=8, latency_sequences=2, repeats=1)
measured = compare(COMPARE_PRESETS, settings, reference=COMPARE_REFERENCE)
display(Markdown(markdown_table(measured)))
for sentence in claim_sentences(measured):
    print("-", sentence)

# %% [markdown]
# **Next:** lesson 3 asks a masked-language model to fill in blanks, and shows how the blanks are made for
# pretraining.
