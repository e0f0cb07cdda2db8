"""Step time of one layout: per-operator compute, communication and what overlaps, the bubble.

``step_time`` prices one micro-batch on the slowest pipeline stage operator by operator, then the
step around it:

- **matrix multiplies** at the share of peak the GPU reaches for their shape (``GPU.gemm_fraction``
  of the GEMM's smallest dimension: the curve in the hardware catalog); the backward pass runs two
  GEMMs of the same three dimensions per forward GEMM (input and weight gradients);
- **memory-bound operators** (norms, activation, residual/dropout, rotary, softmax, the loss and
  the optimizer step) at the sustained HBM bandwidth (``timing.memory_seconds``);
- **attention** by its kernel: eager (and SDPA's math path on CPU ranks) runs ``QK^T`` and ``AV``
  as batched GEMMs of inner dimension ``head_dim`` and materialises the scores; FlashAttention
  (``flash``, and ``sdpa`` on a GPU, which dispatches to it) skips the masked half of a causal
  score matrix, never writes it, and recomputes it in backward (Dao 2023 §3.1: backward = 2.5x the
  forward's FLOPs) at 75% of the GEMM rate (FlashAttention-2 reaches 50-73% of peak on A100,
  Dao 2023 abstract, where dense GEMMs of that size reach ~80%);
- **recompute** as the forward it repeats: full = the whole layer's forward (and its TP
  collectives), selective = the attention scores (Korthikanti et al. 2022 §5; nothing under flash,
  which recomputes them itself);
- **gradients**: each micro-batch's backward lands the weight gradients where the optimizer reads
  them (``timing.grad_accumulation_bytes_per_param``), and the step ends with the optimizer's
  kernels (``timing.optimizer_step_bytes_per_param``), both at HBM bandwidth;
- a **dispatch floor** per layer (``GPU.layer_overhead_seconds``): what a tiny model on a CPU rank
  spends its time on, and a fixed cost per step (``GPU.step_overhead_seconds``: embedding, head,
  loss and the engine's bookkeeping, measured by ``dstk doctor --calibrate``);
- **TP** all-reduces (reduce-scatter + all-gather under sequence parallelism, the same volume)
  on the critical path, as DeepSpeed AutoTP issues them; Megatron runs its backward ones under
  the weight-gradient GEMMs (``MegatronKernels``, ``tp_backward_exposed_seconds``);
- **PP** point-to-point per micro-batch and boundary (x v interleaved) and the bubble
  ``(p - 1)/(m v)`` of the stage time (Narayanan et al. 2021 §2.2);
- **DP**: see ``_dp_exposed_seconds`` and ``zero3_step_seconds``;
- **per-call latency**: every collective the layout issues (``collective_calls``) costs
  ``collective_latency_seconds`` whatever its size; the ZeRO buckets' latency hides with their
  bytes under ``overlap_comm`` on a GPU, the calls after backward are exposed, and a CPU rank
  overlaps nothing (what prices small-bucket ZeRO on gloo).
"""

from __future__ import annotations

import dataclasses

from dstk.estimate import memory as mem
from dstk.estimate import timing as tm

FLASH_FRACTION = 0.75
"""FlashAttention's rate relative to a dense GEMM of the same size (FlashAttention-2, Dao 2023:
50-73% of A100's peak, where cuBLAS reaches ~80-86%, Bekman's MAMF table)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LayerSeconds:
    """One transformer layer, one micro-batch, one GPU: forward seconds by kind, and what backward
    and recompute add."""

    gemm: float
    """The four projections (QKV, output, MLP in, MLP out), forward."""
    attention: float
    """Score GEMMs (eager) or the fused kernel (flash), forward."""
    scores_memory: float
    """Softmax/dropout over the materialised scores (eager only), forward."""
    elementwise: float
    """Norms, residuals, activation, rotary, forward."""
    flash: bool = False
    """The attention kernel is FlashAttention: its backward recomputes the scores (2.5x the
    forward's FLOPs, Dao 2023 §3.1), and there is nothing for selective recompute to repeat."""
    column_gemm: float = 0.0
    """Forward seconds of the column-parallel GEMMs (QKV and MLP in), part of ``gemm``: in backward
    each runs a weight-gradient GEMM of the same size, which Megatron overlaps with the TP
    collective of its input gradient (``MegatronKernels.async_tp_backward``)."""

    @property
    def forward(self) -> float:
        return self.gemm + self.attention + self.scores_memory + self.elementwise

    @property
    def backward(self) -> float:
        return 2.0 * (self.gemm + self.scores_memory + self.elementwise) + (2.5 if self.flash else 2.0) * self.attention

    def recompute(self, mode: str) -> float:
        if mode == "full":
            return self.forward
        if mode == "selective" and not self.flash:
            return self.attention + self.scores_memory
        return 0.0


def uses_flash(*, attention: str, gpu) -> bool:
    """Whether the attention kernel is FlashAttention: ``flash``, or ``sdpa`` on a GPU (PyTorch's
    SDPA picks FlashAttention-2 for 16-bit inputs on sm80+); CPU ranks run SDPA's math path."""
    return not gpu.is_cpu and (attention == "flash" or attention == "sdpa")


def layer_seconds(*, facts, tokens: int, seq_len: int, tp: int, sp: int, act_bytes: int, attention: str, gpu,
                  peak_flops: float) -> LayerSeconds:
    """``LayerSeconds`` of one layer of ``facts`` (``dstk.estimate._Facts``) for ``tokens`` tokens
    of ``seq_len``-long sequences on one GPU of a TP group of ``tp`` (``sp = tp`` with sequence
    parallelism). GEMM shapes per GPU, ``T`` tokens, widths ``q, kv, f`` (Shoeybi et al. 2019 §3):
    QKV ``T x h x (q + 2kv)/t``, output ``T x q/t x h``, MLP in ``T x h x u/t`` (``u = 2f`` gated),
    MLP out ``T x f/t x h``; ``2 N T`` FLOPs in all."""
    shape = facts.shape
    w = act_bytes
    if shape is None:  # a bare parameter count: its FLOPs at the GPU's plain achievable share
        flops = 2.0 * facts.layer_matmul_active * tokens / tp
        return LayerSeconds(gemm=flops / (peak_flops * gpu.achievable_fraction), attention=0.0, scores_memory=0.0,
                            elementwise=0.0)
    h, q, kv, f = facts.hidden, shape.q_width, shape.kv_width, shape.ffn
    up = max(float(f), facts.layer_matmul_active / h - (q + 2 * kv) - q - f)
    gated = up > 1.5 * f
    gemm = column = 0.0
    for i, (m, k, n) in enumerate(((tokens, h, (q + 2 * kv) / tp), (tokens, q / tp, h), (tokens, h, up / tp),
                                   (tokens, f / tp, h))):
        one = tm.gemm_seconds(m=m, n=n, k=k, peak_flops=peak_flops, fraction=gpu.gemm_fraction(min(m, n, k)))
        gemm += one
        column += one if i in (0, 2) else 0.0
    score_flops = 4.0 * tokens * seq_len * q / tp
    scores = tokens * seq_len * (shape.heads / tp)
    if uses_flash(attention=attention, gpu=gpu):
        attn = 0.5 * score_flops / (peak_flops * FLASH_FRACTION * gpu.gemm_fraction(seq_len))
        scores_memory = 0.0
    else:
        attn = score_flops / (peak_flops * gpu.gemm_fraction(facts.head_dim))
        per_score = tm.softmax_bytes_per_score(act_bytes=w, dropout=shape.dropout) + (8 if shape.softmax_fp32 else 0)
        scores_memory = tm.memory_seconds(nbytes=scores * per_score, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    per_token = tm.elementwise_bytes_per_token(hidden=h, q_width=q / tp, kv_width=kv / tp, ffn=f / tp, act_bytes=w,
                                               sp=sp, gated=gated, rotary=facts.rotary, dropout=shape.dropout)
    elementwise = tm.memory_seconds(nbytes=per_token * tokens, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    return LayerSeconds(gemm=gemm, attention=attn, scores_memory=scores_memory, elementwise=elementwise,
                        flash=uses_flash(attention=attention, gpu=gpu), column_gemm=column)


def head_seconds(*, facts, tokens: int, tp: int, act_bytes: int, gpu, peak_flops: float) -> float:
    """The last stage's lm_head (``T x h x V/t``, forward + 2 backward GEMMs) and the
    cross-entropy over ``T x V/t`` logits (read, fp32 softmax written and read back, gradient
    written: ``3(w + 8)`` bytes per logit over forward and backward)."""
    if not facts.vocab:
        return 0.0
    v = facts.vocab / tp
    m, n, k = tokens, v, facts.hidden
    gemm = tm.gemm_seconds(m=m, n=n, k=k, peak_flops=peak_flops, fraction=gpu.gemm_fraction(min(m, n, k)), count=3)
    loss = tm.memory_seconds(nbytes=3.0 * (act_bytes + 8) * tokens * v, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    return gemm + loss


def zero3_step_seconds(*, forward_seconds: float, backward_seconds: float, gather_seconds: float,
                       reduce_scatter_seconds: float, backward_gathers: int) -> float:
    """One micro-batch under ZeRO-3: compute and the parameter traffic of the DP group.

    DeepSpeed gathers each module's parameters before its forward and again in backward (twice
    under full recompute: once for the recompute forward, once for the backward, the layer having
    been released in between), and reduce-scatters the gradients (ZeRO §7: 3 Psi per micro-batch,
    4 Psi with full recompute). All of it crosses the same link (a ring all-gather and a ring
    reduce-scatter each send and receive ``(n - 1)/n`` of the bytes per rank), so the micro-batch
    never takes less than the link's busy time, ``(1 + backward_gathers) G + R``. The overlap:

    - forward: DeepSpeed prefetches the next module's parameters while the current one computes
      (``stage3_prefetch_bucket_size``, 5e7 elements by default: at least the next parameter,
      ``partitioned_param_coordinator.fetch_sub_module``), so forward takes ``max(K_f, G)``;
    - backward: the gradient reduce-scatter runs on its own stream beside the backward compute
      (``overlap_comm``): ``max(K_b, R)``; the ``backward_gathers`` are exposed, the module that
      needs them being the next to run. DeepSpeed 0.19.8 also prefetches in backward once its
      trace is complete (``fetch_sub_module``, ``is_complete_trace``); the runs below did not
      hide those gathers, and no run of today's DeepSpeed at this scale has been measured, so the
      model keeps them exposed (pessimistic if today's prefetch hides them).

    Against Narayanan et al. 2021 Table 2 (DeepSpeed ZeRO-3 on 384-2240 A100s over 8 x HDR IB,
    ``benchmarks/estimate_published.py``): at micro-batch 1 and 2 the runs sit on the link-bound
    floor (175B: 88 and 44 TFLOP/s at 768 and 1536 GPUs are the same 66.7 s per step), at
    micro-batch 4 the exposed backward gathers add to the compute; hiding the backward gathers
    too (``max(K_b, 2G + R)``) would predict the 384-GPU row 35% fast.
    """
    forward = max(forward_seconds, gather_seconds)
    backward = max(backward_seconds, reduce_scatter_seconds) + backward_gathers * gather_seconds
    return forward + backward


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class MegatronKernels:
    """What of Megatron-LM's own overlap a run has (the ``megatron`` engine; DeepSpeed's AutoTP
    overlaps none of its TP collectives)."""

    async_tp_backward: bool = True
    """Backward TP collectives overlap the layer's GEMMs (``LinearWithGradAccumulationAndAsyncCommunication``,
    merged into Megatron-LM on 2021-09-07, b462d2545d "slym/allreduce-overlap", on by default
    since): without sequence parallelism a column-parallel layer's input-gradient all-reduce runs
    while its weight-gradient GEMM does; with it the reduce-scatter runs under the weight-gradient
    GEMM and the re-gather of the layer's input under the input-gradient GEMM, and only the
    row-parallel layers' all-gathers of the output gradient are exposed. megatron-core keeps this
    (``allreduce_dgrad``). The forward's collectives (and the recompute forward's) stay exposed."""


MEGATRON_2021 = MegatronKernels(async_tp_backward=False)
"""Megatron-LM as Narayanan et al. 2021 ran it (arXiv 2104.04473, April 2021: commit aed2f75e20
of 2021-04-11 has no asynchronous TP communication): every TP collective on the critical path."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LayerPass:
    """One transformer layer, one micro-batch, one GPU, as the step prices it (seconds)."""

    forward: float
    """Forward compute (``LayerSeconds.forward``, or its share of the dispatch floor)."""
    backward: float
    """Backward compute, the recompute it repeats, and landing the layer's weight gradients
    (``timing.grad_accumulation_bytes_per_param``)."""
    tp_forward: float
    """TP collectives in forward: two all-reduces (reduce-scatter + all-gather pairs under SP)."""
    tp_backward: float
    """Exposed TP collectives in backward: the forward's two again under full recompute, and the
    backward's own two, less what runs under the GEMMs (``MegatronKernels.async_tp_backward``)."""

    @property
    def tp(self) -> float:
        return self.tp_forward + self.tp_backward


OVERLAPPED_TP_HIDDEN = 0.5
"""Share of an overlapped TP collective's time that the GEMM under it hides on an A100. A collective
running beside a GEMM takes SMs (NCCL runs one block per channel) and HBM bandwidth from it, so
the pair takes longer than the GEMM alone. Calibrated once, on Korthikanti et al. 2022 Table 4 (one
22B layer, TP 8, 2022 Megatron-LM): the measured backward of the five settings sits halfway
between "both backward all-reduces exposed" and "both hidden" without SP (none 11.9 ms,
selective 13.2, full 19.5), and at "exposed" with SP (11.8 / 13.1), where overlap adds a third
collective (the input re-gather) to the link; one share, 0.5, gives all five within 2%
(``benchmarks/estimate_published.py``)."""


def tp_backward_exposed_seconds(*, one_seconds: float, column_gemm_seconds: float, sequence_parallel: bool,
                                overlap: bool) -> float:
    """Exposed seconds of one layer's own backward TP collectives (``one_seconds`` = one all-reduce of
    the layer's ``b s h`` activations, or its reduce-scatter + all-gather pair under SP).

    Without overlap both are exposed (``2 one``; Shoeybi et al. 2019: "two all-reduces in the
    backward pass"). With Megatron's asynchronous communication (``MegatronKernels``) the
    overlapped collectives are hidden by ``OVERLAPPED_TP_HIDDEN`` of their time, and never by more
    than the GEMMs they run under: without SP the two input-gradient all-reduces (``2 one``) run
    under the two column-parallel weight-gradient GEMMs (``column``); with SP the row-parallel
    layers' two all-gathers of the output gradient (``one``) are exposed, and the column-parallel
    layers' reduce-scatters and input re-gathers (``2 one``) run under their weight- and
    input-gradient GEMMs (``2 column``)."""
    if not overlap:
        return 2.0 * one_seconds
    if sequence_parallel:
        overlapped, exposed, under = 2.0 * one_seconds, one_seconds, 2.0 * column_gemm_seconds
    else:
        overlapped, exposed, under = 2.0 * one_seconds, 0.0, column_gemm_seconds
    return exposed + overlapped - min(under, OVERLAPPED_TP_HIDDEN * overlapped)


def layer_pass_seconds(*, facts, layout, training, cluster, tp_style: str = "autotp",
                       kernels: MegatronKernels = MegatronKernels()) -> LayerPass:
    """``LayerPass`` of one layer of ``facts`` under ``layout`` (what ``step_time`` multiplies by
    the layers of a stage; Korthikanti et al. 2022 Table 4 measures the same quantity).
    ``kernels`` applies to the Megatron engine (``tp_style="megatron"``) only."""
    from dstk.estimate import _bandwidth

    gpu = cluster.gpu
    tp = layout.tp
    w = mem.param_bytes(training.precision)
    tokens = layout.micro_batch * training.seq_len
    layer = layer_seconds(facts=facts, tokens=tokens, seq_len=training.seq_len, tp=tp,
                          sp=tp if layout.sequence_parallel else 1, act_bytes=w, attention=training.attention,
                          gpu=gpu, peak_flops=gpu.peak_flops(training.precision))
    fwd, bwd = layer.forward, layer.backward + layer.recompute(layout.recompute)
    floor = gpu.layer_overhead_seconds - fwd - bwd
    if floor > 0:  # dispatch-bound (a tiny model on a CPU rank): the layer takes the floor
        fwd, bwd = fwd + floor / 3, bwd + 2 * floor / 3
    engine = "megatron" if tp_style == "megatron" else "deepspeed"
    params = facts.layer_sharded / tp + facts.layer_replicated
    bwd += tm.memory_seconds(nbytes=tm.grad_accumulation_bytes_per_param(engine=engine, precision=training.precision)
                             * params, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    one = 0.0
    if tp > 1:
        bw, lat = _bandwidth(group=tp, stride=1, cluster=cluster)
        one = tm.ring_allreduce_seconds(nbytes=tokens * facts.hidden * w, ranks=tp, bandwidth=bw, latency=lat)
        calls = 2 if layout.sequence_parallel else 1  # a reduce-scatter + all-gather pair under SP
        one += calls * latency_extra_seconds(call_seconds=collective_latency(group=tp, stride=1, cluster=cluster),
                                             priced_seconds=2 * (tp - 1) * lat / calls)
    own = tp_backward_exposed_seconds(one_seconds=one, column_gemm_seconds=layer.column_gemm,
                                      sequence_parallel=layout.sequence_parallel,
                                      overlap=engine == "megatron" and kernels.async_tp_backward)
    return LayerPass(forward=fwd, backward=bwd, tp_forward=2 * one,
                     tp_backward=(2 * one if layout.recompute == "full" else 0.0) + own)


def _dp_exposed_seconds(*, seconds: float, backward_seconds: float, bucket_seconds: float, overlap: bool) -> float:
    """Exposed gradient reduction: without ``overlap_comm`` DeepSpeed reduces each full bucket on
    the compute stream (or, ZeRO-0 and Megatron, all at once after backward), so all of it adds;
    with it the buckets reduce on a side stream while backward runs, and only what does not fit
    under backward, and the last bucket (filled when backward ends), is exposed."""
    if seconds <= 0:
        return 0.0
    if not overlap:
        return seconds
    return max(min(bucket_seconds, seconds), seconds - backward_seconds)


DS_ALLREDUCE_BUCKET_ELEMENTS = 5e8
"""Elements per flat all-reduce of DeepSpeed's ZeRO-0 gradient reduction (``allreduce_bucket_size``,
default ``MEMORY_OPT_ALLREDUCE_SIZE`` = 5e8, ``engine.allreduce_gradients``)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class CollectiveCalls:
    """Collective calls one rank issues per optimizer step, by where they sit in the step; each
    pays ``GPU.collective_latency_seconds`` whatever its size."""

    dp_buckets: int = 0
    """Gradient reductions (all-reduce or reduce-scatter of a bucket), which ``overlap_comm`` runs
    beside backward on a GPU."""
    dp_tail: int = 0
    """Calls after backward, always exposed: ZeRO-1/2's overflow check and gradient-norm all-reduces
    and the all-gather of the updated partitions, ZeRO-3's gradient norm."""
    zero3_gathers: int = 0
    """ZeRO-3 parameter all-gathers."""
    tp: int = 0
    """TP collectives of the slowest stage (a reduce-scatter + all-gather pair counts two)."""
    pp: int = 0
    """Pipeline point-to-point sends of the slowest stage."""

    @property
    def total(self) -> int:
        return self.dp_buckets + self.dp_tail + self.zero3_gathers + self.tp + self.pp


def _ceil_div(a: float, b: float) -> int:
    return max(1, -int(-a // b)) if a > 0 else 0


def collective_calls(*, zero_stage: int, dp: int, tp: int, pp: int, grad_accum: int, virtual_stages: int = 1,
                     stage_layers: int, recompute: str = "none", sequence_parallel: bool = False,
                     trainable_params: float, reduce_bucket_size: float, modules_per_layer: int = 7,
                     engine: str = "deepspeed") -> CollectiveCalls:
    """``CollectiveCalls`` of one step, counted as DeepSpeed 0.19.8 issues them (each count was
    checked on 2 gloo ranks by ``benchmarks/zero_cpu_cost.py``, which wraps DeepSpeed's backend):

    - ZeRO-0: ``ceil(P / allreduce_bucket_size)`` flat all-reduces after backward (5e8 elements,
      ``engine.allreduce_gradients`` -> ``buffered_allreduce_fallback``); Megatron's DDP reduces
      once after backward likewise (one call);
    - ZeRO-1/2: ``ceil(P / reduce_bucket_size)`` bucket reductions (``stage_1_and_2.py``
      ``reduce_independent_p_g_buckets_and_remove_grads`` reduces a bucket when the next gradient
      would overflow it), once per step for ZeRO-1 (reduced at the accumulation boundary) and in
      every micro-step for ZeRO-2 (it keeps only its partition); then ``step()`` all-reduces the
      overflow flag (``check_overflow`` -> ``has_overflow``, line 3242) and the gradient norm
      (``scaled_global_norm`` -> ``get_grad_norm_direct``, line 2693), and all-gathers the updated
      partitions (``all_gather_dp_groups``, line 3155: one ``all_gather_into_tensor`` per parameter
      group where torch has it, ``allgather_bucket_size`` unused): 3 tail calls;
    - ZeRO-3: ``ceil(P / reduce_bucket_size)`` reduce-scatters per micro-batch, one all-gather per
      parameterised module per micro-batch (the prefetcher folds what it prefetches into the same
      call: the tiny Llama measures 16 = its 14 projections, embedding and head; norms stay
      persistent under dstk's ``stage3_param_persistence_threshold``), and the norm all-reduce;
    - TP: per layer and micro-batch two all-reduces forward and two backward, two more under full
      recompute; sequence parallelism turns each into a reduce-scatter + all-gather pair;
    - PP: a send forward and one backward per micro-batch and boundary, ``v`` times interleaved.

    ``P`` is the rank's trainable elements before ZeRO sharding (ZeRO reduces every gradient)."""
    m = grad_accum
    out: dict[str, int] = {}
    if dp > 1 and trainable_params > 0:
        if engine == "megatron":
            out["dp_buckets"] = 1
        elif zero_stage == 0:
            out["dp_buckets"] = _ceil_div(trainable_params, DS_ALLREDUCE_BUCKET_ELEMENTS)
        elif zero_stage in (1, 2):
            buckets = _ceil_div(trainable_params, reduce_bucket_size)
            out["dp_buckets"] = buckets * (m if zero_stage == 2 else 1)
            out["dp_tail"] = 3
        else:
            out["dp_buckets"] = m * _ceil_div(trainable_params, reduce_bucket_size)
            out["zero3_gathers"] = m * (stage_layers * modules_per_layer + 2)
            out["dp_tail"] = 1
    if tp > 1:
        per_layer = (4 + (2 if recompute == "full" else 0)) * (2 if sequence_parallel else 1)
        out["tp"] = m * stage_layers * per_layer
    if pp > 1:
        out["pp"] = m * 2 * virtual_stages
    return CollectiveCalls(**out)


def modules_per_layer(facts) -> int:
    """Parameterised modules of one layer that ZeRO-3 gathers: its weight matrices (tensors larger
    than ``8 h``: biases and norms are smaller and live in the same modules or stay persistent);
    7 (a Llama layer) when only a parameter count is known."""
    if facts.shape is None or not facts.layer_persistent:
        return 7
    return max(1, sum(1 for t in facts.layer_persistent if t > 8 * facts.hidden))


def collective_latency(*, group: int, stride: int, cluster) -> float:
    """Seconds one collective call over ``group`` ranks ``stride`` apart costs whatever its size:
    ``GPU.collective_latency_seconds`` inside a node, the interconnect's (if larger) across nodes."""
    gpu = cluster.gpu
    if group * stride <= cluster.gpus_per_node or cluster.num_nodes == 1:
        return gpu.collective_latency_seconds
    net = cluster.interconnect
    return max(gpu.collective_latency_seconds, net.collective_latency_seconds if net is not None else 0.0)


def latency_extra_seconds(*, call_seconds: float, priced_seconds: float) -> float:
    """What a call's fixed cost adds over the latency a ring formula already priced (its
    ``2 (n - 1)`` alpha steps, ``timing.ring_allreduce_seconds``): ``max(0, L - priced)``."""
    return max(0.0, call_seconds - priced_seconds)


def step_time(*, facts, layout, training, cluster, buffers, tp_style: str = "autotp",
              kernels: MegatronKernels = MegatronKernels(), lora=None):
    """``Time`` of one optimizer step of ``layout`` (see the module docstring for the model);
    ``kernels``: the Megatron engine's overlap (``MegatronKernels``; ``MEGATRON_2021`` for the
    Megatron-LM of Narayanan et al. 2021). ``lora``: ``dstk.estimate.lora.StepTerms`` when adapters
    train on a frozen base (its deltas are applied at the four places marked "LoRA")."""
    from dstk.estimate import Time, _bandwidth, stage_layers, stage_params

    f = facts
    tp, pp, dp, m, v = layout.tp, layout.pp, layout.dp, layout.grad_accum, layout.virtual_stages
    gpu = cluster.gpu
    peak = gpu.peak_flops(training.precision)
    w = mem.param_bytes(training.precision)
    tokens_mb = layout.micro_batch * training.seq_len
    recompute = layout.recompute
    megatron = tp_style == "megatron"

    layer = layer_pass_seconds(facts=f, layout=layout, training=training, cluster=cluster, tp_style=tp_style,
                               kernels=kernels)
    if lora is not None:  # LoRA: no weight gradients for the frozen base, the adapters' GEMMs
        layer = dataclasses.replace(layer, backward=layer.backward + lora.layer_backward_seconds)
    pp_mb = 0.0
    if pp > 1:
        bw, lat = _bandwidth(group=2, stride=tp * dp, cluster=cluster)
        # Activations forward and gradients backward cross each boundary once per micro-batch
        # (scattered over the TP group, Narayanan et al. 2021 §4.1); interleaving crosses v
        # times as many boundaries (§2.2.2).
        call = collective_latency(group=2, stride=tp * dp, cluster=cluster)
        pp_mb = 2 * v * (tokens_mb * f.hidden * w / tp / bw + lat + latency_extra_seconds(call_seconds=call,
                                                                                         priced_seconds=lat))
    head = head_seconds(facts=f, tokens=tokens_mb, tp=tp, act_bytes=w, gpu=gpu, peak_flops=peak)
    embed = tm.memory_seconds(nbytes=3.0 * 2 * w * f.hidden * tokens_mb, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    if megatron and tp > 1:  # the vocab-parallel embedding all-reduces its output
        bw, lat = _bandwidth(group=tp, stride=1, cluster=cluster)
        embed += tm.ring_allreduce_seconds(nbytes=tokens_mb * f.hidden * w, ranks=tp, bandwidth=bw, latency=lat)

    counts = stage_layers(f.layers, pp, layout=layout)
    accumulate = tm.grad_accumulation_bytes_per_param(engine="megatron" if megatron else "deepspeed",
                                                      precision=training.precision)
    # The slowest stage sets the pace of every micro-batch (1F1B, Narayanan et al. 2021 §2.2).
    stage_fwd = stage_bwd = stage_tp = stage_tp_fwd = 0.0
    for i, n in enumerate(counts):
        ends = stage_params(f, layers=0, first=i == 0, last=i == pp - 1, tp=tp, pp=pp, tp_style=tp_style)
        fwd = n * layer.forward + (embed / 3 if i == 0 else 0.0) + (head / 3 if i == pp - 1 else 0.0)
        bwd = n * layer.backward + (2 * embed / 3 if i == 0 else 0.0) + (2 * head / 3 if i == pp - 1 else 0.0)
        bwd += tm.memory_seconds(nbytes=accumulate * ends, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
        bwd += lora.stage_backward_seconds if lora is not None else 0.0  # LoRA: frozen embedding and head
        if fwd + bwd + n * layer.tp > stage_fwd + stage_bwd + stage_tp:
            stage_fwd, stage_bwd, stage_tp, stage_tp_fwd = fwd, bwd, n * layer.tp, n * layer.tp_forward
    mb_compute = stage_fwd + stage_bwd
    stage_mb = mb_compute + stage_tp + pp_mb
    bubble_frac = tm.bubble_fraction(pp=pp, microbatches=m, virtual_stages=v)

    # Data parallel: gradients (and ZeRO-3's parameter gathers) over the DP group.
    worst = max(range(pp), key=lambda i: counts[i])
    worst_params = stage_params(f, layers=counts[worst], first=worst == 0, last=worst == pp - 1, tp=tp, pp=pp,
                                tp_style=tp_style)
    gathered_bytes = w * (worst_params + (lora.trainable if lora is not None else 0.0))
    if lora is not None:  # LoRA: DP reduces and the optimizer updates the adapters only
        worst_params = lora.trainable
    grad_bytes = w * worst_params
    dp_seconds = gather_seconds = offload_seconds = 0.0
    exposed_dp = exposed_zero3 = 0.0
    if dp > 1:
        bw, lat = _bandwidth(group=dp, stride=tp, cluster=cluster)
        bucket = tm.ring_allreduce_seconds(nbytes=w * min(buffers.reduce_bucket_size, worst_params), ranks=dp,
                                           bandwidth=bw, latency=lat)
        # Per-call latency (``collective_calls``): the buckets' rides with their bytes (hidden beside
        # backward under overlap_comm), the tail after backward is exposed. A CPU rank overlaps
        # nothing: DeepSpeed's CPU accelerator streams are no-ops (``cpu_accelerator.py``
        # ``stream()`` returns a noop context), so gloo's calls run inside backward and step.
        call = collective_latency(group=dp, stride=tp, cluster=cluster)
        calls = collective_calls(zero_stage=layout.zero_stage, dp=dp, tp=tp, pp=pp, grad_accum=m,
                                 stage_layers=counts[worst], trainable_params=worst_params,
                                 reduce_bucket_size=buffers.reduce_bucket_size,
                                 modules_per_layer=modules_per_layer(f), engine="megatron" if megatron else "deepspeed")
        sync = gpu.is_cpu
        tail = calls.dp_tail * call
        if layout.zero_stage == 3:
            one = tm.ring_gather_seconds(nbytes=gathered_bytes, ranks=dp, bandwidth=bw, latency=lat)
            rs = tm.ring_gather_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)  # LoRA: adapters
            rs += calls.dp_buckets / m * call
            backward_gathers = 2 if recompute == "full" else 1
            gathers = calls.zero3_gathers / m * call  # one pass over the modules
            if sync:  # nothing overlaps: every gather and reduce-scatter adds, each module fetched once
                per_mb = mb_compute + stage_tp + (1 + backward_gathers) * one + gathers + rs
                gather_seconds = m * ((1 + backward_gathers) * one + gathers)
            else:
                one += gathers
                gather_seconds = m * (1 + backward_gathers) * one
                per_mb = zero3_step_seconds(forward_seconds=stage_fwd + stage_tp_fwd,
                                            backward_seconds=stage_bwd + stage_tp - stage_tp_fwd, gather_seconds=one,
                                            reduce_scatter_seconds=rs, backward_gathers=backward_gathers)
            dp_seconds = m * rs + tail
            exposed_zero3 = m * (per_mb - mb_compute - stage_tp)
            exposed_dp = tail
        elif layout.zero_stage == 2:
            # DeepSpeed's stage 2 reduce-scatters in every micro-step (it keeps only a gradient
            # partition), then all-gathers the updated parameters once.
            rs = tm.ring_gather_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)
            reduce = rs + calls.dp_buckets / m * call
            dp_seconds = m * reduce + rs + tail
            exposed_dp = m * _dp_exposed_seconds(seconds=reduce, backward_seconds=stage_bwd,
                                                 bucket_seconds=bucket / 2 + call,
                                                 overlap=buffers.overlaps(2) and not sync) + rs + tail
        else:
            dp_seconds = tm.ring_allreduce_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)
            dp_seconds += calls.dp_buckets * call
            overlap = layout.zero_stage == 1 and buffers.overlaps(1) and not megatron and not sync
            exposed_dp = _dp_exposed_seconds(seconds=dp_seconds, backward_seconds=stage_bwd,
                                             bucket_seconds=bucket + call, overlap=overlap) + tail
            dp_seconds += tail
    shard = worst_params / (dp if layout.zero_stage else 1)
    optimizer_seconds = 0.0
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        # fp32 gradients down, bf16 parameters up over PCIe, and the CPU optimizer's update.
        offload_seconds = (4 + w) * shard / gpu.host_bytes_per_s + shard / cluster.cpu_adam_params_per_s
        if layout.offload_params != "none":
            offload_seconds += m * 2 * gathered_bytes / gpu.host_bytes_per_s  # LoRA: the frozen base too
    else:
        per_param = tm.optimizer_step_bytes_per_param(optimizer=training.optimizer, precision=training.precision)
        optimizer_seconds = tm.memory_seconds(nbytes=per_param * shard, hbm_bytes_per_s=gpu.hbm_bytes_per_s)

    compute = m * stage_mb + optimizer_seconds + gpu.step_overhead_seconds
    bubble = bubble_frac * m * stage_mb
    comm = exposed_dp + exposed_zero3 + offload_seconds
    step = compute + bubble + comm

    tokens_step = layout.global_batch * training.seq_len
    fwd_token = tm.forward_flops_per_token(matmul_params=f.layers * f.layer_matmul_active + f.head_matmul,
                                           num_layers=f.layers, seq_len=training.seq_len,
                                           attention_width=f.attention_width)
    attn_fwd = tm.attention_forward_flops_per_token(num_layers=f.layers, seq_len=training.seq_len,
                                                     attention_width=f.attention_width)
    model_flops_token, hw_flops_token = tm.training_flops(forward=fwd_token, attention_forward=attn_fwd,
                                                          recompute=recompute)
    if lora is not None:  # LoRA: no base weight gradients (-2N), the adapters' 6 N_lora
        model_flops_token += lora.flops_per_token
        hw_flops_token += lora.flops_per_token
    recompute_factor = hw_flops_token / model_flops_token
    world = cluster.world_size
    model_flops_step = model_flops_token * tokens_step
    tps = tokens_step / step if step > 0 else 0.0
    achieved = model_flops_step / step / world if step > 0 else 0.0
    return Time(
        step_seconds=step, compute_seconds=compute, comm_seconds=comm,
        comm={"dp": dp_seconds, "zero3_gather": gather_seconds, "tp": m * stage_tp, "pp": m * pp_mb,
              "offload": offload_seconds},
        bubble_seconds=bubble, bubble_fraction=bubble_frac, tokens_per_second=tps,
        tflops_per_gpu=achieved / 1e12, mfu=achieved / peak, hfu=achieved * recompute_factor / peak,
        model_flops_per_step=model_flops_step,
        time_to_train_seconds=training.num_tokens / tps if training.num_tokens and tps else None,
    )
