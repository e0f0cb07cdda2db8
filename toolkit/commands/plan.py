"""``dstk plan``: rank every layout that fits, best first, and say why."""

from __future__ import annotations

import argparse
import json
import sys

from dstk.errors import EXIT_INVALID, DstkError, UsageError

HELP = "rank the parallel layouts that fit a model on a cluster, and say why the best wins"
DESCRIPTION = (
    "Enumerate every consistent layout (dp x tp x pp, ZeRO 0-3, offload, micro-batch, recompute), drop what "
    "does not fit in GPU memory with headroom, rank the rest by predicted step time (the simplest within 3% of "
    "the fastest wins) and explain the choice. Input: an intent YAML file and/or flags (flags win). "
    "Exit 0 with plans, 1 when nothing fits (with the smallest changes that would), 2 on usage errors."
)

# flag -> (intent section, field, argparse kwargs). Model and cluster flags match `dstk estimate`'s.
_FLAGS: list[tuple[str, str, str, dict]] = [
    ("--model", "model", "name", {"metavar": "NAME|PATH"}),
    ("--num-layers", "model", "num_layers", {"type": int}),
    ("--hidden-size", "model", "hidden_size", {"type": int}),
    ("--num-heads", "model", "num_heads", {"type": int}),
    ("--num-kv-heads", "model", "num_kv_heads", {"type": int}),
    ("--ffn-hidden-size", "model", "ffn_hidden_size", {"type": int}),
    ("--vocab-size", "model", "vocab_size", {"type": int}),
    ("--nodes", "cluster", "num_nodes", {"type": int}),
    ("--gpus-per-node", "cluster", "gpus_per_node", {"type": int}),
    ("--gpu", "cluster", "gpu", {"metavar": "TYPE"}),
    ("--interconnect", "cluster", "interconnect", {"metavar": "NET"}),
    ("--gpu-memory-gib", "cluster", "gpu_memory_gib", {"type": float, "metavar": "GIB"}),
    ("--gpu-tflops", "cluster", "gpu_tflops", {"type": float, "metavar": "TFLOPS"}),
    ("--host-memory", "cluster", "host_memory_gib", {"type": float, "metavar": "GIB"}),
    ("--hardware", "cluster", "hardware", {"metavar": "FILE"}),
    ("--seq-len", "training", "seq_len", {"type": int}),
    ("--global-batch", "training", "global_batch", {"type": int}),
    ("--global-batch-tokens", "training", "global_batch_tokens", {"type": int}),
    ("--num-tokens", "training", "num_tokens", {"type": int}),
    ("--train-steps", "training", "train_steps", {"type": int}),
    ("--precision", "training", "precision", {"choices": ["bf16", "fp16", "fp32"]}),
    ("--optimizer", "training", "optimizer", {"choices": ["adamw", "adam", "sgd", "lion", "adafactor"]}),
    ("--attention", "training", "attention", {"choices": ["sdpa", "flash", "eager"]}),
    ("--lr", "training", "lr", {"type": float, "metavar": "LR"}),
    ("--schedule", "training", "schedule", {"choices": ["cosine", "linear", "constant"]}),
    ("--warmup-steps", "training", "warmup_steps", {"type": int}),
    ("--min-lr-ratio", "training", "min_lr_ratio", {"type": float, "metavar": "FRACTION"}),
    ("--weight-decay", "training", "weight_decay", {"type": float, "metavar": "WD"}),
    ("--betas", "training", "betas", {"type": float, "nargs": 2, "metavar": ("BETA1", "BETA2")}),
    ("--eps", "training", "eps", {"type": float, "metavar": "EPS"}),
    ("--grad-clip", "training", "grad_clip", {"type": float, "metavar": "NORM"}),
    ("--lora-rank", "training", "lora_rank", {"type": int, "metavar": "R"}),
    ("--lora-alpha", "training", "lora_alpha", {"type": float, "metavar": "A"}),
    ("--lora-targets", "training", "lora_targets", {"metavar": "all-linear|q,k,v,o,..."}),
    ("--lora-dropout", "training", "lora_dropout", {"type": float, "metavar": "P"}),
    ("--lora-bits", "training", "lora_bits", {"type": int, "choices": [4]}),
    ("--engine", "constraints", "engine", {"choices": ["deepspeed", "megatron"]}),
    ("--nvme-path", "constraints", "nvme_path", {"metavar": "PATH"}),
    ("--max-tp", "constraints", "max_tp", {"type": int}),
    ("--headroom", "constraints", "memory_headroom", {"type": float, "metavar": "FRACTION"}),
    ("--dp", "constraints", "dp", {"type": int}),
    ("--tp", "constraints", "tp", {"type": int}),
    ("--pp", "constraints", "pp", {"type": int}),
    ("--zero", "constraints", "zero_stage", {"type": int, "choices": [0, 1, 2, 3]}),
    ("--micro-batch", "constraints", "micro_batch", {"type": int}),
    ("--recompute", "constraints", "recompute", {"choices": ["none", "selective", "full"]}),
    ("--offload-optimizer", "constraints", "offload_optimizer", {"choices": ["none", "cpu", "nvme"]}),
    ("--offload-params", "constraints", "offload_params", {"choices": ["none", "cpu", "nvme"]}),
    ("--virtual-stages", "constraints", "virtual_stages", {"type": int}),
]


LORA_FIELDS: tuple[str, ...] = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "lora_bits")


def add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--lora-*`` flags alone, exactly as ``add_intent_arguments`` defines them (``_FLAGS``: same
    names, dests and help): for ``dstk estimate``, whose other flags are its own."""
    from dstk.intent import field_doc

    group = parser.add_argument_group("LoRA (intent section `training`)")
    for flag, section, field, kwargs in _FLAGS:
        if field in LORA_FIELDS:
            group.add_argument(flag, dest=f"i_{section}__{field}", default=None, help=field_doc(section, field),
                               **kwargs)


def lora_over(args: argparse.Namespace, lora):
    """``lora`` (an intent's ``dstk.layout.Lora``, or None) with the ``--lora-*`` flags over it; None
    without a rank. The intent's own checks apply (a flag without ``--lora-rank`` is refused)."""
    from dstk.errors import UsageError
    from dstk.intent import TrainingIntent

    values = {} if lora is None else dict(lora_rank=lora.rank, lora_alpha=lora.alpha, lora_targets=lora.targets,
                                          lora_dropout=lora.dropout, lora_bits=lora.bits)
    values.update({f: getattr(args, f"i_training__{f}") for f in LORA_FIELDS
                   if getattr(args, f"i_training__{f}", None) is not None})
    try:
        return TrainingIntent(**values).lora
    except ValueError as exc:
        message, _, fix = str(exc).partition(" -- fix: ")
        raise UsageError(message, hint=fix or "e.g. --lora-rank 8 [--lora-alpha 16 --lora-targets q,v]") from None


def add_intent_arguments(parser: argparse.ArgumentParser, *, positional_help: str | None = None,
                         positional: bool = True, skip: tuple[str, ...] = (), with_from: bool = True) -> None:
    """The intent file and every intent field as a flag (shared by plan, generate, explain and
    finetune, which has its own ``--intent`` and ``--model``: ``positional=False, skip=("--model",))``."""
    from dstk.intent import field_doc

    if positional:
        parser.add_argument("intent", nargs="?", metavar="INTENT",
                            help=positional_help or "intent YAML file (see examples/intents/), - for standard "
                                                    "input; flags override it")
    if with_from:
        parser.add_argument("--from", dest="from_file", metavar="FILE",
                            help="the intent implied by another tool's setup (accelerate, LLaMA-Factory, axolotl, "
                                 "HF TrainingArguments, Megatron args), as `dstk import FILE` writes it")
    groups = {name: parser.add_argument_group(f"{name} (intent section `{name}`)")
              for name in ("model", "cluster", "training", "constraints")}
    for flag, section, field, kwargs in _FLAGS:
        if flag in skip:
            continue
        if "metavar" not in kwargs and "choices" not in kwargs:
            kwargs = {**kwargs, "metavar": "N"}  # every other flag is a count; argparse would show the dest
        groups[section].add_argument(flag, dest=f"i_{section}__{field}", default=None,
                                     help=field_doc(section, field), **kwargs)
    groups["cluster"].add_argument("--gpus", dest="i_gpus", type=int, default=None, metavar="N",
                                   help="total GPUs (sets --nodes from --gpus-per-node)")
    groups["constraints"].add_argument("--no-offload", dest="i_constraints__offload", action="store_const",
                                       const=False, default=None, help="never offload to CPU or NVMe")
    groups["constraints"].add_argument("--tp-across-nodes", dest="i_constraints__tp_across_nodes",
                                       action="store_const", const=True, default=None,
                                       help="allow a TP group to span nodes")
    from dstk.intent import harden_numeric_flags

    harden_numeric_flags(parser)  # inf, nan, 5,000 digits, "abc": exit 1 naming the flag


def intent_from_args(args: argparse.Namespace, *, path: str | None = None):
    """The intent file (if any) with the flags applied over it."""
    from dstk.errors import UsageError
    from dstk.intent import load_intent, with_overrides

    path = path if path is not None else args.intent
    base = (intent_from_stdin() if path == "-" else load_intent(path)) if path else None
    overrides: dict[str, dict] = {"model": {}, "cluster": {}, "training": {}, "constraints": {}}
    for key, value in vars(args).items():
        if key.startswith("i_") and "__" in key and value is not None:
            section, field = key[2:].split("__", 1)
            overrides[section][field] = value
    flags = {f"{section}.{field}": flag for flag, section, field, _ in _FLAGS}
    if args.i_gpus is not None:
        def bad_count(value) -> bool:  # python 3.11's argparse turns `--gpus=--` into [] without the type
            return not isinstance(value, int) or value < 1

        counts = {"--gpus": args.i_gpus, "--gpus-per-node": overrides["cluster"].get("gpus_per_node", 1),
                  "--nodes": overrides["cluster"].get("num_nodes", 1)}
        for bad, value in counts.items():
            if bad_count(value):
                raise DstkError(f"{bad} {value}: expected a positive integer", hint=f"e.g. {bad} 8")
        per_node = overrides["cluster"].get("gpus_per_node") or (base.cluster.gpus_per_node if base else 8)
        if args.i_gpus < per_node and "gpus_per_node" not in overrides["cluster"]:
            per_node = args.i_gpus
        nodes = overrides["cluster"].get("num_nodes")
        if nodes and "gpus_per_node" not in overrides["cluster"] and args.i_gpus % nodes == 0:
            per_node = args.i_gpus // nodes  # --gpus 16 --nodes 2: 8 a node
        if args.i_gpus % per_node:
            raise DstkError(f"--gpus {args.i_gpus} is not a multiple of --gpus-per-node {per_node}",
                            hint="give a multiple, or set --gpus-per-node")
        if nodes is not None and nodes * per_node != args.i_gpus:  # --gpus would silently win over --nodes
            raise DstkError(f"--gpus {args.i_gpus} disagrees with --nodes {nodes} x {per_node} GPUs per node "
                            f"({nodes * per_node} GPUs)",
                            hint=f"give --gpus {args.i_gpus} or --nodes {nodes} with --gpus-per-node, not both; "
                                 f"--gpus {args.i_gpus} means {args.i_gpus // per_node} node(s) x {per_node}")
        overrides["cluster"].update(num_nodes=args.i_gpus // per_node, gpus_per_node=per_node)
    if getattr(args, "from_file", None):
        if base is not None:
            raise UsageError("give an intent file or --from FILE, not both", hint="drop one of them")
        from dstk.importers import import_file

        base = import_file(args.from_file, overrides=overrides).intent
    if base is None and not any(overrides["model"].values()):
        raise UsageError("no intent file and no model",
                         hint="pass an intent YAML (examples/intents/) or --model NAME / the model dimensions")
    if args.i_gpus is not None:
        flags.update({"cluster.num_nodes": "--gpus", "cluster.gpus_per_node": "--gpus-per-node"})
    hardware = overrides["cluster"].get("hardware")
    if hardware and base is None and "gpu" not in overrides["cluster"]:
        from dstk.hardware import file_gpu_slugs  # a calibrated profile is for its own device, not h100-sxm

        slugs = file_gpu_slugs(hardware)
        if len(slugs) == 1:
            overrides["cluster"]["gpu"] = slugs[0]
    intent = with_overrides(base, overrides, flags=flags)
    if intent.cluster.hardware:
        from dstk.hardware import hardware_gpu_note

        note = hardware_gpu_note(path=intent.cluster.hardware, gpu_slug=intent.cluster.gpu)
        if note:
            print(f"warning: {note}", file=sys.stderr)
    return intent


def intent_from_stdin():
    """The intent YAML read from standard input (the path ``-``), named ``<stdin>`` in errors."""
    from dstk.intent import MAX_INTENT_BYTES, intent_from_dict, parse_intent_text

    stream = getattr(sys.stdin, "buffer", sys.stdin)
    text = stream.read(MAX_INTENT_BYTES + 1)
    if len(text) > MAX_INTENT_BYTES:
        raise DstkError(f"standard input is larger than {MAX_INTENT_BYTES >> 20} MiB, not an intent",
                        location="<stdin>", hint="pipe an intent YAML into it (see examples/intents/)")
    data, marks = parse_intent_text(text, source="<stdin>")
    if data is None:
        raise DstkError("standard input is empty, not an intent", location="<stdin>",
                        hint="pipe an intent YAML into it (see examples/intents/), or drop the -")
    return intent_from_dict(data, source="<stdin>", marks=marks)


def configure(parser: argparse.ArgumentParser) -> None:
    add_intent_arguments(parser)
    parser.add_argument("--format", choices=["human", "json"], default="human")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="plans to show (default 10)")


def print_human(result, *, top: int, out=None) -> None:
    """The ranked layouts as a table (``dstk.tables``: numbers whole at any width), the why lines
    of the best and its named buffers."""
    from dstk import tables

    con = tables.console(file=out or sys.stdout)
    tables.print_plain(con, lambda c: _draw_human(c, result, top))


def _draw_human(con, result, top: int) -> None:
    from dstk import tables
    from dstk.commands.estimate import buffer_terms
    from dstk.plan import describe, gib

    con.print(f"{result.num_fitting} of {result.num_considered} layouts fit in {gib(result.usable_bytes)} "
              f"usable per GPU; best first:", markup=False)
    shown = result.plans[:top]
    largest = max(p.estimate.memory.per_gpu.total_bytes for p in shown)
    unit, scale = ("GiB", 2**30) if largest >= 2**30 else ("MiB", 2**20)
    rows = []
    for i, p in enumerate(shown, 1):
        t = p.estimate.time
        mfu = getattr(t, "mfu", None)
        tps = getattr(t, "tokens_per_second", None)
        rows.append([str(i), describe(p.layout), f"{p.estimate.memory.per_gpu.total_bytes / scale:.2f}",
                     f"{t.step_seconds:.4g}", "-" if tps is None else f"{tps:,.0f}",
                     "-" if mfu is None else tables.percent_text(mfu)])
    cols = [tables.Col(header="#"), tables.Col(header="layout", text=True), tables.Col(header=f"{unit}/GPU"),
            tables.Col(header="s/step"), tables.Col(header="tok/s"), tables.Col(header="MFU")]
    tables.show(con, None, cols, rows)
    best_time = result.plans[0].estimate.time
    total = getattr(best_time, "time_to_train_seconds", None)
    if total:  # --num-tokens promises this figure
        from dstk.commands.estimate import _seconds

        tokens = getattr(result.plans[0].estimate.training, "num_tokens", None)
        con.print(f"time to train #1: {_seconds(total)}" + (f" for {tokens:,.0f} tokens" if tokens else ""),
                  markup=False)
    con.print("why:", markup=False)
    con.print(tables.bullets(result.plans[0].why))
    best = result.plans[0].estimate
    terms = buffer_terms(best.memory.per_gpu, cpu_ranks=best.cluster.gpu.is_cpu)
    if terms:
        con.print()
        con.print("buffers of #1 (per GPU):", markup=False)
        con.print(tables.bullets([line.strip() for line in terms], marker=""))


def run(args: argparse.Namespace) -> int:
    from dstk import plan as planner

    if args.top < 1:  # 0 crashed the table; a negative N sliced plans off the end
        raise UsageError(f"--top {args.top}: expected a positive number of plans", hint="e.g. --top 5 (default 10)")
    intent = intent_from_args(args)
    ctx = planner.resolve(intent)
    result = planner.plan_intent(ctx, top=args.top)
    if not result.plans:
        fixes = planner.suggest_fixes(intent)
        if args.format == "json":
            data = result.to_dict(top=args.top)
            data["suggestions"] = fixes
            print(json.dumps(data, indent=2))
        reason = planner.nothing_fits_message(ctx, result)
        raise DstkError(reason, hint="; ".join(fixes) if fixes else "no change dstk tried makes it fit")
    if args.format == "json":
        print(json.dumps(result.to_dict(top=args.top), indent=2))
    else:
        print_human(result, top=args.top)
    return 0 if result.plans else EXIT_INVALID
