"""``dstk estimate``: memory per GPU and step time of one parallel layout."""

from __future__ import annotations

import argparse
import json

from dstk.errors import UsageError

HELP = "memory per GPU (with its breakdown) and step time of one layout"
DESCRIPTION = (
    "Estimate one layout: per-GPU memory (parameters, gradients, optimizer states, activations, DeepSpeed "
    "buffers, framework overhead; CPU/NVMe under offload; per pipeline stage) and step time (compute, "
    "communication, pipeline bubble, tokens/s, MFU). The model is a preset (`dstk models`), an HF config.json, "
    "its dimensions, or --params N (model states only). Formulas and sources: docs/estimate.md."
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intent", metavar="FILE", help="take model, cluster and training from an intent file "
                        "(`dstk plan`'s YAML); the layout flags below still choose the layout")
    m = parser.add_argument_group("model (one of)")
    m.add_argument("--model", metavar="NAME|PATH", help="preset slug or HF config.json (file or directory)")
    m.add_argument("--params", type=float, metavar="N", help="parameter count only (e.g. 7e9): no activations")
    for flag in ("num-layers", "hidden-size", "num-heads", "vocab-size", "ffn-hidden-size", "num-kv-heads"):
        m.add_argument(f"--{flag}", type=int, metavar="N")
    c = parser.add_argument_group("cluster")
    c.add_argument("--gpus", type=int, metavar="N", help="GPUs in all (required without --intent)")
    c.add_argument("--gpus-per-node", type=int, metavar="G", help="default: min(N, 8)")
    c.add_argument("--gpu", default="h100-sxm", metavar="TYPE", help="GPU slug (`dstk gpus`), default h100-sxm")
    c.add_argument("--interconnect", metavar="NET", help="inter-node network slug (default: usual for the GPU)")
    c.add_argument("--hardware", metavar="FILE", help="YAML/JSON file adding or changing GPUs and networks")
    c.add_argument("--gpu-memory-gib", type=float, metavar="GIB", help="override the GPU's memory")
    c.add_argument("--gpu-tflops", type=float, metavar="T", help="override the GPU's dense 16-bit peak")
    lay = parser.add_argument_group("layout")
    lay.add_argument("--zero", type=int, choices=[0, 1, 2, 3], default=0)
    lay.add_argument("--offload-optimizer", choices=["none", "cpu", "nvme"], default="none")
    lay.add_argument("--offload-params", choices=["none", "cpu", "nvme"], default="none")
    lay.add_argument("--tp", type=int, default=1)
    lay.add_argument("--pp", type=int, default=1)
    lay.add_argument("--virtual-stages", type=int, default=1, metavar="V", help="interleaved chunks per stage")
    lay.add_argument("--sequence-parallel", action="store_true")
    lay.add_argument("--micro-batch", type=int, default=1, metavar="B")
    lay.add_argument("--global-batch", type=int, metavar="G", help="sequences per step (default: micro-batch x dp)")
    lay.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    t = parser.add_argument_group("training")
    t.add_argument("--seq-len", type=int, metavar="S", help="default: the model's, else 2048")
    t.add_argument("--precision", choices=["bf16", "fp16", "fp32"], default="bf16")
    t.add_argument("--optimizer", choices=["adamw", "adam", "sgd", "lion", "adafactor"], default="adamw")
    t.add_argument("--attention", choices=["sdpa", "eager", "flash"], default="sdpa")
    t.add_argument("--tokens", type=float, metavar="T", help="token budget, for the time to train")
    parser.add_argument("--format", choices=["human", "json"], default="human")


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
            raise UsageError(f"--params {args.params:g}: expected a positive count")
        return int(args.params)
    missing = [k for k, v in dims.items() if v is None]
    if missing:
        raise UsageError(f"dimensions: missing {', '.join('--' + k.replace('_', '-') for k in missing)}",
                         hint="a model from its dimensions needs --num-layers --hidden-size --num-heads --vocab-size")
    try:
        return ModelSpec.generic(**dims, ffn_hidden_size=args.ffn_hidden_size, num_kv_heads=args.num_kv_heads,
                                 seq_len=args.seq_len)
    except ValueError as exc:
        raise UsageError(f"dimensions: {exc}") from None


def cluster_from_args(args: argparse.Namespace):
    from dstk.hardware import Cluster, default_interconnect, get_gpu, get_interconnect, load_catalog

    gpus, nets = load_catalog(args.hardware) if args.hardware else (None, None)
    gpu = get_gpu(args.gpu, catalog=gpus)
    if args.gpu_memory_gib is not None:
        gpu = gpu.replace(memory_bytes=int(args.gpu_memory_gib * 2**30))
    if args.gpu_tflops is not None:
        gpu = gpu.replace(bf16_flops=args.gpu_tflops * 1e12, fp16_flops=args.gpu_tflops * 1e12)
    per_node = args.gpus_per_node or min(args.gpus, 8)
    if args.gpus < 1 or per_node < 1 or args.gpus % per_node:
        raise UsageError(f"--gpus {args.gpus} is not a multiple of --gpus-per-node {per_node}",
                         hint="give whole nodes, e.g. --gpus 16 --gpus-per-node 8")
    nodes = args.gpus // per_node
    net = get_interconnect(args.interconnect or default_interconnect(gpu.slug), catalog=nets)
    return Cluster(num_nodes=nodes, gpus_per_node=per_node, gpu=gpu, interconnect=net)


def layout_and_training(args: argparse.Namespace, model):
    from dstk.layout import Layout, Training

    tp, pp = args.tp, args.pp
    if tp < 1 or pp < 1 or args.gpus % (tp * pp):
        raise UsageError(f"--gpus {args.gpus} is not divisible by tp*pp = {tp * pp}",
                         hint="choose --tp and --pp whose product divides --gpus")
    dp = args.gpus // (tp * pp)
    per_step = args.micro_batch * dp
    global_batch = args.global_batch or per_step
    if global_batch % per_step:
        near = sorted({per_step * max(1, global_batch // per_step), per_step * (global_batch // per_step + 1)})
        raise UsageError(f"--global-batch {global_batch} is not a multiple of micro-batch x dp = "
                         f"{args.micro_batch} x {dp} = {per_step}",
                         hint=f"nearest: {', '.join(map(str, near))}")
    seq = args.seq_len or (getattr(model, "seq_len", None) and min(model.seq_len, 4096)) or 2048
    try:
        layout = Layout(dp=dp, tp=tp, pp=pp, zero_stage=args.zero, offload_optimizer=args.offload_optimizer,
                        offload_params=args.offload_params, micro_batch=args.micro_batch,
                        grad_accum=global_batch // per_step, recompute=args.recompute,
                        virtual_stages=args.virtual_stages, sequence_parallel=args.sequence_parallel)
        training = Training(seq_len=seq, global_batch=global_batch, precision=args.precision,
                            optimizer=args.optimizer, attention=args.attention,
                            num_tokens=int(args.tokens) if args.tokens else None)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return layout, training


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


def render_human(est) -> str:
    from dstk.estimate import SOURCES

    mem, t = est.memory, est.time
    gpu = est.cluster.gpu
    name = getattr(est.model, "name", None) or f"{est.model:,} params"
    lines = [f"{name} on {est.cluster.world_size} x {gpu.name}: dp={est.layout.dp} tp={est.layout.tp} "
             f"pp={est.layout.pp} ZeRO-{est.layout.zero_stage}, micro-batch {est.layout.micro_batch} x "
             f"{est.layout.grad_accum}, seq {est.training.seq_len}, {est.training.precision}", ""]
    rows = [(k, getattr(mem.per_gpu, k)) for k in ("params_bytes", "grads_bytes", "optimizer_bytes",
                                                  "activations_bytes", "buffers_bytes", "overhead_bytes")]
    lines.append(f"memory per GPU (stage {mem.per_gpu.stage}, the fullest)")
    for key, value in rows:
        lines.append(f"  {key[:-6]:<12} {_gib(value):>12}   {SOURCES[key]}")
    fits = "fits" if mem.per_gpu.total_bytes <= gpu.memory_bytes else "DOES NOT FIT"
    lines.append(f"  {'total':<12} {_gib(mem.per_gpu.total_bytes):>12}   of {_gib(gpu.memory_bytes)}: {fits}")
    if mem.cpu_bytes or mem.nvme_bytes:
        lines.append(f"  {'cpu':<12} {_gib(mem.cpu_bytes):>12}   per rank (offload)")
        lines.append(f"  {'nvme':<12} {_gib(mem.nvme_bytes):>12}   per rank (offload)")
    if len(mem.per_stage) > 1:
        lines.append("  per stage: " + ", ".join(f"{s.stage}: {s.num_layers} layers {_gib(s.total_bytes)}"
                                                 for s in mem.per_stage))
    if mem.per_gpu.activations_bytes is None:
        lines.append("  activations are unknown for a model given by --params only")
    lines += ["", "time per step",
              f"  {'compute':<12} {_seconds(t.compute_seconds):>12}   {SOURCES['compute_seconds']}",
              f"  {'comm':<12} {_seconds(t.comm_seconds):>12}   exposed; {SOURCES['comm_seconds']}",
              f"  {'bubble':<12} {_seconds(t.bubble_seconds):>12}   {t.bubble_fraction:.1%}; {SOURCES['bubble_fraction']}",
              f"  {'step':<12} {_seconds(t.step_seconds):>12}   {t.tokens_per_second:,.0f} tokens/s, "
              f"{t.tflops_per_gpu:.1f} TFLOP/s per GPU, MFU {t.mfu:.1%}"]
    comm = ", ".join(f"{k} {_seconds(v)}" for k, v in t.comm.items() if v)
    if comm:
        lines.append(f"  communication before overlap: {comm}")
    if t.time_to_train_seconds is not None:
        lines.append(f"  time for {est.training.num_tokens:,} tokens: {_seconds(t.time_to_train_seconds)}")
    return "\n".join(lines)


def from_intent(args: argparse.Namespace):
    """Model, cluster and training from an intent file; the layout from the flags."""
    import dataclasses

    from dstk.intent import load_intent
    from dstk.plan import resolve

    clashing = [f for f in ("model", "params", "num_layers", "gpus", "gpu", "seq_len", "global_batch")
                if getattr(args, f) not in (None, "h100-sxm")]
    if clashing:
        raise UsageError(f"--intent gives the model, cluster and training; drop --{clashing[0].replace('_', '-')}",
                         hint="edit the intent file instead, or leave --intent out")
    ctx = resolve(load_intent(args.intent))
    args = argparse.Namespace(**{**vars(args), "gpus": ctx.cluster.world_size,
                                 "global_batch": ctx.training.global_batch, "seq_len": ctx.training.seq_len})
    layout, _ = layout_and_training(args, ctx.model)
    training = dataclasses.replace(ctx.training, attention=args.attention) if args.attention != "sdpa" else ctx.training
    return ctx.model, ctx.cluster, layout, training


def run(args: argparse.Namespace) -> int:
    from dstk.estimate import estimate

    if args.intent:
        model, cluster, layout, training = from_intent(args)
    else:
        if args.gpus is None:
            raise UsageError("--gpus N is required (or give --intent FILE)", hint="e.g. --gpus 8")
        model = model_from_args(args)
        cluster = cluster_from_args(args)
        layout, training = layout_and_training(args, model)
    est = estimate(model=model, layout=layout, training=training, cluster=cluster)
    if args.format == "json":
        print(json.dumps(est.to_dict(), indent=2))
    else:
        print(render_human(est))
    return 0
