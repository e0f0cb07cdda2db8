"""``dstk validate``: check DeepSpeed configs before DeepSpeed does."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from dstk.errors import EXIT_INVALID, EXIT_OK, DstkError, UsageError

HELP = "check DeepSpeed config files against the 0.19.8 schema and the cross-field rules"
DESCRIPTION = (
    "Check DeepSpeed 0.19.8 config files (JSON or hjson, as DeepSpeed reads them): every key against the "
    "schema of what DeepSpeed reads (unknown keys are errors at every level), removed keys, \"auto\", the batch "
    "triad against the data-parallel size (world size / (TP x PP)), precision, ZeRO/offload, pipeline, AutoTP, "
    "optimizer and scheduler names and parameters. All findings of all files are reported. "
    "Exit 0 valid (warnings allowed unless --strict), 1 any file invalid, 2 usage error or unreadable path."
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="config files (JSON or hjson)")
    parser.add_argument("--world-size", type=_positive, metavar="N", help="total ranks; checks the batch triad")
    parser.add_argument("--tensor-parallel", type=_positive, default=1, metavar="T", help="tensor-parallel degree")
    parser.add_argument("--pipeline-stages", type=_positive, default=1, metavar="P", help="pipeline stages")
    parser.add_argument("--hf", action="store_true",
                        help='the file is read by HF transformers\' Trainer, which fills "auto" values')
    parser.add_argument("--strict", action="store_true", help="warnings make a file invalid")
    parser.add_argument("--format", choices=["text", "human", "json", "github"], default="text",
                        help="text (= human) for people, json for scripts, github for Actions annotations")
    parser.add_argument("--deepspeed", action="store_true",
                        help="also run DeepSpeed's own parser (DeepSpeedConfig) and report its verdict (slow)")


def run(args: argparse.Namespace) -> int:
    from dstk.findings import has_errors, render_github, render_text
    from dstk.validate import read_document, validate_document

    options = dict(world_size=args.world_size, tensor_parallel=args.tensor_parallel,
                   pipeline_stages=args.pipeline_stages, hf=args.hf)
    results = []
    unreadable = []
    for path in args.paths:
        if os.path.isdir(path):
            unreadable.append((path, "is a directory"))
            continue
        try:
            doc = read_document(path)
        except OSError as exc:
            unreadable.append((path, exc.strerror or str(exc)))
            continue
        results.append((path, doc, validate_document(doc, **options)))
    if unreadable and not results:
        path, why = unreadable[0]
        raise UsageError(f"cannot read {path}: {why}", hint="pass paths of readable config files")
    for path, why in unreadable:
        print(f"error: cannot read {path}: {why}", file=sys.stderr)

    verdicts = {}
    if args.deepspeed:
        verdicts = _deepspeed_verdicts(results, args)

    invalid = False
    files = []
    for path, _doc, findings in results:
        valid = not has_errors(findings, strict=args.strict)
        invalid |= not valid
        entry = {"path": path, "valid": valid, "findings": [f.to_dict() for f in findings]}
        if path in verdicts:
            entry["deepspeed"] = verdicts[path]
        files.append(entry)
        if args.format in ("text", "human"):
            if findings:
                print(render_text(path, findings))
            ds = verdicts.get(path)
            ds_note = ""
            if ds is not None:
                ds_note = "; DeepSpeed: accepts" if ds["accepted"] else f"; DeepSpeed: rejects ({ds['error']})"
            n_err = sum(f.severity == "error" for f in findings)
            n_warn = len(findings) - n_err
            counts = f"{n_err} error{'s' * (n_err != 1)}, {n_warn} warning{'s' * (n_warn != 1)}"
            print(f"{path}: {'ok' if valid else 'invalid'} ({counts}){ds_note}")
        elif args.format == "github" and findings:
            print(render_github(path, findings))
    if args.format == "json":
        print(json.dumps({"files": files}, indent=2))
    if unreadable:
        return 2
    return EXIT_INVALID if invalid else EXIT_OK


def _deepspeed_verdicts(results, args) -> dict:
    from dstk.validate.deepspeed_check import parse_many

    dp = 1
    if args.world_size:
        dp = max(args.world_size // (args.tensor_parallel * args.pipeline_stages), 1)
    jobs, paths = [], []
    for path, doc, _ in results:
        if isinstance(doc.config, dict):
            jobs.append({"config": doc.config, "dp": 1 if args.hf else dp, "fill": args.hf})
            paths.append(path)
    try:
        verdicts = parse_many(jobs)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise DstkError(f"could not run DeepSpeed's parser: {exc}",
                        hint="check that deepspeed imports (`python -c 'import deepspeed'`), or drop --deepspeed") from None
    return {p: {"accepted": v.accepted, "error": v.error} for p, v in zip(paths, verdicts)}
