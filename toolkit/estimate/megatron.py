"""Per-GPU memory on the Megatron engine (Megatron-LM / megatron-core): model states, activations
and buffers, as small pure functions. No torch.

The DeepSpeed path (``dstk.estimate.memory``) prices HF modules under ZeRO; Megatron allocates
differently: a contiguous fp32 main-gradient buffer, an optional distributed optimizer that shards
only the fp32 master weights and Adam states, a vocabulary-parallel embedding, and fused kernels
that save fewer activations (Korthikanti et al. 2022, Table 2). ``dstk.estimate.estimate(...,
engine="megatron")`` uses these functions. Sources, each cited where it is used:

- Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (NVIDIA's own estimator) and the
  maintainer's note on it (NVIDIA/Megatron-LM issue #654): 18 bytes per parameter, or
  ``6 + 12/d`` with the distributed optimizer.
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv 2205.05198), Table 2 and §4.2-4.3.
- megatron-core source (NVIDIA/Megatron-LM, read at commit d98e8a64, 2026-08): the files named in
  each docstring.

Element counts are per GPU (already divided by TP and PP); bytes out.
"""

from __future__ import annotations

import dataclasses

from dstk.estimate.memory import OPTIMIZER_STATES, LayerShape, ModelStates, param_bytes

__all__ = ["ActivationTerms", "activation_terms", "buffer_bytes", "check_layout", "embedding_activation_bytes",
           "layer_activation_bytes", "model_states", "output_activation_bytes"]

MASK_BYTES = 1
"""A dropout mask is a ``torch.bool`` tensor: 1 byte per element (Korthikanti et al. §4.1)."""


def check_layout(*, zero_stage: int, offload_optimizer: str, offload_params: str) -> None:
    """The Megatron engine shards optimizer states only (its distributed optimizer, dstk's ZeRO 1)
    and has no ZeRO-Offload: anything else is a programmer's mistake here (the intent refuses it
    with a fix, ``dstk.intent.Constraints``)."""
    if zero_stage not in (0, 1):
        raise ValueError(f"zero_stage: the megatron engine takes 0 or 1 (distributed optimizer), got {zero_stage!r}")
    if offload_optimizer != "none" or offload_params != "none":
        raise ValueError("offload_optimizer: the megatron engine has no ZeRO-Offload; use engine deepspeed")


def model_states(*, params: float, precision: str, optimizer: str, distributed_optimizer: bool,
                 dp: int) -> ModelStates:
    """Model-state bytes on one GPU of the Megatron engine, for ``params`` elements (this GPU's share
    after TP and PP).

    Megatron's accounting (``theoretical_memory_usage.py``, ``compute_weight_and_optimizer_memory``:
    ``18 if not args.use_distributed_optimizer else 6 + (12 / args.data_parallel_size)``; NVIDIA
    issue #654: "2 bytes for model parameters used for fprop and bprop, 4 bytes for main parameters,
    4 bytes for gradients, 8 bytes for Adam states ... The model parameters and gradients are *not*
    partitioned when using the distributed optimizer"), generalised to ``K`` fp32 state tensors per
    parameter (Adam: 2) and to fp32 training:

    - bf16/fp16: ``2P`` params; ``4P`` gradients, the contiguous fp32 main-grad buffer
      (``DistributedDataParallel`` with ``grad_reduce_in_fp32``; bf16 forces it,
      ``megatron/training/arguments.py`` "accumulate and all-reduce gradients in fp32 for bfloat16";
      fp16 runs get it from ``--accumulate-allreduce-grads-in-fp32``, which the 18 assumes);
      ``4P`` fp32 main params and ``4K P`` states, divided by ``d`` under the distributed optimizer.
      ``main_param.grad = main_grad.float()`` is a view of an fp32 buffer, so the step adds nothing.
    - fp32: ``4P`` params, ``4P`` main grads, no main-param copy (the optimizer steps the model's
      own fp32 params; the distributed optimizer takes views of their shard), ``4K P`` (``/d``).
    """
    if dp < 1:
        raise ValueError(f"dp: expected a positive integer, got {dp!r}")
    w = param_bytes(precision)
    k = OPTIMIZER_STATES[optimizer]
    shard = params / dp if distributed_optimizer else params
    master = 4.0 * shard if w == 2 else 0.0
    return ModelStates(params_bytes=w * params, grads_bytes=4.0 * params, master_bytes=master,
                       states_bytes=4.0 * k * shard)


def layer_activation_bytes(*, shape: LayerShape, gated: bool, tokens: int, seq_len: int, act_bytes: int,
                           attention: str, recompute: str, sequence_parallel_tp: int = 1) -> float:
    """Bytes one transformer layer of Megatron's fused kernels saves for backward, for
    ``tokens = s b`` tokens of one micro-batch. ``shape`` is already divided by TP (``q_width``,
    ``kv_width``, ``ffn``, ``heads`` per rank; ``hidden`` whole).

    Korthikanti et al. 2022, Table 2 (fp16, 1-byte dropout masks, ``t`` = TP):
    ``sbh(34 + 5as/h)`` without parallelism, ``sbh(10 + 24/t + 5as/(ht))`` with TP,
    ``sbh(34/t + 5as/(ht))`` with TP + sequence parallelism, ``sbh(10 + 24/t)`` and ``sbh(34/t)``
    with selective recompute, ``2sbh`` with full recompute. The terms, per token, with ``w`` bytes
    per activation (§4.1), generalised to grouped-query widths ``q``/``kv`` and gated MLPs:

    - replicated by TP, divided by ``t`` under sequence parallelism (§4.2.2): the two norms' inputs
      (``2wh``), the QKV and fc1 inputs (``2wh``), two residual dropout masks (``2h``, when the
      model trains with dropout): ``10h`` for GPT;
    - attention, sharded: Q and K (``w(q + kv)``), V (``w kv``), the output projection's input
      (``w q``): ``8h/t`` for multi-head attention;
    - materialised scores (``attention="eager"``: Megatron's unfused core attention with the fused
      scale-mask-softmax): softmax output ``w``, dropout mask 1 and dropout output ``w`` per score:
      the ``5as/(ht)`` term; a fused flash kernel (``sdpa``/``flash``: TE/flash attention) keeps
      only its fp32 log-sum-exp (``4a/t``; Dao 2023, FlashAttention-2 Alg. 1), Q, K, V and the
      output being counted above;
    - the MLP, sharded: GELU saves fc1's output and fc2 its input, ``2wf`` (``16h/t`` at
      ``f = 4h``; ``fused_bias_gelu.py`` ``save_for_backward(input, bias)``); the fused SwiGLU
      saves fc1's ``2f`` output and fc2 its ``f`` input, ``3wf`` (``fused_bias_swiglu.py``).

    Selective recompute (core attention, §5) drops the score (or log-sum-exp) term. Full recompute
    keeps the layer input, ``w h`` per token, divided by ``t`` under sequence parallelism (the
    hidden states between layers are sequence-sharded then).
    """
    h, q, kv, f, a = shape.hidden, shape.q_width, shape.kv_width, shape.ffn, shape.heads
    w, sp = act_bytes, sequence_parallel_tp
    if recompute == "full":
        return float(w * h * tokens) / sp
    masks = MASK_BYTES if shape.dropout else 0
    replicated = (4 * w + 2 * masks) * h
    attn = w * (2 * q + 2 * kv)
    if recompute == "none":
        if attention == "eager":
            attn += a * seq_len * (w + (MASK_BYTES + w if shape.dropout else 0))
        else:
            attn += 4 * a
    mlp = (3 if gated else 2) * w * f
    return float(tokens * (replicated / sp + attn + mlp))


def embedding_activation_bytes(*, tokens: int, hidden: int, dropout: bool, sequence_parallel_tp: int = 1) -> float:
    """First stage, one micro-batch: the int64 token ids the embedding's backward indexes with
    (``8sb``) and the embedding dropout mask (``sbh``, 1 byte, sequence-sharded under SP):
    Korthikanti et al. §4.3 (``sbhp/t`` for ``p`` micro-batches in flight) and
    ``theoretical_memory_usage.py`` ("Input to embedding", "Dropout in embedding layer")."""
    return 8.0 * tokens + (MASK_BYTES * hidden * tokens / sequence_parallel_tp if dropout else 0.0)


def output_activation_bytes(*, tokens: int, hidden: int, vocab: int, act_bytes: int, tp: int,
                            sequence_parallel_tp: int = 1) -> float:
    """Last stage, one micro-batch: the final norm's input and the output layer's input
    (``2 w sbh``, sequence-sharded under SP) and the fp32 softmax of the vocabulary-parallel
    cross entropy (``4 sbV/t``): Korthikanti et al. §4.3, ``4sbh/t (1 + V/h)`` with SP."""
    return float(tokens * (2 * act_bytes * hidden / sequence_parallel_tp + 4.0 * vocab / tp))


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ActivationTerms:
    """Activation bytes of one micro-batch on one GPU, in the pieces the per-stage sum needs."""

    layer_bytes: float
    """One layer, as stored between its forward and its backward (``layer_activation_bytes``)."""
    recompute_layer_bytes: float
    """Under full recompute: one layer's full activations, live while backward re-runs it."""
    first_stage_bytes: float
    """The embedding's (``embedding_activation_bytes``), held for every in-flight micro-batch."""
    last_stage_bytes: float
    """The output layer's and the loss's (``output_activation_bytes``)."""


def activation_terms(*, shape: LayerShape, gated: bool, tokens: int, seq_len: int, vocab: int, act_bytes: int,
                     attention: str, recompute: str, tp: int, sequence_parallel_tp: int = 1) -> ActivationTerms:
    """The four activation terms ``dstk.estimate.estimate`` combines per stage: stage ``i`` of
    ``p`` holds ``n_i * layer_bytes`` for ``min(p - i, m)`` micro-batches (1F1B, Narayanan et al.
    2021 §2.2.1), times ``1 + (p - 1)/(p v)`` with ``v`` interleaved chunks (Korthikanti §4.2.3),
    which for the first stage is Korthikanti's Eq. 5: ``L`` layers' worth whatever ``p``."""
    kw = dict(shape=shape, gated=gated, tokens=tokens, seq_len=seq_len, act_bytes=act_bytes, attention=attention,
              sequence_parallel_tp=sequence_parallel_tp)
    layer = layer_activation_bytes(recompute=recompute, **kw)
    again = layer_activation_bytes(recompute="none", **kw) if recompute == "full" else 0.0
    return ActivationTerms(
        layer_bytes=layer, recompute_layer_bytes=again,
        first_stage_bytes=embedding_activation_bytes(tokens=tokens, hidden=shape.hidden, dropout=shape.dropout,
                                                     sequence_parallel_tp=sequence_parallel_tp),
        last_stage_bytes=output_activation_bytes(tokens=tokens, hidden=shape.hidden, vocab=vocab,
                                                 act_bytes=act_bytes, tp=tp,
                                                 sequence_parallel_tp=sequence_parallel_tp))


def buffer_bytes(*, tp: int, pp: int, sequence_parallel: bool, tokens: int, hidden: int, act_bytes: int) -> float:
    """Buffers the Megatron engine allocates beyond model states and saved activations:

    - sequence parallelism all-gathers each column-parallel layer's input into one reused global
      buffer of the whole sequence, ``w sbh`` (``megatron/core/tensor_parallel/layers.py``,
      ``get_global_memory_buffer().get_tensor(dim_size, input.dtype, "mpu")``);
    - with a pipeline, the tensors received from the neighbouring stages, one micro-batch each,
      the activation from the previous stage and the gradient from the next, ``2 w sbh``
      (sequence-sharded under SP) (``megatron/core/pipeline_parallel/p2p_communication.py``,
      ``create_tensor_recv_prev`` / ``create_tensor_recv_next``).

    The distributed optimizer's gradient and parameter buckets are views into the contiguous
    buffers counted in ``model_states`` (``megatron/core/distributed/param_and_grad_buffer.py``),
    so they add nothing.
    """
    w = act_bytes
    sp = tp if sequence_parallel else 1
    out = float(w * tokens * hidden) if sequence_parallel and tp > 1 else 0.0
    if pp > 1:
        out += 2.0 * w * tokens * hidden / sp
    return out
