"""Small file helpers: atomic writes, strict UTF-8 text reading with errors that name the file and line, the
progress bar (on stderr), and how counts and metrics print (count_text, number_text)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from encoderlab.errors import CheckpointError, InputError

TEMP_SUFFIX = ".tmp"  # atomic_write's temp files are named .NAME.RANDOM.tmp beside their final name
LOW_SPACE = 1 << 20  # bytes free below which a failed write is put down to a full disk


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) a temp file beside `path`, fsync, rename it over `path`: a crash or full disk leaves the old file or
    the new one, never a torn one. A failure removes the temp file and raises OSError naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except Exception as err:
        failure = write_error(path, err)  # before the unlink: a full disk is only full while tmp is there
        tmp.unlink(missing_ok=True)
        raise failure from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


# ---- output folders: nothing a user made is lost (docs/reliability.md) --------------------------------------------
ONNX_FILE = "model.onnx"  # the graph in an export folder (infer.onnx), beside model.onnx.json
RESUMABLE = ("checkpoints",)  # a run's own resumable state: what pretrain and finetune may find in their --out


def check_out_folder(out: str | os.PathLike, overwrite: bool, resume: bool | None = None,
                     own: Sequence[str] = (), inputs: Sequence[str | os.PathLike] = ()) -> None:
    """Refuse (InputError, one line) an --out that is a file, that holds or lies in one of `inputs`, or a folder holding
    anything but `own` (the command's resumable state), unless `overwrite` (or `resume`; None: the command does not
    resume). An absent or empty folder is fine. Reads nothing but folder listings: the CLI calls it before any model
    loads."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: is a file, expected a folder")
    if overwrite and resume:
        raise InputError("--overwrite and --resume: give one (--overwrite starts afresh, --resume continues)")
    for given in inputs:
        model = Path(given).resolve()
        if Path(given).is_dir() and (out.resolve() == model or out.resolve() in model.parents):
            raise InputError(f"--out {out} holds the input {given}: write to another folder")
    found = sorted(p.name for p in out.iterdir() if p.name not in own) if out.is_dir() else []
    if found and not (overwrite or resume):
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        also = ", or --resume to continue the run there" if resume is not None else ""
        raise InputError(f"--out {out} holds files this command did not make ({shown}): pass --overwrite to replace "
                         f"them{also}, or choose another folder")


def check_export_folder(out: str | os.PathLike, overwrite: bool, model: str | os.PathLike) -> None:
    """`export`'s --out: a folder (a name ending in .onnx is refused with a hint), checked as check_out_folder does."""
    if Path(out).suffix == ".onnx":
        raise InputError(f"--out {out}: --out is a folder now (it gets {ONNX_FILE}, its settings, config.json and the "
                         f"tokenizer files); try --out {Path(out).with_suffix('')}")
    check_out_folder(out, overwrite, inputs=[model])


def remove_folder(folder: Path) -> None:
    """Rename a folder to a temporary name beside it, then delete it: a kill part way leaves nothing under its name."""
    folder = Path(folder)
    doomed = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old.", suffix=TEMP_SUFFIX, dir=folder.parent))
    folder.rename(doomed / folder.name)
    shutil.rmtree(doomed, ignore_errors=True)


def clear_folder(folder: str | os.PathLike) -> None:
    """--overwrite: empty `folder` (remove_folder, then an empty one in its place) just before a command writes."""
    folder = Path(folder)
    if folder.is_dir():
        remove_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)


def write_error(path: Path, err: Exception) -> OSError:
    """An OSError naming `path` for a failed write; torch.save and safetensors report a full disk as their own errors,
    so another error is put down to a full disk when little space is left."""
    if isinstance(err, OSError):
        return OSError(err.errno or errno.EIO, err.strerror or str(err), str(path))
    reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
    try:
        full = shutil.disk_usage(path.parent).free < LOW_SPACE
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({reason})", str(path))
    return OSError(errno.EIO, f"write failed ({reason})", str(path))


def fsync_folder(folder: Path) -> None:
    """Flush a folder's entries, so a rename into it survives a power cut (not needed to survive a kill)."""
    with contextlib.suppress(OSError):  # a file system that cannot sync folders: the rename is still atomic
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
        line = line_number(raw[: err.start])
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start})") from None


def line_number(before: bytes) -> int:
    """The line a byte sits on, given the bytes before it (LF, CRLF and a lone CR each end a line)."""
    before = before.replace(b"\r\n", b"\n")
    return before.count(b"\n") + before.count(b"\r") + 1


def split_lines(text: str, path: str | os.PathLike) -> list[str]:
    """The lines of a text, each ended by LF, CRLF or a lone CR, so numbers are the ones an editor shows (a form feed or
    U+2028 is text, as to csv, json and the tokenizer); InputError names a NUL's line."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()  # the final line ending ends the last line; it does not start another
    for number, line in enumerate(lines, start=1):
        if "\x00" in line:
            raise InputError(f"{path}:{number}: contains a NUL byte (a binary file?)")
    return lines


def read_lines(path: str | os.PathLike, allow_empty_lines: bool = False) -> list[str]:
    """The lines of a UTF-8 text file, one text per line; InputError naming file and line for a missing or empty file,
    bytes that are not UTF-8, NUL bytes or (unless allowed) a blank line."""
    path = Path(path)
    lines = split_lines(read_text(path), path)
    if not any(line.strip() for line in lines):
        raise InputError(f"{path}: the file is empty (expected one text per line)")
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            if allow_empty_lines:
                continue
            raise InputError(f"{path}:{number}: empty line (expected one text per line)")
        out.append(line)
    return out


def read_json_file(path: Path, kind: type = dict, error: type[Exception] = CheckpointError,
                   optional: bool = False) -> Any:
    """A JSON file whose top level is a `kind` (dict or list); `error` (a checkpoint folder's files: CheckpointError)
    naming it when it is missing (optional: an empty `kind` then), not UTF-8 JSON or of another kind."""
    if optional and not path.is_file():
        return kind()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise error(f"{path}: not valid UTF-8 JSON ({err})") from None
    if not isinstance(data, kind):
        raise error(f"{path}: expected a JSON {'object' if kind is dict else 'array'}, got {type(data).__name__}")
    return data


# ---- progress -------------------------------------------------------------------------------------------------
LOG_INTERVAL = 30.0  # seconds between a bar's lines when stderr is a log file, not a terminal


class _Lines:
    """A file for tqdm off a terminal: each refresh one line, without the carriage returns a log would pile up."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def count_text(count: int, noun: str, plural: str | None = None) -> str:
    """(1, "step") -> "1 step", (2, "step") -> "2 steps": a count and its noun agreeing, the count with separators."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def number_text(value: float | int) -> str:
    """A metric as the commands print it: a count (an int, such as `queries`) whole, a measure to 4 decimals."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{value:.4f}"


def progress_bar(**options: Any) -> tqdm:
    """A tqdm bar on stderr: live on a terminal; otherwise one line every LOG_INTERVAL seconds."""
    if sys.stderr.isatty():
        return tqdm(file=sys.stderr, dynamic_ncols=True, **options)
    # maxinterval too: tqdm's monitor thread otherwise forces a line every 10 s
    return tqdm(file=_Lines(sys.stderr), mininterval=LOG_INTERVAL, maxinterval=LOG_INTERVAL, ncols=100, **options)


# ---- inputs: checked before any model loads (the CLI checks them without torch) ------------------------------
def as_list(values: Any, what: str) -> list:
    """A non-empty list of inputs; InputError for one string, a mapping, an empty list, or no list at all."""
    if isinstance(values, str):
        raise InputError(f"expected a list of {what}s, got one string (wrap it in a list)")
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise InputError(f"expected a list of {what}s, got a {type(values).__name__}")
    values = list(values)
    if not values:
        raise InputError(f"no {what}s given")
    return values


def check_texts(texts: Sequence[str], what: str = "text") -> list[str]:
    """The texts as a list; InputError naming the first empty, whitespace-only or non-string one."""
    texts = as_list(texts, what)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError(f"{what} {i} is a {type(text).__name__}, expected a string")
        if not text.strip():
            raise InputError(f"{what} {i} is empty or whitespace only")
    return texts


def qa_inputs(inputs: Sequence[dict[str, str]]) -> list[tuple[str, str]]:
    """(question, context) pairs from dicts; InputError naming the first bad item."""
    inputs = as_list([inputs] if isinstance(inputs, dict) else inputs, "question")
    out = []
    for i, item in enumerate(inputs):
        if not isinstance(item, dict) or not isinstance(item.get("question"), str) \
                or not isinstance(item.get("context"), str):
            raise InputError(f"input {i}: expected an object with string fields 'question' and 'context'")
        for field in ("question", "context"):
            if not item[field].strip():
                raise InputError(f"input {i}: the {field} is empty or whitespace only")
        out.append((item["question"], item["context"]))
    return out


def require_text(text: str, pair: str | None) -> None:
    """InputError for an empty or whitespace-only text or pair."""
    for name, value in (("text", text), ("pair", pair)):
        if value is not None and not value.strip():
            raise InputError(f"attention: the {name} is empty or only whitespace (expected some words)")
