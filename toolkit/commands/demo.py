"""``dstk demo``: the embedded default, end to end on this machine's CPUs.

plan -> generate -> validate -> fine-tune a tiny Llama-style model on 2 CPU ranks (gloo, the
real DeepSpeed engine) on the corpus bundled with dstk, then show the loss and where the exported
HF model is. No GPU and no network. Each step is the same code path as its own command.
DeepSpeed's and torch's INFO/WARNING lines (the launcher's hostfile, world info and spawned
commands; the ranks' accelerator and scheduler warnings) go to DIR/logs/launch.log with the whole
launch, not to the terminal; --verbose prints them too. On a terminal the progress is one line
redrawn in place (``dstk.train.logs``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, TextIO

from dstk.errors import UsageError

HELP = "run the embedded default: plan, generate, validate and fine-tune a tiny model on 2 CPU ranks"
DESCRIPTION = __doc__

MARKER = ".dstk-demo"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", "-o", default="dstk-demo", metavar="DIR",
                        help="directory for the demo's files (default: ./dstk-demo; a previous demo there is replaced)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of the fine-tune (default 100)")
    parser.add_argument("--skip-finetune", action="store_true",
                        help="stop after plan, generate and validate (no DeepSpeed processes)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also print DeepSpeed's and torch's INFO/WARNING lines (always kept in DIR/logs/launch.log)")


def is_launcher_log(line: str) -> bool:
    """True for DeepSpeed's and torch's INFO/WARNING lines, the launcher's or a rank's
    (``dstk.train.logs.is_noise``); errors and dstk's own lines are not."""
    from dstk.train.logs import is_noise

    return is_noise(line)


def launch_sink(*, log: TextIO, verbose: bool) -> Callable[[str, str], None]:
    """A ``dstk.launch.run_launch`` sink (``dstk.train.logs.RunSink``): every line into ``log``; on the
    terminal all but DeepSpeed's and torch's INFO/WARNING lines (all of them with ``verbose``), each
    stream to its own, the progress records drawn as one line in place when stdout is a terminal."""
    from dstk.train.logs import RunSink

    return RunSink(log=log, verbose=verbose, live=sys.stdout.isatty(), out=sys.stdout, err=sys.stderr)


def _step(title: str) -> None:
    print(f"\n== {title}", flush=True)


def _prepare_output(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).exists():
            raise UsageError(
                f"{out} exists and was not made by `dstk demo`; refusing to touch it",
                hint="pass --output NEW_DIR, or remove the directory yourself",
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("made by dstk demo; `dstk demo` replaces this directory\n")


def run(args: argparse.Namespace) -> int:
    from dstk.cli import main as dstk
    from dstk.errors import require_train_stack

    require_train_stack("demo")
    from dstk.resources import template

    if args.steps < 1:
        raise UsageError(f"--steps: expected a positive integer, got {args.steps}", hint="use --steps 100")
    from dstk.commands.generate import refuse_stdout_dir

    refuse_stdout_dir(args.output, what="the demo's directory",
                      hint="pass --output DIR, or leave it out for ./dstk-demo")
    out = Path(args.output)
    _prepare_output(out)
    run_dir, ft_dir = out / "run", out / "finetune"
    started = time.perf_counter()
    with template("intents", "tiny-llama-cpu.yaml").open("rb") as src:
        intent = out / "intent.yaml"
        intent.write_bytes(src.read())

    _step(f"1/4 plan: {intent} (a tiny Llama-style model on 2 CPU ranks)")
    rc = dstk(["plan", str(intent), "--train-steps", str(args.steps)])
    if rc:
        return rc

    _step(f"2/4 generate: the best plan as configs in {run_dir}")
    rc = dstk(["generate", str(intent), "--output", str(run_dir), "--train-steps", str(args.steps)])
    if rc:
        return rc

    _step("3/4 validate: the generated DeepSpeed configs")
    plan = json.loads((run_dir / "plan.json").read_text())
    world = plan["layout"]["dp"] * plan["layout"]["tp"] * plan["layout"]["pp"]
    rc = dstk(["validate", str(run_dir / "ds_config.json"), "--world-size", str(world),
               "--tensor-parallel", str(plan["layout"]["tp"]), "--pipeline-stages", str(plan["layout"]["pp"])])
    rc = rc or dstk(["validate", "--hf", str(run_dir / "ds_config.hf.json")])
    if rc:
        return rc
    if args.skip_finetune:
        print(f"\ndone in {time.perf_counter() - started:.1f} s (fine-tune skipped); files in {out}")
        return 0

    _step(f"4/4 finetune: {args.steps} steps on the bundled corpus, on {world} CPU ranks (gloo)")
    with template("corpus", "harbour-notes.txt").open("rb") as src:
        corpus = out / "corpus.txt"
        corpus.write_bytes(src.read())
    rc = finetune(run_dir=run_dir, corpus=corpus, ft_dir=ft_dir, steps=args.steps, log_path=out / "logs" / "launch.log",
                  verbose=args.verbose)
    if rc:
        return rc
    summary = json.loads((ft_dir / "summary.json").read_text())
    print(
        f"\ndemo: loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f} over {summary['steps']} steps; "
        f"HF model in {ft_dir / 'model'} (AutoModelForCausalLM.from_pretrained loads it); "
        f"{time.perf_counter() - started:.0f} s in all",
        flush=True,
    )
    return 0 if summary["last_loss"] < summary["first_loss"] else 1




def finetune(*, run_dir: Path, corpus: Path, ft_dir: Path, steps: int, log_path: Path, verbose: bool) -> int:
    """``dstk finetune --prepare-only`` (the same checks and files as the command), then its launch with
    the launcher's log lines kept in ``log_path`` instead of on the terminal unless ``verbose``."""
    import contextlib
    import io

    from dstk.cli import main as dstk
    from dstk.train.prepare import launch

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = dstk(["finetune", "--plan", str(run_dir), "--data", str(corpus), "--output", str(ft_dir),
                   "--steps", str(steps), "--log-every", str(max(1, steps // 8)), "--prepare-only"])
    if rc:
        print(printed.getvalue(), end="")
        return rc
    spec_path = Path(printed.getvalue().strip().splitlines()[-1])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        sink = launch_sink(log=log, verbose=verbose)
        try:
            rc = launch(spec_path, sink=sink)
        finally:
            sink.close()
    if rc:
        from dstk.train.logs import show_tail

        show_tail(log_path)
    elif not verbose:
        print(f"DeepSpeed's and torch's log lines: {log_path}", flush=True)
    return rc
