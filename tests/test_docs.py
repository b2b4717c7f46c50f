"""The commands the README and docs/ show still work: each `encoderlab` command parses with today's CLI, and
each one not marked long-running runs, with the exit code and output the page shows (numbers aside).

A fenced block right after a line `<!-- long-running -->` holds commands that take minutes or need what an
earlier long command made (a fine-tuned folder, prepared shards): those are only parsed. In a `console` block,
`$ ` starts a command and the lines after it are its output; a trailing backslash continues a line."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from encoderlab.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LONG = "<!-- long-running -->"
SHARED = ROOT.parent / "shared"
NUMBER = re.compile(r"-?\d[\d,]*(\.\d+)?(e[-+]?\d+)?")


@dataclass
class Command:
    """One command a page shows: its words, whether it is long-running, and the output shown under it."""

    page: str
    line: int
    argv: list[str]
    long: bool
    output: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {shlex.join(['encoderlab', *self.argv])}"


def encoderlab_argv(words: list[str]) -> list[str] | None:
    """The arguments after `encoderlab` (or `python -m encoderlab`, `torchrun ... -m encoderlab`); None otherwise."""
    if words[:1] == ["encoderlab"]:
        return words[1:]
    for i in range(len(words) - 1):
        if words[i] == "-m" and words[i + 1] == "encoderlab":
            return words[i + 2:]
    return None


def _logical_lines(lines: list[str], start: int) -> list[tuple[int, str]]:
    """(line number, text) with backslash continuations joined."""
    out: list[tuple[int, str]] = []
    pending = ""
    for number, line in enumerate(lines, start=start):
        if pending:
            pending += " " + line.strip()
        else:
            out.append((number, ""))
            pending = line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        out[-1] = (out[-1][0], pending)
        pending = ""
    return out


def _block_commands(page: str, kind: str, body: list[str], start: int, long: bool) -> list[Command]:
    """The encoderlab commands of one fenced block, with the output a console block shows under each."""
    commands: list[Command] = []
    current: Command | None = None
    for number, text in _logical_lines(body, start):
        if kind == "console" and not text.startswith("$ "):
            if current is not None:
                current.output.append(text)
            continue
        words = shlex.split(text.removeprefix("$ "), comments=True)
        words = words[:words.index("|")] if "|" in words else words  # the command before a pipe
        argv = encoderlab_argv(words) if words else None
        current = Command(page, number, argv, long) if argv is not None else None
        if current is not None:
            commands.append(current)
    return commands


def page_commands(path: Path) -> list[Command]:
    """Every encoderlab command in the bash and console blocks of a Markdown page."""
    lines = path.read_text(encoding="utf-8").split("\n")
    commands: list[Command] = []
    previous, i = "", 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            previous = lines[i].strip() or previous
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if fence.group(1) in ("bash", "console", "sh"):
            commands += _block_commands(path.name, fence.group(1), lines[i + 1:end], i + 2, previous == LONG)
        previous, i = "", end + 1
    return commands


COMMANDS = [command for page in PAGES for command in page_commands(page)]


def normalized(lines: list[str]) -> list[str]:
    """Output lines with numbers masked and installed-package paths shortened, blank lines dropped."""
    out = []
    for line in lines:
        line = NUMBER.sub("#", re.sub(r"\S*site-packages/", "", line)).rstrip()
        if line.strip():
            out.append(line)
    return out


def test_the_pages_show_commands():
    assert len(COMMANDS) >= 40
    assert sum(not c.long for c in COMMANDS) >= 8  # enough of them really run


def refused_by_the_parser(command: Command) -> bool:
    """The page shows argparse refusing this command (an argument error), on purpose."""
    return any(line.startswith("error: argument ") for line in command.output)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_parses(command: Command):
    try:
        build_parser().parse_args(command.argv)
    except SystemExit as exit:
        if not (refused_by_the_parser(command) and exit.code == 2):
            pytest.fail(f"{command}: the CLI refuses it (exit {exit.code})")
    else:
        assert not refused_by_the_parser(command), f"{command}: the page shows an argument error, but it parses"


def _is_subsequence(expected: list[str], got: list[str]) -> bool:
    remaining = iter(got)
    return all(any(line == seen for seen in remaining) for line in expected)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch checkout that the short commands share."""
    return scratch_checkout(tmp_path_factory.mktemp("docs"))


def scratch_checkout(root: Path) -> Path:
    """A scratch checkout under root: the repository's examples, configs and models, and ../shared where there is
    one."""
    for name in ("examples", "configs", "models"):
        (root / "repo" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "repo" / name).symlink_to(ROOT / name)
    if SHARED.is_dir():
        (root / "shared").symlink_to(SHARED)
    (root / "repo" / "latin1.txt").write_bytes(b"first\n\xffcole\n")  # reliability.md's non-UTF-8 file
    return root / "repo"


@pytest.mark.parametrize("command", [c for c in COMMANDS if not c.long], ids=str)
@pytest.mark.slow
def test_every_short_command_runs_as_shown(command: Command, workdir, monkeypatch):
    if any("../shared" in word for word in command.argv) and not SHARED.is_dir():
        pytest.skip(f"{command} reads ../shared/data, which is absent here")
    monkeypatch.chdir(workdir)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(command.argv)
        except SystemExit as exit:  # argparse's refusal, shown on purpose (refused_by_the_parser)
            code = exit.code
    got = stdout.getvalue().splitlines() + stderr.getvalue().splitlines()
    expects_error = any(line.startswith("error:") for line in command.output)
    assert (code != 0) == expects_error, f"{command}: exit {code}\n" + "\n".join(got)
    assert _is_subsequence(normalized(command.output), normalized(got)), (
        f"{command}: the page shows\n" + "\n".join(command.output) + "\nbut it prints\n" + "\n".join(got))


def test_every_relative_link_and_image_points_at_a_file():
    broken = [f"{page.name}: {match.group(1)}" for page in PAGES
              for match in re.finditer(r"\]\(([^)#\s]+)(#[^)]*)?\)", page.read_text(encoding="utf-8"))
              if "://" not in match.group(1) and not (page.parent / match.group(1)).exists()]
    assert not broken


def test_the_parser_of_this_test_reads_continuations_comments_and_outputs(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"{LONG}\n```bash\nencoderlab info \\\n  --preset bert-mini   # a comment\ncurl x\n```\n\n"
                    "```console\n$ encoderlab info --model minilm\nline one\n$ ls\n```\n", encoding="utf-8")
    first, second = page_commands(page)
    assert (first.argv, first.long, first.line) == (["info", "--preset", "bert-mini"], True, 3)
    assert (second.argv, second.long, second.output) == (["info", "--model", "minilm"], False, ["line one"])
    assert normalized(["took 1,234.5 s at /x/site-packages/pkg/model", ""]) == ["took # s at pkg/model"]


# ---- the README in a fresh shell, as a newcomer pastes it (issue 37) ----------------------------------------------
README = ROOT / "README.md"
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb"}  # no .venv/bin in it


def setup_lines(path: Path = README) -> list[str]:
    """The lines of the page's set-up block (the first bash block with `make demo`) that follow its `make`
    commands: what a newcomer types after the set-up, in every new shell (`source .venv/bin/activate`)."""
    text = path.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M) if "make demo" in b)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("make ")]


def test_the_readme_says_how_to_get_encoderlab_on_the_path():
    assert "source .venv/bin/activate" in setup_lines()


@pytest.mark.slow
def test_the_readme_commands_run_in_a_fresh_shell_after_the_setup(tmp_path):
    """Each short command of the README, pasted into a new bash with a bare PATH after the set-up block's own lines:
    it must be found, exit as the page shows and print what it shows (numbers aside)."""
    commands = [c for c in page_commands(README) if not c.long]
    if any("../shared" in w for c in commands for w in c.argv) and not SHARED.is_dir():
        pytest.skip("a README command reads ../shared/data, which is absent here")
    workdir = scratch_checkout(tmp_path / "scratch")  # its own: the short commands' outputs would refuse a rerun
    (workdir / ".venv").unlink(missing_ok=True)
    (workdir / ".venv").symlink_to(ROOT / ".venv")
    script = ["set +e", "command -v encoderlab >/dev/null && echo 'encoderlab on the PATH before the set-up' && exit 9",
              *setup_lines()]
    for i, command in enumerate(commands):
        script += [f"echo '@@@ {i}'", shlex.join(["encoderlab", *command.argv]) + " 2>&1", "echo \"@@@ rc=$?\""]
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(script)], cwd=workdir, text=True,
                          capture_output=True, env=CLEAN_ENV | {"HOME": str(tmp_path)}, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    outputs = re.split(r"^@@@ (\d+)\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == 2 * len(commands), done.stdout[-3000:] + done.stderr[-2000:]
    for command, shown in zip(commands, outputs[1::2]):
        body, code = shown.rsplit("@@@ rc=", 1)
        got = body.splitlines()
        expects_error = any(line.startswith("error:") for line in command.output)
        assert (int(code) != 0) == expects_error, f"{command}: exit {code} in a fresh shell\n{body[-2000:]}"
        assert int(code) != 127, f"{command}: not found in a fresh shell after the set-up"
        assert _is_subsequence(normalized(command.output), normalized(got)), (
            f"{command}: the page shows\n" + "\n".join(command.output) + "\nbut a fresh shell prints\n" + body)


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("make") is None, reason="needs root and make, as the target does")
def test_make_test_installs_chromium_from_apt_when_absent(tmp_path):
    """`make test` (the README's test command) depends on `make chromium`, which installs Debian's chromium when it
    is absent, with root and apt-get: a stand-in apt-get on a PATH without chromium records what it is asked."""
    assert re.search(r"^test: .*\bchromium\b", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").symlink_to(shutil.which("id"))
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'apt.log'}\n", encoding="utf-8")
    apt.chmod(0o755)
    done = subprocess.run([shutil.which("make"), "-s", "chromium"], cwd=ROOT, env={"PATH": str(bin_dir)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "apt.log").read_text(encoding="utf-8").splitlines() == ["update -qq",
                                                                               "install -y -qq chromium"]
