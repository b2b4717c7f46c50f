"""Models by their Hugging Face Hub name, `org/name[@revision]`: found in huggingface_hub's cache by reading its
documented layout (models--org--name/refs/REVISION -> snapshots/SHA/), and downloaded through huggingface_hub only
when they are not there, because importing it costs about 0.5 s on 2 cores (bench/startup.py). Also `push`: a
folder uploaded as a Hub model repository. Low in the layers: paths.resolve_model_path calls it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from encoderlab.errors import CheckpointError

# huggingface_hub.utils.validate_repo_id's rule: [namespace/]name of ASCII letters, digits, - _ . (up to 96 each),
# starting and ending with a letter or digit, no "--" or "..", not ending in .git.
REPO_ID = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b", re.ASCII)
REVISION = re.compile(r"[\w\-./]{1,255}", re.ASCII)  # a branch, a tag, a commit or refs/pr/N
COMMIT = re.compile(r"[0-9a-f]{40}")
DEFAULT_REVISION = "main"
# What a model needs (config, weights, tokenizer, sentence-transformers' modules.json, 1_Pooling/..., task.json):
# never pickles (.bin, .pt), TensorFlow (.h5), Flax (.msgpack) or ONNX copies of the same weights.
MODEL_FILES = ["*.json", "*.safetensors", "vocab.txt", "merges.txt", "*.model", "README.md"]
PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub.constants.ENV_VARS_TRUE_VALUES


@dataclass(frozen=True)
class HubName:
    """A model repository on the Hub and the revision asked for (a branch, a tag or a commit)."""

    repo_id: str
    revision: str = DEFAULT_REVISION

    def __str__(self) -> str:
        return self.repo_id if self.revision == DEFAULT_REVISION else f"{self.repo_id}@{self.revision}"


def parse_hub_name(name: str) -> HubName | None:
    """`org/name`, `name` or `org/name@revision` as a HubName; None when the text cannot be a Hub model id."""
    repo_id, at, revision = name.partition("@")
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        return None
    if at and (not REVISION.fullmatch(revision) or ".." in revision):
        return None
    return HubName(repo_id, revision or DEFAULT_REVISION)


def hub_cache() -> Path:
    """huggingface_hub's cache folder, by its own rules (constants.py): HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE,
    else HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    home = os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", os.path.join("~", ".cache")), "huggingface"))
    home = os.path.expandvars(os.path.expanduser(home))
    cache = os.getenv("HF_HUB_CACHE", os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set to 1/ON/YES/TRUE, as huggingface_hub reads it."""
    return (os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE


def cached_snapshot(hub: HubName, cache: Path) -> Path | None:
    """The snapshot folder of a model already downloaded whole (config.json and safetensors weights), else None."""
    storage = cache / f"models--{hub.repo_id.replace('/', '--')}"
    commit = hub.revision if COMMIT.fullmatch(hub.revision) else _read_ref(storage / "refs" / hub.revision)
    if commit is None:
        return None
    snapshot = storage / "snapshots" / commit
    has_weights = any(snapshot.glob("*.safetensors"))
    return snapshot if (snapshot / "config.json").is_file() and has_weights else None


def _read_ref(path: Path) -> str | None:
    """The commit a refs/ file names, or None."""
    try:
        commit = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if COMMIT.fullmatch(commit) else None


def hub_model(hub: HubName, also: str = "") -> Path:
    """The folder of a Hub model: from the cache when it is there whole, else downloaded; CheckpointError in one
    line otherwise (`also` is added to the messages that say the model was not found)."""
    cache = hub_cache()
    snapshot = cached_snapshot(hub, cache)
    if snapshot is not None:
        return snapshot
    if offline():
        raise CheckpointError(f"model {str(hub)!r} is not in the Hugging Face cache {cache} and HF_HUB_OFFLINE is "
                              f"set{also}: {_elsewhere(hub)}")
    folder = _download(hub, cache, also)
    if not any(folder.glob("*.safetensors")):
        raise CheckpointError(_no_safetensors(hub))
    return folder


def _elsewhere(hub: HubName) -> str:
    """How to bring a model here without a network."""
    revision = "" if hub.revision == DEFAULT_REVISION else f" --revision {hub.revision}"
    return (f"on a machine with a network run `hf download {hub.repo_id}{revision}` (or `huggingface-cli download`) "
            f"and copy its cache folder here (HF_HUB_CACHE or HF_HOME say where), or pass --model a folder")


def _download(hub: HubName, cache: Path, also: str) -> Path:
    """snapshot_download of the files a model needs, with huggingface_hub's progress bar, HF_TOKEN and HF_ENDPOINT."""
    import huggingface_hub  # 0.5 s to import: only when a model must be downloaded
    from huggingface_hub import errors

    try:
        return Path(huggingface_hub.snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=MODEL_FILES))
    except errors.GatedRepoError:
        raise CheckpointError(f"model {str(hub)!r} is gated: accept its terms on the Hub, then set HF_TOKEN to a "
                              f"token of that account") from None
    except errors.RepositoryNotFoundError:
        raise CheckpointError(f"model {str(hub)!r}: no such model on the Hub at {huggingface_hub.constants.ENDPOINT}"
                              f" (or it is private: set HF_TOKEN){also}") from None
    except errors.RevisionNotFoundError:
        raise CheckpointError(f"model {str(hub)!r}: {hub.repo_id} has no revision {hub.revision!r}") from None
    except (errors.LocalEntryNotFoundError, errors.HfHubHTTPError, ConnectionError) as err:
        raise CheckpointError(f"model {str(hub)!r} could not be downloaded ({_first_line(err)}) and is not in the "
                              f"Hugging Face cache {cache}{also}: {_elsewhere(hub)}") from None


def _first_line(err: Exception) -> str:
    """An exception's first non-empty line, for a one-line message."""
    return next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)


def _no_safetensors(hub: HubName) -> str:
    """Why a repository without safetensors weights is refused, naming the pickled files it holds instead."""
    from huggingface_hub import list_repo_files

    pickled = [name for name in list_repo_files(hub.repo_id, revision=hub.revision) if name.endswith(PICKLES)]
    holds = f"only pickled weights ({', '.join(pickled)})" if pickled else "no weights"
    return (f"model {str(hub)!r}: the Hub repository holds {holds}, no *.safetensors; encoderlab downloads "
            f"safetensors only, since unpickling a file from the network can run code: try a revision that has them "
            f"(the Hub's conversion bot opens one, {hub.repo_id}@refs/pr/N), or download the files yourself and pass "
            f"the folder (a folder's pytorch_model.bin is read with torch.load(weights_only=True))")


def push(folder: Path, repo_id: str, private: bool = False, revision: str | None = None,
         token: str | None = None) -> str:
    """Upload a model folder to the Hub repository `repo_id` (created if missing, on branch `revision`, created if
    missing); returns the commit's URL. Training state (checkpoints/) and hidden files stay behind."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)  # None: huggingface_hub reads HF_TOKEN, else the saved login
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision not in (None, DEFAULT_REVISION):
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    commit = api.upload_folder(repo_id=repo_id, folder_path=folder, revision=revision,
                               commit_message=f"encoderlab push {folder.name}",
                               ignore_patterns=["checkpoints/*", ".*", "*/.*"])
    return commit.commit_url
