# Lesson 1 of 5: what an encoder reads and what it gives back. Source of examples/01_tokens_and_heads.ipynb
# (python scripts/build_notebooks.py rebuilds the notebook from this file).

# %% [markdown]
# # 1. Tokens in, vectors out, and a head on top
#
# An encoder such as BERT never sees words. A tokenizer cuts text into sub-word pieces and maps each to an id; the
# encoder turns the ids into one vector per piece; a small *head* turns those vectors into what a task needs. This
# lesson walks that path with **all-MiniLM-L6-v2** (`minilm`: a 6-layer BERT of 22.7M parameters, shipped inside a
# PyPI package, so nothing is downloaded) and ends with two classification heads: the built-in one and one we write.
#
# Everything runs on a CPU in under two minutes.

# %%
# Sizes of this lesson: ENCODERLAB_NOTEBOOK_SMALL=1 shrinks them so the tests run every notebook in seconds.
import os

SMALL = os.environ.get("ENCODERLAB_NOTEBOOK_SMALL") == "1"
HEAD_STEPS = 8 if SMALL else 60  # optimizer steps for our own head

# %%
import matplotlib.pyplot as plt
import torch
from torch import nn

import encoderlab
from encoderlab.tokenizer import Tokenizer

torch.manual_seed(0)


# %% [markdown]
# ## Tokenization
#
# `Tokenizer.from_pretrained` takes a model folder or an alias. minilm uses BERT's uncased WordPiece vocabulary of
# 30,522 pieces: a word it knows is one piece; a rarer word is split, and each continuation starts with `##`.

# %%
tokenizer = Tokenizer.from_pretrained("minilm")
print(tokenizer, "| special tokens:", tokenizer.specials)

text = "Tokenizers split unbelievably rare words into pieces."
ids = tokenizer.encode(text)
tokens = [tokenizer.id_to_token(i) for i in ids]
for token, token_id in zip(tokens, ids):
    print(f"{token:>12}  {token_id:>6}")

# %% [markdown]
# The tokenizer added `[CLS]` in front and `[SEP]` at the end: BERT was pretrained with them, and the `[CLS]`
# vector is what the pooler (below) reads. Decoding joins the pieces back into words; the text comes back lower-cased
# because the vocabulary is uncased.

# %%
print(tokenizer.decode(ids))
print(tokenizer.decode(ids, skip_special_tokens=False))

# %% [markdown]
# Two texts can be one input (`[CLS] A [SEP] B [SEP]`): `token_type_ids` tell the halves apart. A batch is padded to
# its longest member, and `attention_mask` marks which positions are real (1) and which are padding (0).

# %%
pair = tokenizer.encode_batch(["Where is the cat?"], ["The cat sat on the mat."])
print([tokenizer.id_to_token(i) for i in pair.input_ids[0].tolist()])
print("token_type_ids:", pair.token_type_ids[0].tolist())

batch = tokenizer.encode_batch(["Hello world.", "A second, rather longer sentence than the first."])
print("input_ids      ", tuple(batch.input_ids.shape))
print("attention_mask ", batch.attention_mask.tolist())

# %% [markdown]
# ## The encoder's output: `last_hidden_state` and the pooler
#
# `encoderlab.load_model(name, kind=...)` builds the class for a kind of model and loads the checkpoint's weights into
# it. `kind="base"` is the bare encoder (transformers' `BertModel`). Every model returns a `ModelOutput`:
# `last_hidden_state` holds one vector per token, `(batch, tokens, hidden)`, and `pooled` is BERT's pooler: the
# `[CLS]` vector through a dense layer and tanh, `(batch, hidden)`.

# %%
encoder = encoderlab.load_model("minilm", kind="base")  # loaded in eval mode: no dropout
print(f"{type(encoder).__name__}: {encoder.num_parameters():,} parameters, {encoder.config.num_layers} layers, "
      f"hidden size {encoder.config.hidden_size}, {encoder.config.num_heads} heads")

with torch.no_grad():
    out = encoder(batch.input_ids, batch.attention_mask, batch.token_type_ids)
print("last_hidden_state", tuple(out.last_hidden_state.shape))  # (B, T, H)
print("pooled           ", tuple(out.pooled.shape))  # (B, H)

# %% [markdown]
# minilm was trained as a *sentence embedder*: its authors average the token vectors (mean pooling) rather than use
# the pooler. Loaded without `kind`, the alias gives that class (`SentenceEmbedder`), whose `embedding` is the mean
# over real tokens. Similar sentences get close vectors:

# %%
embedder = encoderlab.load_model("minilm")
sentences = ["A man is playing a guitar.", "Someone performs music on an instrument.", "Stocks fell on Monday."]
encoded = tokenizer.encode_batch(sentences)
with torch.no_grad():
    vectors = embedder(encoded.input_ids, encoded.attention_mask, encoded.token_type_ids).embedding  # (3, 384)
vectors = torch.nn.functional.normalize(vectors, dim=-1)
similarity = vectors @ vectors.T
for i, sentence in enumerate(sentences[1:], start=1):
    print(f"{similarity[0, i]:.3f}  {sentences[0]!r} vs {sentence!r}")

# %% [markdown]
# ## The built-in classification head
#
# `kind="classify"` puts the family's sequence-classification head on the same encoder: for BERT, dropout and a
# linear layer on the pooled `[CLS]` vector (transformers' `BertForSequenceClassification`). The head is new, so its
# predictions mean nothing yet: both classes come out near 0.5. Given `labels`, the output also carries the loss.

# %%
classifier = encoderlab.load_model("minilm", kind="classify", num_labels=2)
print(classifier.head)
labels = torch.tensor([1, 0])
with torch.no_grad():
    result = classifier(batch.input_ids, batch.attention_mask, batch.token_type_ids, labels=labels)
probabilities = [[round(p, 3) for p in row] for row in result.logits.softmax(-1).tolist()]
print("logits", tuple(result.logits.shape), "probabilities", probabilities)
print(f"cross-entropy loss {result.loss:.3f} (ln 2 = 0.693: a coin toss)")

# %% [markdown]
# ## A head of our own
#
# A head is any `nn.Module`. Here is one with a hidden layer on the pooled vector: the encoder's output is an ordinary
# tensor, so what goes on top is up to us. To keep the lesson fast we freeze the encoder and train only the head on a
# dozen sentences; lesson 5 fine-tunes everything on real data.

# %%
class PooledHead(nn.Module):
    """An encoder, then dropout, a tanh layer and a linear layer on its pooled [CLS] vector: (B, T) ids -> (B, L)."""

    def __init__(self, encoder: nn.Module, num_labels: int, hidden: int = 128, dropout: float = 0.1):
        super().__init__()
        self.encoder = encoder
        size = encoder.config.hidden_size
        self.classify = nn.Sequential(nn.Dropout(dropout), nn.Linear(size, hidden), nn.Tanh(),
                                      nn.Linear(hidden, num_labels))

    def forward(self, input_ids, attention_mask, token_type_ids):
        pooled = self.encoder(input_ids, attention_mask, token_type_ids).pooled  # (B, H)
        return self.classify(pooled)  # (B, L)


model = PooledHead(encoderlab.load_model("minilm", kind="base"), num_labels=2)
for parameter in model.encoder.parameters():
    parameter.requires_grad = False
trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
print(f"trainable: {trainable:,} of {sum(p.numel() for p in model.parameters()):,} parameters")

# %%
reviews = [("a warm, funny and moving film", 1), ("the best thing I have seen all year", 1),
           ("beautifully acted and shot", 1), ("I smiled from start to finish", 1), ("clever, tender and bright", 1),
           ("a joy to watch", 1), ("dull, slow and far too long", 0), ("the worst script in years", 0),
           ("I walked out after an hour", 0), ("flat characters and a silly plot", 0), ("a tedious mess", 0),
           ("nothing here works at all", 0)]
texts, targets = [t for t, _ in reviews], torch.tensor([y for _, y in reviews])
inputs = tokenizer.encode_batch(texts)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
losses = []
model.train()
for step in range(HEAD_STEPS):
    logits = model(inputs.input_ids, inputs.attention_mask, inputs.token_type_ids)
    loss = nn.functional.cross_entropy(logits, targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
model.eval()
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} after {HEAD_STEPS} steps")

# %%
fig, axis = plt.subplots(figsize=(5, 3))
axis.plot(range(1, HEAD_STEPS + 1), losses)
axis.set(xlabel="step", ylabel="cross-entropy", title="our head on a frozen minilm (training sentences)")
axis.grid(alpha=0.3)
plt.show()

# %%
with torch.no_grad():
    new = tokenizer.encode_batch(["a lovely, funny surprise", "boring and far too long"])
    probabilities = model(new.input_ids, new.attention_mask, new.token_type_ids).softmax(-1)
for sentence, p in zip(["a lovely, funny surprise", "boring and far too long"], probabilities):
    print(f"P(positive) = {p[1]:.2f}  {sentence!r}")

# %% [markdown]
# Twelve sentences are enough to fit, not to generalise: treat these two predictions as a smoke test.
#
# The built-in classifier can also take our module as its output layer (`head=`, mapping the pooled `(B, H)` vector to
# `(B, L)` logits). Then it keeps everything else the library gives a classifier: the loss from `labels`, saving,
# and `encoderlab finetune` and the `classify` pipeline. Only a plain `nn.Linear` saves as a folder transformers can
# load, since transformers' classes know no other head.

# %%
custom = encoderlab.load_model("minilm", kind="classify",
                               head=nn.Sequential(nn.Linear(384, 128), nn.Tanh(), nn.Linear(128, 2)))
with torch.no_grad():
    print(tuple(custom(batch.input_ids, batch.attention_mask, batch.token_type_ids).logits.shape))  # (B, 2)

# %% [markdown]
# **Next:** lesson 2 trains the whole model with the recipe that works (AdamW, weight decay, warmup) and sizes up the
# rest of the BERT family.
