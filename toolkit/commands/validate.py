"""``dstk validate``: check DeepSpeed configs before DeepSpeed does."""

from __future__ import annotations

import argparse
import json
import os
import sys

from dstk.errors import EXIT_INVALID, EXIT_OK, DstkError, UsageError

HELP = "check DeepSpeed config files against the schema of your DeepSpeed release (0.14-0.19) and the cross-field rules"
DESCRIPTION = (
    "Check DeepSpeed config files (JSON or hjson, as DeepSpeed reads them) against one release's schema (0.14-0.19: "
    "--deepspeed-version, else [tool.dstk] deepspeed_version, the installed deepspeed, a pin in the repository, "
    "the newest; said on stderr): every key against the "
    "schema of what DeepSpeed reads (unknown keys are errors at every level), removed keys, \"auto\", the batch "
    "triad against the data-parallel size (world size / (TP x PP)), precision, ZeRO/offload, pipeline, AutoTP, "
    "optimizer and scheduler names and parameters. All findings of all files are reported. Settings (ignored "
    "codes, world size, TP/PP, --hf, per-file overrides) are also read from [tool.dstk] in the nearest "
    "pyproject.toml above each file; flags win. "
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
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="config files (JSON or hjson); - reads one from standard input, reported as <stdin>")
    parser.add_argument("--world-size", type=_positive, metavar="N", help="total ranks; checks the batch triad")
    parser.add_argument("--tensor-parallel", type=_positive, metavar="T", help="tensor-parallel degree (default 1)")
    parser.add_argument("--pipeline-stages", type=_positive, metavar="P", help="pipeline stages (default 1)")
    parser.add_argument("--hf", action=argparse.BooleanOptionalAction, default=None,
                        help='the file is read by HF transformers\' Trainer, which fills "auto" values '
                             "(--no-hf overrides hf = true in [tool.dstk])")
    parser.add_argument("--strict", action="store_true", help="warnings make a file invalid")
    parser.add_argument("--ignore", action="append", default=[], metavar="CODE[,CODE]",
                        help="drop findings with these codes (added to [tool.dstk] ignore); repeatable")
    parser.add_argument("--no-project", action="store_true",
                        help="do not read [tool.dstk] from the nearest pyproject.toml")
    parser.add_argument("--format", choices=["text", "human", "json", "github", "sarif"], default="text",
                        help="text (= human) for people, json for scripts, github for Actions annotations, "
                             "sarif (2.1.0) for GitHub code scanning")
    parser.add_argument("--deepspeed", action="store_true",
                        help="also run DeepSpeed's own parser (DeepSpeedConfig) on each file and report its verdict "
                             "(slow; a rejection makes the file invalid)")
    parser.add_argument("--training-args", metavar="FILE",
                        help="training_args.json (TrainingArguments.to_json_string()): report every explicit value "
                             "that disagrees with it (DS240) and optimizer/scheduler blocks that replace it (DS241)")
    parser.add_argument("--deepspeed-version", metavar="X",
                        help="check against this DeepSpeed release's schema (0.14 or 0.14.5: the nearest shipped minor, "
                             "0.14-0.19); default: [tool.dstk] deepspeed_version, else the installed deepspeed, else a "
                             "pin in the repository's requirements*.txt/pyproject.toml, else the newest")
    parser.add_argument("--gpu", metavar="SLUG",
                        help="the GPU the config trains on (a slug from `dstk gpus`, or a unique prefix: v100): "
                             "precision it lacks is DS250 (bf16 on a V100); also gpu = \"...\" in [tool.dstk]")


def run(args: argparse.Namespace) -> int:
    from dstk.findings import Finding, has_errors, render_github, render_text
    from dstk.validate import foreign_file, read_document, validate_document
    from dstk.validate.project import Settings, parse_codes, settings_for
    from dstk.validate.schema import using
    from dstk.validate.versions import nearest_finding, select
    from dstk.validate.source import STDIN_LOCATION, read_stdin

    cli_ignore = frozenset().union(*(parse_codes(text, where="--ignore") for text in args.ignore))
    training_args = None
    if getattr(args, "training_args", None):
        from dstk.validate.training_args import read_training_args

        training_args = read_training_args(args.training_args)
    if args.paths.count("-") > 1:
        raise UsageError("- (standard input) is given more than once",
                         hint="standard input holds one config: pass - once, and the other configs as paths")
    results = []
    unreadable = []
    for path in args.paths:
        data = None
        if path == "-":
            # settings as for a file in the working directory: the pyproject.toml above it applies
            data, doc = read_stdin()
            path, where = STDIN_LOCATION, os.path.join(os.getcwd(), STDIN_LOCATION)
        elif os.path.isdir(path):
            run_dir = os.path.isfile(os.path.join(path, "ds_config.json"))
            unreadable.append((path, "is a directory" + (
                f" (a run directory: validate {os.path.join(path, 'ds_config.json')}, and "
                f"{os.path.join(path, 'ds_config.hf.json')} with --hf)" if run_dir else "")))
            continue
        else:
            try:
                doc = read_document(path)
            except OSError as exc:
                unreadable.append((path, exc.strerror or str(exc)))
                continue
            where = path
        project = Settings() if args.no_project else settings_for(where)
        options = _options(args, project)
        try:
            selection = select(flag=args.deepspeed_version, project_version=project.deepspeed_version,
                               project_source=project.source, config_path=where)
        except ValueError as exc:
            raise UsageError(str(exc), hint="e.g. --deepspeed-version 0.14 (shipped: 0.14 to 0.19)") from None
        foreign = foreign_file(path) if path != STDIN_LOCATION else None  # an accelerate/axolotl YAML
        with using(selection.minor):
            findings = [foreign] if foreign is not None else validate_document(doc, **options)
        if training_args is not None and isinstance(doc.config, dict):
            from dstk.validate import locate
            from dstk.validate.training_args import training_args_findings

            findings += locate(training_args_findings(doc.config, training_args,
                                                      world_size=options["world_size"]), doc)
            findings.sort(key=lambda f: (f.line is None, f.line or 0, f.column or 0))
        gpu_slug = args.gpu or project.gpu
        if gpu_slug and isinstance(doc.config, dict):
            from dstk.validate import locate
            from dstk.validate.gpu import gpu_findings, resolve_gpu

            gpu = resolve_gpu(gpu_slug, where="--gpu" if args.gpu else f"{project.source} [tool.dstk] gpu =")
            findings += locate(gpu_findings(doc.config, gpu=gpu, training_args=training_args), doc)
            findings.sort(key=lambda f: (f.line is None, f.line or 0, f.column or 0))
        extra = nearest_finding(selection)
        if extra is not None:
            findings.insert(0, extra)
        results.append(dict(path=path, doc=doc, findings=findings, options=options, project=project,
                            ignore=cli_ignore | project.ignore, data=data, selection=selection))
    if unreadable and not results:
        path, why = unreadable[0]
        raise UsageError(f"cannot read {path}: {why}", hint="pass paths of readable config files")
    for path, why in unreadable:
        print(f"error: cannot read {path}: {why}", file=sys.stderr)

    verdicts = _deepspeed_verdicts(results, training_args=training_args) if args.deepspeed else {}
    for r in results:
        ds = verdicts.get(r["path"])
        if ds is not None and not ds["accepted"]:
            r["findings"].append(Finding(severity="error", code="DS301", message=f"DeepSpeed's own parser rejects "
                                         f"the file: {ds['error']}", hint="fix what DeepSpeed names"))
        kept = [f for f in r["findings"] if f.code not in r["ignore"]]
        r["ignored"] = len(r["findings"]) - len(kept)
        r["findings"] = kept

    invalid = False
    files = []
    for r in results:
        path, findings = r["path"], r["findings"]
        valid = not has_errors(findings, strict=args.strict)
        invalid |= not valid
        entry = {"path": path, "valid": valid, "findings": [f.to_dict() for f in findings],
                 "deepspeed_schema": r["selection"].release, "deepspeed_version": r["selection"].to_dict()}
        if r["ignored"]:
            entry["ignored"] = r["ignored"]
        if r["project"].source:
            entry["project"] = r["project"].source
        if path in verdicts:
            entry["deepspeed"] = verdicts[path]
        files.append(entry)
        if args.format in ("text", "human"):
            if r["selection"].reason != (files[-2]["deepspeed_version"]["reason"] if len(files) > 1 else None):
                print(f"{path}: checked against {r['selection'].reason}", file=sys.stderr)
            if findings:
                print(render_text(path, findings))
            ds = verdicts.get(path)
            notes = ""
            if ds is not None:
                notes += "; DeepSpeed: accepts" if ds["accepted"] else "; DeepSpeed: rejects"
            if r["ignored"]:
                notes += f"; {r['ignored']} ignored"
            if r["project"].source:
                notes += f"; settings from {r['project'].source}"
            n_err = sum(f.severity == "error" for f in findings)
            n_warn = len(findings) - n_err
            counts = f"{n_err} error{'s' * (n_err != 1)}, {n_warn} warning{'s' * (n_warn != 1)}"
            print(f"{path}: {'ok' if valid else 'invalid'} ({counts}){notes}")
        elif args.format == "github" and findings:
            print(render_github(path, findings))
    if args.format == "json":
        print(json.dumps({"files": files}, indent=2))
    elif args.format == "sarif":
        from dstk import __version__
        from dstk.findings import render_sarif
        from dstk.validate.codes import CODES

        sarif = json.loads(render_sarif([(r["path"], r["findings"]) for r in results], rules=CODES, tool="dstk",
                                        version=__version__))
        sarif["runs"][0]["properties"] = {"deepspeedVersions": [{"path": r["path"], **r["selection"].to_dict()}
                                                                for r in results]}
        print(json.dumps(sarif, indent=2))
    if unreadable:
        return 2
    return EXIT_INVALID if invalid else EXIT_OK


def _options(args: argparse.Namespace, project) -> dict:
    """Command line first, then [tool.dstk] (with its per-file overrides), then the defaults."""
    def pick(flag, setting, default):
        return flag if flag is not None else setting if setting is not None else default

    return dict(world_size=pick(args.world_size, project.world_size, None),
                tensor_parallel=pick(args.tensor_parallel, project.tensor_parallel, 1),
                pipeline_stages=pick(args.pipeline_stages, project.pipeline_stages, 1),
                hf=pick(args.hf, project.hf, False))


def _deepspeed_verdicts(results: list[dict], *, training_args: dict | None = None) -> dict:
    """DeepSpeed's verdict on each file, given the file itself (DeepSpeed reads it with hjson and its
    duplicate-key check), except under --hf, where ``"auto"`` is first filled as the Trainer fills it from
    what is known (``fill_auto``: the file, --training-args, --world-size; nothing invented) and the filled
    dict is handed over; each ``"auto"`` nothing fills is a DS242 warning added to the file's findings."""
    import subprocess

    from dstk.errors import require_train_stack
    from dstk.validate.deepspeed_check import parse_many

    require_train_stack("validate --deepspeed", modules=("torch", "deepspeed"))
    import tempfile

    jobs, paths = [], []
    tmp = tempfile.TemporaryDirectory(prefix="dstk-validate-")
    for r in results:
        o = r["options"]
        dp = 1
        if o["world_size"]:
            dp = max(o["world_size"] // (o["tensor_parallel"] * o["pipeline_stages"]), 1)
        if o["hf"]:
            if not isinstance(r["doc"].config, dict):
                continue
            from dstk.validate import locate
            from dstk.validate.training_args import fill_auto, unfilled_findings

            filled = fill_auto(r["doc"].config, training_args=training_args, world_size=o["world_size"])
            r["findings"] += locate(unfilled_findings(filled), r["doc"])
            r["findings"].sort(key=lambda f: (f.line is None, f.line or 0, f.column or 0))
            jobs.append({"config": filled.config, "dp": dp, "fill": False})
        elif r["data"] is not None:  # standard input: DeepSpeed reads a file, so give it the same bytes as one
            copy = os.path.join(tmp.name, "stdin.json")
            with open(copy, "wb") as fh:
                fh.write(r["data"])
            jobs.append({"config": copy, "dp": dp, "fill": False})
        else:
            jobs.append({"config": os.path.abspath(r["path"]), "dp": dp, "fill": False})
        paths.append(r["path"])
    try:
        verdicts = parse_many(jobs)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise DstkError(f"could not run DeepSpeed's parser: {exc}",
                        hint="check that deepspeed imports (`python -c 'import deepspeed'`), or drop --deepspeed") from None
    finally:
        tmp.cleanup()
    return {p: {"accepted": v.accepted, "error": v.error} for p, v in zip(paths, verdicts)}
