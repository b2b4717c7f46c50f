"""Small file helpers: atomic writes and strict UTF-8 text reading with errors that name the file and line."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from encoderlab.errors import InputError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp) on a temp file beside `path`, fsync it, then rename it over `path`.

    A crash or a full disk leaves either the old file or the new one under `path`, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write UTF-8 text to `path` atomically."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 file's text, BOM removed; InputError naming the file (and line of the first bad byte)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a text file") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start})") from None


def read_lines(path: str | os.PathLike, allow_empty_lines: bool = False) -> list[str]:
    """The lines of a UTF-8 text file, one text per line, with clear errors.

    Raises InputError for a missing or empty file, bytes that are not UTF-8 (with the line number),
    NUL bytes, or (unless allowed) a blank line, naming the file and line.
    """
    path = Path(path)
    text = read_text(path)
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise InputError(f"{path}: the file is empty (expected one text per line)")
    out = []
    for number, line in enumerate(lines, start=1):
        if "\x00" in line:
            raise InputError(f"{path}:{number}: contains a NUL byte")
        if not line.strip():
            if allow_empty_lines:
                continue
            raise InputError(f"{path}:{number}: empty line (expected one text per line)")
        out.append(line)
    return out
