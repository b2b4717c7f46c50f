"""A loopback Hub for the tests: a small HTTP server on 127.0.0.1 that answers the routes huggingface_hub 2.4 calls
for snapshot_download (repo info, tree, resolve) and for push (create repo, validate-yaml, preupload, commit), and
the routes datasets 5.2's load_dataset calls for a dataset repository (repo info, tree, paths-info, resolve). Nothing
leaves the machine: every CLI run is a subprocess with HF_ENDPOINT set to the loopback server and HF_HOME to a
temporary folder. Used by tests/test_hub.py (models) and tests/test_hub_datasets.py (datasets)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]


class Repo:
    """A repository: commits (sha -> {path: bytes}) and refs (branch or tag -> sha)."""

    def __init__(self) -> None:
        self.commits: dict[str, dict[str, bytes]] = {}
        self.refs: dict[str, str] = {}

    def commit(self, files: dict[str, bytes], ref: str = "main") -> str:
        """Add a commit holding `files` and point `ref` at it; returns its sha."""
        sha = hashlib.sha1(json.dumps(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items()))
                           .encode() + ref.encode()).hexdigest()
        self.commits[sha], self.refs[ref] = dict(files), sha
        return sha

    def resolve(self, revision: str) -> str | None:
        """A branch, a tag or a commit sha -> the sha, or None."""
        return revision if revision in self.commits else self.refs.get(revision)


class LoopbackHub(ThreadingHTTPServer):
    """The server: model repos and dataset repos by id, and every request's method and path (to check what was
    asked)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos: dict[str, Repo] = {}
        self.datasets: dict[str, Repo] = {}
        self.requests: list[str] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _entry(name: str, data: bytes) -> dict:
    """A file as the tree and paths-info routes describe it."""
    return {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}


def _folders(files: dict[str, bytes]) -> set[str]:
    """Every folder that holds a file, at any depth."""
    return {"/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)}


def tree(files: dict[str, bytes], under: str, recursive: bool) -> list[dict]:
    """The entries under a folder ("" for the root): files and folders, its children only unless recursive."""
    prefix = f"{under}/" if under else ""
    entries = [_entry(name, data) for name, data in files.items() if name.startswith(prefix)]
    entries += [{"type": "directory", "path": folder, "oid": "0" * 40} for folder in sorted(_folders(files))
                if folder.startswith(prefix)]
    if not recursive:
        entries = [e for e in entries if "/" not in e["path"][len(prefix):]]
    return entries


class Handler(BaseHTTPRequestHandler):
    """Just the routes huggingface_hub's snapshot_download, create_repo, create_branch and upload_folder call, and
    those datasets' load_dataset calls."""

    server: LoopbackHub

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, data, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, json.dumps(data).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _missing(self, code: str) -> None:
        self._json({"error": code}, 404, {"X-Error-Code": code})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _route(self) -> tuple[Repo | None, str, str, list[str]]:
        """(the repo, its id, operation, the rest's segments) of /api/models/ORG/NAME/OP/..., /ORG/NAME/resolve/...,
        /api/datasets/ORG/NAME/OP/... or /datasets/ORG/NAME/resolve/..."""
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        repos = self.server.repos
        if parts[:2] in (["api", "models"], ["api", "datasets"]):
            repos = self.server.datasets if parts[1] == "datasets" else repos
            parts = parts[2:]
        elif parts[:1] == ["datasets"]:
            repos, parts = self.server.datasets, parts[1:]
        repo_id = "/".join(parts[:2])
        return repos.get(repo_id), repo_id, parts[2] if len(parts) > 2 else "", parts[3:]

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def do_GET(self, head: bool = False) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        repo, repo_id, op, rest = self._route()
        if repo is None:
            return self._missing("RepoNotFound")
        if not op:  # /api/datasets/ORG/NAME: the info of main
            op, rest = "revision", ["main"]
        sha = repo.resolve(rest[0]) if rest else None  # snapshot_download resolves files by commit sha
        if sha is None:
            return self._missing("RevisionNotFound")
        files = repo.commits[sha]
        if op == "revision":
            return self._json({"id": repo_id, "sha": sha, "private": False,
                               "siblings": [{"rfilename": name} for name in files]})
        if op == "tree":
            recursive = parse_qs(urlsplit(self.path).query).get("recursive", ["false"])[0].lower() == "true"
            return self._json(tree(files, "/".join(rest[1:]), recursive))
        name = "/".join(rest[1:])
        if op != "resolve" or name not in files:
            return self._missing("EntryNotFound")
        data = files[name]
        self._send(200, data, {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}, head=head)

    def do_POST(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")
        body = self._body()
        if self.path.startswith("/api/repos/create"):
            payload = json.loads(body)
            repo_id = "/".join(filter(None, (payload.get("organization"), payload["name"])))
            self.server.repos.setdefault(repo_id, Repo()).private = payload.get("visibility") == "private"
            return self._json({"url": f"{self.server.endpoint}/{repo_id}"})
        if self.path.startswith("/api/validate-yaml"):
            return self._json({"errors": [], "warnings": []})
        repo, repo_id, op, rest = self._route()
        if repo is None:
            return self._missing("RepoNotFound")
        if op == "paths-info":
            return self._paths_info(repo, rest[0], body)
        if op == "branch":
            repo.refs.setdefault(rest[0], repo.refs.get("main") or repo.commit({}, rest[0]))
            return self._json({})
        if op == "preupload":
            return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in json.loads(body)["files"]]})
        if op == "commit":
            return self._commit(repo, repo_id, rest[0], body)
        self._missing("EntryNotFound")

    def _paths_info(self, repo: Repo, revision: str, body: bytes) -> None:
        """The files and folders among the paths asked for (a form or JSON body of `paths`)."""
        sha = repo.resolve(revision)
        if sha is None:
            return self._missing("RevisionNotFound")
        files = repo.commits[sha]
        try:
            asked = json.loads(body)["paths"]
        except (ValueError, KeyError):
            asked = parse_qs(body.decode()).get("paths", [])
        folders = _folders(files)
        self._json([_entry(p, files[p]) if p in files else {"type": "directory", "path": p, "oid": "0" * 40}
                    for p in asked if p in files or p in folders])

    def _commit(self, repo: Repo, repo_id: str, branch: str, body: bytes) -> None:
        """An ndjson commit of base64 files, on top of the branch."""
        files = dict(repo.commits.get(repo.refs.get(branch, ""), {}))
        for line in body.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        sha = repo.commit(files, branch)
        self._json({"commitUrl": f"{self.server.endpoint}/{repo_id}/commit/{sha}", "commitOid": sha,
                    "pullRequestUrl": None})


@pytest.fixture
def loopback():
    """A running loopback Hub, shut down after the test."""
    server = LoopbackHub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def folder_files(folder: Path) -> dict[str, bytes]:
    """Every file under a folder, by its path inside it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def hub_env(tmp_path: Path, server: LoopbackHub | None, offline: bool = False) -> dict[str, str]:
    """The environment of a CLI run: its own HF_HOME, the loopback endpoint, offline or not. datasets also pings
    S3 to count a download (HF_UPDATE_DOWNLOAD_COUNTS=0 stops it) and asks the dataset viewer, at the endpoint's
    host with `datasets-server.` before it, for a repository's exported infos: HTTP_PROXY sends that request to the
    loopback server (which answers 404, as for a repository the viewer does not know) instead of a DNS lookup."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k.upper() not in PROXIES}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1" if offline else "0", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT / "src"), "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5",
            "HF_UPDATE_DOWNLOAD_COUNTS": "0"}
    if server is not None:
        env |= {"HF_ENDPOINT": server.endpoint, "HTTP_PROXY": server.endpoint, "NO_PROXY": "127.0.0.1,localhost"}
    return env


def cli(env: dict[str, str], *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`encoderlab ARGV` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "encoderlab", *argv], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one error line of a run that exited 2 (a download's progress bars may come before it)."""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and done.stderr.rstrip().endswith(errors[0]), done.stderr
    return errors[0]
