"""``dstk export``: a DeepSpeed checkpoint (pipeline or ZeRO) back to an HF directory."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

HELP = "write a DeepSpeed pipeline or ZeRO checkpoint as an HF directory that from_pretrained loads"
DESCRIPTION = (
    "Read the checkpoint DeepSpeed's save_checkpoint wrote (the tag named in CHECKPOINT_DIR/latest unless --tag "
    "is given): per-layer files of a dstk pipeline, or a ZeRO checkpoint of the unwrapped HF model. Write "
    "config.json and safetensors into --output, which must be new or empty (--force replaces an earlier export "
    "whole: a directory with a config.json and no subdirectories); they are written into a hidden sibling and "
    "renamed into place (swapped in one step over an old one), so a killed export leaves no --output or the old "
    "one, never a part of one or a mix of both. The HF architecture comes from "
    "--config, or from a config.json in the checkpoint directory, or for a `dstk finetune` run (its OUTPUT or "
    "OUTPUT/checkpoints) from the model it started from (OUTPUT/finetune.json). Exit 0 on success, 1 when the "
    "checkpoint does not match the architecture, a file of it is truncated or empty (the previous complete checkpoint is named), or "
    "`latest` points outside the directory, 2 on usage errors."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", metavar="CHECKPOINT_DIR", help="directory given to save_checkpoint")
    parser.add_argument("--output", "-o", required=True, metavar="HF_DIR", help="new HF directory to write")
    parser.add_argument("--config", metavar="HF_DIR|CONFIG_JSON",
                        help="the HF model the training started from (default: config.json beside the checkpoint)")
    parser.add_argument("--tag", help="checkpoint tag (subdirectory); default: the one in CHECKPOINT_DIR/latest")
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="dtype to save in (default: as saved)")
    parser.add_argument("--force", action="store_true",
                        help="replace an earlier export in --output whole (none of its files are kept)")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def run(args: argparse.Namespace) -> int:
    from dstk.commands.generate import refuse_stdout_dir
    from dstk.errors import require_train_stack

    refuse_stdout_dir(args.output, what="an HF model directory", hint="give a directory name, e.g. -o hf-model")
    require_train_stack("export", modules=("torch", "transformers", "safetensors"))
    from dstk.pipeline.export import export_hf
    from dstk.train.integrity import check_export, finetune_model_config, refuse_lora_export

    run = Path(args.checkpoint_dir)
    if (run / "finetune.json").is_file() and (run / "checkpoints").is_dir() and not (run / "latest").exists():
        args.checkpoint_dir = str(run / "checkpoints")  # the run directory given for its checkpoints
        print(f"{run} is a `dstk finetune` run: exporting its checkpoints, {args.checkpoint_dir}", file=sys.stderr)
    refuse_lora_export(args.checkpoint_dir)
    if args.config is None and (source := finetune_model_config(args.checkpoint_dir, tag=args.tag)) is not None:
        print(f"the model config: {source} (the model this finetune run started from, in its finetune.json)",
              file=sys.stderr)
        args.config = source

    # A truncated or empty file, a `latest` outside the directory, an empty config.json: named here,
    # before torch.load or AutoConfig fail on them.
    check_export(args.checkpoint_dir, tag=args.tag, config=args.config, output=args.output)

    # DeepSpeed's logger (imported by transformers) writes to stdout; keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        result = export_hf(args.checkpoint_dir, args.output, config=args.config, tag=args.tag, dtype=args.dtype,
                           force=args.force)
    if args.format == "json":
        json.dump({"output_dir": str(result.output_dir), "kind": result.kind, "tag_dir": str(result.tag_dir),
                   "num_tensors": result.num_tensors, "num_params": result.num_params}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"exported {result.kind} checkpoint {result.tag_dir} -> {result.output_dir} "
              f"({result.num_tensors} tensors, {result.num_params:,} parameters)")
    return 0
