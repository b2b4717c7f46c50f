"""A baseline from scratch for text classification, saved in our own folder format (no transformers class)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from encoderlab.errors import CheckpointError
from encoderlab.nn.model import ModelOutput, sequence_sum


class BiLSTMClassifier(nn.Module):
    """Token ids -> embeddings -> BiLSTM -> max over time (B, 2h) (InferSent, Conneau et al. 2017) -> linear (B, L)."""

    architecture = "BiLSTMClassifier"  # config.json's architectures: our own format, which load_model recognizes
    kind = "bilstm"
    SETTINGS = ("vocab_size", "num_labels", "pad_id", "embed_dim", "hidden_size", "num_layers", "dropout")

    def __init__(self, vocab_size: int, num_labels: int, pad_id: int = 0, embed_dim: int = 300,
                 hidden_size: int = 256, num_layers: int = 1, dropout: float = 0.3,
                 labels: list[str] | None = None, regression: bool = False) -> None:
        super().__init__()
        self.settings = {"vocab_size": vocab_size, "num_labels": num_labels, "pad_id": pad_id, "embed_dim": embed_dim,
                         "hidden_size": hidden_size, "num_layers": num_layers, "dropout": dropout}
        self.labels, self.regression = labels, regression
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=pad_id)
        self.lstm = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True, bidirectional=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        lengths = attention_mask.sum(1).clamp(min=1).cpu()
        x = self.dropout(self.embedding(input_ids))  # (B, T, E)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        states, _ = self.lstm(packed)
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=input_ids.shape[1])
        states = states.masked_fill(~attention_mask.bool()[..., None], float("-inf"))  # (B, T, 2h)
        logits = self.classifier(self.dropout(states.max(1).values))  # (B, L)
        return ModelOutput(logits, terms={} if labels is None else {
            "classify": lambda: sequence_sum(logits, labels, "regression" if self.regression else None)})

    def hf_config(self) -> dict:
        """config.json of our own format."""
        config = {"architectures": [self.architecture], "model_type": "encoderlab-bilstm", **self.settings}
        if self.labels:
            config["id2label"] = {str(i): label for i, label in enumerate(self.labels)}
        if self.regression:
            config["problem_type"] = "regression"
        return config

    @classmethod
    def from_hf(cls, raw: dict, state: dict[str, torch.Tensor], folder: Path) -> BiLSTMClassifier:
        """The model of a folder's config.json (as a dict) and tensors."""
        try:
            settings = {k: raw[k] for k in cls.SETTINGS}
        except KeyError as err:
            raise CheckpointError(f"{folder / 'config.json'}: missing key {err}") from None
        labels = [raw["id2label"][k] for k in sorted(raw["id2label"], key=int)] if raw.get("id2label") else None
        model = cls(**settings, labels=labels, regression=raw.get("problem_type") == "regression")
        try:
            model.load_state_dict(state)
        except RuntimeError as err:
            raise CheckpointError(f"{folder}: weights do not fit BiLSTMClassifier ({str(err).splitlines()[0]})") from None
        return model
