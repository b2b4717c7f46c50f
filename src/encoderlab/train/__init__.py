"""The one training loop: precision, accumulation, DDP, checkpoints, logging."""
