"""A toy capability for the tests of the cards (tests/test_cards.py, tests/test_server.py): one module, registered
by one card row that a test adds to encoderlab.cards.CARDS (TOY_CARD)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field, create_model

from encoderlab.cards import Card, Command
from encoderlab.tasks.pipeline import Pipeline


@dataclass(frozen=True)
class Marks:
    """shout's option per call."""

    marks: int = field(default=1, metadata={"metavar": "N"})
    """exclamation marks after each text"""


class Shout(Pipeline):
    """Texts -> the texts shouted (a capability declared once: call, request fields, result model, how it prints)."""

    task = "shout"
    result = create_model("ShoutResult", text=str)

    @classmethod
    def request(cls, text, many, model):
        return {"texts": (list[text], many()), "marks": (int, Field(1, ge=1, le=3))}

    @staticmethod
    def show(result: dict[str, Any]) -> str:
        return result["text"]

    def __init__(self) -> None:  # a stand-in: no weights, no tokenizer
        self.precision, self.model_name, self.engine_name, self.compiled = "fp32", "", "torch", False
        self.model, self.device, self.tokenizer, self.max_length = torch.nn.Identity(), torch.device("cpu"), None, 8

    @classmethod
    def from_pretrained(cls, name, **options: Any) -> Shout:
        return cls()

    def __call__(self, texts, marks=1):
        return [{"text": t.upper() + "!" * marks} for t in texts]


TOY_CARD = Card("shout", "shout texts back", pipeline="toy_capability:Shout",
                command=Command(Marks, call=("marks",), description="Shout the texts back."), default_model="none")
