"""``dstk generate``: write the best plan (or ``--pick N``) as a ready-to-run directory."""

from __future__ import annotations

import argparse
import json
import sys

from dstk.commands.plan import add_intent_arguments, intent_from_args
from dstk.errors import DstkError, UsageError

HELP = "write ds_config.json, ds_config.hf.json, megatron.args, plan.json and a README for the best plan"
DESCRIPTION = (
    "Plan as `dstk plan` does, then write the chosen plan into --output: ds_config.json (for "
    "deepspeed.initialize), ds_config.hf.json (for transformers' Trainer, with \"auto\"), training_args.json "
    "(the TrainingArguments that fill those \"auto\"), accelerate_config.yaml (accelerate launch), megatron.args, "
    "plan.json and README.md. Every config is validated before it is written. The directory appears complete or "
    "not at all (written as a hidden sibling, then renamed into place; with --force the old one is swapped out "
    "only once the new one is complete, and files dstk does not write are kept); files follow the umask. "
    "An existing non-empty directory is refused without --force."
)


def configure(parser: argparse.ArgumentParser) -> None:
    add_intent_arguments(parser)
    parser.add_argument("--output", "-o", required=True, metavar="DIR",
                        help="run directory to write (a directory: not -)")
    parser.add_argument("--force", action="store_true",
                        help="replace the files dstk writes in an existing DIR (others are kept)")
    parser.add_argument("--pick", type=int, default=1, metavar="N",
                        help="write the N-th plan of `dstk plan` (1 = best, the default)")
    parser.add_argument("--format", choices=["human", "json"], default="human")


def refuse_stdout_dir(output, *, what: str, hint: str) -> None:
    """``-`` means standard output to most tools; where a command writes a directory it would be a
    directory named ``-``: refuse it (generate, demo, finetune and export call this first). Then refuse,
    before any work, a path where no directory can be made (below a regular file, through a dangling
    symlink, in a directory this user cannot write): ``dstk.render.check_output_dir``, exit 1."""
    from dstk.render import check_output_dir

    if str(output) == "-":
        raise UsageError(f"--output - : {what} cannot be standard output", hint=hint)
    check_output_dir(output)


def next_commands(*, output: str, cluster: dict, layout: dict | None = None) -> str:
    """The pasteable next steps: the path quoted for the shell, and on a multi-node plan the hosts
    that `dstk launch` refuses to start without (one per node, as placeholders). ``validate`` gets
    the world size and the plan's TP/PP degrees: without them it cannot check the batch triad, and
    with a world size alone a pipeline plan's file reads as wrong (dp = world / (tp x pp))."""
    import shlex

    nodes, per_node = int(cluster["num_nodes"]), int(cluster["gpus_per_node"])
    hosts = "" if nodes == 1 else " --hosts " + ",".join(f"HOST{i + 1}:{per_node}" for i in range(min(nodes, 2))) + (
        ",..." if nodes > 2 else "")
    base = output.rstrip("/") or output
    degrees = f" --world-size {nodes * per_node}"
    for flag, key in (("--tensor-parallel", "tp"), ("--pipeline-stages", "pp")):
        if int((layout or {}).get(key) or 1) > 1:
            degrees += f" {flag} {int(layout[key])}"
    return (f"next: dstk validate {shlex.quote(base + '/ds_config.json')}{degrees}; "
            f"dstk launch {shlex.quote(base)}{hosts} -- train.py")


def run(args: argparse.Namespace) -> int:
    from dstk import plan as planner
    from dstk.render import write_files

    if args.pick < 1:
        raise UsageError(f"--pick {args.pick}: plans are numbered from 1", hint="use --pick 1 for the best plan")
    refuse_stdout_dir(args.output, what="a run directory",
                      hint="give a directory name, e.g. -o run1; `dstk plan --format json` prints the plan instead")
    intent = intent_from_args(args)
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=None)
    if not result.plans:
        fixes = planner.suggest_fixes(intent)
        raise DstkError(planner.nothing_fits_message(ctx, result),
                        hint="; ".join(fixes) if fixes else "no change dstk tried makes it fit")
    if args.pick > len(result.plans):
        raise UsageError(f"--pick {args.pick}: only {len(result.plans)} plans fit",
                         hint=f"choose 1..{len(result.plans)} (see `dstk plan`)")
    files = planner.run_dir_files(ctx, result, index=args.pick - 1)
    written = write_files(args.output, files, force=args.force)
    planner.check_written(args.output, files)
    plan = json.loads(files["plan.json"])
    if not (plan.get("training") or {}).get("lora"):  # a LoRA plan's README already rules Megatron-LM out
        from dstk.render import megatron_notes

        for note in megatron_notes(planner.model_dims(plan["model"], ctx.model)):
            print(f"warning: megatron.args: Megatron-LM cannot build this model exactly: {note}", file=sys.stderr)
    from dstk.plan import warmup_note

    warm = warmup_note(warmup_steps=ctx.intent.training.warmup_steps, steps=ctx.intent.training.steps,
                       schedule=ctx.intent.training.schedule)
    if warm:  # the configs carry the clipped warmup; the why lines say it, and so does this
        print(f"warning: {warm}", file=sys.stderr)
    if ctx.intent.constraints.engine != "megatron":  # the README says it too ("Not this plan's memory")
        from dstk.render import megatron_layout_note

        note = megatron_layout_note(model=ctx.model, layout=result.plans[args.pick - 1].layout, training=ctx.training,
                                    cluster=ctx.cluster, usable_bytes=result.usable_bytes)
        if note:
            print(f"warning: {note}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"output": str(args.output), "files": [p.name for p in written], "plan": plan}, indent=2))
    else:
        from dstk.plan import describe
        from dstk.layout import Layout

        layout = Layout.from_dict(plan["layout"])
        print(f"wrote {args.output}/ ({', '.join(p.name for p in written)})", file=sys.stdout)
        print(f"plan #{args.pick}: {describe(layout)}: {plan['memory']['per_gpu']['total_bytes'] / 2**30:.2f} GiB/GPU, "
              f"{plan['time']['step_seconds']:.4g} s/step")
        from dstk.commands.estimate import buffer_terms

        terms = buffer_terms(plan["memory"]["per_gpu"], cpu_ranks=plan["cluster"].get("gpu") == "cpu")
        if terms:
            print("buffers (per GPU):\n" + "\n".join(terms))
        print(next_commands(output=str(args.output), cluster=plan["cluster"], layout=plan["layout"]))
    return 0
