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
    to CPU (master + states to NVMe with ``nvme``); under ZeRO-3 the bit16 gradient partition
    too (``stage3.py``: ``self.device`` is the CPU under any optimizer offload); offloaded
    parameters leave only ZeRO-3's gathered working set on the GPU (counted in buffers).
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
    if zero_stage == 3 and offload_optimizer != "none":
        # stage3.py sets ``self.device`` to the CPU under any optimizer offload and allocates
        # ``grad_partitions_flat_buffer`` there (``_setup_for_real_optimizer``).
        cpu, grads = grads, 0.0
    if offload_optimizer == "cpu":
        cpu, master, states, step_grads = cpu + master + states + step_grads, 0.0, 0.0, 0.0
    elif offload_optimizer == "nvme":
        nvme, cpu, master, states, step_grads = master + states, cpu + step_grads, 0.0, 0.0, 0.0
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
    reduce_scatter: bool = True
    """ZeRO-1/2's ``reduce_scatter``: False all-reduces each bucket whole
    (``gradient_reduction_w_predivide``)."""
    use_multi_rank_bucket_allreduce: bool = True
    """ZeRO-1/2 (``stage_1_and_2.py`` ``average_tensor``, DeepSpeed 0.19.8): True (the default)
    **all-reduces** each gradient bucket (``allreduce_and_scatter``) and every rank keeps its slice;
    False reduces each slice to the rank that owns it (``dist.reduce``, one call per owner), about a
    reduce-scatter's traffic. Either way ZeRO-2 reduces in every micro-step."""

    def bucket_all_reduces(self) -> bool:
        """Whether ZeRO-1/2 move a whole all-reduce's traffic per gradient bucket (DeepSpeed's default)."""
        return self.use_multi_rank_bucket_allreduce or not self.reduce_scatter

    def overlaps(self, zero_stage: int) -> bool:
        """Whether ``overlap_comm`` is in effect for ``zero_stage``, DeepSpeed's default resolved."""
        return (zero_stage == 3) if self.overlap_comm is None else bool(self.overlap_comm)


def reduce_bucket_bytes(*, zero_stage: int, precision: str, params: float, buffers: ZeroBuffers) -> float:
    """The gradient reduce bucket(s): ``reduce_bucket_size`` elements of the gradient dtype (``w``),
    **not capped by the model size**: DeepSpeed 0.19.8 allocates the full bucket whatever the
    gradients it will hold. ZeRO-1/2 create it in the first gradient hook
    (``stage_1_and_2.py`` ``setup_buckets``, called from ``process_gradients``) and a second one
    when ``overlap_comm`` is on ("double buffers"), and drop them when backward ends
    (``_release_ipg_buffers``), so a snapshot after ``backward()`` never sees them; ZeRO-3
    allocates one at initialize and keeps it (``stage3.py`` ``_setup_for_real_optimizer``), with
    or without ``overlap_comm``. Only with ``contiguous_gradients`` (the default). DeepSpeed's
    own estimators leave it out (research notes §1.2; tjruwase in DeepSpeed #1302).
    ``params`` is unused: kept so callers need not change."""
    del params
    if zero_stage == 0 or not buffers.contiguous_gradients:
        return 0.0
    copies = 2 if (zero_stage in (1, 2) and buffers.overlaps(zero_stage)) else 1
    return float(copies * param_bytes(precision) * buffers.reduce_bucket_size)


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
    """ZeRO-3's gathered parameters while forward and backward run. DeepSpeed releases a gathered
    parameter only when its next use lies beyond ``stage3_max_reuse_distance`` elements and keeps
    at most ``stage3_max_live_parameters`` gathered (``partitioned_param_coordinator.py``
    ``__params_to_release``), so the working set is the largest module plus the prefetch
    bucket, or up to ``min(max_live, max_reuse)`` retained ones, never more than the parameters:
    with DeepSpeed's 1e9 defaults a model under 1e9 parameters stays whole once gathered.
    (DeepSpeed's estimator counts the largest layer only: ``4 * largest_layer``.)"""
    if zero_stage != 3:
        return 0.0
    retained = min(buffers.max_live_parameters, buffers.max_reuse_distance)
    return param_bytes(precision) * min(max(largest_module + buffers.prefetch_bucket_size, retained), params)


# --- the peak through one step ---------------------------------------------------------------

PHASES = ("forward", "backward", "step")

ALLREDUCE_BUCKET_ELEMENTS = 500_000_000
"""``MEMORY_OPT_ALLREDUCE_SIZE`` in ``deepspeed/runtime/constants.py``: ZeRO-0's engine flattens
the gradients into buckets of up to this many elements to all-reduce them."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Buffer:
    """One named allocation beside parameters, gradients, optimizer states and saved activations."""

    name: str
    """What it is, e.g. "reduce bucket"."""
    bytes: int
    formula: str
    """How ``bytes`` is made, e.g. "2 x 5e8 x 2 B (overlap_comm)"."""
    device: str = "gpu"
    """"gpu" or "cpu" (an offloaded buffer; on CPU ranks everything is "gpu": the rank's device)."""
    phase: str = "always"
    """When it is live: "always" (from initialize on), "forward", "backward", "step", or two of
    them ("forward, backward")."""

    def to_dict(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "formula": self.formula, "device": self.device,
                "phase": self.phase}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class PhasePeak:
    """The live bytes of one rank's device at the fullest moment of one phase, by term."""

    phase: str
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float | None
    buffers: tuple[Buffer, ...]
    """The device's named buffers live at that moment."""

    @property
    def buffers_bytes(self) -> float:
        return float(sum(b.bytes for b in self.buffers))

    @property
    def total_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + (self.activations_bytes or 0.0)
                + self.buffers_bytes)


def _elements(x: float) -> str:
    """5e8, 1.6e7, 262,144: the way a person writes an element count."""
    return f"{x:.3g}".replace("e+0", "e").replace("e+", "e") if x >= 1e6 else f"{int(x):,}"


def element_formula(count: float, unit: int, what: str = "") -> str:
    """``5e8 x 2 B (overlap_comm)``: an element count times bytes per element, and why."""
    return f"{_elements(count)} x {unit} B" + (f" ({what})" if what else "")


def phase_peaks(*, zero_stage: int, precision: str, optimizer: str, dp: int, params: float, largest_tensor: float,
                states: ModelStates, buffers: ZeroBuffers, activations_bytes: float | None,
                logits_elements: float = 0.0, grad_accum: int = 1, offload_optimizer: str = "none",
                live_params_bytes: float = 0.0, fixed: tuple[Buffer, ...] = (),
                cpu_rank: bool = False) -> tuple[PhasePeak, ...]:
    """The fullest moment of forward, backward and the optimizer step on one rank's device,
    following DeepSpeed 0.19.8's code (``P`` = ``params``, this rank's elements before ZeRO;
    ``n`` = dp; ``Ps = P/n``; ``w`` = 2 or 4; ``A`` = saved activations; ``L`` = logits elements of
    one micro-batch on the last stage; ``g`` = ``largest_tensor``).

    Between steps the device holds parameters, fp32 master and optimizer states (``states``), the
    ``fixed`` buffers (ZeRO-3's reduce bucket, offload staging, pipeline buffers) and, under ZeRO-3,
    the bit16 gradient partition. Each phase adds:

    - **forward**, at the loss: ``A``, ZeRO-3's gathered parameters, and HF's loss transient: the
      logits (``wL``) and their fp32 upcast (``4L``, bf16/fp16 only; ``ForCausalLMLoss``) beside the
      saved fp32 log-softmax (in ``A``).
    - **backward**: activations are freed layer by layer as gradients appear, so the live sum is
      linear in the layer index and peaks at one end (checked: the measured peaks fall at the
      first gradient or at the reduction):
      at its start ``A`` + the fp32 gradients of the log-probabilities and of the upcast logits
      (``8L``); at the first gradient hook ``A + wg`` + ZeRO-1/2's reduce bucket(s), created there
      (``reduce_bucket_bytes``); at its end the gradients and the copy the reduction flattens:
      ZeRO-0 ``wP`` + ``w min(P, 5e8)`` (``engine.py`` ``allreduce_gradients`` ->
      ``buffered_allreduce_fallback``); ZeRO-1/2 flatten the bucket they reduce
      (``w min(P, reduce_bucket_size)``, ``allreduce_and_copy_with_multiple_ranks``) beside the
      gradients not yet moved into a bucket, when the bucket is smaller than ``P``: ZeRO-1 without
      ``overlap_comm`` keeps every ``param.grad`` until ``reduce_gradients`` (``wP``), otherwise
      the bit16 partition ``grads_in_partition`` (``wPs``) the earlier buckets were reduced into.
    - **step**: ZeRO-0 in bf16/fp16 keeps the bit16 gradients (``wP``) and copies each into an fp32
      gradient (``4P``, ``fp16/unfused_optimizer.py``); the fused path that FusedAdam takes on a
      GPU (``fp16/fused_optimizer.py``) flattens those copies, ``+4P``. ZeRO-1/2/3 flatten the
      bit16 partition (``wPs``) and cast it to the fp32 partition gradient (``4Ps``,
      ``stage_1_and_2.py`` / ``stage3.py`` ``step``); the bit16 partition is freed before the
      optimizer runs, so the two never coexist with its temporaries. On CPU ranks torch's
      single-tensor AdamW allocates ``sqrt(v)`` and ``sqrt(v)/c`` of each fp32 tensor
      (torch 2.13 ``torch/optim/adam.py`` ``_single_tensor_adam``:
      ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``): ``2 x 4`` bytes per element of the largest
      one (ZeRO-0: ``g``; ZeRO-1/2/3: the flat partition ``Ps``). FusedAdam and DeepSpeedCPUAdam
      allocate none. With optimizer offload the fp32 gradients and the update live on the CPU.

    With gradient accumulation the gradients of earlier micro-batches are live in forward too.
    Checked against the peak of live allocator bytes on 2 gloo ranks (``tests/test_estimate_peak.py``:
    ZeRO 0-3, ``overlap_comm`` on and off, DeepSpeed's and dstk's bucket sizes, bf16 and fp32).
    """
    w = param_bytes(precision)
    shard = params / dp
    act = activations_bytes
    base_grads = states.grads_bytes if zero_stage == 3 else 0.0
    offloaded = offload_optimizer != "none"
    adam = optimizer in ("adam", "adamw")
    gathered = (Buffer(name="ZeRO-3 gathered parameters", bytes=int(live_params_bytes),
                       formula="w x min(P, max(largest module + prefetch, min(max_live, max_reuse)))",
                       phase="forward, backward"),) if live_params_bytes else ()

    # Gradients held from earlier micro-batches of the same step (and at the end of backward).
    if zero_stage == 0:
        held = w * params
    elif zero_stage == 3:
        held = 0.0  # in the partition buffer, counted in base_grads
    elif zero_stage == 1 and not buffers.overlaps(1):
        held = w * params
    else:
        held = 0.0 if offloaded else w * shard
    accum = held if grad_accum > 1 else 0.0

    logits_fwd = (w + (4 if w != 4 else 0)) * logits_elements
    fwd_bufs = gathered + ((Buffer(name="logits and their fp32 upcast", bytes=int(logits_fwd),
                                   formula=f"({w} + 4) B x logits", phase="forward"),) if logits_fwd else ())
    forward = PhasePeak(phase="forward", params_bytes=states.params_bytes, grads_bytes=base_grads + accum,
                        optimizer_bytes=states.optimizer_bytes, activations_bytes=act, buffers=fixed + fwd_bufs)

    bucket = reduce_bucket_bytes(zero_stage=zero_stage, precision=precision, params=params, buffers=buffers)
    copies = 2 if (zero_stage in (1, 2) and buffers.overlaps(zero_stage)) else 1
    bucket_bufs = ()
    if bucket and zero_stage in (1, 2):
        bucket_bufs = (Buffer(name="reduce bucket", bytes=int(bucket), phase="backward",
                              formula=(f"{copies} x " if copies > 1 else "")
                              + element_formula(buffers.reduce_bucket_size, w, "overlap_comm" if copies > 1 else "")),)
    gathered_b = gathered
    loss_grad = 8.0 * logits_elements
    start = PhasePeak(phase="backward", params_bytes=states.params_bytes, grads_bytes=base_grads + accum,
                      optimizer_bytes=states.optimizer_bytes, activations_bytes=act,
                      buffers=fixed + gathered_b + ((Buffer(name="loss gradients", bytes=int(loss_grad),
                                                           formula="2 x 4 B x logits", phase="backward"),)
                                                    if loss_grad else ()))
    first = PhasePeak(phase="backward", params_bytes=states.params_bytes,
                      grads_bytes=base_grads + accum + w * largest_tensor, optimizer_bytes=states.optimizer_bytes,
                      activations_bytes=act, buffers=fixed + gathered_b + bucket_bufs)
    if zero_stage == 0:
        copy = w * min(params, ALLREDUCE_BUCKET_ELEMENTS)
        copy_buf = Buffer(name="all-reduce flat copy", bytes=int(copy), phase="backward",
                          formula=f"w x min(P, 5e8) = {element_formula(min(params, ALLREDUCE_BUCKET_ELEMENTS), w)}")
        end_grads = held
    else:
        flat = min(params, buffers.reduce_bucket_size)
        copy = w * flat
        copy_buf = Buffer(name="reduce-scatter flat copy" if zero_stage == 3 else "reduce flat copy", bytes=int(copy),
                          phase="backward",
                          formula=f"w x min(P, reduce_bucket_size) = {element_formula(flat, w)}")
    if zero_stage == 3:
        end_grads = 0.0
    elif zero_stage != 0:
        # A bucket that takes every gradient has them all moved into it by the time it is
        # flattened; a smaller one leaves the rest held (ZeRO-1 without overlap_comm: ``param.grad``;
        # otherwise the bit16 partition the earlier buckets were reduced into).
        end_grads = held if buffers.reduce_bucket_size < params else 0.0
    end = PhasePeak(phase="backward", params_bytes=states.params_bytes, grads_bytes=base_grads + end_grads,
                    optimizer_bytes=states.optimizer_bytes, activations_bytes=0.0 if act is not None else None,
                    buffers=fixed + gathered_b + bucket_bufs + (copy_buf,))
    backward = max((start, first, end), key=lambda p: p.total_bytes)

    temps = 0.0
    if cpu_rank and adam and not offloaded:
        temps = 8.0 * (largest_tensor if zero_stage == 0 else shard)
    temp_buf = (Buffer(name="AdamW temporaries", bytes=int(temps), phase="step",
                       formula="2 x 4 B x " + ("largest tensor" if zero_stage == 0 else "fp32 partition")),) \
        if temps else ()
    if zero_stage == 0:
        fp32_grads = 4.0 * params if w != 4 else 0.0
        step_grads = w * params + fp32_grads
        fused = Buffer(name="fp32 gradient flat copy", bytes=int(4 * params), phase="step",
                       formula="4 B x P (fused_optimizer.py)")
        step_bufs = temp_buf if (cpu_rank or w == 4) else (fused,)
        step = PhasePeak(phase="step", params_bytes=states.params_bytes, grads_bytes=step_grads,
                         optimizer_bytes=states.optimizer_bytes, activations_bytes=0.0 if act is not None else None,
                         buffers=fixed + step_bufs)
    else:
        fp32 = states.step_grads_bytes  # 4Ps on the device, 0 with offload
        flat = Buffer(name="bit16 gradient flat copy", bytes=int(w * shard), phase="step",
                      formula=f"w x P/n = {element_formula(shard, w)}")
        cast = PhasePeak(phase="step", params_bytes=states.params_bytes, grads_bytes=base_grads + fp32,
                         optimizer_bytes=states.optimizer_bytes, activations_bytes=0.0 if act is not None else None,
                         buffers=fixed + ((flat,) if fp32 else ()))
        update = dataclasses.replace(cast, buffers=fixed + temp_buf)
        step = max((cast, update), key=lambda p: p.total_bytes)
    return forward, backward, step


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
    sdpa_mask: bool = False
    """SDPA is handed an explicit ``[b, 1, s, s]`` mask (Falcon; a sliding window the sequence
    reaches: set per sequence length, ``steptime.sdpa_gets_mask``): K/V
    are repeated to the query heads before it, and each layer saves its own copy of the mask."""


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
      ``w(2q + 2kv)``, plus the fp32 log-sum-exp ``4a``; SDPA handed a mask (Falcon, a reached
      window: ``sdpa_mask``): K and V repeated to all heads and the layer's own copy of the mask, ``4wq + 4a + ws``;
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
    elif attention == "sdpa" and shape.sdpa_mask:
        # q, K and V repeated to all heads, the output, the log-sum-exp, and the mask: torch's
        # ``scaled_dot_product_attention`` turns the boolean mask into an additive one of the query's
        # dtype inside every call (``convert_boolean_attn_mask``), and the kernel saves it for
        # backward, so each layer keeps its own ``b s^2 w`` (measured on CPU ranks, torch 2.13:
        # one bf16 [b, 1, s, s] storage per layer; tests/test_attention_headdim.py).
        attn = 4 * w * q + 4 * a + w * seq_len
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
