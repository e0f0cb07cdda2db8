"""``dstk import``: turn another tool's training setup into a dstk intent, saying what was carried and dropped."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dstk.errors import UsageError

HELP = "write the dstk intent implied by an accelerate / LLaMA-Factory / axolotl / HF / Megatron setup"
DESCRIPTION = (
    "Read a training setup (accelerate config YAML, LLaMA-Factory or axolotl YAML, HF TrainingArguments JSON or "
    "run_clm.py-style flags, a Megatron argument list; a DeepSpeed JSON it names is followed) and write the dstk "
    "intent it implies, with one line per value carried, dropped (and why) or assumed. Values the file fixes "
    "(ZeRO stage, offload, micro-batch, tp/pp) become constraints. Flags win over the file. Local files only. "
    "`dstk plan/generate/estimate/explain/finetune --from FILE` do the same in memory. FILE - is standard input. "
    "See docs/import.md."
)


def configure(parser: argparse.ArgumentParser) -> None:
    from dstk.commands.plan import add_intent_arguments
    from dstk.importers import KINDS

    parser.add_argument("file", metavar="FILE",
                        help="the file to import; - reads it from standard input (the format is told from the "
                             "content; --kind when it cannot be)")
    parser.add_argument("--kind", choices=KINDS, help="the file's format (default: detected from its content)")
    parser.add_argument("--output", "-o", metavar="INTENT_YAML",
                        help="write the intent here (default: print it to stdout, the report to stderr)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --output file")
    parser.add_argument("--format", choices=["human", "json"], default="human")
    add_intent_arguments(parser, positional=False, with_from=False)


def overrides_from_args(args: argparse.Namespace, *, base_per_node: int | None = None) -> dict[str, dict]:
    """The intent flags of ``add_intent_arguments`` as sections (``--gpus`` split into nodes x GPUs)."""
    overrides: dict[str, dict] = {"model": {}, "cluster": {}, "training": {}, "constraints": {}}
    for key, value in vars(args).items():
        if key.startswith("i_") and "__" in key and value is not None:
            section, field = key[2:].split("__", 1)
            overrides[section][field] = value
    gpus = getattr(args, "i_gpus", None)
    if gpus is not None:
        per_node = overrides["cluster"].get("gpus_per_node") or base_per_node or min(gpus, 8)
        if gpus % per_node:
            raise UsageError(f"--gpus {gpus} is not a multiple of --gpus-per-node {per_node}",
                             hint="give a multiple, or set --gpus-per-node")
        overrides["cluster"].update(num_nodes=gpus // per_node, gpus_per_node=per_node)
    return overrides


def _write_atomically(path: str, text: str) -> None:
    import tempfile

    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dstk-import-", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", hint="check the directory exists and is "
                         "writable") from None


def run(args: argparse.Namespace) -> int:
    from dstk.importers import import_file, render_intent_yaml, report_lines

    if args.output and os.path.exists(args.output) and not args.force:
        raise UsageError(f"{args.output} exists", hint="pass --force to overwrite it, or choose another --output")
    result = import_file(args.file, kind=args.kind, overrides=overrides_from_args(args))
    text = render_intent_yaml(result)
    if args.output:
        _write_atomically(args.output, text)
    if args.format == "json":
        data = result.to_dict()
        data["output"] = args.output
        if not args.output:
            data["intent_yaml"] = text
        print(json.dumps(data, indent=2))
        return 0
    lines = [f"{result.source}: {result.kind}"] + [f"  {line}" for line in report_lines(result)]
    if args.output:
        lines.append(f"wrote {args.output}; next: dstk plan {args.output}")
        print("\n".join(lines))
    else:
        sys.stdout.write(text)
        print("\n".join(lines), file=sys.stderr)
    return 0
