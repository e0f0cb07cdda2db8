"""The step-time model against published runs, with the estimator called as the planner calls it.

    .venv/bin/python benchmarks/estimate_published.py
    .venv/bin/python benchmarks/estimate_published.py --zero3-candidates   # mechanisms not applied

Two tables, each row: the predicted figure, the published one, the error; then mean and worst
absolute error per table (goal: mean <= 5%, worst <= 8%). Nothing here is fitted to these rows:
the hardware figures are the catalog's (``dstk.hardware``), the same for every row.

1. Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
   arXiv 2205.05198), Table 5: seconds per iteration of GPT models on Selene (A100-80GB SXM, 8 per
   node, 8 x HDR InfiniBand), TP = 8, s = 2048, V = 51200, no data parallelism, fp16; model
   dimensions, pipeline sizes and batch sizes from its Table 3. "full" = full recompute, "selective
   + SP" = the paper's "present work".
2. Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
   Megatron-LM", arXiv 2104.04473), Table 2: PTD-P (Megatron, TP 8, PP 12 / 35) against ZeRO-3
   without model parallelism (DeepSpeed), same machines, fp16, full recompute, s = 2048,
   V = 51200. The published figure is "achieved teraFLOP/s per GPU" counted with the paper's Eq. 3,
   ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` per iteration, which includes the recompute
   forward (4 passes, not 3). Micro-batch sizes from the table: 1 for PTD-P; ZeRO-3 keeps the batch
   on one GPU (batch / GPUs: 4, 2, 1). The 175B model: 96 layers, h = 12288, 96 heads; the 530B:
   105 layers, h = 20480, 128 heads (the paper's Table 1).

3. Korthikanti et al. 2022 Table 4: forward and backward milliseconds of one 22B layer (TP 8,
   micro-batch 4) in five settings; ``dstk.estimate.steptime.layer_pass_seconds`` is the same
   quantity. A check of the per-layer model, not one of the issue's goals.

Megatron rows run the estimator with ``engine="megatron"`` and eager (fused-softmax) attention, as
Megatron-LM did before FlashAttention; ZeRO-3 rows with ``engine="deepspeed"``. Narayanan's PTD-P
rows ran the Megatron-LM of April 2021, which had no asynchronous TP communication (merged in
September 2021): they call the estimator's ``step_time`` with
``dstk.estimate.steptime.MEGATRON_2021``; Korthikanti's 2022 rows use today's default.

Fused kernels: dstk's ``deepspeed`` engine runs HF transformers' modules, whose norms, rotary,
activation and residual adds run eagerly op by op (``timing.eager_elementwise_bytes_per_token``,
3-4x the bytes of fused kernels). Narayanan's ZeRO-3 rows ran Megatron-DeepSpeed's GPT (Megatron's
fused LayerNorm, bias-GeLU and bias-dropout-add kernels): they call the estimator with
``fused_kernels=True``, as Megatron's rows get by default. The sharded-data-parallel checks below ran
eager PyTorch modules and are priced so (``fused_kernels=False``).

Checks of sharded data parallelism (FSDP, priced as ZeRO-3 over whole nodes), not the issue's goals:
MosaicML's llm-foundry tables of 2023 (``MOSAIC``: Composer FSDP of MPT on A100s, with the Triton
attention kernel they ran) and the PyTorch FSDP blog of 2024 (``FSDP_BLOG``: Llama 2 34B/70B on 128
A100s and 96 H100s). Each states its error (``MOSAIC_TOLERANCE``, ``FSDP_BLOG_TOLERANCE``;
tests/test_sharded_published.py).
"""

from __future__ import annotations

import dataclasses
import inspect

from dstk.estimate import estimate
from dstk.hardware import Cluster, Interconnect, attention_curve, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module

SEQ, VOCAB = 2048, 51200

# name: (heads, hidden, layers, pp, gpus, global batch, micro-batch), Korthikanti Table 3
KORTHIKANTI = {
    "22B": (64, 6144, 48, 1, 8, 4, 4),
    "175B": (96, 12288, 96, 8, 64, 64, 1),
    "530B": (128, 20480, 105, 35, 280, 280, 1),
    "1T": (160, 25600, 128, 64, 512, 512, 1),
}
# Korthikanti §6: "We use the interleaving schedule with three interleaving stages (m = 3) for the
# 175B and 530B models"; the others run the plain 1F1B schedule.
KORTHIKANTI_VIRTUAL = {"22B": 1, "175B": 3, "530B": 3, "1T": 1}
KORTHIKANTI_SECONDS = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83), "1T": (94.42, 71.49)}

NARAYANAN_MODELS = {"175B": (96, 12288, 96), "530B": (128, 20480, 105)}
# (scheme, model, gpus, global batch, micro-batch, tp, pp, virtual stages, published TFLOP/s per
# GPU), Table 2. The table does not say which pipeline schedule the PTD-P rows ran, and the authors'
# scripts (Megatron-LM examples/sc21, de7dc40f88) have none for it: they interleave Table 1's 530B
# layout (run_table_1.sh, 3 virtual stages) and run the 175B layout of Figure 12 both ways
# (run_figure_12.sh). The rows' own scaling answers it: at a fixed global batch, each doubling of the
# DP degree halves the micro-batches per pipeline m, and the throughput falls by the bubble. Plain
# 1F1B, (p - 1)/m: 175B (p = 12, m = 384, 192, 96) keeps 0.973 and 0.923 of the 384-GPU figure,
# published 149/153 = 0.974 and 141/153 = 0.922; 530B (p = 35, m = 1120, 560, 280) 0.971 and 0.919,
# published 0.977 and 0.930. Interleaved (bubble / v) keeps 0.993 and 0.979 (175B, v = 4) and 0.990
# and 0.970 (530B, v = 3): it leaves 5-7% of the drop unexplained (a per-iteration cost of 1.2-2.6 s
# that no part of the 2021 code accounts for; see docs/estimate.md). So the rows run 1F1B (v = 1);
# ``narayanan_interleaved_rows`` prints the interleaved reading beside them.
NARAYANAN = (
    ("ZeRO-3", "175B", 384, 1536, 4, 1, 1, 1, 144),
    ("ZeRO-3", "175B", 768, 1536, 2, 1, 1, 1, 88),
    ("ZeRO-3", "175B", 1536, 1536, 1, 1, 1, 1, 44),
    ("ZeRO-3", "530B", 640, 2560, 4, 1, 1, 1, 138),
    ("ZeRO-3", "530B", 1120, 2240, 2, 1, 1, 1, 98),
    ("ZeRO-3", "530B", 2240, 2240, 1, 1, 1, 1, 48),
    ("PTD-P", "175B", 384, 1536, 1, 8, 12, 1, 153),
    ("PTD-P", "175B", 768, 1536, 1, 8, 12, 1, 149),
    ("PTD-P", "175B", 1536, 1536, 1, 8, 12, 1, 141),
    ("PTD-P", "530B", 560, 2240, 1, 8, 35, 1, 171),
    ("PTD-P", "530B", 1120, 2240, 1, 8, 35, 1, 167),
    ("PTD-P", "530B", 2240, 2240, 1, 8, 35, 1, 159),
)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Row:
    table: str
    label: str
    unit: str
    predicted: float
    published: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1


def gpt(heads: int, hidden: int, layers: int):
    """A GPT-3-style decoder (learned positions, 4h GELU MLP, LayerNorm, dropout 0.1), as in the papers."""
    cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": VOCAB,
           "n_positions": SEQ, "attn_pdrop": 0.1}
    return family_module("gpt2").read(cfg, name=f"gpt-{hidden}")


def _estimate(*, engine: str, **kw):
    """``dstk.estimate.estimate`` with the engine the run used (``engine=`` where the estimator has
    it, else the Megatron embedding sharding it implies)."""
    if "engine" in inspect.signature(estimate).parameters:
        return estimate(engine=engine, **kw)
    return estimate(tp_style="megatron" if engine == "megatron" else "autotp", **kw)


def _cluster(gpus: int) -> Cluster:
    return Cluster(num_nodes=max(1, gpus // 8), gpus_per_node=min(8, gpus), gpu=get_gpu("a100-80gb"),
                   interconnect=get_interconnect("ib-hdr"))


def korthikanti_rows() -> list[Row]:
    out = []
    for name, (heads, hidden, layers, pp, gpus, batch, micro) in KORTHIKANTI.items():
        spec = gpt(heads, hidden, layers)
        training = Training(seq_len=SEQ, global_batch=batch, precision="fp16", attention="eager")
        for (label, recompute, sp), measured in zip((("full", "full", False), ("selective + SP", "selective", True)),
                                                    KORTHIKANTI_SECONDS[name]):
            layout = Layout(dp=1, tp=8, pp=pp, micro_batch=micro, grad_accum=batch // micro, recompute=recompute,
                            sequence_parallel=sp, virtual_stages=KORTHIKANTI_VIRTUAL[name])
            t = _estimate(engine="megatron", model=spec, layout=layout, training=training, cluster=_cluster(gpus)).time
            out.append(Row(table="Korthikanti 2022 Table 5", label=f"{name} {label}", unit="s/iter",
                           predicted=t.step_seconds, published=measured))
    return out


# (recompute, sequence parallel): (forward ms, backward ms), Korthikanti Table 4, 22B
KORTHIKANTI_LAYER_MS = {("none", False): (7.7, 11.9), ("none", True): (7.2, 11.8), ("full", False): (7.7, 19.5),
                        ("selective", False): (7.7, 13.2), ("selective", True): (7.2, 13.1)}


def korthikanti_layer_rows() -> list[Row]:
    from dstk.estimate import _model_facts
    from dstk.estimate.steptime import layer_pass_seconds

    heads, hidden, layers, _, gpus, batch, micro = KORTHIKANTI["22B"]
    facts = _model_facts(gpt(heads, hidden, layers))
    training = Training(seq_len=SEQ, global_batch=batch, precision="fp16", attention="eager")
    out = []
    for (recompute, sp), (fwd_ms, bwd_ms) in KORTHIKANTI_LAYER_MS.items():
        layout = Layout(tp=8, micro_batch=micro, recompute=recompute, sequence_parallel=sp)
        p = layer_pass_seconds(facts=facts, layout=layout, training=training, cluster=_cluster(gpus),
                               tp_style="megatron")
        label = f"{recompute}{' + SP' if sp else ''}"
        out.append(Row(table="Korthikanti 2022 Table 4 (one 22B layer)", label=f"{label} forward", unit="ms",
                       predicted=1e3 * (p.forward + p.tp_forward), published=fwd_ms))
        out.append(Row(table="Korthikanti 2022 Table 4 (one 22B layer)", label=f"{label} backward", unit="ms",
                       predicted=1e3 * (p.backward + p.tp_backward), published=bwd_ms))
    return out


def eq3_flops(*, batch: int, layers: int, hidden: int) -> float:
    """Narayanan et al. 2021 Eq. 3: FLOPs per iteration with full recompute."""
    return 96.0 * batch * SEQ * layers * hidden**2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def _megatron_2021_time(*, model, layout, training, cluster):
    """The estimator's step time for the Megatron-LM of April 2021 (``MEGATRON_2021``): the same
    ``step_time`` that ``estimate(engine="megatron")`` calls, with the 2021 kernels."""
    from dstk.estimate import _DEFAULT_BUFFERS, _model_facts
    from dstk.estimate.steptime import MEGATRON_2021, step_time

    _estimate(engine="megatron", model=model, layout=layout, training=training, cluster=cluster)  # fits, valid
    return step_time(facts=_model_facts(model), layout=layout, training=training, cluster=cluster,
                     buffers=_DEFAULT_BUFFERS, tp_style="megatron", kernels=MEGATRON_2021)


def _deepspeed_2021_time(*, model, layout, training, cluster):
    """The estimator's step time for the DeepSpeed of spring 2021 (``DEEPSPEED_2021``: per-parameter
    blocking gathers, one GPU's share of the node's NICs), with ``step_time`` as
    ``estimate(engine="deepspeed")`` calls it, but with Megatron-DeepSpeed's fused kernels
    (``fused_kernels=True``: the module docstring)."""
    from dstk.estimate import _DEFAULT_BUFFERS, _model_facts
    from dstk.estimate.steptime import DEEPSPEED_2021, step_time

    _estimate(engine="deepspeed", model=model, layout=layout, training=training, cluster=cluster)  # fits, valid
    return step_time(facts=_model_facts(model), layout=layout, training=training, cluster=cluster,
                     buffers=_DEFAULT_BUFFERS, zero_kernels=DEEPSPEED_2021, fused_kernels=True)


NARAYANAN_INTERLEAVED = {"175B": 4, "530B": 3}
"""The virtual stages of the sc21 scripts' interleaved runs of these layouts (run_figure_12.sh: 2 layers
per virtual stage of 8; run_table_1.sh: 1 of 3)."""


def narayanan_interleaved_rows() -> list[Row]:
    """Table 2's PTD-P rows read as interleaved runs (``NARAYANAN_INTERLEAVED``): a check, not the goal."""
    rows = [(scheme, name, gpus, batch, micro, tp, pp, NARAYANAN_INTERLEAVED[name], published)
            for scheme, name, gpus, batch, micro, tp, pp, _, published in NARAYANAN if scheme == "PTD-P"]
    return [dataclasses.replace(r, table="Narayanan 2021 Table 2, PTD-P read as interleaved (check)")
            for r in narayanan_rows(rows)]


def narayanan_rows(rows=NARAYANAN) -> list[Row]:
    out = []
    for scheme, name, gpus, batch, micro, tp, pp, v, published in rows:
        heads, hidden, layers = NARAYANAN_MODELS[name]
        dp = gpus // (tp * pp)
        layout = Layout(dp=dp, tp=tp, pp=pp, micro_batch=micro, grad_accum=batch // (micro * dp), recompute="full",
                        zero_stage=3 if scheme == "ZeRO-3" else 0, virtual_stages=v)
        training = Training(seq_len=SEQ, global_batch=batch, precision="fp16", attention="eager")
        model, cluster = gpt(heads, hidden, layers), _cluster(gpus)
        if scheme == "PTD-P":
            t = _megatron_2021_time(model=model, layout=layout, training=training, cluster=cluster)
        else:
            t = _deepspeed_2021_time(model=model, layout=layout, training=training, cluster=cluster)
        tflops = eq3_flops(batch=batch, layers=layers, hidden=hidden) / t.step_seconds / gpus / 1e12
        out.append(Row(table="Narayanan 2021 Table 2", label=f"{scheme} {name} {gpus} GPUs", unit="TFLOP/s",
                       predicted=tflops, published=published))
    return out


# MosaicML llm-foundry, scripts/train/benchmarking/README.md, the "A100 80GB/40GB with 1600 Gbps
# node-node interconnect (RoCE)" tables: (model, GPU, GPUs, micro-batch, accumulation, published tokens/s
# per GPU). The rows were measured in March-April 2023 (mosaicml/examples, examples/llm/throughput,
# 71dd21bd "add 40gb tput" and 9fa3ceb9 of 2023-04-04; moved unchanged into llm-foundry at 300cc5c58),
# and what ran is in that commit's submit_benchmarks.py, sweep.sh, requirements.txt and yamls:
# - torch 1.13.1 (image mosaicml/pytorch:1.13.1_cu117), Composer 0.13.3 (mosaicml==0.13.3);
# - precision "bf16", which Composer 0.13.3 reads as amp_bf16 (trainer.py
#   ``_get_backwards_compatible_precision``), and FSDP ``mixed_precision: PURE``: param, reduce and buffer
#   dtype all bf16 (Composer ``get_mixed_precision``): the gathers and the gradient reduce-scatters move
#   bf16, as dstk prices;
# - FULL_SHARD, ``activation_checkpointing: true`` (non-reentrant, each block inside its FSDP unit: two
#   gathers per block per micro-batch, the recompute using the backward's), ``limit_all_gathers: true``;
# - ``attn_impl: triton`` (yamls and the script's default): the Triton FlashAttention kernel
#   (triton==2.0.0.dev20221202), not FlashAttention-2, which came out in July 2023. Priced with its own
#   published rate, ``MOSAIC_TRITON_TFLOPS``;
# - MosaicGPT's defaults (configuration_mosaic_gpt.py): learned positions (``alibi: False``), no dropout
#   (``attn_pdrop``, ``resid_pdrop``, ``emb_pdrop`` 0), biases, tied embedding, exact GELU
#   (``nn.GELU(approximate='none')``), ``low_precision_layernorm``; its modules run op by op in eager
#   torch 1.13 (no fused bias-GeLU or dropout-add, no torch.compile): HF GPT-2's eager modules with
#   ``activation_function: "gelu"``, ``fused_kernels=False`` (within 0.2% of the fused pricing here);
# - C4 concatenated to 2048-token samples (``convert_dataset.py --concat_tokens``): no padding; the
#   tokens/s column is samples/s x 2048 (collect_results.py).
# MPT shapes (hidden, layers, heads) from the same commit's yamls/mosaic_gpt/*.yaml, V = 50368.
MPT = {"70b": (8192, 80, 64), "30b": (7168, 48, 56), "13b": (5120, 40, 40), "7b": (4096, 32, 32)}
MOSAIC = (
    ("70b", "a100-80gb", 64, 8, 4, 410), ("70b", "a100-80gb", 32, 2, 16, 373),
    ("70b", "a100-40gb", 128, 4, 1, 376), ("70b", "a100-40gb", 64, 2, 1, 276),
    ("30b", "a100-40gb", 128, 6, 1, 865), ("30b", "a100-40gb", 32, 4, 1, 857),
    ("13b", "a100-40gb", 128, 16, 1, 1972), ("13b", "a100-40gb", 16, 10, 1, 1993),
    ("7b", "a100-40gb", 128, 18, 1, 3623),
)
MOSAIC_TRITON_TFLOPS = (50, 61, 68, 74, 78, 80)
"""The Triton FlashAttention kernel on an A100 80GB SXM4, causal forward + backward, head dim 128 (every
MPT here has 128), TFLOP/s at 512..16k: Dao 2023 (FlashAttention-2, arXiv 2307.08691) Fig. 4d, the
"FlashAttention Triton" bars as printed, read from the flash-attention repository's
``assets/flash2_a100_fwd_bwd_benchmark.png`` (FlashAttention-2 in the same panel: 99..189, the
catalog's ``a100-fa2`` curve). 68 against 155 TFLOP/s at 2k."""
MOSAIC_TOLERANCE = 0.12
"""The check's stated error: every row but ``MOSAIC_UNEXPLAINED`` within 12% (all predicted fast, 2-11%:
docs/estimate.md)."""
MOSAIC_UNEXPLAINED = ("MPT-70b 40gb 64 GPUs mb2",)
"""Rows no sourced mechanism explains (docs/estimate.md): MPT-70b on 64 A100-40GB at micro-batch 2 ran
35.9% MFU where the same model at micro-batch 2 on 32 A100-80GB ran 48.6% and at micro-batch 4 on 128
A100-40GB 48.9%. dstk's memory does not put it nearer the card than the 128-GPU row (27.3 against 28.2
GiB of 40 at the peak), so allocator retries under memory pressure do not single it out either."""


def mpt(name: str):
    """An MPT of ``MPT[name]`` as MosaicGPT ran it in 2023 (``MOSAIC``): HF GPT-2's layout with no dropout
    and exact GELU."""
    hidden, layers, heads = MPT[name]
    cfg = {"model_type": "gpt2", "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": 50368,
           "n_positions": SEQ, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
           "activation_function": "gelu"}
    return family_module("gpt2").read(cfg, name=f"mpt-{name}")


def mosaic_estimate(name: str, gpu: str, gpus: int, micro: int, accum: int, *,
                    attention_tflops: tuple[float, ...] | None = MOSAIC_TRITON_TFLOPS):
    """The estimator's ``Estimate`` of one ``MOSAIC`` row (its time and memory): ZeRO-3 over the catalog's
    ``roce-200`` (8 x 200 Gb/s), with the Triton attention kernel's published rate
    (``MOSAIC_TRITON_TFLOPS``) in place of FlashAttention-2's (``attention_tflops=None``: the catalog's
    FlashAttention-2 curve, what the rows priced before)."""
    layout = Layout(dp=gpus, micro_batch=micro, grad_accum=accum, recompute="full", zero_stage=3)
    training = Training(seq_len=SEQ, global_batch=gpus * micro * accum, precision="bf16", attention="flash")
    a100 = get_gpu(gpu)
    if attention_tflops is not None:
        a100 = a100.replace(flash_attention_efficiency=attention_curve(peak_tflops=312,
                                                                       forward_backward_causal=attention_tflops))
    cluster = Cluster(num_nodes=gpus // 8, gpus_per_node=8, gpu=a100, interconnect=get_interconnect("roce-200"))
    return _estimate(engine="deepspeed", model=mpt(name), layout=layout, training=training, cluster=cluster,
                     fused_kernels=False)  # eager torch 1.13 modules (``MOSAIC``)


def mosaic_rows() -> list[Row]:
    """Composer FSDP as MosaicML ran it (``MOSAIC``), priced as ZeRO-3 (``mosaic_estimate``): a check of
    sharded data parallelism over whole nodes, not one of the issue's goals."""
    out = []
    for name, gpu, gpus, micro, accum, published in MOSAIC:
        t = mosaic_estimate(name, gpu, gpus, micro, accum).time
        out.append(Row(table="MosaicML llm-foundry FSDP, 2023 (check)",
                       label=f"MPT-{name} {gpu[-4:]} {gpus} GPUs mb{micro}", unit="tokens/s/GPU",
                       predicted=t.tokens_per_second / gpus, published=published))
    return out


# Team PyTorch at IBM and Meta, "Maximizing training throughput using PyTorch FSDP" (pytorch.org blog,
# 2024-03-13), Table 1: Llama 2 shapes trained with IBM's fms-fsdp on "an A100 cluster with 128 GPUs and
# 400Gbps inter-node interconnect, and an H100 cluster with 96 GPUs and 800Gbps inter-node interconnect",
# "SDPA FlashAttention v2", bf16 mixed precision, "PyTorch nightlies post-2.2 release", batch 2 per GPU
# of 4k-token sequences ("to mimic choices made in training models of 4k sequence length"; fms-fsdp's
# ``seq_length: 4096``). fms-fsdp of that month (ffbe07a, 2024-03-14): FSDP1 with ``bfSixteen`` (param,
# reduce and buffer dtype bf16: gathers and reduce-scatters in bf16, as dstk prices), ``limit_all_gathers``,
# no torch.compile (``use_torch_compile: False``: the blog's levers are "1, 3, and a variation of 4"), and
# docs/configurations.md: "for larger models like 34b and 70b, FSDP [full shard] will be a necessity";
# ``selective_checkpointing: 1`` checkpoints every block (the table's "Yes": full recompute). Shapes from
# fms-fsdp's ``get_model_config`` (``llama2_34b``: 48 layers, h 8192, 64 heads, 8 KV heads, FFN 22016;
# ``llama2_70b``: 80 layers, FFN 28672), V = 32000, untied head. FMS's LLaMA runs its RMSNorm, SwiGLU and
# rotary op by op: HF Llama's eager modules (``fused_kernels=False``). On H100, SDPA in torch 2.2-2.4 ran
# FlashAttention-2 (cuDNN attention became its first choice later): the FlashAttention-2 curve.
# Left out: the 7B rows (no recompute) ran HSDP, fms-fsdp's default for 7b/13b (sharded in the node,
# replicated across nodes), which the estimator does not price; the 13B rows' "Selective" checkpoints
# every k-th block, not a recompute mode dstk has.
# (model, GPU, GPUs, node interconnect in Gb/s, published tokens/s per GPU)
FSDP_BLOG_LLAMA2 = {"34b": (8192, 48, 64, 8, 22016), "70b": (8192, 80, 64, 8, 28672)}
FSDP_BLOG = (
    ("34b", "a100-80gb", 128, 400, 700), ("70b", "a100-80gb", 128, 400, 370),
    ("34b", "h100-sxm", 96, 800, 1550), ("70b", "h100-sxm", 96, 800, 800),
)
FSDP_BLOG_TOLERANCE = 0.10
"""The check's stated error: every row within 10% (the issue's goal tables ask 8% worst; this one is a
check, with the fabric's efficiency and latency assumed, ``fsdp_blog_interconnect``)."""


def fsdp_blog_interconnect(gbps: int) -> Interconnect:
    """The blog's "``gbps`` inter-node interconnect", read as the node's total; "GPU direct RDMA" over a
    fabric the blog does not name: the catalog's RoCE efficiency and latency (``roce-200``)."""
    roce = get_interconnect("roce-200")
    return Interconnect(slug=f"fsdp-blog-{gbps}g", name=f"{gbps} Gb/s per node (PyTorch FSDP blog)",
                        node_bytes_per_s=gbps / 8 * 1e9, latency_s=roce.latency_s, efficiency=roce.efficiency,
                        collective_latency_seconds=roce.collective_latency_seconds)


def fsdp_blog_rows() -> list[Row]:
    """PyTorch FSDP (FULL_SHARD) of Llama 2 34B/70B as the blog ran it (``FSDP_BLOG``), priced as ZeRO-3
    by the estimator: a check of sharded data parallelism on A100 and H100, not one of the issue's goals."""
    seq, out = 4096, []
    for name, gpu_slug, gpus, gbps, published in FSDP_BLOG:
        hidden, layers, heads, kv_heads, ffn = FSDP_BLOG_LLAMA2[name]
        cfg = {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers,
               "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": ffn,
               "vocab_size": 32000, "max_position_embeddings": seq, "rms_norm_eps": 1e-5}
        model = family_module("llama").read(cfg, name=f"llama2-{name}")
        layout = Layout(dp=gpus, micro_batch=2, grad_accum=1, recompute="full", zero_stage=3)
        training = Training(seq_len=seq, global_batch=2 * gpus, precision="bf16", attention="sdpa")
        gpu = get_gpu(gpu_slug).replace(sdpa_attention_efficiency=None)  # SDPA ran FlashAttention-2
        cluster = Cluster(num_nodes=gpus // 8, gpus_per_node=8, gpu=gpu, interconnect=fsdp_blog_interconnect(gbps))
        t = _estimate(engine="deepspeed", model=model, layout=layout, training=training, cluster=cluster,
                      fused_kernels=False).time
        out.append(Row(table="PyTorch FSDP blog 2024, Llama 2 (check)", label=f"{name} {gpu_slug} {gpus} GPUs",
                       unit="tokens/s/GPU", predicted=t.tokens_per_second / gpus, published=published))
    return out


# Shoeybi et al. 2019 (Megatron-LM, arXiv 1909.08053) §5.1 and Table 1: the single-GPU baseline, a
# GPT-2 of hidden 1536, 16 heads, 40 layers (1.2B), s = 1024, V padded to 51,200, "a fixed batch size of
# 8", mixed precision, "activation checkpointing after every transformer layer" (§4), on one V100 SXM3
# 32GB of a DGX-2H, sustaining "39 TeraFLOPS ... 30% of the theoretical peak FLOPS for a single GPU in a
# DGX-2H server". NVIDIA ADLR's "MegatronLM's Supercharged V1.0" post (nv-adlr.github.io/MegatronLMV1):
# the same baseline after "several software optimizations", "62.4 teraFLOPs which is 48% of the
# theoretical peak FLOPS for a single GPU in a DGX2-H server", 1288 ms per iteration at batch 8.
# Neither says how FLOPs are counted; the post's pair fixes the count per iteration (62.4e12 x 1.288 s),
# which turns the paper's 39 TFLOP/s into seconds on the same count.
MEGATRON_V100_FLOPS_PER_ITER = 62.4e12 * 1.288
MEGATRON_V100_PEAK_FLOPS = 130e12
"""The DGX-2H V100's fp16 peak the authors divide by (39/0.30 = 62.4/0.48 = 130 TFLOP/s; the
catalog's ``v100-32gb`` is the 125 TFLOP/s SXM2 part)."""
MEGATRON_V100 = (
    ("Megatron v1.0 (ADLR post)", True, 1.288),
    ("Megatron 2019 (paper)", True, MEGATRON_V100_FLOPS_PER_ITER / 39e12),
    ("Megatron 2019, unfused", False, MEGATRON_V100_FLOPS_PER_ITER / 39e12),
)
"""(label, fused kernels, published seconds per iteration). The 2019 code's kernels are not listed in
the paper; the unfused row prices its norms, GeLU and residuals op by op (HF GPT-2's eager modules,
the estimator's ``fused_kernels=False``), a reading, not the authors' statement."""


def megatron_v100_rows() -> list[Row]:
    """Megatron-LM's 1.2B single-V100 baseline (``MEGATRON_V100``) priced as run: ``engine="megatron"``,
    fp16, full recompute, eager attention, the catalog's ``v100-32gb`` at the DGX-2H peak
    (``MEGATRON_V100_PEAK_FLOPS``, the GEMM curve's shares unchanged). A check of the V100 entry
    (``dstk.hardware.ASSUMED_MAMF``), not one of the issue's goals."""
    spec = family_module("gpt2").read({"model_type": "gpt2", "n_embd": 1536, "n_layer": 40, "n_head": 16,
                                       "vocab_size": VOCAB, "n_positions": 1024, "attn_pdrop": 0.1},
                                      name="megatron-gpt2-1.2b")
    gpu = get_gpu("v100-32gb").replace(fp16_flops=MEGATRON_V100_PEAK_FLOPS)
    cluster = Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu, interconnect=get_interconnect("ib-hdr"))
    training = Training(seq_len=1024, global_batch=8, precision="fp16", attention="eager")
    layout = Layout(dp=1, micro_batch=8, grad_accum=1, recompute="full")
    out = []
    for label, fused, seconds in MEGATRON_V100:
        t = _estimate(engine="megatron", model=spec, layout=layout, training=training, cluster=cluster,
                      fused_kernels=fused).time
        out.append(Row(table="Shoeybi 2019 Megatron 1.2B on one V100 (check)", label=label, unit="s/iter",
                       predicted=t.step_seconds, published=seconds))
    return out


def summary(rows: list[Row]) -> tuple[float, float]:
    """(mean, worst) absolute error."""
    errors = [abs(r.error) for r in rows]
    return sum(errors) / len(errors), max(errors)


def zero3_candidates() -> list[tuple[str, list[float]]]:
    """Errors of Table 2's six ZeRO-3 rows under two sourced mechanisms the model does not apply
    (docs/estimate.md, "Against published runs"): each row's micro-batch is recomputed with
    ``steptime.zero3_step_seconds`` from the inputs the estimator hands it (forward and backward
    compute, one gather pass ``G``, the reduce-scatter ``R``; the estimator adds the two backward
    gathers after the call), with ``2 - keep`` backward gathers and ``per_rank`` seconds per rank
    and call added to ``G`` and ``R`` for each of a layer's parameter tensors (DeepSpeed 2021
    gathers and reduce-scatters them one call each):

    - ``keep = 1/3``: DeepSpeed 2021's ``_keep_for_later`` keeps a module reused within
      ``stage3_max_reuse_distance`` (1e9 elements), the layer's last (``dense_4h_to_h``, 4h^2 of
      12h^2) from its recompute to its backward;
    - ``per_rank``: PyTorch 1.8's list ``all_gather``/``reduce_scatter`` copy one tensor per rank."""
    from dstk.estimate import _model_facts, steptime

    seen: list[dict] = []
    step = steptime.zero3_step_seconds

    def record(**kw):
        seen.append(kw)
        return step(**kw)

    steptime.zero3_step_seconds = record
    try:
        base = []
        for r in (r for r in NARAYANAN if r[0] == "ZeRO-3"):
            seen.clear()
            heads, hidden, layers = NARAYANAN_MODELS[r[1]]
            calls = layers * len(_model_facts(gpt(heads, hidden, layers)).layer_persistent)
            base.append((narayanan_rows([r])[0], dict(seen[-1]), calls, r[2]))
    finally:
        steptime.zero3_step_seconds = step

    def micro_batch(k: dict, *, keep: float, extra: float) -> float:
        return step(**{**k, "gather_seconds": k["gather_seconds"] + extra,
                       "reduce_scatter_seconds": k["reduce_scatter_seconds"] + extra, "backward_gathers": 2 - keep})

    out = []
    for keep, per_rank in ((0.0, 0.0), (1 / 3, 0.0), (0.0, 1e-6), (1 / 3, 1e-6)):
        errors = [row.predicted * micro_batch(k, keep=0.0, extra=0.0)
                  / micro_batch(k, keep=keep, extra=calls * ranks * per_rank) / row.published - 1
                  for row, k, calls, ranks in base]
        out.append((f"keep {keep:.2f}, {per_rank * 1e6:.0f} us per rank and call", errors))
    return out


def main() -> None:
    import sys

    if "--zero3-candidates" in sys.argv[1:]:
        print("Narayanan 2021 Table 2, ZeRO-3 rows (175B 384/768/1536, 530B 640/1120/2240): errors")
        for label, errors in zero3_candidates():
            print(f"  {label:<38} " + " ".join(f"{e:+6.1%}" for e in errors)
                  + f"   worst {max(abs(e) for e in errors):.1%}")
        return
    for rows in (korthikanti_rows(), narayanan_rows(), korthikanti_layer_rows(), narayanan_interleaved_rows(),
                 mosaic_rows(), fsdp_blog_rows(), megatron_v100_rows()):
        print(f"{rows[0].table}")
        print(f"  {'row':<28} {'predicted':>10} {'published':>10} {'error':>7}")
        for r in rows:
            print(f"  {r.label:<28} {r.predicted:>10.2f} {r.published:>10.2f} {r.error:>+7.1%}  {r.unit}")
        mean, worst = summary(rows)
        print(f"  mean absolute error {mean:.1%}, worst {worst:.1%}\n")


if __name__ == "__main__":
    main()
