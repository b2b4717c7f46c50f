"""`encoderlab push`: a model folder uploaded to the Hugging Face Hub, with a model card written if it has none."""

from __future__ import annotations

import argparse
from pathlib import Path

from encoderlab.errors import CheckpointError, InputError
from encoderlab.folder import model_card
from encoderlab.hub import parse_hub_name, push
from encoderlab.io import atomic_write_text


def cmd_push(args: argparse.Namespace) -> None:
    """Upload a model folder to a Hub repository (created if missing), writing README.md from task.json and
    training.json when the folder has none."""
    folder, hub = Path(args.folder), parse_hub_name(args.repo)
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json here; push uploads a model folder (config.json + weights)")
    if hub is None or "/" not in hub.repo_id or "@" in args.repo:
        raise InputError(f"{args.repo!r}: expected a Hub repository id org/name (use --revision for a branch)")
    card = folder / "README.md"
    if not card.exists():
        atomic_write_text(card, model_card(folder, hub.repo_id))
        print(f"wrote {card} (from config.json, task.json and training.json)")
    url = push(folder, hub.repo_id, private=args.private, revision=args.revision, token=args.token)
    print(f"pushed {folder} to {hub.repo_id}{'@' + args.revision if args.revision else ''}: {url}")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `push` on the main parser's subparsers."""
    parser = subparsers.add_parser("push", help="upload a model folder to the Hugging Face Hub",
                                   description=cmd_push.__doc__)
    parser.add_argument("folder", metavar="FOLDER", help="a model folder (config.json, weights, tokenizer files)")
    parser.add_argument("repo", metavar="ORG/NAME", help="the Hub repository, created if missing")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", "--branch", default=None, metavar="BRANCH",
                        help="the branch to commit to, created if missing (default: main)")
    parser.add_argument("--token", default=None, metavar="TOKEN",
                        help="a Hub token with write access (default: HF_TOKEN, else the saved `hf auth login`)")
    parser.set_defaults(func=cmd_push)
