"""What one request to `encoderlab serve` may hold: apart from the server so that the CLI can build its parser
without importing FastAPI."""

from __future__ import annotations

from dataclasses import dataclass

from encoderlab.errors import InputError

API_KEY_ENV = "ENCODERLAB_API_KEY"  # where `serve` reads its API key from (or --api-key-file; never an argument)


@dataclass
class Limits:
    """What one request may hold, and how long a batch waits for company."""

    max_batch: int = 64
    """Most texts (or QA items) in one request; also the most a micro-batch collects before it runs."""
    max_text_chars: int = 10_000
    """Most characters in any one text, pair text, question or context."""
    max_body_bytes: int = 1_000_000
    """Largest request body; a bigger one gets 413 before it is parsed."""
    batch_wait_ms: float = 5.0
    """How long the first request of a batch waits for others to join it."""
    body_timeout_s: float = 30.0
    """Most seconds a client may take to send its body; a slower one gets 408 (a trickling client holds no task)."""

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_text_chars", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} {getattr(self, name)}: expected a positive number")
        if self.batch_wait_ms < 0:
            raise InputError(f"batch_wait_ms {self.batch_wait_ms}: expected zero or more")
        if not self.body_timeout_s > 0:
            raise InputError(f"body_timeout_s {self.body_timeout_s}: expected a positive number")
