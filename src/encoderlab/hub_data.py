"""Data by its Hugging Face Hub name: `hf:NAME[/CONFIG][:SPLIT]`, wherever a command takes a data file.

NAME is `name` or `org/name`; a third segment is the CONFIG: `hf:imdb`, `hf:stanfordnlp/sst2:train`,
`hf:nyu-mll/glue/sst2:validation`. Two segments are always `org/name`, so a config of a name without an org is
written with the org the Hub gives it (`hf:stanfordnlp/imdb/plain_text`, not `hf:imdb/plain_text`). SPLIT is a split
as `datasets` takes it (`train`, `validation`, `train[:1000]`); without one, the command's default (--train and
--corpus: train; --eval and --data: validation).

The split is loaded with `datasets.load_dataset(name, config, split=...)` into datasets' own cache (HF_HOME,
HF_DATASETS_CACHE; HF_HUB_OFFLINE and HF_DATASETS_OFFLINE honoured) and written once, as the file the task's reader
reads (JSONL for tables, NER and corpora; SQuAD JSON for QA), to HF_DATASETS_CACHE/encoderlab/, named by the split's
fingerprint: the readers stay as they are, column detection included, and their messages name a line of that file.
ClassLabel columns are written as their class names, and their names in id order are returned for the label list.
`datasets` is imported only here, and only to load (its import: 1.7-2.2 CPU s; a warm split in all 2.3 s); parsing
a name imports nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from encoderlab.errors import InputError
from encoderlab.io import atomic_write

PREFIX = "hf:"
FORMS = ("table", "conll", "squad", "corpus")  # what the file is written as: by the reader that will read it
SYNTAX = ("expected hf:NAME[/CONFIG][:SPLIT], NAME being name or org/name (hf:imdb, hf:stanfordnlp/sst2:train, "
          "hf:nyu-mll/glue/sst2:validation)")
_SEGMENT = r"[A-Za-z0-9](?:[\w\-.]{0,94}[A-Za-z0-9])?"  # huggingface_hub's repo-id part: letters, digits, - _ .
_NAME = re.compile(rf"(?P<name>{_SEGMENT}(?:/{_SEGMENT})?)(?:/(?P<config>{_SEGMENT}))?", re.ASCII)
_ONE_SPLIT = r"\w+(?:\.\w+)*(?:\[-?\d*%?:?-?\d*%?\])?"  # datasets' split names, with an optional slice
_SPLIT = re.compile(rf"{_ONE_SPLIT}(?:\+{_ONE_SPLIT})*", re.ASCII)
TOKEN_COLUMNS = ("tokens", "words")
TAG_COLUMNS = ("ner_tags", "tags")
CORPUS_COLUMNS = ("text", "content", "document")


@dataclass(frozen=True)
class HubDataset:
    """A split of a Hub dataset repository, and of one of its configs."""

    name: str
    config: str | None
    split: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.name}{'/' + self.config if self.config else ''}:{self.split}"


@dataclass
class LocalData:
    """The file a split was written to, its columns and the class names of its ClassLabel columns (in id order)."""

    path: Path
    columns: list[str]
    classes: dict[str, list[str]] = field(default_factory=dict)


def is_hub_data(text: str | os.PathLike) -> bool:
    """Whether a data argument names a Hub dataset (hf:...) rather than a file."""
    return isinstance(text, str) and text.startswith(PREFIX)


def parse_hub_dataset(text: str, default_split: str = "train", split: bool = True) -> HubDataset:
    """`hf:NAME[/CONFIG][:SPLIT]` as a HubDataset; InputError in one line for any other text (split=False: a SPLIT
    is refused, for a suite's --data)."""
    body = text.removeprefix(PREFIX)
    repo, colon, chosen = body.partition(":")
    match = _NAME.fullmatch(repo)
    bad_repo = match is None or "--" in repo or ".." in repo
    if not text.startswith(PREFIX) or bad_repo or (colon and not _SPLIT.fullmatch(chosen)):
        raise InputError(f"{text!r}: {SYNTAX}")
    if colon and not split:
        raise InputError(f"{text!r}: a suite's --data takes hf:NAME[/CONFIG] without a split (each task reads its own)")
    return HubDataset(match["name"], match["config"], chosen or default_split)


def datasets_cache() -> Path:
    """datasets' cache folder, by its own rules (datasets/config.py): HF_DATASETS_CACHE, else HF_HOME/datasets,
    else $XDG_CACHE_HOME/huggingface/datasets."""
    home = os.getenv("HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", os.path.join("~", ".cache")), "huggingface"))
    cache = os.getenv("HF_DATASETS_CACHE", os.path.join(os.path.expanduser(os.path.expandvars(home)), "datasets"))
    return Path(os.path.expanduser(os.path.expandvars(cache)))


def local_copy(text: str, form: str, default_split: str = "train") -> LocalData:
    """The split `text` names, as a file the `form` reader reads: loaded through datasets, written once."""
    if form not in FORMS:
        raise ValueError(f"form {form!r}: expected one of {FORMS}")
    hub = parse_hub_dataset(text, default_split)
    dataset = load(hub)
    folder = datasets_cache() / "encoderlab" / _file_name(f"{hub.name}--{hub.config or 'default'}")
    suffix = ".json" if form == "squad" else ".jsonl"
    path = folder / f"{_file_name(hub.split)}-{form}-{dataset._fingerprint}{suffix}"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: _write(dataset, hub, form, tmp))
    return LocalData(path, list(dataset.column_names), class_names(dataset.features))


def _file_name(text: str) -> str:
    """A name or split as one file-name part."""
    return re.sub(r"[^\w.\-+]", "_", text.replace("/", "--"))


def load(hub: HubDataset):
    """datasets.load_dataset of the split; InputError in one line naming the dataset and the cache when it cannot
    be found or reached (HF_HUB_OFFLINE with a cold cache, no network, no such dataset, config or split)."""
    import datasets  # about 2 CPU s to import: only when a Hub dataset is read

    datasets.logging.set_verbosity_error()  # not "Using the latest cached version ..." on every offline run
    try:
        return datasets.load_dataset(hub.name, hub.config, split=hub.split)
    except (ValueError, KeyError) as err:  # an unknown config or split: datasets lists the ones there are
        raise InputError(f"dataset {hub}: {_first_line(err)}") from None
    except Exception as err:  # noqa: BLE001 -- datasets and huggingface_hub raise many kinds for one cause
        if not _unreachable(err):
            raise
        offline = " and HF_HUB_OFFLINE is set" if datasets.config.HF_HUB_OFFLINE else ""
        raise InputError(f"dataset {hub} is not in the datasets cache {datasets.config.HF_DATASETS_CACHE}{offline} "
                         f"({_first_line(err)}): run the command once on a machine with a network and copy its "
                         f"HF_HOME (or HF_DATASETS_CACHE) here, or pass a file") from None


def _unreachable(err: Exception) -> bool:
    """Whether an error of load_dataset means: not found, not reachable, not cached."""
    import datasets
    from huggingface_hub import errors

    kinds = (FileNotFoundError, ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError,
             errors.HfHubHTTPError, errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled)
    return isinstance(err, kinds)


def _first_line(err: Exception) -> str:
    """An exception's first non-empty line, for a one-line message."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def class_names(features) -> dict[str, list[str]]:
    """The class names of each ClassLabel column, and of each list-of-ClassLabel column (multi-label, NER tags)."""
    import datasets

    out = {}
    for name, feature in features.items():
        inner = getattr(feature, "feature", None) if isinstance(feature, (datasets.List, datasets.LargeList)) \
            else feature[0] if isinstance(feature, list) and feature else feature
        if isinstance(inner, datasets.ClassLabel):
            out[name] = list(inner.names)
    return out


# ---- writing a split as the file its reader reads ------------------------------------------------------------
def _rows(dataset) -> Iterator[dict]:
    """The rows, class ids as names: streamed a thousand at a time, so memory stays flat."""
    names = class_names(dataset.features)
    for batch in dataset.iter(batch_size=1000):
        columns = list(batch)
        for values in zip(*(batch[c] for c in columns)):
            yield {c: _named(v, names.get(c)) for c, v in zip(columns, values)}


def _named(value, names: list[str] | None):
    """A ClassLabel id (or a list of them) as its name; -1, datasets' "no label", as None."""
    if names is None:
        return value
    if isinstance(value, list):
        return [names[v] for v in value if v >= 0]
    return names[value] if value is not None and value >= 0 else None


def _write(dataset, hub: HubDataset, form: str, tmp: Path) -> None:
    """The split as `form`'s file at tmp."""
    if form == "squad":
        tmp.write_text(json.dumps({"version": str(hub), "data": _squad_articles(_rows(dataset), hub)}),
                       encoding="utf-8")
        return
    convert = {"table": _table_row, "conll": _tagged_row, "corpus": _corpus_row}[form]
    with open(tmp, "w", encoding="utf-8") as out:
        for number, row in enumerate(_rows(dataset)):
            record = convert(row, hub, number)
            if record is not None:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


def _table_row(row: dict, hub: HubDataset, number: int) -> dict:
    """A table row: scalar columns as they are; a list of scalars (a multi-label row's classes) joined by "|";
    other nested values left out. A missing class (-1: GLUE's unlabelled test splits) is refused."""
    out = {}
    for name, value in row.items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            value = "|".join(map(str, value))
        if value is None and name in ("label", "labels"):
            raise InputError(f"{hub} row {number}: no {name} (-1): the split is unlabelled; take another split")
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[name] = value
    return out


def _tagged_row(row: dict, hub: HubDataset, number: int) -> dict:
    """A sentence of NER as the JSONL the CoNLL reader reads: tokens and their tag names."""
    tokens = next((c for c in TOKEN_COLUMNS if c in row), None)
    tags = next((c for c in TAG_COLUMNS if c in row), None)
    if tokens is None or tags is None:
        raise InputError(f"{hub}: expected columns {' or '.join(TOKEN_COLUMNS)} and {' or '.join(TAG_COLUMNS)} "
                         f"for ner (columns: {', '.join(row)})")
    return {"tokens": row[tokens], "tags": [str(tag) for tag in row[tags]]}


def _corpus_row(row: dict, hub: HubDataset, number: int) -> dict | None:
    """A document of a corpus: its text column (text, content or document, else the only string column)."""
    name = next((c for c in CORPUS_COLUMNS if c in row), None)
    strings = [c for c, v in row.items() if isinstance(v, str)]
    name = name or (strings[0] if len(strings) == 1 else None)
    if name is None:
        raise InputError(f"{hub}: cannot tell which column holds the text (columns: {', '.join(row)}); expected "
                         f"one of {', '.join(CORPUS_COLUMNS)}")
    return {"text": row[name]} if isinstance(row[name], str) and row[name].strip() else None


def _squad_articles(rows: Iterator[dict], hub: HubDataset) -> list[dict]:
    """SQuAD's articles from the Hub's flat rows (id, title, context, question, answers{text, answer_start}):
    consecutive rows of one context are one paragraph; a question without answers is SQuAD 2.0's impossible one."""
    articles: list[dict] = []
    for number, row in enumerate(rows):
        missing = [c for c in ("id", "context", "question", "answers") if c not in row]
        if missing:
            raise InputError(f"{hub} row {number}: no column {', '.join(missing)} (SQuAD's columns: id, title, "
                             f"context, question, answers)")
        answers = [{"text": t, "answer_start": s} for t, s in zip(row["answers"]["text"],
                                                                   row["answers"]["answer_start"])]
        title = row.get("title") or ""
        if not articles or articles[-1]["title"] != title:
            articles.append({"title": title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != row["context"]:
            paragraphs.append({"context": row["context"], "qas": []})
        paragraphs[-1]["qas"].append({"id": str(row["id"]), "question": row["question"], "answers": answers,
                                      "is_impossible": not answers})
    return articles
