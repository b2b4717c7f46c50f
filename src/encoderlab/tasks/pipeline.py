"""Pipeline, the base of every capability's inference side, beside Task (tasks/base.py): a task module declares
its Task and its Pipeline, and the capability's card (encoderlab.cards) names both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from encoderlab.checkpoint import load_model, resolve_model_path
from encoderlab.choices import COMBINE
from encoderlab.engine import Engine, forward, mean_by_owner, window
from encoderlab.errors import InputError
from encoderlab.folder import Settings, settings
from encoderlab.nn.output import ModelOutput
from encoderlab.tokenizer import Tokenizer


class Pipeline:
    """What a capability does with a loaded model: its __call__ takes a list of inputs and keyword options and returns
    one plain dict (JSON-ready) per input, in input order. Beside it a subclass declares what the server and the
    command line need: `result`, the pydantic model of one result; `request`, the request body's fields; `show`, the
    line(s) the command line prints for a result. Its capability's card (encoderlab.cards) names it;
    encoderlab.infer.pipelines loads it and puts it on a runtime (prepare)."""

    task: ClassVar[str]
    model_kind: ClassVar[str | None] = None  # the kind load_model is asked for; None: what the folder holds
    model_class: ClassVar[type[nn.Module]] = nn.Module  # what the model must be; `needs` says how to get one
    needs: ClassVar[str] = ""
    result: ClassVar[Any]  # the server's pydantic model of one result

    def __init__(self, model: nn.Module, tokenizer: Tokenizer, batch_size: int = 32, max_length: int | None = None,
                 device: str | torch.device = "cpu", settings: Settings | None = None, model_name: str = "") -> None:
        """settings: the folder's (encoderlab.folder.settings); model_name: the folder or alias it came from. It runs
        the model as given, in torch; encoderlab.infer.pipelines.prepare puts it on another engine or precision."""
        if not isinstance(model, self.model_class):
            raise InputError(f"{self.task} needs {self.needs}, not a {type(model).__name__}")
        self.labels = list(model.config.labels or [])
        self.settings, self.model_name = settings or Settings(), model_name
        self.device = torch.device(device)
        self.tokenizer, self.batch_size = tokenizer, batch_size
        self.max_length = window(model.config, tokenizer, max_length, self.settings.max_length)
        self.engine = Engine(tokenizer, self.max_length, batch_size, self.device)
        self.model = model.eval().to(self.device)
        self.precision, self.engine_name, self.compiled = "fp32", "torch", False

    @classmethod
    def from_pretrained(cls, name: str | Path, **options: Any) -> Pipeline:
        """Load the model and tokenizer of a checkpoint folder or alias for this task, with its settings."""
        folder = resolve_model_path(name)
        return cls(cls.load(folder), Tokenizer.from_pretrained(folder), settings=settings(folder), model_name=str(name),
                   **options)

    @classmethod
    def load(cls, folder: Path) -> nn.Module:
        """The model of a checkpoint folder, as the kind this pipeline runs."""
        return load_model(folder, kind=cls.model_kind)

    @classmethod
    def request(cls, text: Any, many: Callable[..., Any], model: Callable[..., type]) -> dict[str, Any]:
        """The server's request fields as pydantic (type, Field) pairs, the inputs first, then __call__'s options (by
        default: texts alone). text: a text within the server's limits; many(description): the Field of a list within
        them ("{}" in the description: the most items); model(name, **fields): a nested model."""
        return {"texts": (list[text], many())}

    def _forward(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> ModelOutput:
        """The model's output on a padded batch."""
        return forward(model, batch)

    def probe(self, model: nn.Module) -> object:
        """One representative forward pass (32 x 64 tokens), for timing the precision modes and compiling."""
        T = min(64, self.max_length)
        with torch.inference_mode():  # the batch made inside it, as Engine.run makes its batches: a compiled encoder
            # guards on the inputs' dispatch keys, so a probe tensor made outside would compile a variant no call uses
            ids = torch.full((32, T), self.tokenizer.cls_id, dtype=torch.long, device=self.device)
            return self._forward(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                         "token_type_ids": torch.zeros_like(ids)})

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """This pipeline's model's logits on a padded batch."""
        return self._forward(self.model, batch).logits

    def _windowing(self, stride: int | None, combine: str | None) -> None:
        """How a text longer than the window is read: whole, in windows sharing `stride` tokens, or (None) truncated;
        None follows the folder's settings."""
        self.stride = self.settings.stride if stride is None else stride
        self.combine = combine or self.settings.combine
        if self.combine not in COMBINE:
            raise InputError(f"combine {self.combine!r}: expected one of {', '.join(COMBINE)}")

    def _window_rows(self, texts: list[str], forward: Callable[[dict[str, torch.Tensor]], torch.Tensor],
                     probs: bool = False) -> torch.Tensor:
        """forward's rows for each text: over its windows, averaged (as probabilities, then back to logits, if asked)."""
        windows, owners = self.engine.windows(texts, self.stride)
        rows = self.engine.rows(windows, forward)
        if not probs:
            return mean_by_owner(rows, owners, len(texts))
        return mean_by_owner(rows.softmax(-1), owners, len(texts)).log()

    def info(self) -> dict[str, Any]:
        """What this pipeline runs: task, engine, precision, whether compiled, window, batch size."""
        return {"task": self.task, "engine": self.engine_name, "precision": self.precision, "compiled": self.compiled,
                "max_length": self.max_length, "batch_size": self.batch_size, "device": str(self.device)}
