"""Corpus, query and qrels readers for retrieval, torch-free: the command line checks a whole corpus with them before
any model loads.

A corpus is read one document at a time (never all texts at once) from:
- BEIR's corpus.jsonl: one {"_id", "title", "text"} object a line (Thakur et al. 2021, arXiv:2104.08663);
- a TSV/CSV table whose header names an id column (_id, id, docid, doc_id, pid) and a text column (text, passage,
  contents, body), a title column optional; a headerless two-column TSV (MS MARCO's collection.tsv: pid, text);
- Parquet, read one row group at a time (pyarrow), with the same column names;
- any other file: one text per line, its id the line number (blank lines skipped; the numbers stay file lines).

A document's text for the encoder and for BM25 is `title + " " + text`, stripped (BEIR's dense models, beir/retrieval/
models/sentence_bert.py's encode_corpus, join them with sep = " "); a document without a title is its text alone.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from encoderlab.errors import InputError

ID_COLUMNS = ("_id", "id", "docid", "doc_id", "pid", "qid", "query-id", "query_id")
TEXT_COLUMNS = ("text", "passage", "contents", "body", "query", "question")
TITLE_COLUMN = "title"
PARQUET_BATCH = 4096  # rows per Parquet batch: a row group is read in slices of this many
csv.field_size_limit(1 << 30)  # a long passage in one field is fine


@dataclass(frozen=True)
class Document:
    """One corpus document (or query): its id, title ("" when none) and text; `where` names its file and line."""

    id: str
    title: str
    text: str
    where: str = ""

    @property
    def joined(self) -> str:
        """What is encoded and indexed: BEIR's `title + " " + text`, stripped."""
        return f"{self.title} {self.text}".strip() if self.title else self.text.strip()


def corpus_format(path: Path) -> str:
    """jsonl, tsv, csv, parquet or lines, by the file's name."""
    suffixes = [s.lower() for s in path.suffixes]
    for name in ("jsonl", "tsv", "csv", "parquet"):
        if f".{name}" in suffixes:
            return name
    return "jsonl" if suffixes[-1:] == [".json"] else "lines"


def read_documents(path: str | os.PathLike, what: str = "corpus") -> Iterator[Document]:
    """The documents of a corpus file, one at a time, in file order; InputError naming the file and line of a bad
    one (not JSON, no id, no text)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file" if not path.exists() else f"{path}: is a folder, expected a "
                         f"{what} file")
    reader = {"jsonl": _jsonl, "tsv": _table, "csv": _table, "parquet": _parquet, "lines": _lines}
    try:
        yield from reader[corpus_format(path)](path)
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start} of a read block)") from None


def scan(path: str | os.PathLike, what: str = "corpus") -> int:
    """Read a whole corpus once, holding its ids only: the count of documents; InputError for a bad document, a
    duplicate id (naming both lines) or an empty corpus. Nothing is written before this passes."""
    seen: dict[str, str] = {}
    for document in read_documents(path, what):
        if document.id in seen:
            raise InputError(f"{document.where}: duplicate id {document.id!r} (first at {seen[document.id]})")
        seen[document.id] = document.where
    if not seen:
        raise InputError(f"{path}: the {what} holds no documents")
    return len(seen)


def read_queries(path: str | os.PathLike) -> dict[str, str]:
    """BEIR's queries.jsonl ({"_id", "text"}), a TSV of id and text, or one query a line: {id: text}."""
    queries: dict[str, str] = {}
    for document in read_documents(path, "queries"):
        if document.id in queries:
            raise InputError(f"{document.where}: duplicate query id {document.id!r}")
        queries[document.id] = document.joined
    if not queries:
        raise InputError(f"{path}: no queries")
    return queries


def read_qrels(path: str | os.PathLike) -> dict[str, dict[str, int]]:
    """BEIR's qrels TSV (a header `query-id corpus-id score`, then one judgement a line), or TREC's qrels (qid 0
    docid relevance, no header): {query id: {doc id: relevance}}."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such qrels file")
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.split()
            if not fields or (number == 1 and not fields[-1].lstrip("-").isdigit()):
                continue  # a blank line, or the header
            if len(fields) not in (3, 4) or not fields[-1].lstrip("-").isdigit():
                raise InputError(f"{path}:{number}: expected query-id, corpus-id and a whole-number score "
                                 f"(or TREC's qid 0 docid relevance), got {line.strip()[:100]!r}")
            qrels.setdefault(fields[0], {})[fields[-2]] = int(fields[-1])
    if not qrels:
        raise InputError(f"{path}: no relevance judgements")
    return qrels


# ---- the formats ------------------------------------------------------------------------------------------------
def _jsonl(path: Path) -> Iterator[Document]:
    """BEIR's corpus.jsonl: {"_id", "title", "text"} a line."""
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except ValueError as err:
                raise InputError(f"{where}: not valid JSON ({err})") from None
            if not isinstance(row, dict):
                raise InputError(f"{where}: expected a JSON object with _id and text, got {type(row).__name__}")
            yield _document(row, where)


def _document(row: dict, where: str) -> Document:
    """A Document from a row's id, title and text fields; InputError naming what is missing."""
    ident = next((row[name] for name in ID_COLUMNS if row.get(name) is not None), None)
    if ident is None or str(ident).strip() == "":
        raise InputError(f"{where}: no id (expected a field {', '.join(ID_COLUMNS[:5])})")
    text = next((row[name] for name in TEXT_COLUMNS if name in row), None)
    title = row.get(TITLE_COLUMN) or ""
    if text is None or not isinstance(text, str) or not isinstance(title, str):
        raise InputError(f"{where}: id {ident!r} has no text (expected a string field "
                         f"{', '.join(TEXT_COLUMNS[:4])})")
    if not text.strip() and not title.strip():
        raise InputError(f"{where}: id {ident!r}: the text and title are empty")
    return Document(str(ident), title, text, where)


def _table(path: Path) -> Iterator[Document]:
    """A TSV/CSV table with a header naming its id and text columns, or a headerless id<TAB>text TSV."""
    delimiter = "," if corpus_format(path) == "csv" else "\t"
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = csv.reader(handle, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL if delimiter == "," else
                          csv.QUOTE_NONE)
        header = next(rows, None)
        if header is None:
            return
        names = [name.strip().lower() for name in header]
        if len(header) == 2 and not any(name in ID_COLUMNS for name in names):
            names = ["id", "text"]  # headerless (MS MARCO's collection.tsv): the first row is data
            yield _document(dict(zip(names, header)), f"{path}:1")
        elif not any(name in ID_COLUMNS for name in names) or not any(name in TEXT_COLUMNS for name in names):
            raise InputError(f"{path}:1: the header {header[:6]} names no id column ({', '.join(ID_COLUMNS[:5])}) "
                             f"or no text column ({', '.join(TEXT_COLUMNS[:4])})")
        for number, fields in enumerate(rows, 2):
            if not fields:
                continue
            if len(fields) != len(names):
                raise InputError(f"{path}:{rows.line_num}: {len(fields)} fields, expected {len(names)} as the header")
            yield _document(dict(zip(names, fields)), f"{path}:{rows.line_num}")


def _parquet(path: Path) -> Iterator[Document]:
    """A Parquet file with id and text columns (title optional), one row group slice at a time."""
    import pyarrow.parquet as pq  # an optional heavy import, for this format alone

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises its own errors for a file that is not Parquet
        raise InputError(f"{path}: not a Parquet file ({err})") from None
    names = [name for name in table.schema_arrow.names]
    wanted = [n for n in names if n.lower() in ID_COLUMNS + TEXT_COLUMNS + (TITLE_COLUMN,)]
    row = 0
    for batch in table.iter_batches(batch_size=PARQUET_BATCH, columns=wanted):
        for values in batch.to_pylist():
            row += 1
            yield _document({k.lower(): v for k, v in values.items()}, f"{path}: row {row}")


def _lines(path: Path) -> Iterator[Document]:
    """One text a line; its id is the line number."""
    with open(path, encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            text = line.rstrip("\n")
            if text.strip():
                yield Document(str(number), "", text, f"{path}:{number}")
