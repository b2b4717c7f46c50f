# Lesson 3 of 5: fill in the blank, and how the blanks are made. Source of examples/03_fill_mask_and_masking.ipynb
# (python scripts/build_notebooks.py rebuilds the notebook). Reads ../shared/data/wikipedia where present, else the
# shipped examples/sentences.txt.

# %% [markdown]
# # 3. Fill in the blank, and how the blanks are made
#
# BERT learns by filling in blanks: hide some tokens, predict them from both sides. This lesson first asks a trained
# masked-language model to fill blanks, then builds the training blanks the way BERT does (15% of tokens, of those
# 80% `[MASK]`, 10% a random token, 10% unchanged; special tokens never) on real Wikipedia text, and counts them.
#
# The model is `models/encoderlab-fill-mask`, which ships with the repository: minilm's encoder with a masked-LM head,
# adapted by this toolkit's continued pretraining on Wikipedia (its card, `models/encoderlab-fill-mask/README.md`,
# says what it saw and how well it does). `pipeline("fill-mask")` uses it when no model is named.

# %%
# Sizes of this lesson: ENCODERLAB_NOTEBOOK_SMALL=1 shrinks them so the tests run every notebook in seconds.
import os

SMALL = os.environ.get("ENCODERLAB_NOTEBOOK_SMALL") == "1"
DOCUMENTS = 3 if SMALL else 40  # Wikipedia articles whose tokens are masked and counted
DRAWS = 2 if SMALL else 10  # fresh masks drawn over them (BERT draws new ones every time it sees a text)

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from encoderlab import EncoderlabError
from encoderlab.data.collate import MaskingCollator
from encoderlab.data.corpus import corpus_files, iter_documents
from encoderlab.data.sentences import split_sentences
from encoderlab.infer.pipelines import pipeline

ROOT = Path.cwd().parent if Path.cwd().name == "examples" else Path.cwd()  # Jupyter starts in examples/
DATA = Path(os.environ.get("ENCODERLAB_DATA", ROOT.parent / "shared" / "data"))  # as the tests find it


# %% [markdown]
# ## Fill-mask
#
# Three sentences, one blank each. The pipeline returns, for every `[MASK]`, the top-k tokens with their
# probabilities over the whole vocabulary, and the sentence filled with the best guess.

# %%
fill_mask = pipeline("fill-mask")  # no model named: the shipped models/encoderlab-fill-mask
sentences = ["Paris is the [MASK] of France.", "The cat [MASK] on the mat.", "I love [MASK] learning."]
results = fill_mask(sentences, top_k=5)
for result in results:
    guesses = result["masks"][0]["predictions"]
    print(f"{result['text']:<32} -> {result['filled']}")
    print("    " + "  ".join(f"{g['token']} {g['score']:.3f}" for g in guesses))

# %%
fig, axes = plt.subplots(1, len(results), figsize=(4 * len(results), 2.8))
for axis, result in zip(axes, results):
    guesses = result["masks"][0]["predictions"]
    axis.barh([g["token"] for g in guesses][::-1], [g["score"] for g in guesses][::-1])
    axis.set(title=result["text"], xlabel="probability")
    axis.grid(alpha=0.3, axis="x")
fig.tight_layout()
plt.show()

# %% [markdown]
# Read the guesses as a reader would: which are grammatical, which are true, which are merely frequent words? The
# shipped model saw a few million tokens of adaptation, not the billions bert-base-uncased saw; its card lists the
# probes it passes and those it does not yet (training continues over sessions, so these guesses may change).
#
# A sentence may hold several blanks; each gets its own predictions, made jointly from the same pass:

# %%
two = fill_mask(["The cat [MASK] on the [MASK]."], top_k=3)[0]
for mask in two["masks"]:
    print(f"position {mask['position']}: " + "  ".join(f"{g['token']} {g['score']:.3f}" for g in mask["predictions"]))

# %% [markdown]
# minilm itself cannot do this: it was released as a sentence embedder without its masked-LM head, and the pipeline
# says so rather than guess with a random head.

# %%
try:
    pipeline("fill-mask", "minilm")
except EncoderlabError as error:
    print(f"{type(error).__name__}: {error}")

# %% [markdown]
# ## Making the blanks: masked-LM data
#
# Real text first. The Wikipedia corpus in `../shared/data/wikipedia` is WikiExtractor output; `corpus_files` and
# `iter_documents` read it (and plain text, JSONL, gzip) as documents, lists of paragraphs, the way `encoderlab
# prepare` does. Without the corpus, the lesson falls back to the sentences shipped in `examples/sentences.txt`.

# %%
wikipedia = DATA / "wikipedia"
if wikipedia.is_dir():
    source = corpus_files([wikipedia])[0]
    documents = []
    for document in iter_documents(source):
        documents.append(document)
        if len(documents) == DOCUMENTS:
            break
else:
    source = ROOT / "examples" / "sentences.txt"
    documents = [[line] for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(f"{wikipedia} is absent: using the shipped {source.name} instead")
texts = [sentence for document in documents for paragraph in document for sentence in split_sentences(paragraph)]
print(f"{source}: {len(documents)} documents, {len(texts)} sentences; the first:\n{texts[0]}")

# %% [markdown]
# The masking itself is `MaskingCollator`, the one `encoderlab pretrain` uses, here over the shipped model's
# tokenizer. Its `mask` takes a padded batch of ids and a random generator, and returns the masked ids and the
# labels: the original id where a token was chosen, -100 (ignored by the loss) everywhere else.

# %%
tokenizer = fill_mask.tokenizer
collator = MaskingCollator(tokenizer.vocab_size, tokenizer.mask_id, tokenizer.pad_id, tokenizer.special_ids)
batch = tokenizer.encode_batch(texts, max_length=128)


def word_starts(batch) -> torch.Tensor:
    """(B, T) bool: the token begins a word (special tokens and padding count as their own words)."""
    rows = [[w is None or k == 0 or w != ids[k - 1] for k, w in enumerate(ids)] for ids in batch.word_ids]
    return torch.tensor(rows)


starts = word_starts(batch)
generator = torch.Generator().manual_seed(0)
masked, labels = collator.mask(batch.input_ids, batch.attention_mask, starts, generator)

lengths, targets = batch.attention_mask.sum(1), (labels != -100).sum(1)
short = [r for r in range(len(texts)) if lengths[r] <= 24 and targets[r] >= 3]  # a short sentence, several targets
row = short[0] if short else int(targets.argmax())
print(f"{'original':>14}  {'input':>14}  label")
for original, shown, label in zip(batch.input_ids[row].tolist(), masked[row].tolist(), labels[row].tolist()):
    if original == tokenizer.pad_id:
        break
    mark = "" if label == -100 else ("  <- [MASK]" if shown == tokenizer.mask_id else
                                     "  <- random" if shown != original else "  <- kept, still predicted")
    print(f"{tokenizer.id_to_token(original):>14}  {tokenizer.id_to_token(shown):>14}  {label}{mark}")

# %% [markdown]
# Why not always `[MASK]`? The token never appears when the model is fine-tuned or used, so a model that only learned
# to fix `[MASK]` positions would have no reason to build good vectors for ordinary tokens. Replacing 10% with a
# random token and leaving 10% alone means any token might be a target (Devlin et al. 2019, section 3.1 and
# appendix C.2).
#
# ## Counting: is it really 15%, then 80/10/10?
#
# Draw fresh masks over the same text several times (as pretraining does, every epoch) and count.

# %%
special = torch.tensor(sorted(tokenizer.special_ids))
counts = {"tokens": 0, "chosen": 0, "[MASK]": 0, "random": 0, "kept": 0, "special chosen": 0}
for _ in range(DRAWS):
    masked, labels = collator.mask(batch.input_ids, batch.attention_mask, starts, generator)
    chosen = labels != -100
    is_special = torch.isin(batch.input_ids, special)
    counts["tokens"] += int((batch.attention_mask.bool() & ~is_special).sum())
    counts["chosen"] += int(chosen.sum())
    counts["[MASK]"] += int((chosen & (masked == tokenizer.mask_id)).sum())
    counts["random"] += int((chosen & (masked != tokenizer.mask_id) & (masked != batch.input_ids)).sum())
    counts["kept"] += int((chosen & (masked == batch.input_ids)).sum())
    counts["special chosen"] += int((chosen & is_special).sum())

share = counts["chosen"] / counts["tokens"]
print(f"chosen: {counts['chosen']:,} of {counts['tokens']:,} ordinary tokens = {share:.3f}")
for kind in ("[MASK]", "random", "kept"):
    print(f"{kind:>7}: {counts[kind] / counts['chosen']:.3f} of the chosen")
print(f"special tokens ([CLS], [SEP], padding) ever chosen: {counts['special chosen']}")
assert counts["special chosen"] == 0

# %% [markdown]
# Within sampling noise, that is 15% and 80/10/10. (A random replacement can draw the original token back, so
# "kept" is, in expectation, a hair above 10% and "random" a hair below: by 0.1 / 30,517, about 3 in a million.)

# %%
fig, axis = plt.subplots(figsize=(5, 3))
shares = [counts[kind] / counts["chosen"] for kind in ("[MASK]", "random", "kept")]
axis.bar(["[MASK]", "random token", "unchanged"], shares, color=["C0", "C1", "C2"])
axis.axhline(0.1, color="gray", linestyle=":")
axis.set(ylabel="share of the chosen tokens", title=f"{counts['chosen']:,} masked-LM targets")
plt.show()

# %% [markdown]
# **Whole-word masking.** With `whole_word=True` a word is chosen as a unit, so a model cannot guess `##ing` from
# the `learn` beside it: every piece of a chosen word is a target together (the whole-word-masking release of BERT).

# %%
whole = MaskingCollator(tokenizer.vocab_size, tokenizer.mask_id, tokenizer.pad_id, tokenizer.special_ids,
                        whole_word=True)
masked, labels = whole.mask(batch.input_ids, batch.attention_mask, starts, torch.Generator().manual_seed(1))
pieces = torch.tensor([[tokenizer.id_to_token(i).startswith("##") for i in ids] for ids in batch.input_ids.tolist()])
split = ((labels != -100) & pieces).any(1)  # (B,): a chosen word of several pieces
sizes = batch.attention_mask.sum(1).tolist()
row = min(split.nonzero().squeeze(1).tolist(), key=lambda r: (sizes[r] < 12, sizes[r]), default=0)  # short, not tiny
print(" ".join(f"[{tokenizer.id_to_token(i)}]" if label != -100 else tokenizer.id_to_token(i)
               for i, label, keep in zip(batch.input_ids[row].tolist(), labels[row].tolist(),
                                         batch.attention_mask[row].tolist()) if keep))
print("(targets in brackets)")

# %% [markdown]
# **Next:** lesson 4 trains a small BERT from scratch on these masked batches of Wikipedia text and looks at its
# attention.
