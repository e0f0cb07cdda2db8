"""Per-GPU memory: model states, DeepSpeed's buffers and activations, as small pure functions.

Model states follow what DeepSpeed 0.19.8 allocates (checked against the live tensor storages of
real ranks in ``tests/test_estimate_deepspeed.py``), which is not quite the ZeRO paper's
``2 + 2 + 12`` bytes per parameter; each function says where it differs. Element counts are
per GPU (already divided by TP and PP); bytes out.
"""

from __future__ import annotations

import dataclasses

OPTIMIZER_STATES = {"adamw": 2.0, "adam": 2.0, "sgd": 1.0, "lion": 1.0, "adafactor": 0.0}
"""fp32 state tensors per parameter: Adam/AdamW keep exp_avg and exp_avg_sq (Kingma & Ba 2015),
SGD with momentum and Lion one momentum buffer (Chen et al. 2023). Adafactor's factored second
moment is ``rows + cols`` per matrix, counted separately by ``adafactor_state_elements``."""


def param_bytes(precision: str) -> int:
    """Bytes of one compute parameter: 2 for bf16/fp16, 4 for fp32."""
    return 4 if precision == "fp32" else 2


def adafactor_state_elements(params: float, hidden_size: int) -> float:
    """Adafactor without momentum keeps a row and a column accumulator per matrix (Shazeer & Stern
    2018): ``(rows + cols) / (rows * cols)`` of the matrix, ~``2 / hidden`` of the parameters."""
    return 2.0 * params / hidden_size


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer states on one GPU, and what offload moves out.

    ``grads_bytes`` is what is held after backward; ``step_grads_bytes`` the fp32 gradient
    partition DeepSpeed creates inside ``step()`` on top of it (part of the peak, not of the
    steady state); ``optimizer_bytes`` = fp32 master + states."""

    params_bytes: float
    grads_bytes: float
    step_grads_bytes: float = 0.0
    master_bytes: float = 0.0
    states_bytes: float = 0.0
    cpu_bytes: float = 0.0
    nvme_bytes: float = 0.0

    @property
    def optimizer_bytes(self) -> float:
        return self.master_bytes + self.states_bytes


def model_states(*, params: float, persistent: float, precision: str, optimizer: str, zero_stage: int, dp: int,
                 offload_optimizer: str = "none", offload_params: str = "none",
                 state_elements: float | None = None) -> ModelStates:
    """Model-state bytes on one GPU under DeepSpeed's ZeRO (Rajbhandari et al. 2020, §5.1), as
    DeepSpeed 0.19.8 actually holds them (measured: ``tests/test_estimate_deepspeed.py``).

    ``params`` are this GPU's elements before ZeRO sharding; ``persistent`` (ZeRO-3) the elements
    of tensors under ``stage3_param_persistence_threshold``, kept whole on every rank after the
    first gather. With ``w`` = 2 (bf16/fp16) or 4 (fp32), ``K`` = fp32 optimizer state tensors
    per parameter (Adam: 2) and ``n`` = dp:

    - ZeRO-0, fp32: ``4P`` params, ``4P`` grads, ``4K P`` states (a plain torch optimizer).
    - ZeRO-0, bf16/fp16: DeepSpeed's ``BF16_Optimizer``/``FP16_Optimizer`` keep an fp32 master of
      every tensor, unsharded, and create the states at initialize: ``wP`` params, ``wP`` grads,
      ``(4 + 4K) P`` optimizer. (The paper's DP baseline is the same 16 bytes/param.)
    - ZeRO-1 and ZeRO-2 hold the same in 0.19.8 (both reduce into a gradient partition): a flat
      ``wP`` parameter buffer, a ``wP/n`` gradient partition, and an fp32 master partition that is
      a *clone* even in fp32 (``single_partition_of_fp32_groups``), so fp32 ZeRO pays ``4P/n``
      beyond the paper's ``K P/n``; states ``4K P/n``; the step adds a ``4P/n`` fp32 gradient.
      The paper's ZeRO-1 keeps full gradients (``2P``); DeepSpeed does not.
    - ZeRO-3: a ``wP/n`` parameter partition, ``w * persistent`` whole, a ``wP/n`` gradient
      partition buffer allocated at initialize, master and states as above, ``4P/n`` at the step.

    Offload (ZeRO-Offload, Ren et al. 2021): master, states and the fp32 gradient partition move
    to CPU (master + states to NVMe with ``nvme``); offloaded parameters leave only ZeRO-3's
    gathered working set on the GPU (counted in buffers).
    """
    w = param_bytes(precision)
    k = OPTIMIZER_STATES[optimizer] if state_elements is None else state_elements / max(params, 1)
    if zero_stage == 0:
        if w == 2:
            return ModelStates(params_bytes=w * params, grads_bytes=w * params, master_bytes=4 * params,
                               states_bytes=4 * k * params)
        return ModelStates(params_bytes=4 * params, grads_bytes=4 * params, states_bytes=4 * k * params)
    shard = params / dp
    master, states, step_grads = 4 * shard, 4 * k * shard, 4 * shard
    if zero_stage == 3:
        p_bytes = (0.0 if offload_params != "none" else w * shard) + w * persistent
    else:
        p_bytes = w * params
    # With optimizer offload, ZeRO-1/2 copy each reduced gradient straight into the pinned fp32
    # partition (through the staging buffers of ``offload_buffer_bytes``): no bit16 partition.
    grads = 0.0 if (offload_optimizer != "none" and zero_stage < 3) else w * shard
    cpu = nvme = 0.0
    if offload_optimizer == "cpu":
        cpu, master, states, step_grads = master + states + step_grads, 0.0, 0.0, 0.0
    elif offload_optimizer == "nvme":
        nvme, cpu, master, states, step_grads = master + states, step_grads, 0.0, 0.0, 0.0
    if offload_params == "cpu":
        cpu += w * shard
    elif offload_params == "nvme":
        nvme += w * shard
    return ModelStates(params_bytes=p_bytes, grads_bytes=grads, step_grads_bytes=step_grads, master_bytes=master,
                       states_bytes=states, cpu_bytes=cpu, nvme_bytes=nvme)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ZeroBuffers:
    """DeepSpeed's ZeRO buffer and communication settings, in elements, with DeepSpeed 0.19.8's
    defaults (``deepspeed/runtime/zero/config.py``). This is the one object that carries what a
    ``zero_optimization`` block sets: ``dstk estimate --config`` reads it from a file, the renderer
    writes it into generated configs, and the estimator prices it, so the three agree."""

    reduce_bucket_size: float = 5e8
    allgather_bucket_size: float = 5e8
    overlap_comm: bool | None = None
    """None: DeepSpeed's dynamic default, True for ZeRO-3 and False otherwise (``overlap_comm_valid``)."""
    contiguous_gradients: bool = True
    prefetch_bucket_size: float = 5e7
    """``stage3_prefetch_bucket_size``."""
    param_persistence_threshold: float = 1e5
    """``stage3_param_persistence_threshold``."""
    max_live_parameters: float = 1e9
    """``stage3_max_live_parameters``."""
    max_reuse_distance: float = 1e9
    """``stage3_max_reuse_distance``."""

    def overlaps(self, zero_stage: int) -> bool:
        """Whether ``overlap_comm`` is in effect for ``zero_stage``, DeepSpeed's default resolved."""
        return (zero_stage == 3) if self.overlap_comm is None else bool(self.overlap_comm)


def reduce_bucket_bytes(*, zero_stage: int, precision: str, params: float, buffers: ZeroBuffers) -> float:
    """The gradient reduce bucket: ``reduce_bucket_size`` elements of ``w`` bytes, never more
    than the gradients it buckets. ZeRO-3 allocates it at initialize and keeps it; ZeRO-2 (and
    ZeRO-1 in 0.19.8) creates it in backward (``ipg_buffer``) and drops it after the reduction,
    so it is part of the peak. DeepSpeed's own estimators leave it out (research notes §1.2:
    "GBs by default", tjruwase in DeepSpeed #1302)."""
    if zero_stage == 0:
        return 0.0
    return param_bytes(precision) * min(buffers.reduce_bucket_size, params)


def offload_buffer_bytes(*, zero_stage: int, precision: str, offload_optimizer: str, params: float, dp: int,
                         largest_tensor: float) -> tuple[float, float]:
    """(GPU, CPU) bytes of ZeRO-1/2's offload staging buffers (``stage_1_and_2.py``, 0.19.8):
    a bit16 copy of the parameter partition on the CPU (``param_buffer_of_bit16_for_cpu_offload``)
    and one bit16 buffer of the largest parameter on each side (``temp_grad_buffer_for_gpu_offload``,
    ``temp_grad_buffer_for_cpu_offload``). ZeRO-3's offload has none of these."""
    if offload_optimizer != "cpu" or zero_stage not in (1, 2):
        return 0.0, 0.0
    w = param_bytes(precision)
    return w * largest_tensor, w * params / dp + w * largest_tensor


def live_param_bytes(*, zero_stage: int, precision: str, params: float, largest_module: float,
                     buffers: ZeroBuffers) -> float:
    """ZeRO-3's gathered parameters while a module runs: the largest module plus the prefetch
    bucket, capped by ``stage3_max_live_parameters`` (DeepSpeed's estimator counts the largest
    layer only, ``estimate_zero3_model_states_mem_needs``: ``4 * largest_layer``)."""
    if zero_stage != 3:
        return 0.0
    return param_bytes(precision) * min(buffers.max_live_parameters, largest_module + buffers.prefetch_bucket_size,
                                        params)


# --- activations ---------------------------------------------------------------------------------


MLP_SAVED = {"silu": 4, "swiglu": 4, "gelu_pytorch_tanh": 4, "gelu_new": 5, "gelu": 2, "bloom_gelu": 2, "relu": 1}
"""Tensors of width ``ffn`` an MLP saves for backward, by HF activation (measured with
``saved_tensors_hooks``): gated MLPs keep gate, up, act(gate) and the product (4); GPT-2's
python ``gelu_new`` keeps fc1's output and three intermediates plus fc2's input (5); a fused
GELU its input and fc2's input (2); ReLU its output, which is fc2's input (1)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LayerShape:
    """What the activation formulas need of one transformer layer (already divided by TP)."""

    hidden: int
    q_width: int
    """heads * head_dim / tp."""
    kv_width: int
    """kv_heads * head_dim / tp."""
    ffn: int
    """MLP width / tp (times experts_per_token for MoE: each routed token runs k experts)."""
    heads: int
    """Attention heads / tp."""
    mlp_saved: int = 4
    """``MLP_SAVED`` of the activation."""
    rmsnorm: bool = True
    dropout: bool = False
    """The model trains with dropout (GPT-2): masks are saved, and CPU sdpa falls back to math."""
    softmax_fp32: bool = True
    """HF's Llama-style eager attention computes the softmax in fp32 and casts it back."""


def norm_bytes(*, hidden: int, act_bytes: int, rmsnorm: bool) -> float:
    """Per token: HF's RMSNorm upcasts its input to fp32 (``4h``), keeps ``rsqrt`` (4), the
    normalised value cast back (``wh``, saved by the weight multiply) and the output (``wh``,
    saved by the next matmul); ``nn.LayerNorm`` keeps input, mean, rstd and output (``2wh + 8``)."""
    return (4 * hidden + 4 + 2 * act_bytes * hidden) if rmsnorm else (2 * act_bytes * hidden + 8)


def layer_activation_bytes(*, shape: LayerShape, tokens: int, seq_len: int, act_bytes: int, attention: str,
                           recompute: str, sequence_parallel_tp: int = 1, fused_dropout: bool = True) -> float:
    """Bytes one layer saves for backward for ``tokens = b * s`` tokens of one micro-batch.

    Korthikanti et al. 2022 (Table 2) give ``sbh(34 + 5as/h)`` for a Megatron GPT layer in fp16
    with 1-byte dropout masks; HF's modules save a different set, measured here with
    ``torch.autograd.graph.saved_tensors_hooks`` (``tests/test_estimate_activations.py``).
    Per token, ``w`` bytes per activation, ``q``/``kv`` projection widths, ``a`` heads:

    - two norms (``norm_bytes``), Llama-style or GPT-style;
    - fused attention (sdpa/flash): q, k, v and the output, which is also o_proj's input:
      ``w(2q + 2kv)``, plus the fp32 log-sum-exp ``4a``;
    - materialised attention (eager, or sdpa's math fallback when dropout runs on a CPU): q,
      K and V repeated to all heads, o_proj's input (``4wq``), and per score: the fp32 softmax
      (``4``; Llama-style: plus its cast back, ``w``; GPT-2 in its own dtype) and, with dropout,
      mask and output (``2w``): that is Korthikanti's ``5as/h`` term;
    - the MLP: ``MLP_SAVED[act] * w * f``; with dropout, one ``wh`` mask per residual branch.

    Selective recompute drops the score terms (Korthikanti §4.2); full recompute keeps only the
    checkpointed layer input ``wh`` (HF ``gradient_checkpointing``, Chen et al. 2016).
    Sequence parallelism divides the norm and dropout terms by ``t`` (Korthikanti §4.2.2).
    """
    h, q, kv, f, a = shape.hidden, shape.q_width, shape.kv_width, shape.ffn, shape.heads
    w = act_bytes
    if recompute == "full":
        return float(w * h * tokens) / sequence_parallel_tp
    replicated = 2 * norm_bytes(hidden=h, act_bytes=w, rmsnorm=shape.rmsnorm) + (2 * w * h if shape.dropout else 0)
    materialised = attention == "eager" or (attention == "sdpa" and shape.dropout and not fused_dropout)
    if materialised and recompute == "none":
        softmax = (4 + (w if w != 4 else 0)) if shape.softmax_fp32 else w
        attn = 4 * w * q + (softmax + (2 * w if shape.dropout else 0)) * a * seq_len
    elif materialised:  # selective: scores recomputed, the rest as eager keeps it
        attn = 4 * w * q
    else:
        attn = w * (2 * q + 2 * kv) + 4 * a
    mlp = shape.mlp_saved * w * f
    return float((replicated / sequence_parallel_tp + attn + mlp) * tokens)


def model_io_bytes(*, tokens: int, seq_len: int, hidden: int, vocab: int, act_bytes: int, rmsnorm: bool,
                   dropout: bool, rotary: bool, head_dim: int, tp: int = 1,
                   checkpointed_mask: bool = False) -> tuple[float, float]:
    """(first stage, last stage) bytes outside the layers: token ids (int64), rotary cos/sin
    (``2 s d w``, once per forward) or learned position ids, the embedding dropout mask; the final
    norm, HF's fp32 log-softmax of the logits (``4V`` per token, the largest term for big
    vocabularies; Megatron counts the same ``4sbV``) and the int64 labels.

    ``checkpointed_mask``: under full recompute each checkpointed layer keeps its inputs, and
    GPT-2's eager attention takes a materialised ``[b, 1, s, s]`` additive mask (one shared
    storage, ``b s^2 w``; measured); Llama-style eager attention passes none."""
    first = 8.0 * tokens + (2.0 * seq_len * head_dim * act_bytes if rotary else 8.0 * seq_len)
    if dropout:
        first += act_bytes * hidden * tokens
    if checkpointed_mask:
        first += tokens * seq_len * act_bytes
    last = tokens * (norm_bytes(hidden=hidden, act_bytes=act_bytes, rmsnorm=rmsnorm) + 4.0 * vocab / tp + 8.0)
    return first, last


def in_flight_microbatches(*, pp: int, stage: int, grad_accum: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at the peak of 1F1B: ``min(p - i, m)``
    (Narayanan et al. 2021 §2.2.1); interleaving stores ``1 + (p - 1)/(p v)`` times more on the
    first stage (Korthikanti et al. 2022 §4.2.3, Megatron's theoretical_memory_usage.py)."""
    held = min(pp - stage, grad_accum)
    if virtual_stages > 1 and pp > 1:
        held = held * (1 + (pp - 1) / (pp * virtual_stages))
    return float(held)


def pipeline_buffer_bytes(*, pp: int, tokens: int, hidden: int, act_bytes: int) -> float:
    """DeepSpeed's pipeline engine keeps send and receive buffers of one micro-batch's hidden
    states per direction (``pipe/engine.py``, ``_allocate_buffers``): ``2 * 2 * b s h w``."""
    return 0.0 if pp == 1 else float(4 * tokens * hidden * act_bytes)


def zero_paper_bytes(*, params: float, dp: int, stage: int, k: float = 12.0) -> float:
    """Per-device model states in the ZeRO paper's own accounting (Rajbhandari et al. 2020 §5.1,
    Figure 1): ``(2 + 2 + K) Psi`` for DP, ``2Psi + 2Psi + K Psi/N_d`` for P_os,
    ``2Psi + (2 + K) Psi/N_d`` for P_os+g and ``(2 + 2 + K) Psi/N_d`` for P_os+g+p, with
    ``K = 12`` for mixed-precision Adam. Kept for the comparison in docs/estimate.md."""
    if stage == 0:
        return (4 + k) * params
    if stage == 1:
        return 4 * params + k * params / dp
    if stage == 2:
        return 2 * params + (2 + k) * params / dp
    return (4 + k) * params / dp
