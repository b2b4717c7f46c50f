"""`encoderlab export onnx`: a checkpoint or fine-tuned folder as one self-contained ONNX folder for onnxruntime."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from encoderlab.choices import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from encoderlab.choices import ONNX_KINDS as KINDS
from encoderlab.cli.options import add_json, add_model, add_overwrite
from encoderlab.io import check_export_folder


def cmd_export_onnx(args: argparse.Namespace) -> None:
    """Export a checkpoint or fine-tuned folder to one ONNX folder: model.onnx, its settings (model.onnx.json),
    config.json and the tokenizer files."""
    check_export_folder(args.out, args.overwrite, args.model)  # before torch loads
    from encoderlab.infer.onnx import export_onnx

    result = export_onnx(args.model, args.out, int8=args.int8, kind=args.kind, opset=args.opset,
                         overwrite=args.overwrite)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    size = f"{result['bytes'] / 1e6:.1f} MB"
    if args.int8:
        size += f", int8: {result['bytes'] / result['fp32_bytes']:.0%} of fp32's {result['fp32_bytes'] / 1e6:.1f} MB"
    check = "" if result["max_abs_diff"] is None else f"; max |torch - onnxruntime| {result['max_abs_diff']:.1e}"
    print(f"wrote {result['path']} ({size}); {result['task']} outputs {', '.join(result['outputs'])}; "
          f"opset {result['opset']}{check}")
    print(f"wrote {Path(result['sidecar']).name}, config.json" + (" and the tokenizer files" if result["tokenizer"]
          else " (no tokenizer: the source has none)") + f" in {Path(result['path']).parent}")


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register `export onnx` on the main parser's subparsers."""
    export = subparsers.add_parser("export", help="export a model to another format (ONNX)",
                                   description="Export a model to another format.")
    formats = export.add_subparsers(dest="format", required=True, metavar="FORMAT")
    onnx = formats.add_parser("onnx", help="ONNX for onnxruntime, optionally int8", description=cmd_export_onnx.__doc__)
    add_model(onnx, "checkpoint folder, alias ('minilm'), Hub name, or any fine-tuned folder (its task's outputs)")
    onnx.add_argument("--out", required=True, metavar="DIR",
                      help="the export folder: DIR/model.onnx, DIR/model.onnx.json (its settings), config.json and the "
                           "tokenizer files (an absent or empty folder, unless --overwrite)")
    add_overwrite(onnx)
    onnx.add_argument("--int8", action="store_true",
                      help="dynamic int8 quantization of the linear layers and embeddings (about 1/4 of the size)")
    onnx.add_argument("--kind", choices=KINDS, default="base",
                      help="base: hidden states, or a fine-tuned folder's task outputs; mlm: masked-LM logits "
                           "(default: base)")
    onnx.add_argument("--opset", type=int, default=DEFAULT_OPSET, metavar="N",
                      help=f"ONNX opset, {MIN_OPSET} to {MAX_OPSET} (default: {DEFAULT_OPSET})")
    add_json(onnx, "print what was written as JSON")
    onnx.set_defaults(func=cmd_export_onnx)
