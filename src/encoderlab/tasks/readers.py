"""Readers for fine-tuning data: GLUE-style TSV/CSV, JSONL, folders of class folders, CoNLL files, SQuAD JSON.

Every reader is strict: a malformed row or a byte that is not UTF-8 raises InputError naming the file and line (or
the SQuAD question id); nothing is dropped silently; a BOM is accepted. A .csv follows RFC 4180. A .tsv follows
GLUE, whose files keep quote characters as text (`"Would you like to?"`); a field is unquoted only where a writer
must have quoted it: wrapped in quotes with a doubled quote or a tab inside, as pandas writes such fields. A .csv
whose first line has more tabs than commas is read as tab-separated (the SemEval STS benchmark's sts-*.csv files).
Rows with more or fewer fields than the first are refused, unless the text and label columns are all named: then
each row needs only those (SemEval STS rows carry trailing source fields), and a warning gives the count.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from encoderlab import io
from encoderlab.errors import InputError

PathLike = str | os.PathLike
log = logging.getLogger(__name__)

# Header names that hold the label or score, and pairs of text columns, of the GLUE tasks and their kin.
LABEL_NAMES = ("label", "labels", "gold_label", "score", "similarity", "relatedness", "quality",
               "is_duplicate", "class", "target")
TEXT_COLUMN_SETS = (("sentence1", "sentence2"), ("question1", "question2"), ("question", "sentence"),
                    ("premise", "hypothesis"), ("text_a", "text_b"), ("#1 string", "#2 string"),
                    ("anchor", "positive", "negative"), ("anchor", "positive"), ("query", "positive", "negative"),
                    ("query", "positive"), ("query", "passage"),
                    ("sentence",), ("text",), ("content",))
ID_NAMES = ("index", "idx", "id", "guid", "#1 id", "#2 id")
# Retrieval training data (scripts/retrieval_pairs.py) keeps its header when it has no hard negatives: a last text
# column of this name that is empty on every row is dropped, and the rows are pairs.
OPTIONAL_TEXT = "negative"


@dataclass
class TextExample:
    """One or two texts and their label: a class name (str), a score (float), or None when unlabelled."""

    texts: tuple[str, ...]
    label: str | float | None
    where: str  # "file:line", for messages


@dataclass
class TaggedSentence:
    """The words of one sentence and their tags (IOB2 after reading)."""

    words: list[str]
    tags: list[str]
    where: str


@dataclass
class Answer:
    """An answer span: its text and the character offset where it starts in the context."""

    text: str
    start: int


@dataclass
class QAExample:
    """One SQuAD question over a context paragraph; no answers and is_impossible=True for SQuAD 2.0 negatives."""

    id: str
    title: str
    context: str
    question: str
    answers: list[Answer] = field(default_factory=list)
    is_impossible: bool = False


# ---- text files ---------------------------------------------------------------------------------------------
def read_text(path: PathLike) -> str:
    """A file's text, BOM removed, line endings made LF; InputError naming the line of a non-UTF-8 or NUL byte."""
    path = Path(path)
    text = io.read_text(path)
    if not text.strip():
        raise InputError(f"{path}: the file is empty")
    return "\n".join(io.split_lines(text, path)) + "\n"  # LF, CRLF and lone CR mixed: one line ending


def _delimiter(path: Path, first_line: str) -> str:
    """Comma for .csv (tab if its first line has more tabs than commas), tab for .tsv; otherwise a tab if the first
    line has one, else a comma."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "\t" if first_line.count("\t") > first_line.count(",") else ","
    return "\t" if suffix == ".tsv" or "\t" in first_line else ","


def _unquote_tsv(value: str) -> str:
    """A TSV field without the quotes a writer added (see the module docstring); GLUE's literal quotes stay."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        inner = value[1:-1]
        if '"' not in inner.replace('""', "") and ('""' in inner or "\t" in inner):
            return inner.replace('""', '"')
    return value


def _records(path: Path, text: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every non-blank record."""
    if delimiter == ",":
        return _csv_records(path, text)
    out: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        fields = [_unquote_tsv(value) for value in line.split("\t")]
        if out and len(fields) != len(out[0][1]) and '"' in line:  # a tab inside a quoted field?
            fields = _quoted_tsv_line(line, len(out[0][1])) or fields
        out.append((number, fields))
    return out


def _quoted_tsv_line(line: str, width: int) -> list[str] | None:
    """The fields of a TSV line read with CSV quoting, if that gives `width` fields."""
    try:
        fields = next(csv.reader([line], delimiter="\t", strict=True))
    except csv.Error:
        return None
    return fields if len(fields) == width else None


def _csv_records(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """RFC 4180 records; a record's number is the line it starts on."""
    reader = csv.reader([line + "\n" for line in text.split("\n")], strict=True)  # not splitlines: \f is text
    out, previous_end = [], 0
    try:
        for fields in reader:
            start, previous_end = previous_end + 1, reader.line_num
            if any(value.strip() for value in fields):
                out.append((start, fields))
    except csv.Error as err:
        raise InputError(f"{path}:{reader.line_num}: malformed CSV ({err})") from None
    return out


@dataclass
class Columns:
    """Which columns of a table hold the texts and the label (indices into each row)."""

    text: list[int]
    label: int | None
    names: list[str]


def _column_index(spec: str, names: list[str], path: Path) -> int:
    """A column by header name (case-insensitive) or 0-based index."""
    lowered = [name.strip().lower() for name in names]
    if spec.strip().lower() in lowered:
        return lowered.index(spec.strip().lower())
    if spec.strip().lstrip("-").isdigit():
        index = int(spec)
        if -len(names) <= index < len(names):
            return index % len(names)
    raise InputError(f"{path}: no column {spec!r} (columns: {', '.join(names)})")


def choose_columns(names: list[str], path: Path, text_cols: list[str] | None = None,
                   label_col: str | None = None, need_label: bool = True, hint: str = "") -> Columns:
    """The text and label columns: those named, else detected from GLUE's usual header names; `hint` ends the
    error when the label column cannot be told."""
    lowered = [name.strip().lower() for name in names]
    if label_col is not None:
        label = _column_index(label_col, names, path)
    else:
        label = next((lowered.index(n) for n in LABEL_NAMES if n in lowered), None)
        if label is None and need_label:
            raise InputError(f"{path}: cannot tell which column holds the label (columns: {', '.join(names)}); "
                             f"name it with --label-col{hint}")
    if text_cols:
        text = [_column_index(spec, names, path) for spec in text_cols]
    else:
        found = next((group for group in TEXT_COLUMN_SETS if all(n in lowered for n in group)), None)
        if found is not None:
            text = [lowered.index(n) for n in found]
        else:
            text = [i for i, n in enumerate(lowered) if i != label and n not in ID_NAMES]
            if not 1 <= len(text) <= 2:
                raise InputError(f"{path}: cannot tell which columns hold the text (columns: {', '.join(names)}); "
                                 f"name them with --text-cols")
    if label is not None and label in text:
        raise InputError(f"{path}: column {names[label]!r} is both a text and the label column")
    return Columns(text, label, names)


def parse_label(value: str, regression: bool, where: str) -> str | float:
    """A class name as given, or a float score for regression."""
    value = value.strip()
    if not value:
        raise InputError(f"{where}: the label is empty")
    if not regression:
        return value
    try:
        return float(value)
    except ValueError:
        raise InputError(f"{where}: expected a number for the regression score, got {value!r}") from None


def read_table(path: PathLike, text_cols: list[str] | None = None, label_col: str | None = None,
               regression: bool = False, header: bool = True, need_label: bool = True) -> list[TextExample]:
    """The examples of a GLUE-style TSV/CSV file (single texts or pairs; class names or scores)."""
    path = Path(path)
    text = read_text(path)
    first = text.split("\n", 1)[0]
    records = _records(path, text, _delimiter(path, first))
    if not records:
        raise InputError(f"{path}: no rows (every line is blank or holds only empty fields)")
    if header:
        (_, names), rows = records[0], records[1:]
    else:
        names, rows = [str(i) for i in range(len(records[0][1]))], records
    reason = _looks_like_data(names) if header else None
    hint = f"; the first row looks like data ({reason}): if the file has no header, pass --no-header" if reason else ""
    columns = choose_columns(names, path, text_cols, label_col, need_label, hint)
    if header and _named_by_index(names, text_cols, label_col):
        _refuse_data_as_header(path, records[0][0], names, rows, columns, regression)
    columns = _without_empty_negatives(columns, rows, path)
    named = bool(text_cols) and (label_col is not None or not need_label)
    out, irregular = [], 0
    for number, fields in rows:
        where = f"{path}:{number}"
        irregular += _check_width(fields, names, columns, named, where)
        label = None if columns.label is None else parse_label(fields[columns.label], regression, where)
        texts = tuple(fields[i] for i in columns.text)
        _require_texts(texts, [names[i] for i in columns.text], where)
        out.append(TextExample(texts, label, where))
    if not out:
        raise InputError(f"{path}: no examples (only a header?)")
    if irregular:  # said once per file: the SemEval STS rows carry 1-2 trailing source fields
        log.warning(f"{path}: {irregular} of {len(out)} rows have other than {len(names)} fields; read by the named "
                    f"columns, other fields ignored")
    return out


def _without_empty_negatives(columns: Columns, rows: list[tuple[int, list[str]]], path: Path) -> Columns:
    """The columns without a last OPTIONAL_TEXT text column that is empty on every row; refuse one empty on some."""
    last = columns.text[-1]
    if len(columns.text) < 2 or columns.names[last].strip().lower() != OPTIONAL_TEXT:
        return columns
    empty = [number for number, fields in rows if last >= len(fields) or not fields[last].strip()]
    if not empty:
        return columns
    if len(empty) == len(rows):
        return Columns(columns.text[:-1], columns.label, columns.names)
    raise InputError(f"{path}:{empty[0]}: the {columns.names[last]!r} text is empty here but not on every row; expected "
                     f"a hard negative on every row, or on none (pairs)")


def _check_width(fields: list[str], names: list[str], columns: Columns, named: bool, where: str) -> int:
    """1 for a row of another width that is accepted (every column named and present), 0 for a regular row."""
    if len(fields) == len(names):
        return 0
    needed = max(columns.text + ([] if columns.label is None else [columns.label])) + 1
    if named and len(fields) >= needed:
        return 1
    raise InputError(f"{where}: expected {len(names)} fields ({', '.join(names)}), got {len(fields)}")


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _looks_like_data(cells: list[str]) -> str | None:
    """Why a header row looks like a data row (a cell is a number, or a text of five words or more), or None."""
    for cell in cells:
        value = cell.strip()
        if value and _is_number(value):
            return f"{value!r} is a number"
        if len(value.split()) >= 5:
            return f"{value[:40]!r} is a text"
    return None


def _named_by_index(names: list[str], text_cols: list[str] | None, label_col: str | None) -> bool:
    """Whether a column is given by index rather than by a header name."""
    lowered = {name.strip().lower() for name in names}
    specs = (text_cols or []) + ([label_col] if label_col is not None else [])
    return any(spec.strip().lower() not in lowered for spec in specs)


def _refuse_data_as_header(path: Path, number: int, names: list[str], rows: list, columns: Columns,
                           regression: bool) -> None:
    """Columns named by index over a header row that looks like data (CoLA read without --no-header): stop."""
    reason = None
    if columns.label is not None:
        value = names[columns.label].strip()
        labels = {fields[columns.label].strip() for _, fields in rows if len(fields) > columns.label}
        if (regression and _is_number(value)) or (not regression and value in labels):
            reason = f"its label {value!r} is {'a score' if regression else 'one of the labels of the other rows'}"
    long = [names[i] for i in columns.text if len(names[i].split()) >= 5]
    reason = reason or (f"its text {long[0][:40]!r} is long for a column name" if long else None)
    if reason:
        raise InputError(f"{path}:{number}: the first row looks like data ({reason}) but is read as the header, "
                         f"because the columns are named by index; pass --no-header to read it as data")


def read_jsonl(path: PathLike, text_cols: list[str] | None = None, label_col: str | None = None,
               regression: bool = False, need_label: bool = True) -> list[TextExample]:
    """The examples of a JSON-lines file: one object per line, text and label keys as for a table header."""
    path = Path(path)
    out = []
    columns: Columns | None = None
    for number, obj in _json_lines(path):
        where = f"{path}:{number}"
        names = list(obj)
        if columns is None:
            columns = choose_columns(names, path, text_cols, label_col, need_label)
            keys = [columns.names[i] for i in columns.text]
            label_key = None if columns.label is None else columns.names[columns.label]
        missing = [k for k in keys + ([label_key] if label_key else []) if k not in obj]
        if missing:
            raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
        texts = tuple(obj[k] for k in keys)
        if not all(isinstance(t, str) for t in texts):
            raise InputError(f"{where}: text values must be strings")
        _require_texts(texts, keys, where)
        label = None if label_key is None else parse_label(str(obj[label_key]), regression, where)
        out.append(TextExample(texts, label, where))
    return out


def _require_texts(texts: tuple[str, ...], names: list[str], where: str) -> None:
    """Refuse an empty or whitespace-only text, naming its column."""
    for text, name in zip(texts, names):
        if not text.strip():
            raise InputError(f"{where}: the text in {name!r} is empty or whitespace only")


def _json_lines(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of a JSONL file."""
    out = []
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        out.append((number, obj))
    if not out:
        raise InputError(f"{path}: no examples")
    return out


def is_jsonl(path: PathLike) -> bool:
    """Whether a file is JSON lines (by its extension)."""
    return Path(path).suffix.lower() in (".jsonl", ".ndjson")


def read_texts(path: PathLike, text_cols: list[str] | None = None, label_col: str | None = None,
               regression: bool = False, header: bool = True, need_label: bool = True,
               classes: list[str] | None = None) -> list[TextExample]:
    """A TSV/CSV table or a JSONL file, chosen by extension; a folder of class folders (`classes`: which ones)."""
    if Path(path).is_dir():
        return read_class_folders(path, classes)
    if is_jsonl(path):
        return read_jsonl(path, text_cols, label_col, regression, need_label)
    return read_table(path, text_cols, label_col, regression, header, need_label)


def read_class_folders(path: PathLike, classes: list[str] | None = None) -> list[TextExample]:
    """One example per .txt file of each class folder, the folder's name its label (aclImdb's train/pos,
    train/neg); `classes` picks the folders (default: every subfolder holding .txt files)."""
    path = Path(path)
    found = sorted(p.name for p in path.iterdir() if p.is_dir() and any(p.glob("*.txt")))
    chosen = list(classes or found)
    missing = [name for name in chosen if name not in found]
    if not chosen or missing:
        raise InputError(f"{path}: expected one subfolder of .txt files per class"
                         + (f"; no .txt files in {', '.join(missing)}" if missing else "")
                         + f" (subfolders with .txt files: {', '.join(found) or 'none'})")
    ignored = [name for name in found if name not in chosen]
    if ignored:  # aclImdb/train/unsup: unlabelled reviews beside the classes
        log.info(f"{path}: folders {', '.join(ignored)} are not among the classes {', '.join(chosen)}: not read")
    out = []
    for label in chosen:
        for file in sorted((path / label).glob("*.txt")):
            text = " ".join(read_text(file).split("\n")).strip()
            out.append(TextExample((text,), label, str(file)))
    return out


# ---- CoNLL ---------------------------------------------------------------------------------------------------
TAG_PREFIXES = {"B": "B", "I": "I", "E": "I", "L": "I", "S": "B", "U": "B"}  # BIOES / BILOU -> IOB2 roles


def read_conll(path: PathLike, tag_col: int = -1, token_col: int = 0) -> list[TaggedSentence]:
    """Sentences of a CoNLL column file (blank line between sentences, -DOCSTART- skipped), tags in IOB2."""
    path = Path(path)
    if is_jsonl(path):
        return _read_tagged_jsonl(path)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start, width = 0, None
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append(TaggedSentence(words, to_iob2(tags, f"{path}:{start}"), f"{path}:{start}"))
            words, tags = [], []
            continue
        width = width or len(fields)
        if len(fields) != width:
            raise InputError(f"{path}:{number}: expected {width} columns as on the first token line, got {len(fields)}")
        if not (-width <= tag_col < width and -width <= token_col < width):
            raise InputError(f"{path}:{number}: tag column {tag_col} or token column {token_col} does not exist "
                             f"({width} columns)")
        start = start if words else number
        words.append(fields[token_col])
        tags.append(fields[tag_col])
    if words:
        sentences.append(TaggedSentence(words, to_iob2(tags, f"{path}:{start}"), f"{path}:{start}"))
    if not sentences:
        raise InputError(f"{path}: no sentences")
    return sentences


def _read_tagged_jsonl(path: Path) -> list[TaggedSentence]:
    """Sentences of a JSONL file with "tokens" (or "words") and "tags" (or "ner_tags") string lists."""
    out = []
    for number, obj in _json_lines(path):
        where = f"{path}:{number}"
        words = obj.get("tokens", obj.get("words"))
        tags = obj.get("tags", obj.get("ner_tags"))
        if not isinstance(words, list) or not isinstance(tags, list) or len(words) != len(tags):
            raise InputError(f"{where}: expected equal-length lists 'tokens' and 'tags'")
        if not all(isinstance(t, str) for t in words + tags):
            raise InputError(f"{where}: tokens and tags must be strings")
        out.append(TaggedSentence(words, to_iob2(tags, where), where))
    return out


def to_iob2(tags: list[str], where: str) -> list[str]:
    """IOB1, IOB2, BIOES or BILOU tags as IOB2: every entity starts with B-, continues with I-."""
    out: list[str] = []
    for tag in tags:
        if tag == "O":
            out.append(tag)
            continue
        prefix, _, kind = tag.partition("-")
        if prefix not in TAG_PREFIXES or not kind:
            raise InputError(f"{where}: tag {tag!r} is not O or B-/I-/E-/S-/L-/U- followed by a type")
        role = TAG_PREFIXES[prefix]
        previous = out[-1] if out else "O"
        # IOB1 starts an entity with I-; so does any I- that does not continue an entity of its type.
        if role == "I" and previous[2:] != kind:
            role = "B"
        out.append(f"{role}-{kind}")
    return out


# ---- SQuAD ---------------------------------------------------------------------------------------------------
def read_squad(path: PathLike) -> list[QAExample]:
    """The questions of a SQuAD v1.1 or v2.0 JSON file, answer offsets checked against the context."""
    path = Path(path)
    text = read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise InputError(f"{path}: expected a SQuAD object with a 'data' list of articles")
    out = []
    for a, article in enumerate(data["data"]):
        if not isinstance(article, dict):
            raise InputError(f"{path}: article {a}: expected an object with 'paragraphs', got {type(article).__name__}")
        title = str(article.get("title", f"article {a}"))
        for p, paragraph in enumerate(_require(article, "paragraphs", list, f"{path}: article {title!r}")):
            where = f"{path}: article {title!r} paragraph {p}"
            context = _require(paragraph, "context", str, where)
            for qa in _require(paragraph, "qas", list, where):
                out.append(_qa_example(qa, title, context, where))
    if not out:
        raise InputError(f"{path}: no questions")
    return out


def _require(obj: object, key: str, kind: type, where: str):
    if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
        raise InputError(f"{where}: expected key {key!r} holding a {kind.__name__}")
    return obj[key]


def _qa_example(qa: dict, title: str, context: str, where: str) -> QAExample:
    """One question, each answer's start checked (and re-found nearby when off by a few characters)."""
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), (str, int)):
        raise InputError(f"{where}: every question needs an 'id'")
    qid = str(qa["id"])
    where = f"{where} question {qid}"
    question = _require(qa, "question", str, where)
    impossible = bool(qa.get("is_impossible", False))
    answers = []
    for raw in _require(qa, "answers", list, where):
        if not (isinstance(raw, dict) and isinstance(raw.get("text"), str)
                and isinstance(raw.get("answer_start"), int)):
            raise InputError(f"{where}: each answer needs 'text' (string) and 'answer_start' (integer)")
        answers.append(Answer(raw["text"], _answer_start(context, raw["text"], raw["answer_start"], where)))
    if not answers and not impossible:
        raise InputError(f"{where}: no answers, and is_impossible is not set")
    return QAExample(qid, title, context, question, answers, impossible)


def _answer_start(context: str, text: str, start: int, where: str) -> int:
    """The answer's offset: as given when the context holds the text there, else the nearest occurrence."""
    if context[start:start + len(text)] == text:
        return start
    found = [i for i in range(len(context)) if context.startswith(text, i)] if text else []
    if not found:
        raise InputError(f"{where}: answer {text!r} does not occur in the context")
    return min(found, key=lambda i: abs(i - start))
