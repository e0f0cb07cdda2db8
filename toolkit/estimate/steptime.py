"""Step time of one layout: per-operator compute, communication and what overlaps, the bubble.

``step_time`` prices one micro-batch on the slowest pipeline stage operator by operator, then the
step around it:

- **matrix multiplies** at the share of peak the GPU reaches for their shape (``GPU.gemm_fraction``
  of the GEMM's smallest dimension: the curve in the hardware catalog) times the share of its
  waves its output tiles fill (``wave_fraction``, where the catalog gives ``num_sms``); the backward
  pass runs two GEMMs of the same three dimensions per forward GEMM (input and weight gradients),
  each with its own output shape and waves;
- **memory-bound operators** (norms, activation, residual/dropout, rotary, softmax, the loss and
  the optimizer step) at the sustained HBM bandwidth (``timing.memory_seconds``);
- **attention** by its kernel: eager (and SDPA's math path on CPU ranks) runs ``QK^T`` and ``AV``
  as batched GEMMs of inner dimension ``head_dim`` and materialises the scores; a fused kernel
  (``flash``: FlashAttention-2; ``sdpa`` on a GPU: what torch dispatches to, FlashAttention-2 or
  cuDNN) skips the masked half of a causal score matrix, never writes it, and recomputes it in
  backward (Dao 2023 §4.1: backward = 2.5x the forward's FLOPs), at the published causal
  forward + backward rate for the GPU, sequence length and head dim (``GPU.attention_fraction``,
  ``timing.flash_attention_forward_seconds``: 0.30 of an H100's peak at 8k for FlashAttention-2);
  SDPA handed an explicit mask (Falcon; a sliding window the sequence reaches, ``sdpa_gets_mask``)
  runs every score block at the published unmasked rate of the kernel torch picks then
  (memory-efficient on A100, cuDNN on H100); FlashAttention-2 skips the blocks left of a sliding
  window (``window_share``);
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
  ``(p - 1)/(m v)`` of the stage time (Narayanan et al. 2021 §2.2); under DeepSpeed's pipeline
  engine the blocking transfers of ``deepspeed_pipe_transfers``, ``BF16_Optimizer``'s per
  micro-batch gradient passes for ZeRO-0 in bf16 (``bf16_pipe_grad_bytes_per_param``), the tied
  embedding's gradient all-reduce (``tied_grad_allreduce_seconds``) and no DP overlap;
- **DP**: see ``_dp_exposed_seconds`` and ``zero3_step_seconds``;
- **per-call latency**: every collective the layout issues (``collective_calls``) costs NCCL's
  latency for its kind, group and size (``collective_latency``: it grows with the ring, 32 us
  over a node to ~2-5 ms over 1024 GPUs), less the ring alpha its bytes' formula already priced
  (``latency_extra_seconds``); ZeRO's gradient reductions as the bucket flushes DeepSpeed
  issues over the model's tensors in backward order (``grad_flushes``), each at its own size's
  latency; gloo's flat measured figure on CPU ranks; the ZeRO buckets'
  latency hides with their bytes under ``overlap_comm`` on a GPU, the calls after backward are
  exposed, and a CPU rank overlaps nothing (what prices small-bucket ZeRO on gloo);
- **ZeRO's own work** (``zero_overhead_seconds``): its hooks and copies per parameter tensor and
  micro-batch, at dp = 1 too (measured on CPU ranks, 0 on GPUs).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math

from dstk.estimate import memory as mem
from dstk.estimate import timing as tm

WAVE_TILE = (256, 128)
"""Output tile of one thread block of a large 16-bit GEMM, one per SM at a time: the tile NVIDIA's
Matrix Multiplication Background User's Guide ("Dimension quantization effects", "Wave
quantization") uses for A100, whose 108 SMs then run 108 tiles per wave."""


def wave_fraction(*, m: float, n: float, num_sms: int | None) -> float:
    """Share of its waves a GEMM with an ``m x n`` output keeps busy: its ``ceil(m/256) ceil(n/128)``
    tiles (``WAVE_TILE``) run ``num_sms`` at a time, and the last, partial wave takes as long as a
    full one, so the GEMM runs at ``tiles / (num_sms * ceil(tiles / num_sms))`` of the rate of one
    whose tiles fill its waves (NVIDIA's Matrix Multiplication Background User's Guide, "Wave
    quantization": on an A100, 109 tiles take two waves, as 216 do). The ``gemm_efficiency``
    curve's asymptote is Bekman's MAMF, the best rate over a sweep of shapes, i.e. of full waves,
    so the two multiply. 1 below one wave (cuBLAS then splits K or takes smaller tiles; the curve
    prices such small GEMMs) and where ``num_sms`` is unknown. Not modelled: cuBLAS picking another
    tile or split-K above one wave (a 1.33-wave output may run better than this says)."""
    if not num_sms:
        return 1.0
    tiles = math.ceil(m / WAVE_TILE[0]) * math.ceil(n / WAVE_TILE[1])
    if tiles <= num_sms:
        return 1.0
    return tiles / (num_sms * math.ceil(tiles / num_sms))


def _gemm_seconds(*, m: float, n: float, k: float, gpu, peak_flops: float) -> float:
    """One ``(m x k) @ (k x n)`` GEMM: ``GPU.gemm_fraction`` of its smallest dimension times its
    ``wave_fraction``."""
    fraction = gpu.gemm_fraction(min(m, n, k)) * wave_fraction(m=m, n=n, num_sms=gpu.num_sms)
    return tm.gemm_seconds(m=m, n=n, k=k, peak_flops=peak_flops, fraction=fraction)


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
    """The attention kernel is a fused one (FlashAttention, cuDNN): its backward recomputes the scores
    (2.5x the forward's FLOPs, Dao 2023 §4.1), and there is nothing for selective recompute to repeat."""
    column_gemm: float = 0.0
    """Seconds of the column-parallel layers' (QKV and MLP in) weight-gradient GEMMs, part of
    ``backward_gemm``, which Megatron overlaps with the TP collective of their input gradient
    (``MegatronKernels.async_tp_backward``)."""
    backward_gemm: float | None = None
    """The projections' backward: per forward GEMM ``T x k x n`` an input-gradient GEMM with a
    ``T x k`` output and a weight-gradient GEMM with a ``k x n`` output over ``K = T``, each
    with its own wave quantization (``wave_fraction``). None: ``2 gemm``."""
    backward_scores_memory: float | None = None
    """Softmax/dropout backward over the scores (eager only). None: ``2 scores_memory``."""
    weight_grad_gemm: float | None = None
    """The weight-gradient GEMMs alone, part of ``backward_gemm`` (what a frozen base skips under
    LoRA, ``dstk.estimate.lora``). None: ``gemm``."""
    backward_elementwise: float | None = None
    """Norms, residuals, activation, rotary, backward (counted op by op for HF's eager modules,
    ``timing.eager_elementwise_bytes_per_token``). None: ``2 elementwise`` (fused kernels)."""

    @property
    def forward(self) -> float:
        return self.gemm + self.attention + self.scores_memory + self.elementwise

    @property
    def backward(self) -> float:
        gemm = 2.0 * self.gemm if self.backward_gemm is None else self.backward_gemm
        scores = 2.0 * self.scores_memory if self.backward_scores_memory is None else self.backward_scores_memory
        elementwise = 2.0 * self.elementwise if self.backward_elementwise is None else self.backward_elementwise
        return gemm + scores + elementwise + (tm.FLASH_BACKWARD_RATIO if self.flash else 2.0) * self.attention

    def recompute(self, mode: str) -> float:
        if mode == "full":
            return self.forward
        if mode == "selective" and not self.flash:
            return self.attention + self.scores_memory
        return 0.0


def uses_flash(*, attention: str, gpu) -> bool:
    """Whether the attention kernel is a fused one: ``flash``, or ``sdpa`` on a GPU (PyTorch's SDPA
    picks FlashAttention-2 for 16-bit inputs on sm80+, cuDNN first on sm90/sm100 with torch 2.11+:
    ``GPU.sdpa_attention_efficiency``); CPU ranks run SDPA's math path."""
    return not gpu.is_cpu and (attention == "flash" or attention == "sdpa")


def sdpa_gets_mask(facts, *, seq_len: int) -> bool:
    """Whether the family's HF layer code hands SDPA an explicit mask for ``seq_len``-long
    sequences: always for Falcon (``FalconModel`` builds the causal mask with
    ``allow_is_causal_skip=False``; its ``EagerLayer.kv_repeated`` marks it), and for a sliding
    window (Mistral-7B-v0.1, Phi-3 4k; the sliding layers of a Qwen2/3 with ``use_sliding_window``:
    ``layer_seconds`` splits those) once ``seq_len >= sliding_window``: transformers 5.25's
    ``masking_utils._ignore_causal_mask_sdpa`` keeps the mask when ``kv_length >=
    local_attention_size`` (at ``seq_len == window`` too, where the window masks nothing).
    transformers repeats K/V to the query heads before SDPA exactly when a mask is passed
    (``sdpa_attention_forward``: ``use_gqa_in_sdpa`` is False on CUDA with a mask). SDPA then
    cannot run FlashAttention-2 nor skip blocks (``GPU.attention_fraction(kernel="sdpa_masked")``:
    the memory-efficient and cuDNN kernels read the dense mask block by block and compute all
    ``s x s`` scores, so a window saves no FLOPs there), and each layer saves the mask
    (``memory.LayerShape.sdpa_mask``)."""
    if dict(getattr(facts, "eager_keywords", ())).get("kv_repeated", False):
        return True
    window = getattr(facts, "sliding_window", None)
    return window is not None and seq_len >= window


def sliding_layer_share(facts) -> float:
    """Share of the model's layers that apply its sliding window: 0 without one, 1 when every layer
    does (Mistral, Phi-3, Mixtral), ``len(sliding_layers) / layers`` when only some do (Qwen2/3's
    ``layer_types``: ``ModelSpec.sliding_layers``)."""
    if getattr(facts, "sliding_window", None) is None:
        return 0.0
    layers = getattr(facts, "sliding_layers", None)
    return 1.0 if layers is None else len(layers) / facts.layers


def _mixed(windowed: LayerSeconds, full: LayerSeconds, *, share: float) -> LayerSeconds:
    """The mean layer of a model where ``share`` of the layers slide: each time weighted by its layers."""
    def mean(a, b):
        return None if a is None and b is None else share * a + (1.0 - share) * b

    return dataclasses.replace(windowed, **{
        field.name: mean(getattr(windowed, field.name), getattr(full, field.name))
        for field in dataclasses.fields(LayerSeconds) if field.name != "flash"})


def window_share(*, seq_len: int, window: int | None) -> float:
    """Share of a causal ``s x s`` score matrix inside a sliding window of ``W``: query ``i`` sees
    ``min(i + 1, W)`` keys, ``sW - W(W - 1)/2`` of ``s(s + 1)/2`` scores (1 when ``s <= W``).
    FlashAttention-2 with ``window_size`` skips the key blocks left of the window, so its causal work
    shrinks by this share (transformers 5.25's ``modeling_flash_attention_utils`` passes
    ``window_size=(W - 1, W - 1)`` when ``key_length > sliding_window``: W keys per query); SDPA with
    a mask does not (``sdpa_gets_mask``)."""
    if window is None or seq_len <= window:
        return 1.0
    return (seq_len * window - window * (window - 1) / 2) / (seq_len * (seq_len + 1) / 2)


def layer_seconds(*, facts, tokens: int, seq_len: int, tp: int, sp: int, act_bytes: int, attention: str, gpu,
                  peak_flops: float, fused: bool = True) -> LayerSeconds:
    """``LayerSeconds`` of one layer of ``facts`` (``dstk.estimate._Facts``) for ``tokens`` tokens
    of ``seq_len``-long sequences on one GPU of a TP group of ``tp`` (``sp = tp`` with sequence
    parallelism). GEMM shapes per GPU, ``T`` tokens, widths ``q, kv, f`` (Shoeybi et al. 2019 §3):
    QKV ``T x h x (q + 2kv)/t``, output ``T x q/t x h``, MLP in ``T x h x u/t`` (``u = 2f`` gated),
    MLP out ``T x f/t x h``; ``2 N T`` FLOPs in all. Each GEMM at ``GPU.gemm_fraction`` of its
    smallest dimension times its ``wave_fraction``; in backward each projection runs an
    input-gradient GEMM (``T x n x k``, output ``T x k``) and a weight-gradient GEMM (``k x T x n``,
    output ``k x n``), whose waves differ from the forward's (22B layer at TP 8, micro-batch 4: the
    forward's QKV and MLP-in outputs fill 5.3 and 7.1 waves of 108 tiles, 11% idle).

    Eager attention's memory-bound backward is counted kernel by kernel, not as twice the forward:
    dropout's backward reads the gradient and the 1-byte mask and writes the gradient (``2w + 1``),
    the softmax's reads the probabilities and their gradient and writes the scores' gradient
    (``3w``: ``dx = y (dy - sum(y dy))``, Megatron's ``scaled_*_softmax_warp_backward`` and
    PyTorch's ``_softmax_backward_data``), against ``4w + 1`` forward (``timing.softmax_bytes_per_score``);
    the fp32 softmax's casts count as in forward.

    Norms, residuals, activation and rotary: ``fused`` (Megatron's kernels) read and write each
    tensor once (``timing.elementwise_bytes_per_token``, backward twice the forward); otherwise
    HF transformers' eager modules, op by op (``timing.eager_elementwise_bytes_per_token``,
    forward and backward each counted; 3.6x the fused bytes for a Llama layer).

    A model whose window only some layers apply (``sliding_layer_share`` between 0 and 1) gets the
    mean of a windowed and a full-attention layer, weighted by their counts."""
    share = sliding_layer_share(facts)
    if 0.0 < share < 1.0:
        kw = dict(tokens=tokens, seq_len=seq_len, tp=tp, sp=sp, act_bytes=act_bytes, attention=attention, gpu=gpu,
                  peak_flops=peak_flops, fused=fused)
        return _mixed(layer_seconds(facts=dataclasses.replace(facts, sliding_layers=None), **kw),
                      layer_seconds(facts=dataclasses.replace(facts, sliding_window=None, sliding_layers=None), **kw),
                      share=share)
    shape = facts.shape
    w = act_bytes
    if shape is None:  # a bare parameter count: its FLOPs at the GPU's plain achievable share
        flops = 2.0 * facts.layer_matmul_active * tokens / tp
        return LayerSeconds(gemm=flops / (peak_flops * gpu.achievable_fraction), attention=0.0, scores_memory=0.0,
                            elementwise=0.0)
    h, q, kv, f = facts.hidden, shape.q_width, shape.kv_width, shape.ffn
    up = max(float(f), facts.layer_matmul_active / h - (q + 2 * kv) - q - f)
    gated = up > 1.5 * f
    gemm = column = backward_gemm = weight_grads = 0.0
    for i, (m, k, n) in enumerate(((tokens, h, (q + 2 * kv) / tp), (tokens, q / tp, h), (tokens, h, up / tp),
                                   (tokens, f / tp, h))):
        gemm += _gemm_seconds(m=m, n=n, k=k, gpu=gpu, peak_flops=peak_flops)
        weight_grad = _gemm_seconds(m=k, n=n, k=m, gpu=gpu, peak_flops=peak_flops)
        backward_gemm += _gemm_seconds(m=m, n=k, k=n, gpu=gpu, peak_flops=peak_flops) + weight_grad
        column += weight_grad if i in (0, 2) else 0.0
        weight_grads += weight_grad
    score_flops = 4.0 * tokens * seq_len * q / tp
    scores = tokens * seq_len * (shape.heads / tp)
    # HF's layer code hands SDPA a mask; Megatron (``fused``) passes the window to its fused kernel instead
    # (``--window-size``, TransformerEngine's and FlashAttention's ``window_size``), which skips the blocks.
    masked = attention == "sdpa" and not fused and sdpa_gets_mask(facts, seq_len=seq_len)
    if uses_flash(attention=attention, gpu=gpu) and masked:
        # Every score block computed (no causal skip): the full 4 T s q at the masked kernel's rate.
        attn = score_flops / (peak_flops * gpu.attention_fraction(kernel="sdpa_masked", seq_len=seq_len,
                                                                  head_dim=facts.head_dim))
        scores_memory = backward_scores = 0.0
    elif uses_flash(attention=attention, gpu=gpu):
        attn = tm.flash_attention_forward_seconds(tokens=tokens, seq_len=seq_len, q_width=q / tp, peak_flops=peak_flops,
                                                  fraction=gpu.attention_fraction(kernel=attention, seq_len=seq_len,
                                                                                  head_dim=facts.head_dim))
        if attention == "flash" or fused:  # HF passes sliding_window to flash_attn's window_size; Megatron too
            attn *= window_share(seq_len=seq_len, window=getattr(facts, "sliding_window", None))
        scores_memory = backward_scores = 0.0
    else:
        attn = score_flops / (peak_flops * gpu.gemm_fraction(facts.head_dim))
        per_score = tm.softmax_bytes_per_score(act_bytes=w, dropout=shape.dropout) + (8 if shape.softmax_fp32 else 0)
        scores_memory = tm.memory_seconds(nbytes=scores * per_score, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
        per_score_back = 3.0 * w + ((2.0 * w + 1.0) if shape.dropout else 0.0) + (8 if shape.softmax_fp32 else 0)
        backward_scores = tm.memory_seconds(nbytes=scores * per_score_back, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    per_token = tm.elementwise_bytes_per_token(hidden=h, q_width=q / tp, kv_width=kv / tp, ffn=f / tp, act_bytes=w,
                                               sp=sp, gated=gated, rotary=facts.rotary, dropout=shape.dropout)
    backward_elementwise = None
    if not fused:
        eager = tm.eager_elementwise_bytes_per_token(
            hidden=h, q_width=q / tp, kv_width=kv / tp, ffn=f / tp, head_dim=facts.head_dim, act_bytes=w, sp=sp,
            norm="rmsnorm" if shape.rmsnorm else "layernorm", activation=facts.activation, gated=gated,
            rotary=facts.rotary, dropout=shape.dropout, bias=facts.bias, fused_qkv=facts.fused_qkv,
            qk_norm=facts.qk_norm, **dict(facts.eager_keywords,
                                          # HF's flash_attention_2 path takes grouped K/V as they are:
                                          # no repeat_kv copies (integrations/flash_attention.py)
                                          **({"kv_repeated": False} if attention == "flash" else {}),
                                          # a mask (a reached sliding window) makes SDPA's K/V repeated
                                          **({"kv_repeated": True} if masked else {})))
        per_token = eager.forward
        backward_elementwise = tm.memory_seconds(nbytes=eager.backward * tokens, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    elementwise = tm.memory_seconds(nbytes=per_token * tokens, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    return LayerSeconds(gemm=gemm, attention=attn, scores_memory=scores_memory, elementwise=elementwise,
                        flash=uses_flash(attention=attention, gpu=gpu), column_gemm=column,
                        backward_gemm=backward_gemm, backward_scores_memory=backward_scores,
                        weight_grad_gemm=weight_grads, backward_elementwise=backward_elementwise)


def head_seconds(*, facts, tokens: int, tp: int, act_bytes: int, gpu, peak_flops: float) -> float:
    """The last stage's lm_head (``T x h x V/t``, forward + 2 backward GEMMs) and the
    cross-entropy over ``T x V/t`` logits (read, fp32 softmax written and read back, gradient
    written: ``3(w + 8)`` bytes per logit over forward and backward). Each GEMM with its own
    ``wave_fraction``: outputs ``T x V/t`` forward, ``T x h`` (input gradient), ``h x V/t``
    (weight gradient)."""
    if not facts.vocab:
        return 0.0
    v = facts.vocab / tp
    m, n, k = tokens, v, facts.hidden
    gemm = sum(_gemm_seconds(m=a, n=b, k=c, gpu=gpu, peak_flops=peak_flops) for a, b, c in ((m, n, k), (m, k, n),
                                                                                             (k, n, m)))
    loss = tm.memory_seconds(nbytes=3.0 * (act_bytes + 8) * tokens * v, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    return gemm + loss


def zero3_step_seconds(*, forward_seconds: float, backward_seconds: float, gather_seconds: float,
                       reduce_scatter_seconds: float, backward_gathers: float) -> float:
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
class ZeroKernels:
    """How DeepSpeed's data-parallel collectives use the network (the ``deepspeed`` engine)."""

    share_nics: bool = True
    """A DP group with several members in a node spreads its ring over their NICs
    (``dstk.estimate._bandwidth``). Since DeepSpeed 0.6 ZeRO-3 gathers and reduce-scatters batched,
    coalesced buckets with fine-grained stream waits (PR #1453, 4912e0ad7, 2022-01-20), and the
    per-gather ``torch.cuda.synchronize()`` is gone (PR #1188, c0eeb69df, v0.5.5)."""
    replay_gathers: bool = True
    """ZeRO-3's gathers as DeepSpeed 0.19.8's coordinator issues them (``zero3_gathers``); False:
    each module once forward and once backward (twice under full recompute)."""
    per_param_reduce: bool = False
    """ZeRO-3 reduce-scatters every gradient in its own call, persistent ones included, rather than
    in ``reduce_bucket_size`` flushes (``grad_flushes``): DeepSpeed v0.3.13's stage 3 hands each
    bucket to ``reduce_gradients_at_owner`` -> ``partition_parameters.py``
    ``_reduce_scatter_gradients``, a loop of one ``_reduce_scatter_gradient`` per parameter."""


DEEPSPEED_2021 = ZeroKernels(share_nics=False, replay_gathers=False, per_param_reduce=True)
"""DeepSpeed as Narayanan et al. 2021 ran ZeRO-3 (v0.3.13-v0.4, spring 2021): one blocking
``all_gather`` per parameter, each preceded and followed by ``torch.cuda.synchronize()``
(``_allgather_param``, ``_synchronize_communication``), and per-parameter reduce-scatters
(``per_param_reduce``). Its
runs moved 12-18 GB/s per GPU over 8 x HDR (Table 2 at micro-batch 1), one GPU's share of the
node's NICs or less: that share is what this preset prices, one figure for the release line, not
fitted per row."""


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
(``benchmarks/estimate_published.py``); kept, not refitted, when GEMM waves and the
kernel-by-kernel softmax backward came in (all five within 3%, +0.3% to +2.9%)."""


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
                       kernels: MegatronKernels = MegatronKernels(), fused_kernels: bool | None = None) -> LayerPass:
    """``LayerPass`` of one layer of ``facts`` under ``layout`` (what ``step_time`` multiplies by
    the layers of a stage; Korthikanti et al. 2022 Table 4 measures the same quantity).
    ``kernels`` applies to the Megatron engine (``tp_style="megatron"``) only. ``fused_kernels``:
    whether norms, residuals, activation and rotary run as fused kernels (``layer_seconds``);
    None: the engine's own, fused for Megatron, HF transformers' eager modules for DeepSpeed."""
    from dstk.estimate import _bandwidth

    gpu = cluster.gpu
    tp = layout.tp
    w = mem.param_bytes(training.precision)
    tokens = layout.micro_batch * training.seq_len
    layer = layer_seconds(facts=facts, tokens=tokens, seq_len=training.seq_len, tp=tp,
                          sp=tp if layout.sequence_parallel else 1, act_bytes=w, attention=training.attention,
                          gpu=gpu, peak_flops=gpu.peak_flops(training.precision),
                          fused=tp_style == "megatron" if fused_kernels is None else fused_kernels)
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
        call = collective_latency(group=tp, stride=1, cluster=cluster, nbytes=tokens * facts.hidden * w,
                                  kind="reduce_scatter" if calls == 2 else "all_reduce")
        one += calls * latency_extra_seconds(call_seconds=call, priced_seconds=2 * (tp - 1) * lat / calls)
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
    pays ``collective_latency`` (NCCL's model for its group on GPUs, the flat figure on gloo)."""

    dp_buckets: int = 0
    """Gradient reductions (all-reduce or reduce-scatter of a bucket), which ``overlap_comm`` runs
    beside backward on a GPU."""
    dp_tail: int = 0
    """Calls after backward, always exposed: ZeRO-1/2's overflow check and gradient-norm all-reduces
    and the all-gather of the updated partitions, ZeRO-3's gradient norm and the all-gathers of its
    persistent tensors."""
    zero3_gathers: int = 0
    """ZeRO-3 parameter all-gathers."""
    tp: int = 0
    """TP collectives of the slowest stage (a reduce-scatter + all-gather pair counts two)."""
    pp: int = 0
    """Pipeline point-to-point sends of the slowest stage."""
    dp_bucket_elements: tuple[float, ...] = ()
    """Elements of each gradient-reduction call of one reduction pass (a micro-batch for ZeRO-2/3,
    the accumulation boundary for ZeRO-1), in issue order (``grad_flushes``); empty when the
    model's tensors are unknown (``dp_buckets`` then comes from ``ceil(P / bucket)``)."""

    @property
    def total(self) -> int:
        return self.dp_buckets + self.dp_tail + self.zero3_gathers + self.tp + self.pp


def _ceil_div(a: float, b: float) -> int:
    return max(1, -int(-a // b)) if a > 0 else 0


def stage_grad_tensors(facts, *, layers: int, first: bool, last: bool, tp: int = 1,
                       pp: int = 1) -> tuple[float, ...] | None:
    """One GPU's trainable tensors of a stage (elements) in the model's parameter order (forward:
    embedding, ``layers`` x the layer's tensors, final norm, head), as DeepSpeed flattens them;
    None when only a parameter count is known. AutoTP shards every matrix and keeps norms (width
    ``h`` or ``head_dim``) and the input embedding whole (``dstk.estimate.stage_params``); a tied
    head is the embedding (its gradient is ready when the embedding's is), except on the last
    stage of a pipeline, which holds its own copy."""
    if facts.shape is None or not facts.layer_persistent:
        return None
    h = facts.hidden
    small = {h, facts.head_dim}
    out: list[float] = []
    if first:
        out += [float(t) for t in facts.embed_tensors]
    out += [float(t) if t in small else t / tp for t in facts.layer_persistent] * layers
    if last:
        if facts.final and facts.final % h == 0:
            out += [float(h)] * (facts.final // h)
        elif facts.final:
            out.append(float(facts.final))
        if facts.lm_head and not facts.tied:
            out.append(facts.lm_head / tp)
        elif facts.tied and pp > 1 and facts.embed_tensors:
            out.append(facts.embed_tensors[0] / tp)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def grad_flushes(*, tensors: tuple[float, ...], reduce_bucket_size: float, zero_stage: int, dp: int,
                 ready_order: bool = True, per_param: bool = False) -> tuple[float, ...]:
    """Elements of each gradient-reduction call DeepSpeed 0.19.8 issues in one reduction pass over
    ``tensors`` (``stage_grad_tensors``, parameter order), for ZeRO-1/2/3 with
    ``contiguous_gradients``, ``reduce_scatter`` and ``use_multi_rank_bucket_allreduce`` at their
    defaults (on).

    - Order: gradients arrive as backward makes them ready, the reverse of the parameter order
      (``ready_order``); ZeRO-1 without ``overlap_comm`` registers no hooks and reduces at the
      accumulation boundary in parameter order (``stage_1_and_2.py:971`` ``reduce_gradients``).
    - Packing: the bucket is flushed when the next gradient would overflow it
      (``reduce_independent_p_g_buckets_and_remove_grads``: ``stage3.py:1583``, which also needs
      ``elements > 0``; ``stage_1_and_2.py:1422`` has no such guard, but an empty flush issues no
      call: ``average_tensor`` finds no parameters). A gradient larger than the bucket thus goes
      alone (ZeRO-1/2 keep it aside, ``extra_large_param_to_reduce``, line 1449) and the next one
      flushes it; the last bucket is flushed when backward ends.
    - Calls per flush: ZeRO-3 one ``reduce_scatter_tensor`` (``__avg_scatter_grads`` ->
      ``reduce_scatter_coalesced``). ZeRO-1/2 one all-reduce of the bucket
      (``average_tensor`` -> ``allreduce_and_scatter``, line 1545), which splits its slices (a
      gradient cut at the ``dp`` partition boundaries of the flat group) into calls of more than
      ``reduce_bucket_size`` elements each: a bucket of at most that many elements is one call; an
      oversized gradient is one call per partition boundary it crosses after the running slices
      passed the bucket size, plus the remainder.
    - ``per_param`` (DeepSpeed v0.3.13's ZeRO-3, ``ZeroKernels.per_param_reduce``): one call per
      tensor.

    Checked call by call (each call's elements, in order) on 2 gloo ranks with buckets smaller
    than the largest matrices (tiny and 5M Llamas, tied and untied, a tiny GPT-2; ZeRO-1 with
    ``overlap_comm``, 2, 3): ``benchmarks/zero_cpu_cost.py --flush-calls``. The partitions are
    ``P / dp`` (DeepSpeed's alignment padding left out) over ``tensors``' order, the forward
    order; ZeRO-1 without ``overlap_comm`` follows the order the module registered its
    parameters, which for HF's Llama puts a layer's two norms after its MLP: with matrices over
    the bucket each norm flushes alone here and with the other there (measured 34 calls where
    this counts 39 on the 4-layer Llama at 50,000)."""
    if per_param:
        return tuple(t for t in tensors if t > 0)
    order = tuple(reversed(tensors)) if ready_order else tensors
    index = range(len(tensors) - 1, -1, -1) if ready_order else range(len(tensors))
    partition = sum(tensors) / max(dp, 1)
    offsets = list(itertools.accumulate(tensors, initial=0.0))  # the flat group, in parameter order
    calls: list[float] = []

    def flush(sizes: list[float], position: int) -> None:
        if not sizes:
            return
        if zero_stage == 3 or len(sizes) > 1 or sizes[0] <= reduce_bucket_size:
            calls.append(sum(sizes))
            return
        pos, end, run = offsets[position], offsets[position] + sizes[0], 0.0
        while pos < end:  # the oversized gradient's slices, cut at partition boundaries
            cut = min(end, (int(pos // partition) + 1) * partition)
            run += cut - pos
            pos = cut
            if run > reduce_bucket_size:
                calls.append(run)
                run = 0.0
        if run > 0:
            calls.append(run)

    bucket: list[float] = []
    held, last = 0.0, 0
    for i, t in zip(index, order):
        if t <= 0:
            continue
        if bucket and held + t > reduce_bucket_size:
            flush(bucket, last)
            bucket, held = [], 0.0
        bucket.append(t)
        held += t
        last = i
    flush(bucket, last)
    return tuple(calls)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Zero3Gathers:
    """ZeRO-3's parameter all-gathers of one micro-batch on one rank, as DeepSpeed 0.19.8 issues
    them (``zero3_gathers``)."""

    forward_calls: int
    backward_calls: int
    """Calls during ``engine.backward``, the recompute forward of each layer included."""
    forward_elements: float
    backward_elements: float
    """Elements gathered (whole parameters; a rank receives ``(n - 1)/n`` of them)."""
    step_calls: int
    """Calls after ``optimizer.step()``: one per persistent parameter (once per optimizer step)."""
    model_elements: float
    """Every parameter of the replayed model (or stage), persistent ones included: the elements
    of one full pass, to which the step model scales its gathered bytes."""


def _zero3_modules(tensors, hidden: int) -> tuple[tuple[float, ...], ...]:
    """A block's tensor sizes (forward order) as the modules DeepSpeed fetches: a matrix (over
    ``8 h`` elements) starts a module; a small tensor after a matrix is its bias, unless it is
    ``h`` wide (a norm, its own module); a small tensor after a small one joins it (a norm's bias)."""
    modules: list[list[float]] = []
    last_big = False
    for t in tensors:
        big = t > 8 * hidden
        if not modules or big or (last_big and t == hidden):
            modules.append([t])
        else:
            modules[-1].append(t)
        last_big = big
    return tuple(tuple(m) for m in modules)


def _zero3_layer_order(matrices: tuple[bool, ...]) -> tuple[list[int | None], list[int | None]]:
    """The hook order of one layer's modules (indices; None for a module without parameters),
    forward and backward, from which modules hold a matrix (the rest are norms): the layer, each
    run of matrices inside its container (attention, MLP), the activation after the MLP's first
    matrix; backward each container before its run, reversed. A Llama layer (HF transformers
    5.x): ``L n1 [A] q k v o n2 [M] gate [act] up down`` and ``L [M] down up [act] gate n2 [A] o v
    k q n1``."""
    n = len(matrices)
    starts = [j for j in range(n) if matrices[j] and (j == 0 or not matrices[j - 1])]
    act = starts[-1] + 1 if starts and starts[-1] + 1 < n and matrices[starts[-1] + 1] else None
    fwd: list[int | None] = [None]
    for j in range(n):
        fwd += [None] if j in starts or j == act else []
        fwd.append(j)
    bwd: list[int | None] = [None]
    j = n - 1
    while j >= 0:
        if not matrices[j]:
            bwd.append(j)
            j -= 1
            continue
        start = max(s for s in starts if s <= j)
        bwd.append(None)
        for t in range(j, start - 1, -1):
            bwd.append(t)
            bwd += [None] if t == act else []
        j = start - 1
    return fwd, bwd


@functools.lru_cache(maxsize=1024)
def _zero3_replay(*, embed: tuple, layer: tuple, matrices: tuple, final: tuple, head: tuple | None, layers: int,
                  recompute: bool, prefetch_bucket: float, max_live: float, max_reuse: float, persistence: float,
                  first_step: bool) -> Zero3Gathers:
    """Replay ``PartitionedParameterCoordinator`` over one micro-batch (``zero3_gathers``). Modules
    are tuples of parameter sizes, ``matrices`` which of the layer's hold a matrix; ``head`` None:
    tied to the embedding's first parameter."""
    size: list[float] = []

    def ids(mods):
        out = []
        for m in mods:
            out.append(tuple(range(len(size), len(size) + len(m))))
            size.extend(m)
        return out

    emb = ids(embed)
    blocks = [ids(layer) for _ in range(layers)]
    fin = ids(final)
    hd = ids(head) if head is not None else [(emb[0][0],)]
    persist = [s <= persistence for s in size]
    # Steps in hook order: (params, True forward / False backward / None release only, release
    # after?). Param-less steps stand for the modules without parameters whose hooks fire there
    # (the model, the rotary embedding, each layer, its attention and MLP, the activation): the
    # prefetcher runs at every step, so they set how far ahead it reaches.
    fwd_order, bwd_order = _zero3_layer_order(matrices)
    steps: list[tuple[tuple[int, ...], bool | None, bool]] = [((), True, True)] * 2
    steps += [(m, True, True) for m in emb] + [((), True, True)]
    for b in blocks:
        steps += [(b[j] if j is not None else (), True, True) for j in fwd_order]
    steps += [(m, True, True) for m in fin + hd]
    steps += [((), False, True)] + [(m, False, True) for m in reversed(hd)] + [((), False, True)]
    steps += [(m, False, True) for m in reversed(fin)]
    last = len(layer) - 1
    for b in reversed(blocks):
        bwd = [(b[j] if j is not None else (), False, True) for j in bwd_order]
        if recompute:
            # Non-reentrant checkpoint: the last module's pre-backward hook fetches first, then the
            # recompute forward runs up to the last saved tensor (torch's early stop: that module's
            # post-forward hook, its release, never runs); its post-backward hook releases it.
            k = bwd_order.index(last)
            steps += bwd[:k] + [(b[last], False, False)]
            steps += [(b[j] if j is not None else (), True, j != last) for j in fwd_order]
            steps += [(b[last], None, True)] + bwd[k + 1:]
        else:
            steps += bwd
    steps += [(m, False, True) for m in reversed(emb)]

    trace = [m for m, fw, _ in steps if fw is not None]
    prefix = [0.0]
    for m in trace:
        prefix.append(prefix[-1] + sum(size[p] for p in m))
    uses: dict[int, list[int]] = {}
    for i, m in enumerate(trace):
        for p in m:
            uses.setdefault(p, []).append(i)
    queue = [(p, i) for i, m in enumerate(trace) for p in sorted(m)]
    available = [persist[p] and not first_step for p in range(len(size))]
    recent = [-1] * len(size)
    calls = {True: 0, False: 0}
    elements = {True: 0.0, False: 0.0}
    live = 0.0
    head_q = 0
    i = -1
    forward = True

    def gather(params) -> None:
        nonlocal live
        todo = [p for p in params if not available[p]]
        if todo:
            calls[forward] += 1
            n = sum(size[p] for p in todo)
            elements[forward] += n
            live += n
            for p in todo:
                available[p] = True

    for m, fw, rel in steps:
        if fw is not None:
            i += 1
            forward = forward and fw
            gather(m)
            if not first_step:
                for _ in [p for p in m if recent[p] < i]:  # this module's own entries leave the queue
                    p, at = queue[head_q]
                    head_q += 1
                    recent[p] = at
                if prefetch_bucket > 0:
                    budget = min(max_live - live, prefetch_bucket)
                    batch: list[int] = []
                    n = 0.0
                    while head_q < len(queue) and n < budget:
                        p, at = queue[head_q]
                        head_q += 1
                        if not available[p] and p not in batch:
                            batch.append(p)
                            n += size[p]
                        recent[p] = max(recent[p], at)
                    gather(batch)
        if not rel:
            continue
        if first_step:
            release = set(m)
        else:
            # Kept: a parameter whose later use the prefetcher has passed, or one used again within
            # the next modules holding max_reuse_distance elements.
            end = bisect.bisect_left(prefix, prefix[i + 1] + max_reuse, lo=i + 1)
            release = set()
            for p in m:
                later = uses[p]
                j = bisect.bisect_right(later, i)
                if persist[p] or recent[p] > i or (j < len(later) and later[j] < end):
                    continue
                release.add(p)
        for p in release:
            if available[p]:
                available[p] = False
                live -= size[p]
    return Zero3Gathers(forward_calls=calls[True], backward_calls=calls[False], forward_elements=elements[True],
                        backward_elements=elements[False], step_calls=sum(persist), model_elements=sum(size))


def zero3_gathers(*, facts, buffers: mem.ZeroBuffers, tp: int = 1, stage_layers: int | None = None,
                  recompute: str = "none", first_step: bool = False) -> Zero3Gathers | None:
    """ZeRO-3's parameter all-gathers per micro-batch, by replaying DeepSpeed 0.19.8's
    ``PartitionedParameterCoordinator`` over the model's module trace with ``buffers``'
    ``stage3_prefetch_bucket_size``, ``stage3_max_live_parameters``, ``stage3_max_reuse_distance``
    and ``stage3_param_persistence_threshold``. None when the model's tensors are unknown.

    What DeepSpeed does (``runtime/zero/``; checked call by call on 2 gloo ranks, tiny and 5M
    Llamas, by ``benchmarks/zero_cpu_cost.py --zero3-calls``):

    - Parameters of at most ``stage3_param_persistence_threshold`` elements are persistent
      (``parameter_offload.py:317`` ``mark_persistent_parameters``): never gathered by a module,
      but all-gathered again after every optimizer step, **one call per parameter**
      (``stage3.py:2841`` ``_post_step`` -> ``partition_parameters.py:2022``
      ``_allgather_params_coalesced``, a loop of ``all_gather_into_tensor``, line 2073):
      ``step_calls``.
    - Each module's pre-forward and pre-backward hook calls ``fetch_sub_module``
      (``partitioned_param_coordinator.py:310``; a non-reentrant checkpoint's recompute forward
      fires the forward hooks again): the module's parameters not yet gathered go out in **one**
      coalesced call (line 368 -> ``__all_gather_params_`` line 582 -> ``all_gather_coalesced``,
      ``partition_parameters.py:1540``: one ``all_gather_into_tensor`` per dtype, line 1362, or
      for a single parameter, line 1598).
    - Step 1 records the trace (``reset_step``, line 251, at every forward; line 277): no
      prefetch, and every module releases all of its parameters after use, persistent ones too
      (line 498), so step 1 gathers each module before forward, again before backward, and a third
      time in the recompute forward (``first_step``).
    - From step 2 the trace is complete. At every hook, modules without parameters included,
      the prefetcher pops the parameter trace (one entry per use, in order) and gathers the
      not-yet-gathered parameters it meets in **one** call, until it has queued
      ``min(stage3_prefetch_bucket_size, stage3_max_live_parameters - gathered)`` elements (line
      451; the last parameter may overshoot). Parameters it meets already gathered are passed
      over, and a parameter whose next use it has passed is not released (line 650). After a
      module runs, its parameters are released unless used again within the modules that follow
      until ``stage3_max_reuse_distance`` elements are traversed (line 658).

    So a model smaller than the bucket goes out in one call at the first hook and is kept for
    backward (the tiny Llama: 1 call per micro-batch); modules larger than the bucket go one call
    each, forward and backward (and in the recompute forward unless kept within the reuse
    distance): the published 10^8-10^9-element modules at the default 5e7 bucket.

    The trace is a Llama-like model's (HF transformers 5.x): the model and each layer's hooks,
    embedding, the layer's modules (``_zero3_modules``), final norm, head; backward in reverse;
    under full recompute each layer's last module is fetched for backward, the recompute forward
    stops after it (torch ``checkpoint`` early stop) and the rest run backward in reverse."""
    if facts.shape is None or not facts.layer_persistent:
        return None
    h = facts.hidden

    def split(tensors):  # AutoTP shards every matrix; norms stay whole
        return tuple(t if t == h else t / tp for t in tensors)

    if facts.final and facts.final % h == 0:
        final = ((float(h),) * (facts.final // h),)
    else:
        final = ((float(facts.final),),) if facts.final else ()
    head = None if facts.tied or not facts.lm_head else ((facts.lm_head / tp,),)
    modules = _zero3_modules(facts.layer_persistent, h)
    return _zero3_replay(
        embed=_zero3_modules(split(facts.embed_tensors), h), layer=tuple(split(m) for m in modules),
        matrices=tuple(max(m) > 8 * h for m in modules), final=final, head=head,
        layers=facts.layers if stage_layers is None else stage_layers, recompute=recompute == "full", prefetch_bucket=float(buffers.prefetch_bucket_size),
        max_live=float(buffers.max_live_parameters), max_reuse=float(buffers.max_reuse_distance),
        persistence=float(buffers.param_persistence_threshold), first_step=first_step)


def collective_calls(*, zero_stage: int, dp: int, tp: int, pp: int, grad_accum: int, virtual_stages: int = 1,
                     stage_layers: int, recompute: str = "none", sequence_parallel: bool = False,
                     trainable_params: float, reduce_bucket_size: float, modules_per_layer: int = 7,
                     engine: str = "deepspeed", zero3: Zero3Gathers | None = None,
                     grad_tensors: tuple[float, ...] | None = None, overlap_comm: bool | None = None,
                     per_param_reduce: bool = False) -> CollectiveCalls:
    """``CollectiveCalls`` of one step, counted as DeepSpeed 0.19.8 issues them (each count was
    checked on 2 gloo ranks by ``benchmarks/zero_cpu_cost.py``, which wraps DeepSpeed's backend):

    - ZeRO-0: ``ceil(P / allreduce_bucket_size)`` flat all-reduces after backward (5e8 elements,
      ``engine.allreduce_gradients`` -> ``buffered_allreduce_fallback``); Megatron's DDP reduces
      once after backward likewise (one call);
    - ZeRO-1/2: the bucket flushes of ``grad_flushes`` over ``grad_tensors`` (the stage's
      tensors, ``stage_grad_tensors``; ``stage_1_and_2.py``
      ``reduce_independent_p_g_buckets_and_remove_grads`` reduces a bucket when the next gradient
      would overflow it; ZeRO-1 in parameter order unless ``overlap_comm``, DeepSpeed's default
      off; without ``grad_tensors`` ``ceil(P / reduce_bucket_size)``), once per step for ZeRO-1
      (reduced at the accumulation boundary) and in every micro-step for ZeRO-2 (it keeps only
      its partition); then ``step()`` all-reduces the overflow flag (``check_overflow`` ->
      ``has_overflow``, line 3242) and the gradient norm (``scaled_global_norm`` ->
      ``get_grad_norm_direct``, line 2693), and all-gathers the updated partitions
      (``all_gather_dp_groups``, line 3155: one ``all_gather_into_tensor`` per parameter group
      where torch has it, ``allgather_bucket_size`` unused): 3 tail calls;
    - ZeRO-3: ``grad_flushes``' reduce-scatters per micro-batch (``stage3.py:1583`` flushes the
      bucket when the next gradient would overflow it; one per tensor under ``per_param_reduce``,
      DeepSpeed v0.3.13; without ``grad_tensors`` ``ceil(P / reduce_bucket_size)``), the parameter
      all-gathers of
      ``zero3`` (``zero3_gathers``: forward and backward per micro-batch; after the step one per
      persistent parameter, counted in the tail with the norm all-reduce); without ``zero3`` (the
      model's tensors unknown) one all-gather per parameterised module per micro-batch;
    - TP: per layer and micro-batch two all-reduces forward and two backward, two more under full
      recompute; sequence parallelism turns each into a reduce-scatter + all-gather pair;
    - PP: Megatron, a send forward and one backward per micro-batch and boundary, ``v`` times
      interleaved; DeepSpeed's pipeline engine, the blocking sends and receives of one stage's
      timeline (``deepspeed_pipe_transfers``: 8 per micro-batch on an inner stage at tp = 1).

    ``P`` is the rank's trainable elements before ZeRO sharding (ZeRO reduces every gradient)."""
    m = grad_accum
    out: dict = {}
    flushes = None
    if dp > 1 and trainable_params > 0 and zero_stage in (1, 2, 3) and engine != "megatron" and grad_tensors:
        overlap = (zero_stage == 3) if overlap_comm is None else overlap_comm
        flushes = grad_flushes(tensors=grad_tensors, reduce_bucket_size=float(reduce_bucket_size),
                               zero_stage=zero_stage, dp=dp, ready_order=zero_stage != 1 or overlap,
                               per_param=per_param_reduce and zero_stage == 3)
        out["dp_bucket_elements"] = flushes
    if dp > 1 and trainable_params > 0:
        if engine == "megatron":
            out["dp_buckets"] = 1
        elif zero_stage == 0:
            out["dp_buckets"] = _ceil_div(trainable_params, DS_ALLREDUCE_BUCKET_ELEMENTS)
        elif zero_stage in (1, 2):
            buckets = len(flushes) if flushes is not None else _ceil_div(trainable_params, reduce_bucket_size)
            out["dp_buckets"] = buckets * (m if zero_stage == 2 else 1)
            out["dp_tail"] = 3
        else:
            out["dp_buckets"] = m * (len(flushes) if flushes is not None
                                     else _ceil_div(trainable_params, reduce_bucket_size))
            if zero3 is None:
                out["zero3_gathers"] = m * (stage_layers * modules_per_layer + 2)
                out["dp_tail"] = 1
            else:
                out["zero3_gathers"] = m * (zero3.forward_calls + zero3.backward_calls)
                out["dp_tail"] = 1 + zero3.step_calls
    if tp > 1:
        per_layer = (4 + (2 if recompute == "full" else 0)) * (2 if sequence_parallel else 1)
        out["tp"] = m * stage_layers * per_layer
    if pp > 1:
        out["pp"] = m * (2 * virtual_stages if engine == "megatron" else deepspeed_pipe_transfers(pp=pp, tp=tp)[1])
    return CollectiveCalls(**out)


def modules_per_layer(facts) -> int:
    """Parameterised modules of one layer that ZeRO-3 gathers: its weight matrices (tensors larger
    than ``8 h``: biases and norms are smaller and live in the same modules or stay persistent);
    7 (a Llama layer) when only a parameter count is known."""
    if facts.shape is None or not facts.layer_persistent:
        return 7
    return max(1, sum(1 for t in facts.layer_persistent if t > 8 * facts.hidden))


def stage_tensors(facts, *, layers: int, first: bool, last: bool, pp: int = 1) -> int:
    """Parameter tensors of one pipeline stage: those of ``stage_grad_tensors`` (AutoTP shards
    tensors but keeps their number); when only a parameter count is known, ``layers`` x 9 (a Llama
    layer's), the embedding on the first stage, the final norm and an untied head on the last."""
    tensors = stage_grad_tensors(facts, layers=layers, first=first, last=last, pp=pp)
    if tensors is not None:
        return len(tensors)
    n = layers * (len(facts.layer_persistent) or 9)
    if first:
        n += len(facts.embed_tensors) or (1 if facts.embed else 0)
    if last:
        n += (1 if facts.final else 0) + (1 if facts.lm_head and not facts.tied else 0)
    return n


def zero_overhead_seconds(*, zero_stage: int, num_tensors: int, num_micro_batches: int, gpu) -> float:
    """ZeRO's own host work per step apart from its communication, paid even over one
    data-parallel rank: ``num_micro_batches x num_tensors x`` ``GPU.zero_tensor_seconds``
    (ZeRO-1/2: the per-parameter gradient hook and its copies into the flat bucket and the
    partition) or ``GPU.zero3_tensor_seconds`` (ZeRO-3: the module hooks' fetch/release
    bookkeeping and partition/gather copies, DeepSpeed 0.19.8 ``parameter_offload.py`` and
    ``partitioned_param_coordinator.py``); 0 for ZeRO-0. It scales with the tensors and the
    micro-steps, not the elements: on one CPU rank ZeRO-3 added 10-15 ms to the tiny Llama (21
    tensors), 19-21 ms to a 4-layer one (39 tensors) and 10-22 ms at 3x the elements (21 tensors),
    0.57 ms a tensor by least squares over three runs, and cProfile counts
    ~4.3e4 Python calls a step for ZeRO-3 against ~3.5e3 for ZeRO-0
    (``benchmarks/zero_dp1_cost.py --one-rank``; docs/estimate.md)."""
    if zero_stage == 3:
        per_tensor = gpu.zero3_tensor_seconds
    elif zero_stage in (1, 2):
        per_tensor = gpu.zero_tensor_seconds
    else:
        per_tensor = 0.0
    return num_micro_batches * num_tensors * per_tensor


NCCL_BASE_US = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}, "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}}
"""NCCL's fixed latency of one collective, microseconds, by algorithm and protocol (``baseLat``,
``src/graph/tuning.cc``, NCCL 2.18-2.27; 2.8-2.12 had ring LL 3.6 and tree LL 4.4)."""

NCCL_HOP_US = {
    ("ring", "nvlink"): {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},
    ("ring", "pci"): {"LL": 1.0, "LL128": 2.5, "Simple": 5.7},
    ("ring", "net"): {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
    ("tree", "nvlink"): {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
    ("tree", "pci"): {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
    ("tree", "net"): {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
}
"""NCCL's latency per step of a ring / level of a tree, microseconds (``hwLat``, ``tuning.cc``,
NCCL 2.18-2.27; the network's ring Simple hop was 9.6 us in 2.8-2.11 and 28 in 2.12)."""

NCCL_NET_OVERHEAD_US = 1.0
"""Posting one network operation (``getNetOverhead``: 1 us on Intel and other hosts, 2 on AMD;
three times that under Simple): in a ring across nodes every intra-node step costs at least it."""

NCCL_BW_FACTOR = {("ring", "LL"): 0.5, ("ring", "LL128"): 0.92, ("ring", "Simple"): 1.0,
                  ("tree", "LL"): 0.92 / 3.8, ("tree", "LL128"): 0.92 * 120 / 128, ("tree", "Simple"): 0.92,
                  ("pat", "Simple"): 0.75}
"""Bus bandwidth of each algorithm/protocol relative to the ring's Simple (``ncclTopoTuneModel``'s
"model refinements", NCCL 2.27): LL carries 4 bytes of data per 8, LL128 120 of 128."""

NCCL_LL_MAX_BYTES_PER_S = {"ampere": (87.7e9, 22.5e9, 19.0e9), "hopper": (141.0e9, 45.0e9, 35.0e9)}
"""LL's bus bandwidth cap on 1, 2 and more nodes (``llMaxBws``, NCCL 2.27; Volta's row is below
Ampere's): what keeps LL off large messages. dstk takes the Hopper row for a GPU of 500+ dense
TFLOP/s, the Ampere row otherwise."""


def nccl_latency_seconds(*, kind: str, ranks: int, nodes: int, algorithm: str = "ring", protocol: str = "Simple",
                         link: str = "nvlink") -> float:
    """NCCL's latency of one ``kind`` call (``all_reduce``, ``all_gather``, ``reduce_scatter``)
    over ``ranks`` GPUs on ``nodes`` nodes (``ncclTopoTuneModel``, ``src/graph/tuning.cc``, NCCL
    2.18-2.27; facts only), ``link`` the intra-node link (``nvlink`` or ``pci``):

    - ring: ``base + (s - s_net) * intra + s_net * net`` with ``s = 2 (n - 1)`` steps for an
      all-reduce, ``n - 1`` for an all-gather or reduce-scatter, ``s_net`` the steps that cross
      nodes (``2 (N - 1)`` or ``N - 1``), ``intra`` at least the network post overhead across nodes;
    - tree (all-reduce only): ``base + 2 ((n/N - 1) intra + log2(N) net)``;
    - PAT (all-gather / reduce-scatter with one GPU per node, NCCL 2.23+, Simple):
      ``8 + log2(N) net / 3.5 + 2.8 n``.

    At 1024 H100s on 128 nodes a ring all-gather under Simple costs 8.4 + 896 x 3.4 + 127 x 14 us
    = 4.8 ms whatever its size: why ZeRO++ hpZ, MiCS and FSDP+TP keep gathers inside smaller groups."""
    n, nn = ranks, max(1, nodes)
    if n <= 1:
        return 0.0
    if algorithm == "pat":
        return (8.0 + int(math.log2(nn)) * NCCL_HOP_US[("tree", "net")]["Simple"] / 3.5 + 2.8 * n) * 1e-6
    intra = NCCL_HOP_US[(algorithm, link)][protocol]
    net = NCCL_HOP_US[(algorithm, "net")][protocol]
    base = NCCL_BASE_US[algorithm][protocol]
    if algorithm == "tree":
        return (base + 2 * ((n / nn - 1) * intra + int(math.log2(nn)) * net)) * 1e-6
    if nn > 1:
        intra = max(intra, NCCL_NET_OVERHEAD_US * (3 if protocol == "Simple" else 1))
    steps, net_steps = (2 * (n - 1), 2 * (nn - 1)) if kind == "all_reduce" else (n - 1, nn - 1)
    return (base + (steps - net_steps) * intra + net_steps * net) * 1e-6


def group_nodes(*, group: int, stride: int, cluster) -> int:
    """Nodes a group of ``group`` ranks ``stride`` apart spans (ranks numbered TP fastest):
    ``ceil(group / r)``, ``r`` its members per node (``dstk.estimate.members_per_node``)."""
    from dstk.estimate import members_per_node

    if group * stride <= min(cluster.gpus_per_node, cluster.world_size) or cluster.num_nodes == 1:
        return 1
    return min(cluster.num_nodes, -(-group // members_per_node(group=group, stride=stride, cluster=cluster)))


def collective_latency(*, group: int, stride: int, cluster, kind: str = "all_reduce",
                       nbytes: float | None = None) -> float:
    """Seconds one ``kind`` call (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``send``)
    over ``group`` ranks ``stride`` apart costs beyond its bytes at the Simple ring's bandwidth.

    On GPUs, NCCL's own cost model (``nccl_latency_seconds``): of the algorithms and protocols
    NCCL would run for a call of ``nbytes`` (ring LL/LL128/Simple, tree for an all-reduce, PAT for
    one GPU per node), the cheapest ``lat + traffic / (bw x factor)`` (``NCCL_BW_FACTOR``), less
    ``traffic / bw`` (what the ring formulas price); ``nbytes`` None: the smallest latency (a tiny
    message). LL128 only over NVLink (NCCL enables it there by default); LL's bus bandwidth capped
    (``NCCL_LL_MAX_BYTES_PER_S``), which keeps it off large messages. It grows with the ring:
    32 us for a Simple all-gather over 8 GPUs of a node, 70 us over 2 nodes, 0.30 ms over 8, 4.8 ms
    over 128. Never below the catalog's per-call figure (``GPU.collective_latency_seconds`` inside
    a node, the interconnect's across nodes; ``dstk doctor --calibrate`` measures the GPU's): a
    point-to-point ``send`` pays that figure only. CPU ranks (gloo, not NCCL): the flat measured
    ``GPU.collective_latency_seconds``."""
    gpu = cluster.gpu
    nodes = group_nodes(group=group, stride=stride, cluster=cluster)
    floor = gpu.collective_latency_seconds
    if nodes > 1 and cluster.interconnect is not None:
        floor = max(floor, cluster.interconnect.collective_latency_seconds)
    if gpu.is_cpu or group <= 1 or kind == "send":
        return floor
    link = "nvlink" if gpu.intra_node_bytes_per_s >= 100e9 else "pci"
    protocols = ("LL", "LL128", "Simple") if link == "nvlink" else ("LL", "Simple")
    options = [("ring", p) for p in protocols]
    if kind == "all_reduce":
        options += [("tree", p) for p in protocols]
    elif nodes == group and nodes > 1:
        options.append(("pat", "Simple"))
    costs = [(nccl_latency_seconds(kind=kind, ranks=group, nodes=nodes, algorithm=a, protocol=p, link=link), a, p)
             for a, p in options]
    if nbytes is None or nbytes <= 0:
        return max(floor, min(c for c, _, _ in costs))
    from dstk.estimate import _bandwidth

    bw, _ = _bandwidth(group=group, stride=stride, cluster=cluster)
    ring = (2.0 if kind == "all_reduce" else 1.0) * (group - 1) / group * nbytes / bw
    caps = NCCL_LL_MAX_BYTES_PER_S["hopper" if gpu.fp16_flops >= 500e12 else "ampere"]
    ll_cap = caps[min(nodes, 3) - 1]

    def seconds(lat: float, algorithm: str, protocol: str) -> float:
        rate = bw * NCCL_BW_FACTOR[(algorithm, protocol)]
        rate = min(rate, ll_cap) if protocol == "LL" else rate
        return lat + (2.0 * nbytes if algorithm == "tree" else ring * bw) / rate

    best = min(seconds(lat, a, p) for lat, a, p in costs) - ring
    return max(floor, best)


def latency_extra_seconds(*, call_seconds: float, priced_seconds: float) -> float:
    """What a call's fixed cost adds over the latency a ring formula already priced (its
    ``2 (n - 1)`` alpha steps, ``timing.ring_allreduce_seconds``): ``max(0, L - priced)``."""
    return max(0.0, call_seconds - priced_seconds)


PIPE_FORWARD_TENSORS = 3
"""Tensors ``dstk.pipeline`` passes between stages: ``(hidden, attention_mask, position_ids)``
(``toolkit/pipeline/stages.py``); only the hidden state is float and has a gradient."""


def deepspeed_pipe_transfers(*, pp: int, tp: int = 1) -> tuple[int, int]:
    """``(hidden-state transfers, calls)`` that one micro-batch puts on a stage's timeline under
    DeepSpeed 0.19.8's ``PipelineEngine`` with ``TrainSchedule`` (1F1B):

    - Every transfer is a blocking ``dist.send``/``dist.recv`` (``pipe/p2p.py:46-84`` asserts
      ``async_op == False``), one call per tensor of the tuple (``pipe/engine.py:1042-1046``
      ``_exec_send_activations``, ``1094-1108`` ``_exec_send_grads``): ``PIPE_FORWARD_TENSORS``
      forward, the hidden state's gradient backward; with ``pipe_partitioned``/``grad_partitioned``
      (dstk's config when tp > 1) one more each, the ``PartitionedTensor`` meta
      (``engine.py:748``, ``1080``). The tensor meta goes once per run (``first_output_send``,
      ``engine.py:1038``).
    - The schedule runs lock-step (``pipe/schedule.py:197-245``): a forward step first sends the
      previous gradient back then receives the activation (``SendGrad``, ``RecvActivation``), a
      backward step receives the gradient then sends the previous activation; nothing overlaps
      compute, since the compute stream waits on each call. An inner stage so carries 2 sends and
      2 receives of the hidden state per micro-batch, an end stage (pp = 2) 1 and 1.
      ``tests/test_pipeline_costs.py`` replays DeepSpeed's own ``TrainSchedule`` with blocking
      transfers of ``c`` seconds: each further micro-batch adds ``4 c`` at pp = 4 and 8, ``2 c``
      at pp = 2, and the fill and drain no more (Megatron's ``send_forward_recv_backward`` pairs
      them: 2 ``c``).
    Counted on 2 gloo ranks: ``tests/test_pipeline_costs.py`` (3 sends and 1 receive a
    micro-batch on stage 0)."""
    neighbours = 1 if pp <= 2 else 2
    partitioned = 1 if tp > 1 else 0
    return 2 * neighbours, neighbours * (PIPE_FORWARD_TENSORS + partitioned + 1 + partitioned)


def tied_grad_allreduce_seconds(*, facts, pp: int, tp: int, dp: int, precision: str, cluster) -> float:
    """DeepSpeed 0.19.8's pipeline engine all-reduces the gradient of a weight tied across stages
    (the embedding and a tied head, ``TiedLayerSpec``) between the stages that hold it, once a step
    after the last backward and before the DP reduction (``ReduceTiedGrads``, ``pipe/schedule.py:239``;
    ``_exec_reduce_tied_grads``, ``pipe/engine.py:269-285``): a 2-rank ring all-reduce of
    ``w V h`` bytes (the 16-bit gradient, or ``BF16_Optimizer``'s bf16 accumulation buffer) between
    stage 0 and stage ``p - 1``, ``(p - 1) t d`` ranks apart, exposed. 0 without a pipeline or a tie.
    Counted on 2 gloo ranks (``tests/test_pipeline_costs.py``: one all-reduce of ``V h`` elements)."""
    if pp <= 1 or not facts.tied or not facts.vocab:
        return 0.0
    from dstk.estimate import _bandwidth

    bw, lat = _bandwidth(group=2, stride=(pp - 1) * tp * dp, cluster=cluster)
    nbytes = mem.param_bytes(precision) * facts.vocab * facts.hidden
    call = collective_latency(group=2, stride=(pp - 1) * tp * dp, cluster=cluster, nbytes=nbytes)
    return tm.ring_allreduce_seconds(nbytes=nbytes, ranks=2, bandwidth=bw, latency=lat) + latency_extra_seconds(
        call_seconds=call, priced_seconds=2 * lat)


def bf16_optimizer_in_pipeline(*, engine: str, pp: int, zero_stage: int, precision: str,
                                grad_accum_dtype: str | None = None, offload_optimizer: str = "none") -> bool:
    """Whether DeepSpeed 0.19.8 wraps the optimizer in ``BF16_Optimizer`` for a pipeline: ZeRO-0 in
    bf16 with the default ``data_types.grad_accum_dtype`` (the model's: ``engine.py:1806``), which
    ``_do_optimizer_sanity_check`` sends to ``BFLOAT16`` only under a pipeline
    (``engine.py:2316-2320``, with a warning that bf16 accumulation over many micro-batches is not
    safe); without one it is ``FP16_Optimizer``'s fused path (``DDP_BFLOAT16``). ZeRO-1 with
    ``grad_accum_dtype: "fp32"`` runs it too (``memory.bf16_optimizer_in_pipeline``)."""
    return engine == "deepspeed" and mem.bf16_optimizer_in_pipeline(pp=pp, zero_stage=zero_stage, precision=precision,
                                                                    grad_accum_dtype=grad_accum_dtype,
                                                                    offload_optimizer=offload_optimizer)


def bf16_pipe_grad_bytes_per_param(*, last: bool, precision: str = "bf16",
                                   grad_accum_dtype: str | None = None) -> float:
    """HBM bytes per parameter that ``BF16_Optimizer`` adds to each micro-batch's backward under
    DeepSpeed's pipeline engine, beyond the accumulation into ``.grad`` that
    ``timing.grad_accumulation_bytes_per_param`` prices:

    - ``clear_lp_grads`` zeroes every 16-bit ``.grad`` (``w`` written, ``bf16_optimizer.py:612``)
      before each backward: twice on a stage that is not last (``pipe/engine.py:846-847``, then
      the engine's ``_backward_prologue`` through the output hooks, ``engine.py:3011-3021`` and
      ``3141``), once on the last (``DeepSpeedEngine.backward``);
    - ``update_hp_grads`` after each backward (``pipe/engine.py:862-865``; the last stage's
      ``_backward_epilogue``, ``engine.py:3159-3161``) adds each ``.grad`` into the flat
      accumulation buffer of ``grad_acc_dtype`` (bf16 by default):
      ``hp.add_(lp.to(hp.dtype))`` (``bf16_optimizer.py:520``), read ``w`` twice and write ``w``.

    ``5 w`` (10 B) per micro-batch on an inner stage, ``4 w`` on the last. Counted on 2 gloo ranks:
    ``tests/test_pipeline_costs.py``. With ``grad_accum_dtype: "fp32"`` the buffer is fp32 and
    ``lp.to(hp.dtype)`` materialises an fp32 copy first: read ``w``, write and read 4, read and
    write the buffer's 4: ``clears w + w + 16`` (22 B inner, 20 B last)."""
    w = mem.param_bytes(precision)
    clears = 1 if last else 2
    if mem.accumulates_in_fp32(grad_accum_dtype):
        return clears * w + w + 16.0
    return clears * w + 3 * w


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class OffloadTraffic:
    """Bytes one rank moves over its host link (PCIe) per optimizer step under ZeRO offload, per
    element of its partition, as DeepSpeed 0.19.8 issues the copies (``offload_traffic``).
    "down" is device -> host, "up" host -> device."""

    accumulate: tuple[tuple[float, float], ...]
    """(down, up) per micro-batch, in order: the gradient in its accumulation dtype, carried across
    micro-batches on the host and copied up, added and copied back down from backward's hooks (under
    ZeRO-1/2 per element of every parameter that touches the partition, whole)."""
    gradient_down: float
    """The fp32 gradient copied down in the last micro-batch's hooks (converted on the GPU)."""
    parameter_up: float = 0.0
    """The updated 16-bit partition copied up after the CPU step (converted on the host)."""
    parameter_down: float = 0.0
    """Parameter offload alone: the 16-bit partition copied down from the GPU's fp32 step."""
    gather_up: float = 0.0
    """Parameter offload: the 16-bit partition copied up by one gather pass over the stage."""
    gather_passes: float = 0.0
    """Gather passes per micro-batch (forward, backward, and the recompute's forward)."""

    @property
    def down_bytes(self) -> float:
        return sum(d for d, _ in self.accumulate) + self.gradient_down + self.parameter_down

    def up_bytes(self, *, num_micro_batches: int) -> float:
        return (sum(u for _, u in self.accumulate) + self.parameter_up
                + num_micro_batches * self.gather_passes * self.gather_up)


def offload_traffic(*, zero_stage: int, precision: str, num_micro_batches: int, offload_optimizer: bool,
                    offload_params: bool = False, gather_passes: float = 2.0,
                    grad_accum_bytes: int | None = None) -> OffloadTraffic:
    """Host-link bytes per partition element and step under ZeRO offload, as DeepSpeed 0.19.8 moves
    them (``w``: the 16-bit/model dtype's bytes; ``a``: the gradient accumulation dtype's,
    ``data_types.grad_accum_dtype``, the model dtype unless set; m micro-batches). Counted on a real
    engine by ``tests/offload_traffic_ranks.py`` (every ``copy_``/``.to`` touching a host buffer):

    - **ZeRO-1** (optimizer offload): the gradient accumulates on the GPU and is reduced once, at the
      boundary; ``copy_grads_in_partition`` (stage_1_and_2.py:2161-2176) sends the partition's fp32
      gradient down (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``, :1902-1909, ``.to(fp32)``
      on the GPU): 4 down; the step converts the fp32 partition to 16 bits on the host
      (:3095) and copies it up (:3096): w up. Whatever m.
    - **ZeRO-2**: the same at m = 1. With m > 1 every micro-batch's hook also keeps the gradient on
      the host in the model dtype (``async_accumulate_grad_in_cpu_via_gpu``, :1809-1858, a whole
      ``param.numel()`` buffer per parameter touching the partition): micro-batch 0 copies it down
      (:1846), every later one copies it up (:1833), adds, and copies it down again, the last one
      too (:2166 ``micro_step_id > 0``): m a down and (m - 1) a up, then the 4 and the w above.
      With ``grad_accum_dtype: fp32`` on 16-bit weights the gradients accumulate in an fp32
      partition buffer on the GPU instead (``_use_compact_grad_partition_buffer``, :1259-1266;
      :2145-2159 copies it down at the boundary only): 4 down, w up, as ZeRO-1.
    - **ZeRO-3** (``partition_grads``, stage3.py:2006-2054): the reduce-scattered partition goes to
      the host gradient buffer (``grad_partitions_flat_buffer``, on the CPU under optimizer offload,
      :791) every micro-batch: the first copies it down (:2025) and straight back up (:2028, to take
      the norm on the GPU); each later one copies it up (:2034), adds, and copies it down (:2036);
      the boundary then sends the fp32 gradient down (``_offload_grad_partition_at_boundary``,
      :1457, converted on the GPU): m a + 4 down, m a up; after the CPU step the 16-bit partition on
      the GPU is written from the host's fp32 one (``_reassign_or_swap_out_partitioned_parameters``,
      :2858): w up (torch converts host -> device copies on the CPU, ``copy_kernel_cuda``). With
      ``offload_param`` that partition lives on the host: no upload at the step, but every gather
      copies the rank's partition up before the all-gather (partition_parameters.py:1396
      ``ds_tensor.to(device)``): w per element per gather pass (forward, backward, and the
      recompute's), every micro-batch. Parameter offload without optimizer offload keeps the
      gradients on the GPU and copies the GPU's fp32 step result down: w.

    fp16 moves the same bytes as bf16 (the same code paths); fp32 training has w = a = 4."""
    if num_micro_batches < 1:
        raise ValueError(f"num_micro_batches must be >= 1, got {num_micro_batches}")
    w = mem.param_bytes(precision)
    a = w if grad_accum_bytes is None else grad_accum_bytes
    m = num_micro_batches
    gather = dict(gather_up=float(w), gather_passes=gather_passes) if offload_params and zero_stage == 3 else {}
    if not offload_optimizer:
        return OffloadTraffic(accumulate=((0.0, 0.0),) * m, gradient_down=0.0,
                              parameter_down=w if offload_params else 0.0, **gather)
    if zero_stage == 3:
        return OffloadTraffic(accumulate=((a, a),) * m, gradient_down=4.0,
                              parameter_up=0.0 if offload_params else w, **gather)
    if zero_stage == 2 and m > 1 and not (a == 4 and w != 4):
        return OffloadTraffic(accumulate=((a, 0.0),) + ((a, a),) * (m - 1), gradient_down=4.0, parameter_up=w)
    return OffloadTraffic(accumulate=((0.0, 0.0),) * m, gradient_down=4.0, parameter_up=w)


def offload_link_seconds(*, traffic: OffloadTraffic, params: float, bucket_params: float, backward_seconds: float,
                         forward_seconds: float, host_bytes_per_s: float) -> float:
    """Exposed seconds of ``traffic`` (``offload_traffic``) for a partition of ``params`` elements
    over a host link of ``host_bytes_per_s`` each way. PCIe is full duplex (each direction has its
    own lanes, ``host_bytes_per_s`` is one direction's), so a micro-batch's copies take the larger
    direction's bytes over the link. DeepSpeed issues the gradient copies from backward's hooks on
    its side stream (stage_1_and_2.py:2238 ``reduction_stream`` under ``overlap_comm``; stage3.py:1671
    ``reduce_and_partition_stream``): each micro-batch's hide behind its backward
    (``backward_seconds``; pass 0 without ``overlap_comm``, where they run on the compute stream)
    and what exceeds it is exposed, plus the last bucket's share, copied after
    backward ends (``bucket_params`` of the partition). The parameter upload after the CPU step (or
    the download under parameter offload alone) is exposed: the next forward, or ZeRO-1/2's all-gather,
    waits for it. Parameter offload's gather uploads ride with the gathers: the forward pass's hide
    behind the forward compute, the backward passes' are exposed, as ZeRO-3's backward gathers are
    (``zero3_step_seconds``). Pinned host buffers are assumed (dstk renders ``pin_memory: true``;
    DeepSpeed's default, pageable, makes each copy synchronous and exposes it)."""
    link = host_bytes_per_s
    m = len(traffic.accumulate)
    exposed = 0.0
    for i, (down, up) in enumerate(traffic.accumulate):
        if i == m - 1:
            down += traffic.gradient_down
        exposed += max(0.0, max(down, up) * params / link - backward_seconds)
    last_down = traffic.accumulate[-1][0] + traffic.gradient_down
    exposed += last_down * min(bucket_params, params) / link
    exposed += (traffic.parameter_up + traffic.parameter_down) * params / link
    if traffic.gather_up:  # forward's pass behind the forward compute, backward's exposed
        one_pass = traffic.gather_up * params / link
        exposed += m * (max(0.0, one_pass - forward_seconds) + (traffic.gather_passes - 1) * one_pass)
    return exposed


def step_time(*, facts, layout, training, cluster, buffers, tp_style: str = "autotp",
              kernels: MegatronKernels = MegatronKernels(), zero_kernels: ZeroKernels = ZeroKernels(), lora=None,
              fused_kernels: bool | None = None):
    """``Time`` of one optimizer step of ``layout`` (see the module docstring for the model);
    ``kernels``: the Megatron engine's overlap (``MegatronKernels``; ``MEGATRON_2021`` for the
    Megatron-LM of Narayanan et al. 2021); ``zero_kernels``: DeepSpeed's (``ZeroKernels``;
    ``DEEPSPEED_2021`` for its ZeRO-3 of the same paper). ``lora``: ``dstk.estimate.lora.StepTerms`` when adapters
    train on a frozen base (its deltas are applied at the four places marked "LoRA").
    ``fused_kernels``: see ``layer_pass_seconds`` (None: the engine's own)."""
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
                               kernels=kernels, fused_kernels=fused_kernels)
    if lora is not None:  # LoRA: no weight gradients for the frozen base, the adapters' GEMMs
        layer = dataclasses.replace(layer, backward=layer.backward + lora.layer_backward_seconds)
    pp_mb = 0.0
    if pp > 1:
        bw, lat = _bandwidth(group=2, stride=tp * dp, cluster=cluster)
        # Activations forward and gradients backward cross each boundary once per micro-batch
        # (scattered over the TP group, Narayanan et al. 2021 §4.1); interleaving crosses v
        # times as many boundaries (§2.2.2).
        call = collective_latency(group=2, stride=tp * dp, cluster=cluster, kind="send")
        per_call = lat + latency_extra_seconds(call_seconds=call, priced_seconds=lat)
        if megatron:
            pp_mb = 2 * v * (tokens_mb * f.hidden * w / tp / bw + per_call)
        else:  # DeepSpeed's PipelineEngine: every send and receive blocks, one after another
            transfers, calls = deepspeed_pipe_transfers(pp=pp, tp=tp)
            pp_mb = transfers * tokens_mb * f.hidden * w / tp / bw + calls * per_call
        if tp > 1 and not (megatron and layout.sequence_parallel):
            # The receiver re-assembles the scattered tensor with an all-gather over its TP group
            # before it can compute (Megatron ``gather_split_1d_tensor``; DeepSpeed's pipe engine
            # ``PartitionedTensor.full``, ``pipe_partitioned`` on by default when model parallel).
            # Under sequence parallelism Megatron sends the sequence shard as it is (no gather).
            bw_tp, lat_tp = _bandwidth(group=tp, stride=1, cluster=cluster)
            pp_mb += 2 * v * tm.ring_gather_seconds(nbytes=tokens_mb * f.hidden * w, ranks=tp, bandwidth=bw_tp,
                                                    latency=lat_tp)
    head = head_seconds(facts=f, tokens=tokens_mb, tp=tp, act_bytes=w, gpu=gpu, peak_flops=peak)
    embed = tm.memory_seconds(nbytes=3.0 * 2 * w * f.hidden * tokens_mb, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    if megatron and tp > 1:  # the vocab-parallel embedding all-reduces its output
        bw, lat = _bandwidth(group=tp, stride=1, cluster=cluster)
        embed += tm.ring_allreduce_seconds(nbytes=tokens_mb * f.hidden * w, ranks=tp, bandwidth=bw, latency=lat)

    counts = stage_layers(f.layers, pp, layout=layout, facts=f, seq_len=training.seq_len,
                          engine="megatron" if megatron else "deepspeed")
    accumulate = tm.grad_accumulation_bytes_per_param(engine="megatron" if megatron else "deepspeed",
                                                      precision=training.precision)
    # The slowest stage sets the pace of every micro-batch (1F1B, Narayanan et al. 2021 §2.2).
    hp_grads = bf16_optimizer_in_pipeline(engine="megatron" if megatron else "deepspeed", pp=pp,
                                          zero_stage=layout.zero_stage, precision=training.precision,
                                          grad_accum_dtype=buffers.grad_accum_dtype,
                                          offload_optimizer=layout.offload_optimizer)
    stage_fwd = stage_bwd = stage_tp = stage_tp_fwd = 0.0
    for i, n in enumerate(counts):
        ends = stage_params(f, layers=0, first=i == 0, last=i == pp - 1, tp=tp, pp=pp, tp_style=tp_style)
        fwd = n * layer.forward + (embed / 3 if i == 0 else 0.0) + (head / 3 if i == pp - 1 else 0.0)
        bwd = n * layer.backward + (2 * embed / 3 if i == 0 else 0.0) + (2 * head / 3 if i == pp - 1 else 0.0)
        bwd += tm.memory_seconds(nbytes=accumulate * ends, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
        bwd += lora.stage_backward_seconds if lora is not None else 0.0  # LoRA: frozen embedding and head
        if hp_grads and lora is None:  # BF16_Optimizer under a DeepSpeed pipeline, every micro-batch
            hp_bytes = bf16_pipe_grad_bytes_per_param(last=i == pp - 1, precision=training.precision,
                                                      grad_accum_dtype=buffers.grad_accum_dtype)
            bwd += tm.memory_seconds(nbytes=hp_bytes * stage_params(f, layers=n, first=i == 0, last=i == pp - 1,
                                                                    tp=tp, pp=pp, tp_style=tp_style),
                                     hbm_bytes_per_s=gpu.hbm_bytes_per_s)
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
        bw, lat = _bandwidth(group=dp, stride=tp, cluster=cluster,
                             share_nics=megatron or zero_kernels.share_nics)
        bucket = tm.ring_allreduce_seconds(nbytes=w * min(buffers.reduce_bucket_size, worst_params), ranks=dp,
                                           bandwidth=bw, latency=lat)
        # Per-call latency (``collective_calls``): the buckets' rides with their bytes (hidden beside
        # backward under overlap_comm), the tail after backward is exposed. A CPU rank overlaps
        # nothing: DeepSpeed's CPU accelerator streams are no-ops (``cpu_accelerator.py``
        # ``stream()`` returns a noop context), so gloo's calls run inside backward and step.
        zero3 = (zero3_gathers(facts=f, buffers=buffers, tp=tp, stage_layers=counts[worst], recompute=recompute)
                 if layout.zero_stage == 3 and not megatron and zero_kernels.replay_gathers else None)
        calls = collective_calls(zero_stage=layout.zero_stage, dp=dp, tp=tp, pp=pp, grad_accum=m,
                                 stage_layers=counts[worst], trainable_params=worst_params,
                                 reduce_bucket_size=buffers.reduce_bucket_size,
                                 modules_per_layer=modules_per_layer(f), engine="megatron" if megatron else "deepspeed",
                                 zero3=zero3, overlap_comm=buffers.overlaps(layout.zero_stage),
                                 grad_tensors=None if lora is not None else stage_grad_tensors(
                                     f, layers=counts[worst], first=worst == 0, last=worst == pp - 1, tp=tp, pp=pp),
                                 per_param_reduce=zero_kernels.per_param_reduce)
        sync = gpu.is_cpu
        # Each call at NCCL's latency for its kind, group and size (``collective_latency``), less
        # the ring alpha the bandwidth formula of the same bytes already priced.
        bucket_bytes = w * (worst_params if megatron else min(
            worst_params, DS_ALLREDUCE_BUCKET_ELEMENTS if layout.zero_stage == 0 else buffers.reduce_bucket_size))
        # ZeRO-2 all-reduces its buckets unless ``use_multi_rank_bucket_allreduce`` is off
        # (``ZeroBuffers.bucket_all_reduces``); ZeRO-3 reduce-scatters.
        zero2_all_reduce = layout.zero_stage == 2 and not megatron and buffers.bucket_all_reduces()
        bucket_kind = "reduce_scatter" if layout.zero_stage >= 2 and not zero2_all_reduce else "all_reduce"
        call = collective_latency(group=dp, stride=tp, cluster=cluster, kind=bucket_kind, nbytes=bucket_bytes)
        small = collective_latency(group=dp, stride=tp, cluster=cluster)  # a norm or overflow flag
        # The gradient flushes of one reduction pass, each at its own size's latency (``grad_flushes``:
        # a flush of a few norms costs less than a full bucket); without the model's tensors every
        # bucket at the full bucket's.
        if calls.dp_bucket_elements:
            sizes: dict[float, int] = {}
            for e in calls.dp_bucket_elements:
                sizes[e] = sizes.get(e, 0) + 1
            pass_calls = sum(k * collective_latency(group=dp, stride=tp, cluster=cluster, kind=bucket_kind,
                                                    nbytes=w * e) for e, k in sizes.items())
        else:
            pass_calls = calls.dp_buckets / (m if layout.zero_stage in (2, 3) and not megatron else 1) * call
        if layout.zero_stage == 3:  # the norm, then one all-gather per persistent tensor
            tail = small + (calls.dp_tail - 1) * collective_latency(group=dp, stride=tp, cluster=cluster,
                                                                     kind="all_gather")
        elif calls.dp_tail:  # overflow and norm all-reduces, the all-gather of the updated partitions
            tail = (calls.dp_tail - 1) * small + latency_extra_seconds(
                call_seconds=collective_latency(group=dp, stride=tp, cluster=cluster, kind="all_gather",
                                                nbytes=grad_bytes), priced_seconds=(dp - 1) * lat)
        else:
            tail = 0.0
        if layout.zero_stage == 3:
            one = tm.ring_gather_seconds(nbytes=gathered_bytes, ranks=dp, bandwidth=bw, latency=lat)
            rs = tm.ring_gather_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)  # LoRA: adapters
            rs += latency_extra_seconds(call_seconds=pass_calls, priced_seconds=(dp - 1) * lat)
            # The gathers' bytes (as full passes over the stage, ``one`` each) and calls in forward
            # and in backward, as DeepSpeed issues them (``zero3_gathers``); without the model's
            # tensors, a pass forward and one (two under full recompute) in backward, each module
            # in one call per pass.
            alpha = (dp - 1) * lat  # what ``one`` priced per full pass
            if zero3 is not None:
                full = max(zero3.model_elements, 1.0)
                num = zero3.forward_calls + zero3.backward_calls
                gather = collective_latency(group=dp, stride=tp, cluster=cluster, kind="all_gather",
                                            nbytes=w * (zero3.forward_elements + zero3.backward_elements) / max(num, 1))
                fwd_gather = zero3.forward_elements / full * one + latency_extra_seconds(
                    call_seconds=zero3.forward_calls * gather, priced_seconds=zero3.forward_elements / full * alpha)
                bwd_gather = zero3.backward_elements / full * one + latency_extra_seconds(
                    call_seconds=zero3.backward_calls * gather, priced_seconds=zero3.backward_elements / full * alpha)
            else:
                passes = 2 if recompute == "full" else 1
                per_pass = calls.zero3_gathers / m
                gather = collective_latency(group=dp, stride=tp, cluster=cluster, kind="all_gather",
                                            nbytes=gathered_bytes / max(per_pass, 1))
                fwd_gather = one + latency_extra_seconds(call_seconds=per_pass * gather, priced_seconds=alpha)
                bwd_gather = passes * fwd_gather
            if sync:  # nothing overlaps: every gather and reduce-scatter adds
                per_mb = mb_compute + stage_tp + fwd_gather + bwd_gather + rs
            else:  # the backward gathers exposed (``zero3_step_seconds``)
                per_mb = zero3_step_seconds(forward_seconds=stage_fwd + stage_tp_fwd,
                                            backward_seconds=stage_bwd + stage_tp - stage_tp_fwd,
                                            gather_seconds=fwd_gather, reduce_scatter_seconds=rs,
                                            backward_gathers=0) + bwd_gather
            gather_seconds = m * (fwd_gather + bwd_gather)
            dp_seconds = m * rs + tail
            exposed_zero3 = m * (per_mb - mb_compute - stage_tp)
            exposed_dp = tail
        elif layout.zero_stage == 2:
            # DeepSpeed's stage 2 reduces its gradients in every micro-step (it keeps only a gradient
            # partition), then all-gathers the updated parameters once. Each bucket is all-reduced
            # whole by default (``stage_1_and_2.py`` ``average_tensor`` -> ``allreduce_and_scatter``,
            # ``use_multi_rank_bucket_allreduce=True``; ``benchmarks/zero_cpu_cost.py --flush-calls``
            # counts those all-reduces): a whole all-reduce's traffic per micro-step, not a
            # reduce-scatter's; with it off, one ``reduce`` per owning rank, about a reduce-scatter's.
            rs = tm.ring_gather_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)
            if zero2_all_reduce:
                moved = tm.ring_allreduce_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)
                alpha, one_bucket = 2 * (dp - 1) * lat, bucket
            else:
                moved, alpha, one_bucket = rs, (dp - 1) * lat, bucket / 2
            reduce = moved + latency_extra_seconds(call_seconds=pass_calls, priced_seconds=alpha)
            dp_seconds = m * reduce + rs + tail
            exposed_dp = m * _dp_exposed_seconds(seconds=reduce, backward_seconds=stage_bwd,
                                                 bucket_seconds=one_bucket + latency_extra_seconds(
                                                     call_seconds=call, priced_seconds=alpha),
                                                 overlap=buffers.overlaps(2) and not sync) + rs + tail
        else:
            dp_seconds = tm.ring_allreduce_seconds(nbytes=grad_bytes, ranks=dp, bandwidth=bw, latency=lat)
            dp_seconds += latency_extra_seconds(call_seconds=pass_calls,
                                                priced_seconds=2 * (dp - 1) * lat)
            # DeepSpeed's pipeline engine reduces after the last backward (``PipelineEngine`` sets
            # ``enable_backward_allreduce = False``, pipe/engine.py:80; ``ReduceGrads`` at the
            # schedule's last step, pipe/schedule.py:239-241): nothing overlaps under pp > 1.
            overlap = layout.zero_stage == 1 and buffers.overlaps(1) and not megatron and not sync and pp == 1
            exposed_dp = _dp_exposed_seconds(seconds=dp_seconds, backward_seconds=stage_bwd,
                                             bucket_seconds=bucket + latency_extra_seconds(
                                                 call_seconds=call, priced_seconds=2 * (dp - 1) * lat),
                                             overlap=overlap) + tail
            dp_seconds += tail
    shard = worst_params / (dp if layout.zero_stage else 1)
    optimizer_seconds = 0.0
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        # The host link's copies as DeepSpeed issues them (``offload_traffic``: gradients down and
        # back each micro-batch, fp32 gradients down, 16-bit parameters up), exposed where they
        # outrun backward or follow the CPU step (``offload_link_seconds``), and the CPU optimizer's
        # update, all the node's ranks at once on its DRAM bandwidth (``host_optimizer_seconds``).
        from dstk import hardware as hw
        z3 = zero3 if dp > 1 and layout.zero_stage == 3 else None
        passes = ((z3.forward_elements + z3.backward_elements) / max(z3.model_elements, 1.0) if z3 is not None
                  else 1 + (2 if recompute == "full" else 1))
        traffic = offload_traffic(zero_stage=layout.zero_stage, precision=training.precision, num_micro_batches=m,
                                  offload_optimizer=layout.offload_optimizer != "none",
                                  offload_params=layout.offload_params != "none", gather_passes=passes,
                                  grad_accum_bytes=4 if mem.accumulates_in_fp32(buffers.grad_accum_dtype) else None)
        # Without overlap_comm DeepSpeed copies on the compute stream (stage_1_and_2.py:2240-2245;
        # stage3.py:340-341 makes the "side" stream the default one): nothing hides.
        hides = buffers.overlaps(layout.zero_stage) and not gpu.is_cpu
        link = offload_link_seconds(traffic=dataclasses.replace(traffic, gather_up=0.0), params=shard,
                                    bucket_params=buffers.reduce_bucket_size / max(dp, 1),
                                    backward_seconds=stage_bwd if hides else 0.0, forward_seconds=stage_fwd,
                                    host_bytes_per_s=gpu.host_bytes_per_s)
        if traffic.gather_up:  # LoRA: the frozen base is gathered too
            link += offload_link_seconds(
                traffic=OffloadTraffic(accumulate=((0.0, 0.0),) * m, gradient_down=0.0, gather_up=traffic.gather_up,
                                       gather_passes=traffic.gather_passes),
                params=gathered_bytes / w / (dp if layout.zero_stage else 1), bucket_params=0.0,
                backward_seconds=stage_bwd, forward_seconds=stage_fwd, host_bytes_per_s=gpu.host_bytes_per_s)
        offload_seconds = link + hw.host_optimizer_seconds(
            params_per_rank=shard, ranks_per_node=cluster.gpus_per_node,
            host_dram_bytes_per_s=cluster.host_dram_bytes_per_s,
            bytes_per_param=hw.host_optimizer_bytes_per_param(
                optimizer=training.optimizer, precision=training.precision, zero_stage=layout.zero_stage,
                gradient_clipping=training.grad_clip))
    else:
        per_param = tm.optimizer_step_bytes_per_param(optimizer=training.optimizer, precision=training.precision)
        optimizer_seconds = tm.memory_seconds(nbytes=per_param * shard, hbm_bytes_per_s=gpu.hbm_bytes_per_s)

    # ZeRO's hooks and copies (``zero_overhead_seconds``), at dp = 1 too; Megatron's optimizer has none.
    zero_hooks = 0.0 if megatron else zero_overhead_seconds(
        zero_stage=layout.zero_stage, num_micro_batches=m, gpu=gpu,
        num_tensors=stage_tensors(f, layers=counts[worst], first=worst == 0, last=worst == pp - 1, pp=pp))
    compute = m * stage_mb + optimizer_seconds + gpu.step_overhead_seconds + zero_hooks
    bubble = bubble_frac * m * stage_mb
    tied = tied_grad_allreduce_seconds(facts=f, pp=pp, tp=tp, dp=dp, precision=training.precision,
                                       cluster=cluster) if not megatron and lora is None else 0.0
    comm = exposed_dp + exposed_zero3 + offload_seconds + tied
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
        comm={"dp": dp_seconds, "zero3_gather": gather_seconds, "tp": m * stage_tp, "pp": m * pp_mb + tied,
              "offload": offload_seconds},
        bubble_seconds=bubble, bubble_fraction=bubble_frac, tokens_per_second=tps,
        tflops_per_gpu=achieved / 1e12, mfu=achieved / peak, hfu=achieved * recompute_factor / peak,
        model_flops_per_step=model_flops_step,
        time_to_train_seconds=training.num_tokens / tps if training.num_tokens and tps else None,
    )
