"""Raw-text corpora as a stream of documents: plain text, JSONL, WikiExtractor output, each optionally gzipped.

A document is a list of paragraphs (non-blank lines, right-stripped). The format is detected per file: gzip by its
magic bytes; JSONL by a .jsonl/.ndjson/.json name or a first line that is a JSON object with "text"; WikiExtractor
by a first line `<doc ...>`; else plain text, documents separated by blank lines (BERT's sample_text.txt). Files are
read line by line and decoded strictly: memory stays flat and a bad byte is reported with its line.
"""

from __future__ import annotations

import gzip
import html
import itertools
import json
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from encoderlab.errors import InputError
from encoderlab.hub_data import is_hub_data, local_copy

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_GZIP_MAGIC = b"\x1f\x8b"
_DOC_OPEN = re.compile(r"<doc\b[^>]*>")
_TITLE = re.compile(r'\btitle="([^"]*)"')


def corpus_files(paths: list[str | os.PathLike]) -> list[Path]:
    """The files named by `paths`, folders expanded recursively in sorted order (hidden entries skipped); a Hub
    dataset (hf:NAME[/CONFIG][:SPLIT], split train unless named) as the JSONL file of its text column."""
    if not paths:
        raise InputError("no corpus paths given")
    files: list[Path] = []
    for raw in paths:
        path = local_copy(raw, "corpus", "train").path if is_hub_data(raw) else Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file()  # hidden: .git, .DS_Store, editor temp files
                           and not any(part.startswith(".") for part in p.relative_to(path).parts))
            if not found:
                raise InputError(f"{path}: the folder holds no files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"{path}: no such file or folder")
    return list(dict.fromkeys(files))  # a file named twice is read once


def iter_documents(path: str | os.PathLike) -> Iterator[list[str]]:
    """The documents of one corpus file, each a list of paragraphs; InputError names the file (and line)."""
    return iter(DocumentReader(path))


class DocumentReader:
    """Iterates the documents of one file and counts the bytes read (uncompressed and on disk) as it goes."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.bytes_read = 0  # uncompressed text bytes consumed so far
        self.format: str | None = None  # known once iteration has seen the first line
        self._raw = None  # the on-disk file object, for progress in compressed bytes
        self._disk_done = 0  # its size, once read to the end

    @property
    def disk_bytes_read(self) -> int:
        """How far into the file on disk reading has got (compressed bytes for .gz)."""
        if self._raw is None or self._raw.closed:
            return self._disk_done
        try:
            return self._raw.tell()
        except (OSError, ValueError):
            return self._disk_done

    def __iter__(self) -> Iterator[list[str]]:
        lines = self._lines()
        first = next(lines, None)
        if first is None:
            return
        self.format = _detect(self.path, first[1])
        parse = {"plain": _plain, "jsonl": _jsonl, "wikiextractor": _wikiextractor}[self.format]
        yield from parse(self.path, itertools.chain([first], lines))

    def _lines(self) -> Iterator[tuple[int, str]]:
        """(line number, text without the newline) for every line, decoded as strict UTF-8."""
        number = 0
        try:
            with open(self.path, "rb") as raw:
                self._raw = raw
                gzipped = raw.read(2) == _GZIP_MAGIC
                raw.seek(0)
                with (gzip.GzipFile(fileobj=raw) if gzipped else raw) as handle:
                    for number, data in enumerate(handle, start=1):
                        self.bytes_read += len(data)
                        yield number, _decode(self.path, number, data)
                    self._disk_done = raw.tell()
        except FileNotFoundError:
            raise InputError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise InputError(f"{self.path}: is a folder, expected a corpus file") from None
        except PermissionError:
            raise InputError(f"{self.path}: permission denied") from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise InputError(f"{self.path}: corrupted gzip data after line {number} ({err})") from None
        except OSError as err:
            raise InputError(f"{self.path}: cannot be read after line {number} ({err})") from None


def _decode(path: Path, number: int, data: bytes) -> str:
    """One line as text; InputError naming file and line for bad UTF-8 or a NUL byte (a binary file)."""
    try:
        text = data.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}:{number}: not valid UTF-8 (byte 0x{data[err.start]:02x} at column "
                         f"{err.start + 1}); is it a binary or differently encoded file?") from None
    if "\x00" in text:
        raise InputError(f"{path}:{number}: contains a NUL byte; is it a binary file?")
    return text.rstrip("\r\n")


def _detect(path: Path, first_line: str) -> str:
    """The format of a file from its name (minus .gz) and its first line."""
    name = path.name.removesuffix(".gz")
    if name.lower().endswith(JSONL_SUFFIXES):
        return "jsonl"
    head = first_line.strip()
    if _DOC_OPEN.fullmatch(head):
        return "wikiextractor"
    if head.startswith("{"):
        try:
            if isinstance(record := json.loads(head), dict) and "text" in record:
                return "jsonl"  # e.g. WikiExtractor --json writes wiki_00 without a suffix
        except ValueError:
            pass
    return "plain"


def _plain(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[list[str]]:
    """Documents separated by one or more blank lines; each other line is a paragraph."""
    document: list[str] = []
    for _, line in lines:
        if line.strip():
            document.append(line.rstrip())
        elif document:
            yield document
            document = []
    if document:
        yield document


def _jsonl(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[list[str]]:
    """One JSON object per line with a string "text"; its lines are the paragraphs; blank lines skipped."""
    for number, line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as err:
            raise InputError(f"{path}:{number}: not valid JSON ({err})") from None
        if not isinstance(record, dict) or "text" not in record:
            found = f"keys {sorted(record)}" if isinstance(record, dict) else type(record).__name__
            raise InputError(f"{path}:{number}: expected a JSON object with a \"text\" field, got {found}")
        if not isinstance(record["text"], str):
            raise InputError(f"{path}:{number}: \"text\" must be a string, got {type(record['text']).__name__}")
        paragraphs = [p.rstrip() for p in record["text"].splitlines() if p.strip()]
        if paragraphs:
            yield paragraphs


def _wikiextractor(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[list[str]]:
    """`<doc ... title="T">`, the title line (dropped: it is metadata, kept in the tag), paragraphs, `</doc>`."""
    opened_at, title, document = 0, None, []
    for number, line in lines:
        head = line.strip()
        if _DOC_OPEN.fullmatch(head):
            if opened_at:
                raise InputError(f"{path}:{number}: <doc> inside the document opened at line {opened_at}")
            opened_at, document = number, []
            title = html.unescape(m.group(1)) if (m := _TITLE.search(head)) else None
        elif head == "</doc>":
            if not opened_at:
                raise InputError(f"{path}:{number}: </doc> without an opening <doc>")
            if document and document[0] == title:
                document = document[1:]
            if document:
                yield document
            opened_at = 0
        elif head:
            if not opened_at:
                raise InputError(f"{path}:{number}: text outside <doc> ... </doc> in WikiExtractor output")
            document.append(line.rstrip())
    if opened_at:
        raise InputError(f"{path}: the <doc> opened at line {opened_at} is never closed by </doc>")
