"""``dstk explain``: a report of a plan for people (tables, optional pictures, or JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dstk.commands.plan import add_intent_arguments, intent_from_args
from dstk.errors import DstkError, UsageError

HELP = "explain a plan: memory per stage, the 1F1B timeline and bubble, comm vs compute, alternatives"
DESCRIPTION = (
    "Explain a plan from a run directory (written by `dstk generate`), a plan.json, or an intent (planned "
    "on the spot). Prints tables; with matplotlib installed (pip install 'dstk[explain]') --pictures DIR "
    "also writes memory.png/svg and schedule.png/svg. --format html prints one self-contained page (tables, "
    "pictures inline, why lines) to attach to a pull request or a ticket."
)


def configure(parser: argparse.ArgumentParser) -> None:
    add_intent_arguments(parser, positional_help="run directory, plan.json, or intent YAML")
    parser.add_argument("--pick", type=int, default=1, metavar="N", help="explain the N-th plan of an intent")
    parser.add_argument("--pictures", metavar="DIR", help="write PNG and SVG pictures into DIR (needs matplotlib)")
    parser.add_argument("--force", action="store_true", help="replace pictures already in --pictures DIR")
    parser.add_argument("--format", choices=["human", "json", "html"], default="human",
                        help="human: tables; json: the report as data; html: one self-contained page on stdout")


def _load_plan(args: argparse.Namespace) -> dict:
    target = Path(args.intent) if args.intent else None
    if target is not None and target.is_dir():
        target = target / "plan.json"
        if not target.is_file():
            raise UsageError(f"{args.intent} has no plan.json", hint="point at a directory written by `dstk generate`")
    if target is not None and target.suffix == ".json":
        try:
            plan = json.loads(target.read_text())
        except OSError as exc:
            raise UsageError(f"cannot read {target}: {exc.strerror}", hint="check the path") from None
        except json.JSONDecodeError as exc:
            raise DstkError(f"{target} is not JSON: {exc.msg}", location=f"{target}:{exc.lineno}:{exc.colno}",
                            hint="regenerate it with `dstk generate`") from None
        if not isinstance(plan, dict) or "layout" not in plan:
            raise DstkError(f"{target} is not a dstk plan (no \"layout\")", hint="regenerate it with `dstk generate`")
        return plan
    from dstk import plan as planner

    intent = intent_from_args(args)
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=None)
    if not result.plans:
        raise DstkError(planner.nothing_fits_message(ctx, result),
                        hint="; ".join(planner.suggest_fixes(intent)) or "no change dstk tried makes it fit")
    if not 1 <= args.pick <= len(result.plans):
        raise UsageError(f"--pick {args.pick}: {len(result.plans)} plans fit", hint=f"choose 1..{len(result.plans)}")
    return json.loads(planner.run_dir_files(ctx, result, index=args.pick - 1)["plan.json"])


def check_pictures_dir(directory: str, *, rep: dict, force: bool) -> None:
    """Refuse a ``--pictures`` path that cannot be a directory (a file, or a file above it: it was an
    internal error, ``FileExistsError``) and, without ``--force``, one that already holds a picture
    this run would write (memory.png/svg; schedule.png/svg for a pipeline): they were replaced
    silently, a file of the user's with them."""
    path = Path(directory)
    for above in (path, *path.parents):
        if above.exists() and not above.is_dir():
            if above == path:
                raise UsageError(f"--pictures {directory}: exists and is not a directory",
                                 hint=f"choose a directory path, e.g. {directory}-pictures")
            raise UsageError(f"--pictures {directory}: {above} is a file, so nothing can be made below it",
                             hint=f"choose a directory outside {above}")
    names = ["memory.png", "memory.svg"]
    if (rep.get("schedule") or {}).get("slots"):
        names += ["schedule.png", "schedule.svg"]
    taken = [str(path / n) for n in names if (path / n).exists()]
    if taken and not force:
        raise UsageError(f"--pictures {directory}: {', '.join(taken)} already exist{'s' if len(taken) == 1 else ''}",
                         hint="pass --force to replace them, or choose another directory")


def run(args: argparse.Namespace) -> int:
    from dstk import explain

    plan = _load_plan(args)
    cluster = plan.get("cluster", {})
    rep = explain.report(plan, usable_bytes=cluster.get("usable_bytes"), capacity_bytes=cluster.get("gpu_memory_bytes"))
    note = None
    if args.pictures:
        if explain.have_matplotlib():
            check_pictures_dir(args.pictures, rep=rep, force=args.force)
            try:
                written = explain.write_pictures(rep, args.pictures)
            except OSError as exc:
                raise DstkError(f"--pictures {args.pictures}: cannot write there: {exc.strerror or exc}",
                                hint="choose a writable directory") from None
            rep["pictures"] = [str(p) for p in written]
            note = "pictures: " + ", ".join(str(p) for p in written)
        else:
            rep["pictures"] = []
            note = explain.PICTURES_HINT
    elif not explain.have_matplotlib():
        note = f"(no pictures: {explain.PICTURES_HINT}, then pass --pictures DIR)"
    else:
        note = "(pass --pictures DIR for PNG/SVG charts)"
    if args.format == "html":
        pngs = explain.picture_pngs(rep) if explain.have_matplotlib() else None
        print(explain.render_html(rep, pngs=pngs, note=None if pngs else f"(no pictures: {explain.PICTURES_HINT})"),
              end="")
    elif args.format == "json":
        if args.pictures and not rep["pictures"]:
            rep["pictures_hint"] = explain.PICTURES_HINT
        print(json.dumps(rep, indent=2))
    else:
        explain.render_text(rep, pictures_note=note)
    return 0
