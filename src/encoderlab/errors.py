"""The exceptions encoderlab raises: for bad input, each message names the file, line or key at fault."""


class EncoderlabError(Exception):
    """Base of every error caused by user input; the CLI prints it without a traceback."""


class ConfigError(EncoderlabError, ValueError):
    """A config key is unknown, out of range or inconsistent with another."""


class CheckpointError(EncoderlabError):
    """A checkpoint folder or weight file is missing, corrupted or does not fit the model."""


class MissingHeadError(CheckpointError):
    """A checkpoint lacks the head a task needs (fill-mask of an encoder with no masked-LM head)."""


class InputError(EncoderlabError, ValueError):
    """A user data file or text is empty, unreadable or malformed."""


class Terminated(KeyboardInterrupt):
    """A training run stopped by SIGTERM (a scheduler's or a container's stop) after saving; the CLI exits 143."""


class TrainingDiverged(EncoderlabError):
    """A training step's loss or gradient norm was not finite; the run stopped without saving from that point."""
