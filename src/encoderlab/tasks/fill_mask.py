"""fill-mask: the tokens a masked-LM head predicts behind each mask (no fine-tuning task: any MLM checkpoint)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, create_model
from torch import nn

from encoderlab.checkpoint import read_config, resolve_model_path, stored_kind
from encoderlab.engine import Encoded, check_texts, forward
from encoderlab.errors import CheckpointError, InputError, MissingHeadError
from encoderlab.nn.model import IGNORE_INDEX
from encoderlab.nn.output import ModelOutput
from encoderlab.paths import DEFAULT_FILL_MASK_MODEL
from encoderlab.tasks.pipeline import Pipeline

class FillMask(Pipeline):
    """Texts with one or more mask tokens -> the top-k tokens for each mask, with probabilities."""

    task = "fill-mask"
    model_kind = "mlm"
    MASK_SPELLINGS = ("[MASK]", "<mask>")  # accepted in input whatever the tokenizer's own spelling
    MLM_KINDS = ("mlm", "pretraining")  # stored kinds that hold a masked-LM head
    result = create_model("FillMaskResult", text=str, masks=(list[create_model(
        "MaskResult", position=(int, Field(description="token position of the mask")), predictions=list[create_model(
            "Prediction", token=str, id=int, score=(float, Field(description="probability")))])], Field(
        description="one entry per mask, in text order")), filled=(str, Field(
        description="the text with each mask replaced by its top token")))

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        return {"texts": (list[text], many("texts with one or more [MASK] (or <mask>) tokens")),
                "top_k": (int, Field(5, ge=1, le=100, description="predictions per mask"))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return "\n".join([result["text"], *(f"  [MASK] {n}: " + "  ".join(f"{p['token']} {p['score']:.3f}" for p in
                                                                        mask["predictions"])
                                            for n, mask in enumerate(result["masks"], 1))])

    @classmethod
    def from_pretrained(cls, name: str | Path = DEFAULT_FILL_MASK_MODEL, **options: Any) -> Pipeline:
        """As Pipeline's, on the shipped model by default; MissingHeadError, naming that model, for a checkpoint
        with no masked-LM head (minilm: an encoder trained for sentence embeddings)."""
        folder = resolve_model_path(name)  # a missing folder, or a missing default, is reported as such
        try:
            return super().from_pretrained(name, **options)
        except CheckpointError as err:
            raw = read_config(folder)
            if stored_kind(folder, raw) in cls.MLM_KINDS:  # it should hold the head: damaged, reported as it is
                raise
            architecture = (raw.get("architectures") or ["no architecture"])[0]
            raise MissingHeadError(f"{name} has no masked-LM head (its config.json names {architecture}), and "
                                   f"fill-mask needs one: use --model {DEFAULT_FILL_MASK_MODEL} (the default), "
                                   f"or another masked-LM checkpoint") from err

    def __call__(self, texts: Sequence[str], top_k: int = 5) -> list[dict[str, Any]]:
        texts = [self._normalize(t) for t in check_texts(texts)]
        if top_k < 1:
            raise InputError(f"top_k {top_k}: expected a positive number")
        items = self.engine.encode(texts)
        for i, item in enumerate(items):
            if self.tokenizer.mask_id not in item.input_ids:
                raise InputError(f"text {i} has no {self.tokenizer.mask_token} token within the first "
                                 f"{self.max_length} tokens: {texts[i][:200]!r}")
        results: list[dict[str, Any]] = [{} for _ in texts]

        def collect(indices: list[int], out: tuple[torch.Tensor, torch.Tensor]) -> None:
            probs, where = out  # (N, V) over the masks of the batch, (N, 2) = (row, position)
            top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
            masks: dict[int, list] = {}
            for n, (row, position) in enumerate(where.tolist()):
                predictions = [{"token": self.tokenizer.id_to_token(int(token)), "id": int(token),
                                "score": round(float(score), 6)}
                               for score, token in zip(top.values[n].tolist(), top.indices[n].tolist())]
                masks.setdefault(row, []).append({"position": position, "predictions": predictions})
            for row, i in enumerate(indices):
                results[i] = {"text": texts[i], "masks": masks[row], "filled": self._fill(items[i], masks[row])}

        self.engine.run(items, self._masked_probs, collect)
        return results

    def _normalize(self, text: str) -> str:
        """Any accepted mask spelling rewritten as the tokenizer's own."""
        for spelling in self.MASK_SPELLINGS:
            text = text.replace(spelling, self.tokenizer.mask_token)
        return text

    def _masked_probs(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the vocabulary at the mask positions only: (N, V), and their (row, position)."""
        where = (batch["input_ids"] == self.tokenizer.mask_id).nonzero()  # (N, 2), in the order the model selects
        return self.logits(batch).float().softmax(-1), where

    def _forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """Logits (N, V) at the N mask positions only: the masks as labels, so the vocabulary matmul skips the rest."""
        ids = batch["input_ids"]
        return forward(model, batch, labels=ids.masked_fill(ids != self.tokenizer.mask_id, IGNORE_INDEX))

    def _fill(self, item: Encoded, masks: list[dict[str, Any]]) -> str:
        """The text with each mask replaced by its top token."""
        ids = list(item.input_ids)
        for mask in masks:
            ids[mask["position"]] = mask["predictions"][0]["id"]
        return self.tokenizer.decode(ids)
