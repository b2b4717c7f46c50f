"""encoderlab.data.corpus and .sentences: every input format (gzipped too), errors that name file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import shared_file

from encoderlab.data.corpus import DocumentReader, corpus_files, iter_documents
from encoderlab.data.sentences import split_sentences
from encoderlab.errors import InputError

DOCUMENTS = [["First paragraph of one.", "Second paragraph of one."], ["Only paragraph of two."],
             ["Three: ünïcödé ✓ text.", "Another line."]]


def write(path: Path, text: str | bytes, gz: bool = False) -> Path:
    """Write text (or bytes) to path, gzip-compressed when gz (the name then ends in .gz)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def as_plain(documents: list[list[str]]) -> str:
    return "\n\n".join("\n".join(doc) for doc in documents) + "\n"


def as_jsonl(documents: list[list[str]]) -> str:
    return "".join(json.dumps({"id": i, "text": "\n".join(doc)}) + "\n" for i, doc in enumerate(documents))


def as_wikiextractor(documents: list[list[str]]) -> str:
    return "".join(f'<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="Title {i}">\n'
                   f"Title {i}\n\n" + "\n".join(doc) + "\n\n</doc>\n" for i, doc in enumerate(documents))


FORMATS = {"plain": ("corpus.txt", as_plain), "jsonl": ("corpus.jsonl", as_jsonl),
           "wikiextractor": ("wiki_00", as_wikiextractor)}


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_reads_the_same_documents(tmp_path, fmt, gz):
    name, render = FORMATS[fmt]
    path = write(tmp_path / name, render(DOCUMENTS), gz)
    reader = DocumentReader(path)
    assert list(reader) == DOCUMENTS
    assert reader.format == fmt
    assert reader.bytes_read == len(render(DOCUMENTS).encode("utf-8"))  # uncompressed bytes, for MB/s
    assert reader.disk_bytes_read == path.stat().st_size


def test_plain_text_tolerates_crlf_bom_runs_of_blank_lines_and_trailing_spaces(tmp_path):
    text = "\ufeffa one  \r\nb one\r\n\r\n \r\n\r\nc two\r\n\r\n"
    assert list(iter_documents(write(tmp_path / "c.txt", text))) == [["a one", "b one"], ["c two"]]


def test_jsonl_skips_blank_lines_and_empty_texts(tmp_path):
    text = '{"text": "a\\n\\nb"}\n\n{"text": ""}\n{"text": "c"}\n'
    assert list(iter_documents(write(tmp_path / "c.jsonl", text))) == [["a", "b"], ["c"]]


def test_jsonl_is_detected_without_the_suffix(tmp_path):
    # WikiExtractor --json writes wiki_00 with one JSON object per line.
    path = write(tmp_path / "wiki_00", as_jsonl(DOCUMENTS), gz=True)
    reader = DocumentReader(path)
    assert list(reader) == DOCUMENTS and reader.format == "jsonl"


@pytest.mark.parametrize("bad, message", [
    ('{"text": "fine"', "not valid JSON"),
    ('{"body": "no text field"}', 'with a "text" field, got keys [\'body\']'),
    ('["a", "list"]', 'with a "text" field, got list'),
    ('{"text": 3}', '"text" must be a string, got int'),
])
@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_malformed_jsonl_line_is_named(tmp_path, bad, message, gz):
    path = write(tmp_path / "c.jsonl", '{"text": "one"}\n{"text": "two"}\n' + bad + "\n", gz)
    with pytest.raises(InputError) as err:
        list(iter_documents(path))
    assert f"{path}:3: " in str(err.value) and message in str(err.value)


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_non_utf8_file_is_named_with_its_line(tmp_path, gz):
    path = write(tmp_path / "latin1.txt", "good line\nsecond\ncaf\u00e9 latin-1\n".encode("latin-1"), gz)
    with pytest.raises(InputError, match=r"latin1\.txt(\.gz)?:3: not valid UTF-8 \(byte 0xe9"):
        list(iter_documents(path))


def test_binary_file_with_nul_bytes_is_refused(tmp_path):
    with pytest.raises(InputError, match=r"blob\.txt:2: contains a NUL byte"):
        list(iter_documents(write(tmp_path / "blob.txt", b"text\nab\x00cd\n")))


def test_corrupted_gzip_is_named(tmp_path):
    data = gzip.compress(as_plain(DOCUMENTS * 50).encode())
    path = write(tmp_path / "cut.txt.gz", data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.txt\.gz: corrupted gzip data"):
        list(iter_documents(path))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(InputError, match=r"nope\.txt: no such file"):
        list(iter_documents(tmp_path / "nope.txt"))


@pytest.mark.parametrize("text, message", [
    ('<doc id="1" title="T">\nT\ntext\n', r"the <doc> opened at line 1 is never closed"),
    ('<doc id="1" title="T">\ntext\n<doc id="2" title="U">\n', r":3: <doc> inside the document opened at line 1"),
    ('<doc id="1" title="T">\ntext\n</doc>\n</doc>\n', r":4: </doc> without an opening <doc>"),
    ('<doc id="1" title="T">\ntext\n</doc>\nstray text\n', r":4: text outside <doc>"),
])
def test_malformed_wikiextractor_is_named(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        list(iter_documents(write(tmp_path / "wiki_00", text)))


def test_wikiextractor_title_line_is_dropped_only_when_it_is_the_title(tmp_path):
    text = '<doc id="1" title="A &amp; B">\nA & B\nBody.\n</doc>\n<doc id="2" title="C">\nNot the title.\n</doc>\n'
    assert list(iter_documents(write(tmp_path / "wiki_00", text))) == [["Body."], ["Not the title."]]


def test_corpus_files_expands_folders_recursively_in_sorted_order(tmp_path):
    for name in ("b/2.txt", "b/10.txt", "a/x.gz", ".hidden/z.txt", "b/.swp", "c.txt"):
        (tmp_path / "root" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / name).write_text("x\n")
    files = corpus_files([tmp_path / "root", tmp_path / "root" / "c.txt"])
    assert [p.relative_to(tmp_path / "root").as_posix() for p in files] == ["a/x.gz", "b/10.txt", "b/2.txt", "c.txt"]


def test_corpus_files_errors_name_the_path(tmp_path):
    with pytest.raises(InputError, match="missing: no such file or folder"):
        corpus_files([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="empty: the folder holds no files"):
        corpus_files([tmp_path / "empty"])
    with pytest.raises(InputError, match="no corpus paths"):
        corpus_files([])


def test_first_real_wikipedia_file_parses_into_articles():
    path = shared_file("wikipedia/AA/wiki_00.gz")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        opened = sum(line.startswith("<doc ") for line in handle)
    documents = list(iter_documents(path))
    assert len(documents) == opened == 38
    assert documents[0][0].startswith("Anarchism is a political philosophy")  # the title line is gone
    assert not any(p.startswith(("<doc", "</doc")) for doc in documents for p in doc)


@pytest.mark.parametrize("paragraph, sentences", [
    ("One here. Two there! Three? Four.", ["One here.", "Two there!", "Three?", "Four."]),
    ("Dr. Smith met Mr. Jones in the U.S. Army in 1999. Then he left.",
     ["Dr. Smith met Mr. Jones in the U.S. Army in 1999.", "Then he left."]),
    ("J. R. R. Tolkien wrote it. It sold.", ["J. R. R. Tolkien wrote it.", "It sold."]),
    ('He said "Stop." Then "Go!" she said. (It ended.) Next.', ['He said "Stop."', 'Then "Go!" she said.',
                                                               "(It ended.)", "Next."]),
    ("Version 1.4 is out. e.g. lowercase. after this", ["Version 1.4 is out. e.g. lowercase. after this"]),
    ("   ", []),
])
def test_split_sentences(paragraph, sentences):
    assert split_sentences(paragraph) == sentences
