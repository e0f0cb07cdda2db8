"""``dstk estimate``: memory per GPU and step time of one parallel layout."""

from __future__ import annotations

import argparse
import json
import sys

from dstk.errors import DstkError, UsageError

HELP = "memory per GPU (with its breakdown) and step time of one layout"
DESCRIPTION = (
    "Estimate one layout: per-GPU memory (parameters, gradients, optimizer states, activations, DeepSpeed "
    "buffers, framework overhead; CPU/NVMe under offload; per pipeline stage) and step time (compute, "
    "communication, pipeline bubble, tokens/s, MFU). The model is a preset (`dstk models`), an HF config.json, "
    "its dimensions, or --params N (model states only). With --config ds_config.json the layout, precision, "
    "optimizer and ZeRO buffers come from an existing DeepSpeed config (DeepSpeed's defaults where it is "
    "silent; \"auto\" filled as transformers' Trainer fills it). Formulas and sources: docs/estimate.md."
)

LAYOUT_DEFAULTS = {"zero": 0, "offload_optimizer": "none", "offload_params": "none", "tp": 1, "pp": 1,
                   "micro_batch": 1, "recompute": "none", "precision": "bf16", "optimizer": "adamw"}
"""Defaults of the layout and training flags; the parser keeps None so --config can tell a flag given
from a default (a given flag that contradicts the file is an error)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intent", metavar="FILE", help="take model, cluster and training from an intent file "
                        "(`dstk plan`'s YAML; - reads it from standard input); the layout flags below still "
                        "choose the layout")
    parser.add_argument("--from", dest="from_file", metavar="FILE", help="estimate the run another tool's setup "
                        "describes (accelerate, LLaMA-Factory, axolotl, HF TrainingArguments, Megatron args; see "
                        "`dstk import`): its ZeRO stage, offload, tp/pp and micro-batch are the layout; flags win")
    parser.add_argument("--config", metavar="DS_CONFIG", help="estimate this DeepSpeed config (JSON or hjson): its "
                        "ZeRO stage, buffers, offload, batch, precision and optimizer; the model and cluster come "
                        "from the flags or --intent; a flag that contradicts the file is an error")
    m = parser.add_argument_group("model (one of)")
    m.add_argument("--model", metavar="NAME|PATH", help="preset slug or HF config.json (file or directory)")
    m.add_argument("--params", type=float, metavar="N", help="parameter count only (e.g. 7e9): no activations")
    for flag in ("num-layers", "hidden-size", "num-heads", "vocab-size", "ffn-hidden-size", "num-kv-heads"):
        m.add_argument(f"--{flag}", type=int, metavar="N")
    c = parser.add_argument_group("cluster")
    c.add_argument("--gpus", type=int, metavar="N", help="GPUs in all (required without --intent)")
    c.add_argument("--gpus-per-node", type=int, metavar="G", help="default: min(N, 8)")
    c.add_argument("--gpu", default=None, metavar="TYPE",
                   help="GPU slug (`dstk gpus`), default h100-sxm, or the --hardware file's GPU where it has one")
    c.add_argument("--interconnect", metavar="NET", help="inter-node network slug (default: usual for the GPU)")
    c.add_argument("--hardware", metavar="FILE", help="YAML/JSON file adding or changing GPUs and networks")
    c.add_argument("--gpu-memory-gib", type=float, metavar="GIB", help="override the GPU's memory")
    c.add_argument("--gpu-tflops", type=float, metavar="T", help="override the GPU's dense 16-bit peak")
    lay = parser.add_argument_group("layout")
    lay.add_argument("--zero", type=int, choices=[0, 1, 2, 3], help="default 0")
    lay.add_argument("--offload-optimizer", choices=["none", "cpu", "nvme"], help="default none")
    lay.add_argument("--offload-params", choices=["none", "cpu", "nvme"], help="default none")
    lay.add_argument("--tp", type=int, help="default 1")
    lay.add_argument("--pp", type=int, help="default 1")
    lay.add_argument("--virtual-stages", type=int, default=1, metavar="V", help="interleaved chunks per stage")
    lay.add_argument("--sequence-parallel", action="store_true")
    lay.add_argument("--engine", choices=["deepspeed", "megatron"], default="deepspeed",
                     help="the runtime priced: deepspeed (default) or megatron (fp32 main gradients, "
                          "--zero 1 as its distributed optimizer, vocabulary-parallel embedding)")
    lay.add_argument("--micro-batch", type=int, metavar="B", help="default 1")
    lay.add_argument("--global-batch", type=int, metavar="G", help="sequences per step (default: micro-batch x dp)")
    lay.add_argument("--recompute", choices=["none", "selective", "full"], help="default none")
    t = parser.add_argument_group("training")
    t.add_argument("--seq-len", type=int, metavar="S",
                   help="default 2048, as `dstk plan`'s, or the model's positions when fewer")
    t.add_argument("--precision", choices=["bf16", "fp16", "fp32"],
                   help="default bf16, fp16 on a GPU without bf16 (V100), as `dstk plan` picks")
    t.add_argument("--optimizer", choices=["adamw", "adam", "sgd", "lion", "adafactor"], help="default adamw")
    t.add_argument("--attention", choices=["sdpa", "eager", "flash"],
                   help="default sdpa, eager where the model's HF class has no SDPA (BLOOM), as `dstk plan` picks")
    t.add_argument("--tokens", type=float, metavar="T", help="token budget, for the time to train")
    from dstk.commands.plan import add_lora_arguments

    add_lora_arguments(parser)  # the same --lora-* flags as plan, generate and finetune
    parser.add_argument("--format", choices=["human", "json"], default="human")
    from dstk.intent import harden_numeric_flags

    harden_numeric_flags(parser)  # inf, nan, 5,000 digits, "abc": exit 1 naming the flag


def model_from_args(args: argparse.Namespace):
    """A ModelSpec, or an int parameter count for --params."""
    from dstk.models import ModelSpec, get_model

    dims = {k: getattr(args, k) for k in ("num_layers", "hidden_size", "num_heads", "vocab_size")}
    given = [k for k, v in dims.items() if v is not None]
    sources = [bool(args.model), args.params is not None, bool(given)]
    if sum(sources) != 1:
        raise UsageError("give exactly one model: --model NAME|PATH, --params N, or its dimensions",
                         hint="e.g. --model llama-3-8b, or --num-layers 32 --hidden-size 4096 --num-heads 32 "
                              "--vocab-size 32000")
    if args.model:
        return get_model(args.model)
    if args.params is not None:
        if args.params < 1:
            raise DstkError(f"--params {args.params:g}: expected a positive count")
        return int(args.params)
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise UsageError(f"dimensions: missing {', '.join('--' + k.replace('_', '-') for k in missing)}",
                         hint="a model from its dimensions needs --num-layers --hidden-size --num-heads --vocab-size")
    try:
        return ModelSpec.generic(**dims, ffn_hidden_size=args.ffn_hidden_size, num_kv_heads=args.num_kv_heads,
                                 seq_len=args.seq_len)
    except ValueError as exc:
        raise DstkError(f"dimensions: {exc}") from None


def cluster_from_args(args: argparse.Namespace):
    from dstk.hardware import Cluster, default_interconnect, get_gpu, get_interconnect, load_catalog

    gpus, nets = load_catalog(args.hardware) if args.hardware else (None, None)
    slug = args.gpu
    if args.hardware:  # a calibrated profile is for its own device (as `dstk plan`), and says when unused
        from dstk.hardware import file_gpu_slugs, hardware_gpu_note

        own = file_gpu_slugs(args.hardware)
        slug = slug or (own[0] if len(own) == 1 else None)
        note = hardware_gpu_note(path=args.hardware, gpu_slug=slug or "h100-sxm")
        if note:
            print(f"warning: {note}", file=sys.stderr)
    gpu = get_gpu(slug or "h100-sxm", catalog=gpus)
    if args.gpu_memory_gib is not None:
        gpu = gpu.replace(memory_bytes=int(args.gpu_memory_gib * 2**30))
    if args.gpu_tflops is not None:  # as `dstk plan` does: a GPU without bf16 (V100) does not gain it
        gpu = gpu.replace(bf16_flops=None if gpu.bf16_flops is None else args.gpu_tflops * 1e12,
                          fp16_flops=args.gpu_tflops * 1e12)
    per_node = args.gpus_per_node or min(args.gpus, 8)
    if args.gpus < 1 or per_node < 1 or args.gpus % per_node:
        raise DstkError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {per_node}",
                        hint="give whole nodes, e.g. --gpus 16 --gpus-per-node 8")
    nodes = args.gpus // per_node
    net = get_interconnect(args.interconnect or default_interconnect(gpu.slug), catalog=nets)
    return Cluster(num_nodes=nodes, gpus_per_node=per_node, gpu=gpu, interconnect=net)


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``LAYOUT_DEFAULTS`` where a layout or training flag was not given."""
    return argparse.Namespace(**{**vars(args), **{k: v for k, v in LAYOUT_DEFAULTS.items()
                                                  if getattr(args, k, None) is None}})


def layout_and_training(args: argparse.Namespace, model):
    from dstk.layout import Layout, Training

    args = with_defaults(args)
    tp, pp = args.tp, args.pp
    if tp < 1 or pp < 1 or args.gpus % (tp * pp):
        raise DstkError(f"--gpus {args.gpus} is not divisible by tp*pp = {tp * pp}",
                        hint="choose --tp and --pp whose product divides --gpus")
    dp = args.gpus // (tp * pp)
    per_step = args.micro_batch * dp
    global_batch = args.global_batch or per_step
    if global_batch % per_step:
        near = sorted({per_step * max(1, global_batch // per_step), per_step * (global_batch // per_step + 1)})
        raise DstkError(f"--global-batch {global_batch} is not a multiple of micro-batch x dp = "
                        f"{args.micro_batch} x {dp} = {per_step}",
                        hint=f"nearest: {', '.join(map(str, near))}")
    seq = args.seq_len or default_seq_len(model)
    try:
        layout = Layout(dp=dp, tp=tp, pp=pp, zero_stage=args.zero, offload_optimizer=args.offload_optimizer,
                        offload_params=args.offload_params, micro_batch=args.micro_batch,
                        grad_accum=global_batch // per_step, recompute=args.recompute,
                        virtual_stages=args.virtual_stages, sequence_parallel=args.sequence_parallel)
        training = Training(seq_len=seq, global_batch=global_batch, precision=args.precision,
                            optimizer=args.optimizer, attention=args.attention,
                            num_tokens=int(args.tokens) if args.tokens else None)
    except ValueError as exc:
        raise DstkError(str(exc), hint=_layout_fix(str(exc))) from None
    return layout, training


LAYOUT_FIXES = (
    ("pipeline engine supports ZeRO 0 or 1", "use --zero 0 or 1 with --pp, or drop --pp for ZeRO-2/3"),
    ("offload_optimizer: needs ZeRO", "add --zero 1, 2 or 3, or drop --offload-optimizer"),
    ("offload_params: needs ZeRO stage 3", "add --zero 3, or drop --offload-params"),
    ("virtual_stages: interleaving needs pp > 1", "add --pp N (N > 1), or drop --virtual-stages"),
    ("sequence_parallel: needs tp > 1", "add --tp N (N > 1), or drop --sequence-parallel"),
)
"""A ``Layout`` refusal (``dstk.layout``) and the flags that fix it: `dstk estimate` printed the
refusal alone, where `dstk plan` names the fix."""


def _layout_fix(message: str) -> str | None:
    return next((fix for said, fix in LAYOUT_FIXES if said in message), None)


def default_seq_len(model) -> int:
    """The sequence length when none is given: `dstk plan`'s default (``TrainingIntent.seq_len``,
    2048), or the model's positions (``max_position_embeddings``) when it has fewer (GPT-2: 1024).
    It used to be ``min(positions, 4096)``: the same model priced at twice `dstk plan`'s length
    (qwen2.5-7b: 65 GiB against the plan's 35 GiB for one layout)."""
    from dstk.intent import TrainingIntent

    planned = TrainingIntent().seq_len
    positions = getattr(model, "seq_len", None)
    return min(planned, positions) if positions else planned


def assumption_notes(args: argparse.Namespace, *, training, layout) -> list[str]:
    """The notes of what the estimate assumed because no flag (and no intent) said it: the
    sequence length and, for ``--config``, activation recomputation, which a DeepSpeed config
    cannot carry (HF's ``gradient_checkpointing_enable()`` and Megatron's ``--recompute-*`` live
    outside it), so a plan's recomputing layout read back from its ds_config.json would otherwise be
    priced without recompute and look as if it did not fit."""
    notes = []
    if args.seq_len is None and not args.intent:
        notes.append(f"seq_len {training.seq_len:,}: the default (`dstk plan`'s, at most the model's positions); "
                     "give --seq-len for yours")
    if args.config and args.recompute is None:
        notes.append(f"recompute {layout.recompute}: a DeepSpeed config does not say whether the model recomputes "
                     "activations (HF gradient_checkpointing_enable(), Megatron --recompute-granularity); give "
                     "--recompute full or selective if it does")
    return notes


def planned_run_notes(args: argparse.Namespace, *, model, cluster, layout, training) -> list[str]:
    """Where an estimate of ``--config`` differs from the ``plan.json`` that `dstk generate` wrote
    beside it (a run directory) in what the DeepSpeed file cannot say: model, GPUs, sequence
    length, recompute, attention, LoRA. One note naming the differences and the flags that
    estimate the planned run; none when they agree or there is no readable plan.json there."""
    from pathlib import Path

    if not args.config or args.config == "-":
        return []
    path = Path(args.config).parent / "plan.json"
    try:
        plan = json.loads(path.read_text())
        planned_layout, planned_training = plan["layout"], plan["training"]
        planned_cluster, planned_model = plan["cluster"], plan["model"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not all(isinstance(x, dict) for x in (planned_layout, planned_training, planned_cluster, planned_model)):
        return []
    differ, flags = [], []

    def check(what, here, there, flag):
        if there is not None and here != there:
            differ.append(f"{what} {here} here, {there} there")
            if flag:
                flags.append(flag)

    name = getattr(model, "name", None)
    check("model", name, planned_model.get("name"), f"--model {planned_model.get('name')}")
    world = (planned_cluster.get("num_nodes") or 0) * (planned_cluster.get("gpus_per_node") or 0)
    check("GPUs", cluster.world_size, world or None, f"--gpus {world}")
    check("GPU", cluster.gpu.slug, planned_cluster.get("gpu"), f"--gpu {planned_cluster.get('gpu')}")
    record = planned_cluster.get("hardware")  # the --hardware file (a calibrated profile) the plan was priced with
    if isinstance(record, dict) and record.get("file"):
        import os

        here = os.path.abspath(args.hardware) if getattr(args, "hardware", None) else None
        check("hardware", here or "the catalog's", record["file"], f"--hardware {record['file']}")
    check("seq", training.seq_len, planned_training.get("seq_len"), f"--seq-len {planned_training.get('seq_len')}")
    check("recompute", layout.recompute, planned_layout.get("recompute"),
          f"--recompute {planned_layout.get('recompute')}")
    check("attention", training.attention, planned_training.get("attention"),
          f"--attention {planned_training.get('attention')}")
    lora, planned_lora = getattr(training, "lora", None), planned_training.get("lora")
    here_rank = getattr(lora, "rank", None)
    there_rank = planned_lora.get("rank") if isinstance(planned_lora, dict) else None
    if here_rank != there_rank:
        differ.append(f"LoRA rank {here_rank or 'none'} here, {there_rank or 'none'} there")
        if there_rank:
            flags.append(f"--lora-rank {there_rank}")
    there_bits = planned_lora.get("bits") if isinstance(planned_lora, dict) else None
    if there_rank and getattr(lora, "bits", None) != there_bits:  # QLoRA: NF4 base weights
        differ.append(f"LoRA base weights {getattr(lora, 'bits', None) or 16}-bit here, {there_bits or 16}-bit there")
        if there_bits:
            flags.append(f"--lora-bits {there_bits}")
    there_targets = planned_lora.get("targets") if isinstance(planned_lora, dict) else None
    if there_rank and here_rank and there_targets and getattr(lora, "targets", None) != there_targets:
        check("LoRA targets", getattr(lora, "targets", None), there_targets, f"--lora-targets {there_targets}")
    if plan.get("engine") == "megatron":  # no flag makes a DeepSpeed estimate of Megatron-LM's run
        differ.append("engine deepspeed here, megatron there (the plan prices Megatron-LM running megatron.args: "
                      "its fp32 gradients and distributed optimizer; `dstk explain` shows its figures)")
    if not differ:
        return []
    give = f"; add {' '.join(flags)} to estimate the planned run" if flags else ""
    return [f"{path} (the plan this config was generated from) differs: {'; '.join(differ)}{give}"]


def _with_lora(args: argparse.Namespace, *, training, layout, model):
    """``training`` with the ``--lora-*`` flags over its LoRA settings (an intent's), checked as
    ``dstk finetune`` would run them: data parallelism and ZeRO only, a model with a shape."""
    import dataclasses

    from dstk.commands.plan import lora_over

    lora = lora_over(args, training.lora)
    if lora is None:
        return dataclasses.replace(training, lora=None) if training.lora is not None else training
    if layout.tp > 1 or layout.pp > 1:
        raise DstkError(f"LoRA with tp={layout.tp}, pp={layout.pp}: AutoTP and the pipeline engine do not know peft's "
                        "LoRA layers", hint="drop --tp/--pp: LoRA runs on data parallelism and ZeRO")
    if isinstance(model, int):
        raise UsageError("LoRA needs the model's shape to size its adapters, not --params",
                         hint="give --model NAME or the dimensions")
    return dataclasses.replace(training, lora=lora)


def _gib(n) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1 (tiny CPU models read as KiB)."""
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _seconds(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= 2 * size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.3g} s"


def render_human(est, *, width: int | None = None) -> str:
    """The estimate as text: a memory table and a time table (``dstk.tables``: numbers whole, the
    source column wrapped, at the terminal's width or ``width``)."""
    from dstk import tables

    return tables.to_text(lambda con: _draw_human(con, est), width=width or tables.console().width)


def fit_verdict(mem, gpu) -> str:
    """``fits``, ``DOES NOT FIT``, or, between the planner's usable memory (the default 10% headroom
    for allocator fragmentation and estimate error, ``dstk.plan.usable_gpu_bytes``) and the GPU's
    capacity, a warning: such a layout is one `dstk plan` refuses, and it often OOMs in practice."""
    from dstk.intent import Constraints
    from dstk.plan import gib, usable_gpu_bytes

    total = mem.per_gpu.total_bytes
    if total > gpu.memory_bytes:
        return "DOES NOT FIT"
    headroom = Constraints().memory_headroom
    usable = usable_gpu_bytes(capacity_bytes=gpu.memory_bytes, overhead_bytes=gpu.overhead_bytes, headroom=headroom)
    if total > usable:
        return (f"TIGHT: over the {gib(usable)} `dstk plan` keeps usable ({headroom:.0%} headroom for "
                "fragmentation); it risks out-of-memory errors")
    return "fits"


def _draw_human(con, est) -> None:
    from dstk import tables
    from dstk.estimate import SOURCES

    mem, t = est.memory, est.time
    gpu = est.cluster.gpu
    name = getattr(est.model, "name", None) or f"{est.model:,} params"
    con.print(f"{name} on {est.cluster.world_size} x {gpu.name}: dp={est.layout.dp} tp={est.layout.tp} "
              f"pp={est.layout.pp} ZeRO-{est.layout.zero_stage}, micro-batch {est.layout.micro_batch} x "
              f"{est.layout.grad_accum}, seq {est.training.seq_len}, {est.training.precision}, "
              f"recompute {est.layout.recompute}", markup=False)
    con.print()
    cols = [tables.Col(header="term", text=True), tables.Col(header="per GPU"), tables.Col(header="source", text=True)]
    rows = [[k[:-6], _gib(getattr(mem.per_gpu, k)), SOURCES[k]]
            for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
                      "overhead_bytes")]
    rows.append(["total", _gib(mem.per_gpu.total_bytes), f"of {_gib(gpu.memory_bytes)}: {fit_verdict(mem, gpu)}"])
    phase = getattr(mem.per_gpu, "peak_phase", None)
    if phase:
        rows.append(["peak in", phase, "the fullest moment of the step; the terms above are at it"])
    if mem.cpu_bytes or mem.nvme_bytes:
        rows.append(["cpu", _gib(mem.cpu_bytes), "per rank (offload)"])
        rows.append(["nvme", _gib(mem.nvme_bytes), "per rank (offload)"])
    notes = []
    lora = getattr(est.training, "lora", None)
    if lora is not None:
        from dstk.estimate.lora import lora_facts, why_line

        notes.append(why_line(lf=lora_facts(model=est.model, lora=lora), lora=lora, precision=est.training.precision,
                              zero_stage=est.layout.zero_stage))
    if len(mem.per_stage) > 1:
        notes.append("per stage: " + ", ".join(f"{s.stage}: {s.num_layers} layers {_gib(s.total_bytes)}"
                                               for s in mem.per_stage))
    if mem.per_gpu.activations_bytes is None:
        notes.append("activations are unknown for a model given by --params only")
    tables.show(con, f"memory per GPU (stage {mem.per_gpu.stage}, the fullest)", cols, rows)
    if notes:
        con.print(tables.bullets(notes, marker=""))
        con.print()
    rows = [["compute", _seconds(t.compute_seconds), SOURCES["compute_seconds"]],
            ["comm", _seconds(t.comm_seconds), f"exposed; {SOURCES['comm_seconds']}"],
            ["bubble", _seconds(t.bubble_seconds), f"{t.bubble_fraction:.1%}; {SOURCES['bubble_fraction']}"],
            ["step", _seconds(t.step_seconds), f"{t.tokens_per_second:,.0f} tokens/s, "
             f"{tables.flops_text(t.tflops_per_gpu)} per GPU, MFU {tables.percent_text(t.mfu)}"]]
    tables.show(con, "time per step", [tables.Col(header="term", text=True), tables.Col(header="time"),
                                       tables.Col(header="source", text=True)], rows)
    lines = []
    comm = ", ".join(f"{k} {_seconds(v)}" for k, v in t.comm.items() if v)
    if comm:
        lines.append(f"communication before overlap: {comm}")
    if t.time_to_train_seconds is not None:
        lines.append(f"time for {est.training.num_tokens:,} tokens: {_seconds(t.time_to_train_seconds)}")
    if lines:
        con.print(tables.bullets(lines, marker=""))


def from_intent(args: argparse.Namespace):
    """Model, cluster and training from an intent file; the layout from the flags."""
    import dataclasses

    ctx = _intent_context(args)
    if args.attention:  # --attention over the intent's, checked against the model as `dstk plan` checks it
        from dstk.plan import check_attention

        check_attention(attention=args.attention, precision=ctx.training.precision, gpu=ctx.cluster.gpu,
                        spec=ctx.model, engine=ctx.intent.constraints.engine)
    args = argparse.Namespace(**{**vars(args), "gpus": ctx.cluster.world_size, "attention": args.attention
                                 or ctx.training.attention, "global_batch": ctx.training.global_batch,
                                 "seq_len": ctx.training.seq_len})
    layout, _ = layout_and_training(args, ctx.model)
    training = dataclasses.replace(ctx.training, attention=args.attention)
    return ctx.model, ctx.cluster, layout, training


def _intent_context(args: argparse.Namespace):
    """The intent resolved as the planner resolves it; ``--hardware`` (a calibrated profile, say)
    applies over the intent's own hardware file."""
    from dstk.intent import load_intent, with_overrides
    from dstk.plan import resolve

    clashing = [f for f in ("model", "params", "num_layers", "gpus", "gpu", "seq_len", "global_batch")
                if getattr(args, f) not in (None, "h100-sxm")]
    if clashing:
        raise UsageError(f"--intent gives the model, cluster and training; drop --{clashing[0].replace('_', '-')}",
                         hint="edit the intent file instead, or leave --intent out")
    if args.intent == "-":
        from dstk.commands.plan import intent_from_stdin

        intent = intent_from_stdin()
    else:
        intent = load_intent(args.intent)
    if args.hardware:
        intent = with_overrides(intent, {"cluster": {"hardware": args.hardware}})
    if intent.cluster.hardware:
        from dstk.hardware import hardware_gpu_note

        note = hardware_gpu_note(path=intent.cluster.hardware, gpu_slug=intent.cluster.gpu)
        if note:
            print(f"warning: {note}", file=sys.stderr)
    return resolve(intent)


def _source(args: argparse.Namespace):
    """(model, cluster, the intent's Training or None) from --intent or the flags."""
    if args.intent:
        ctx = _intent_context(args)
        return ctx.model, ctx.cluster, ctx.training
    if args.gpus is None:
        raise UsageError("--gpus N is required (or give --intent FILE)", hint="e.g. --gpus 8")
    return model_from_args(args), cluster_from_args(args), None


def _attention(model, *, requested: str | None, precision: str, gpu) -> str:
    """``dstk plan``'s kernel for ``model``: the requested one checked, else sdpa (eager where its HF
    class has no SDPA: BLOOM)."""
    from dstk.plan import choose_attention

    return choose_attention(requested=requested, spec=model, precision=precision, gpu=gpu)[0]


def from_config(args: argparse.Namespace):
    """(model, cluster, layout, training, ZeroBuffers, notes) for ``--config``: the file decides the
    layout, precision, optimizer and buffers (``dstk.estimate.dsconfig``); model and cluster come
    from the flags or the intent."""
    from dstk.errors import DstkError
    from dstk.estimate.dsconfig import read_settings, to_layout
    from dstk.layout import Training
    from dstk.validate import read_document, validate_config

    path = args.config
    try:
        doc = read_document(path)
    except OSError as exc:
        import os

        inside = os.path.join(path, "ds_config.json")
        hint = (f"give the config file in that run directory: --config {inside}" if os.path.isfile(inside)
                else "check the path")
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}", hint=hint) from None
    for f in doc.findings:
        if f.severity == "error":
            where = path + (f":{f.line}:{f.column}" if f.line is not None and f.column is not None else "")
            raise DstkError(f.message, hint=f.hint, location=where)
    model, cluster, base = _source(args)
    settings = read_settings(doc.config, hidden_size=getattr(model, "hidden_size", None), positions=doc.positions,
                             source=path)
    flags = {"zero": args.zero, "offload_optimizer": args.offload_optimizer, "offload_params": args.offload_params,
             "tp": args.tp, "micro_batch": args.micro_batch, "global_batch": args.global_batch,
             "precision": args.precision, "optimizer": args.optimizer}
    fallback = {} if base is None else {"global_batch": base.global_batch, "precision": base.precision,
                                        "optimizer": base.optimizer}
    layout, precision, optimizer, notes = to_layout(settings, world_size=cluster.world_size, flags=flags,
                                                    fallback=fallback, pp=args.pp or 1, recompute=args.recompute,
                                                    positions=doc.positions, source=path)
    if precision == "bf16" and cluster.gpu.bf16_flops is None:  # `dstk plan`'s refusal, with the file's fix
        from dstk.plan import choose_precision

        try:
            choose_precision(requested=precision, gpu=cluster.gpu)
        except DstkError as exc:
            raise DstkError(exc.message.replace("training.precision: ", ""), location=path,
                            hint='use fp16 (dynamic loss scaling): set "bf16": '
                            '{"enabled": false} and "fp16": {"enabled": true} in the file (--precision fp16 '
                            'where it says "auto"), or estimate it on a GPU with bf16') from None
    notes = [f.message for f in doc.findings] + list(notes)
    from dstk.validate.source import has_auto

    hf = has_auto(doc.config)
    refused = []
    for f in validate_config(doc.config, world_size=cluster.world_size, tensor_parallel=layout.tp,
                             pipeline_stages=layout.pp, hf=hf):
        if deepspeed_refuses(f):
            refused.append(f)
        elif f.severity == "error":
            notes.append(f"dstk validate: {f.pointer or '/'}: {f.message}")
    seq = args.seq_len or (base.seq_len if base else None) or default_seq_len(model)
    tokens = int(args.tokens) if args.tokens else (base.num_tokens if base else None)
    try:
        training = Training(seq_len=seq, global_batch=layout.global_batch, precision=precision, optimizer=optimizer,
                            attention=_attention(model, requested=args.attention or (base.attention if base else None),
                                                 precision=precision, gpu=cluster.gpu),
                            num_tokens=tokens, grad_clip=_config_grad_clip(doc.config))
    except ValueError as exc:
        raise DstkError(str(exc)) from None
    from dstk.validate import locate

    return model, cluster, layout, training, settings.buffers, tuple(notes), tuple(locate(refused, doc))


def _config_grad_clip(config) -> float:
    """The file's ``gradient_clipping`` as DeepSpeed 0.19.8 reads it: absent is its default, 1.0
    (``dstk.hardware.GRADIENT_CLIPPING_DEFAULT``); "auto" is the HF Trainer's ``max_grad_norm``,
    1.0 unless set; a value validate refuses is priced as the default."""
    from dstk.hardware import GRADIENT_CLIPPING_DEFAULT

    value = config.get("gradient_clipping") if isinstance(config, dict) else None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else GRADIENT_CLIPPING_DEFAULT


def deepspeed_refuses(finding) -> bool:
    """Whether DeepSpeed 0.19.8 refuses a config with this ``dstk validate`` finding (an exception at
    ``deepspeed.initialize``) rather than running it with the setting ignored: an error in a section
    DeepSpeed parses with a pydantic model (``x-dstk-parser`` in the shipped schema: zero_optimization,
    bf16, fp16, tensor_parallel, ...; ``DeepSpeedConfigModel`` has ``extra="forbid"``,
    ``deepspeed/runtime/config_utils.py``), or an optimizer/scheduler parameter its constructor does
    not take. An unknown top-level key is not one: DeepSpeed ignores it (``dstk estimate`` prices the
    config without it and says so in a note)."""
    from dstk.validate.schema import load_schema

    if finding.severity != "error":
        return False
    if "fails at initialize" in finding.message:
        return True
    parts = finding.pointer.split("/")
    if not finding.code.startswith("DS1") or len(parts) < 2 or not parts[1]:
        return False
    section = load_schema()["properties"].get(parts[1].replace("~1", "/").replace("~0", "~"))
    return isinstance(section, dict) and str(section.get("x-dstk-parser", "")).startswith("pydantic")


CPU_RANK_PLACES = {"gpu": "rank's host memory", "cpu": "offload copy, host memory"}
"""Where a buffer lives on CPU ranks (``--gpu cpu``): the estimate's ``gpu`` is the rank's own memory
and its ``cpu`` the offloaded copy, both in the host's RAM (DeepSpeed's CPU accelerator has no
device memory), so neither reads "gpu"."""


def buffer_terms(per_gpu, *, cpu_ranks: bool = False) -> list[str]:
    """One line per named buffer of an estimate's ``MemoryBreakdown`` (or its ``to_dict()``), e.g.
    ``reduce bucket: 2 x 5e8 x 2 B = 1.86 GiB (gpu, backward)``; empty when the estimate has none.
    ``cpu_ranks``: the ranks are CPU processes, so places read as ``CPU_RANK_PLACES`` says."""
    terms = per_gpu.get("buffers") if isinstance(per_gpu, dict) else getattr(per_gpu, "buffers", None)
    at_peak = set((per_gpu.get("peak_buffers") if isinstance(per_gpu, dict) else getattr(per_gpu, "peak_buffers", None))
                  or ())
    lines = []
    for b in terms or ():
        get = b.get if isinstance(b, dict) else (lambda k, b=b: getattr(b, k, None))
        device = get("device")
        if cpu_ranks and device in CPU_RANK_PLACES:
            device = CPU_RANK_PLACES[device]
        where = ", ".join(str(x) for x in (device, get("phase"), "at the peak" if get("name") in at_peak
                                           else None) if x)
        formula = get("formula")
        lines.append(f"  {get('name')}: {formula + ' = ' if formula else ''}{_gib(get('bytes'))}"
                     + (f" ({where})" if where else ""))
    return lines


def buffer_lines(est, buffers) -> list[str]:
    """The costly buffers by name: the estimate's own terms (``MemoryBreakdown.buffers``) where it
    has them, and the ZeRO settings that size them."""
    from dstk.estimate import memory as mem
    from dstk.estimate.buckets import elements_text

    per_gpu = est.memory.per_gpu
    zero = est.layout.zero_stage
    lines = buffer_terms(per_gpu, cpu_ranks=est.cluster.gpu.is_cpu)
    named = {b.name for b in getattr(per_gpu, "buffers", ())}
    if zero >= 1 and "reduce bucket" not in named and buffers.contiguous_gradients:
        # Sized by the file whether or not it is live at the peak: the term users look for.
        w = mem.param_bytes(est.training.precision)
        copies = 2 if buffers.overlaps(zero) and zero < 3 else 1
        size = buffers.reduce_bucket_size
        when = "from initialize on" if zero == 3 else "backward, from the first gradient hook"
        lines.append(f"  reduce bucket: {copies} x {elements_text(size)} x {w} B = {_gib(copies * size * w)}"
                     + (" (overlap_comm)" if copies == 2 else "") + f" ({when})")
    if zero >= 1:
        e = elements_text
        knobs = (f"reduce_bucket_size {e(buffers.reduce_bucket_size)}, allgather_bucket_size "
                 f"{e(buffers.allgather_bucket_size)}, overlap_comm {str(buffers.overlaps(zero)).lower()}, "
                 f"contiguous_gradients {str(buffers.contiguous_gradients).lower()}")
        if zero == 3:
            knobs += (f", stage3_prefetch_bucket_size {e(buffers.prefetch_bucket_size)}, "
                      f"stage3_param_persistence_threshold {e(buffers.param_persistence_threshold)}, "
                      f"stage3_max_live_parameters {e(buffers.max_live_parameters)}, "
                      f"stage3_max_reuse_distance {e(buffers.max_reuse_distance)}")
        lines.append(f"  ZeRO settings: {knobs}")
    return lines


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from dstk.estimate import ZeroBuffers, estimate

    buffers, notes, refused = ZeroBuffers(), (), ()
    from dstk.intent import check_flag_ranges

    check_flag_ranges(args)  # 0, -1, 1e300 for --gpus, --seq-len, --gpu-memory-gib ...: exit 1 naming the flag
    if getattr(args, "from_file", None):
        from dstk.importers import estimate_args

        args = estimate_args(args)
    if args.config:
        model, cluster, layout, training, buffers, notes, refused = from_config(args)
    elif args.intent:
        model, cluster, layout, training = from_intent(args)
    else:
        if args.gpus is None:
            raise UsageError("--gpus N is required (or give --intent FILE)", hint="e.g. --gpus 8")
        model = model_from_args(args)
        cluster = cluster_from_args(args)
        from dstk.plan import choose_attention, choose_precision

        # `dstk plan`'s rule and message: bf16 refused where the GPU has none; unset: bf16, else fp16
        args = argparse.Namespace(**{**vars(args), "precision": choose_precision(requested=args.precision,
                                                                                  gpu=cluster.gpu)[0]})
        # `dstk plan`'s too: what the model's HF class runs (BLOOM: eager), a kernel it lacks refused
        attention, attention_note = choose_attention(requested=args.attention, spec=model, precision=args.precision,
                                                     gpu=cluster.gpu)
        args = argparse.Namespace(**{**vars(args), "attention": attention})
        notes = (attention_note,) if attention_note else ()
        layout, training = layout_and_training(args, model)
    training = _with_lora(args, training=training, layout=layout, model=model)
    from dstk.plan import context_note

    longer = None if isinstance(model, int) else context_note(spec=model, seq_len=training.seq_len)
    notes = (*planned_run_notes(args, model=model, cluster=cluster, layout=layout, training=training),
             *assumption_notes(args, training=training, layout=layout), *((longer,) if longer else ()), *notes)
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        from dstk.hardware import host_optimizer_note  # the node bandwidth the CPU step was priced at, threads

        notes = (*notes, *filter(None, [host_optimizer_note(cluster=cluster)]))
    engine = getattr(args, "engine", "deepspeed")
    if engine == "megatron" and args.config:
        raise UsageError("--engine megatron with --config: a DeepSpeed config is run by DeepSpeed",
                         hint="drop --engine megatron, or drop --config and give the layout flags")
    try:
        est = estimate(model=model, layout=layout, training=training, cluster=cluster, buffers=buffers,
                       engine=engine, tp_style="megatron" if engine == "megatron" else "autotp")
    except ValueError as exc:
        if engine != "megatron":
            raise
        raise DstkError(f"--engine megatron: {exc}", hint="Megatron-LM shards the optimizer states only: "
                        "use --zero 0 or 1 and no offload") from None
    if args.format == "json":
        data = est.to_dict()
        data["notes"] = list(notes)  # what the human output lists under "notes" (assumed defaults, ...)
        if args.config:
            data["config"] = {"path": args.config, "buffers": dataclasses.asdict(buffers), "notes": list(notes),
                              "deepspeed_refuses": [f.to_dict() for f in refused]}
        print(json.dumps(data, indent=2))
    else:
        from dstk import tables

        width = tables.console().width
        text = render_human(est, width=width)
        extra = buffer_lines(est, buffers)
        if args.config:
            text = f"{args.config}:\n" + text
        for title, lines, marker in (("buffers (per GPU)", [x.strip() for x in extra], ""), ("notes", notes, "-")):
            if lines:
                text += f"\n\n{title}\n" + tables.to_text(
                    lambda con, lines=lines, marker=marker: con.print(tables.bullets(lines, marker=marker)),
                    width=width)
        print(text)
    if refused:  # the estimate is printed, but of a file deepspeed.initialize would not accept
        from dstk.errors import EXIT_INVALID
        from dstk.findings import render_text

        print(f"error: DeepSpeed refuses {args.config} at deepspeed.initialize; the estimate above is of the file "
              f"with {'this setting' if len(refused) == 1 else 'these settings'} left out\n"
              + render_text(args.config, refused), file=sys.stderr)
        return EXIT_INVALID
    return 0
