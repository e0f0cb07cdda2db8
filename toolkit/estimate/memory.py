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
    grad_accum_dtype: str | None = None
    """``data_types.grad_accum_dtype`` (not a ZeRO key, carried here so that what the renderer writes,
    ``estimate --config`` reads and the estimator prices agree): None is DeepSpeed's default (the
    model's dtype). Under a bf16 pipeline it picks the optimizer (``bf16_optimizer_in_pipeline``)."""

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


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class GatheredParams:
    """ZeRO-3's gathered parameters (the persistent ones left out: ``model_states`` counts those
    whole) at two moments of a training step (``gathered_params``): elements, or bytes when
    ``live_param_bytes`` made it (``unit``)."""

    at_loss: float
    """Held while the loss is computed and backward starts: beside the logits, the step's peak."""
    most: float
    """The most held at any moment of the step (forward's last layer, before the logits exist)."""
    formula: str
    """Which case of ``gathered_params`` set ``at_loss``, for the buffer line."""
    unit: str = "elements"
    """"elements" or "bytes"."""


def gathered_params(*, params: float, persistent: float, largest_tensor: float, largest_layer_tensor: float,
                    buffers: ZeroBuffers) -> GatheredParams:
    """ZeRO-3's gathered parameters as DeepSpeed 0.19.8's coordinator holds them
    (``deepspeed/runtime/zero/partitioned_param_coordinator.py``). ``Pg`` = ``params - persistent``
    (the partitioned ones; persistent ones are never released nor counted, ``:638-640``), ``g`` =
    ``largest_tensor`` (the embedding or LM head), ``t`` = ``largest_layer_tensor``,
    ``live``/``reuse``/``bucket`` = ``stage3_max_live_parameters``/``stage3_max_reuse_distance``/
    ``stage3_prefetch_bucket_size``.

    - ``max_live`` caps only the **prefetch**, never what stays gathered: each module's fetch
      gathers its own parameters whatever is live (``:381``), then prefetches while fewer than
      ``min(live - gathered, bucket)`` elements are queued (``:451-459``), adding whole
      parameters, so the last one **overshoots** by up to its size. The prefetch runs ahead to
      ``live`` and, when it reaches the LM head at forward's end with fewer than ``live``
      gathered, adds all of it: the step's most is ``live + g`` (measured ``live - 1 layer matrix
      or two + g``: ``tests/test_zero3_gathered_peak.py``), or ``live + t`` where a layer tensor is
      the larger (Mixtral's fused experts).
    - At the loss the LM head is kept (its next use, backward's first, is within ``reuse``) and
      the prefetch has refilled to ``live`` with one layer parameter of overshoot: ``max(g, live + t)``.
    - A parameter is released after its module only if its next use lies ``reuse`` elements or
      more ahead in the trace (``__params_to_release``, ``:653-662``, counting every parameter,
      persistent ones too). A forward parameter with ``X`` elements after it is used again in
      backward ``2X`` later, so the tail of ``reuse/2`` elements (``Pg/P`` of it partitioned) stays
      gathered from forward into backward (an estimate: measured within one layer matrix); with
      ``reuse >= 2P`` nothing is released: ``Pg``.

    So ``at_loss = min(Pg, max(g, live + t, retained))`` and
    ``most = min(Pg, max(live + max(g, t), retained))``,
    ``retained = Pg`` if ``reuse >= 2P`` else ``reuse/2 x Pg/P``. Both are bounds DeepSpeed reaches
    within one layer matrix (the prefetch stops on a whole parameter). DeepSpeed's 1e9 defaults keep
    a model under 5e8 parameters whole. (DeepSpeed's own estimator counts the largest layer only:
    ``4 * largest_layer``.)"""
    gathered = max(params - persistent, 0.0)
    reuse, live = buffers.max_reuse_distance, buffers.max_live_parameters
    if params <= 0 or reuse >= 2 * params:
        return GatheredParams(at_loss=gathered, most=gathered, formula="Pg (reuse >= 2P: none released)")
    retained = reuse / 2 * gathered / params
    at_loss = max(largest_tensor, live + largest_layer_tensor, retained)
    formula = ("reuse/2 x Pg/P" if at_loss == retained else "g (the LM head)" if at_loss == largest_tensor
               else "(max_live + t)")
    most = max(live + max(largest_tensor, largest_layer_tensor), retained)
    return GatheredParams(at_loss=min(gathered, at_loss), most=min(gathered, most),
                          formula=formula if at_loss < gathered else "Pg")


def live_param_bytes(*, zero_stage: int, precision: str, params: float, largest_module: float,
                     buffers: ZeroBuffers, persistent: float = 0.0,
                     largest_layer_tensor: float | None = None) -> GatheredParams | None:
    """``gathered_params`` in bytes (``w`` per element) for ZeRO-3, None otherwise.
    ``largest_module`` is the largest tensor; ``largest_layer_tensor`` defaults to it."""
    if zero_stage != 3:
        return None
    g = gathered_params(params=params, persistent=persistent, largest_tensor=largest_module,
                        largest_layer_tensor=largest_module if largest_layer_tensor is None else largest_layer_tensor,
                        buffers=buffers)
    w = param_bytes(precision)
    return GatheredParams(at_loss=w * g.at_loss, most=w * g.most, formula=g.formula, unit="bytes")


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
                gathered_bytes: GatheredParams | None = None, fixed: tuple[Buffer, ...] = (),
                cpu_rank: bool = False, pipeline: bool = False,
                kept: dict[str, tuple[Buffer, ...]] | None = None) -> tuple[PhasePeak, ...]:
    """The fullest moment of forward, backward and the optimizer step on one rank's device,
    following DeepSpeed 0.19.8's code (``P`` = ``params``, this rank's elements before ZeRO;
    ``n`` = dp; ``Ps = P/n``; ``w`` = 2 or 4; ``A`` = saved activations; ``L`` = logits elements of
    one micro-batch on the last stage; ``g`` = ``largest_tensor``).

    Between steps the device holds parameters, fp32 master and optimizer states (``states``), the
    ``fixed`` buffers (ZeRO-3's reduce bucket, offload staging, pipeline buffers) and, under ZeRO-3,
    the bit16 gradient partition. Each phase adds:

    - **forward**, at the loss: ``A``, ZeRO-3's gathered parameters, and HF's loss transient: the
      logits (``wL``) and their fp32 upcast (``4L``, bf16/fp16 only; ``ForCausalLMLoss``) beside the
      saved fp32 log-softmax (in ``A``). ZeRO-3 holds more gathered parameters earlier, at the
      last layer before the logits exist (``GatheredParams.most``): forward is the larger of the two.
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
    Under DeepSpeed's pipeline engine (``pipeline``; ZeRO-1, as ``BF16_Optimizer`` is priced by
    ``bf16_optimizer_peaks``) nothing releases ZeRO-1's bucket between micro-batches, so it is live
    in the later forwards too, and ``reduce_gradients(pipeline_parallel=True)`` appends a **second**
    bucket at the schedule's end (``stage_1_and_2.py:962-969``); ``kept`` adds the last stage's
    kept outputs per phase (``pipeline_kept_outputs``; the end of backward counts the step's).
    Checked against the peak of live allocator bytes on 2 gloo ranks (``tests/test_estimate_peak.py``:
    ZeRO 0-3, ``overlap_comm`` on and off, DeepSpeed's and dstk's bucket sizes, bf16 and fp32).
    """
    w = param_bytes(precision)
    shard = params / dp
    act = activations_bytes
    base_grads = states.grads_bytes if zero_stage == 3 else 0.0
    offloaded = offload_optimizer != "none"
    adam = optimizer in ("adam", "adamw")
    gathered = (Buffer(name="ZeRO-3 gathered parameters", bytes=int(gathered_bytes.at_loss),
                       formula=f"w x {gathered_bytes.formula}, at the loss (gathered_params)",
                       phase="forward, backward"),) if gathered_bytes and gathered_bytes.at_loss else ()

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
    if gathered_bytes and gathered_bytes.most > gathered_bytes.at_loss:
        last_layer = PhasePeak(phase="forward", params_bytes=states.params_bytes, grads_bytes=base_grads + accum,
                               optimizer_bytes=states.optimizer_bytes, activations_bytes=act,
                               buffers=fixed + (Buffer(name="ZeRO-3 gathered parameters, forward's last layer",
                                                       bytes=int(gathered_bytes.most), phase="forward",
                                                       formula="w x min(Pg, max(max_live + max(g, t), retained))"
                                                               " (gathered_params)"),))
        forward = max((forward, last_layer), key=lambda p: p.total_bytes)

    bucket = reduce_bucket_bytes(zero_stage=zero_stage, precision=precision, params=params, buffers=buffers)
    copies = 2 if (zero_stage in (1, 2) and buffers.overlaps(zero_stage)) else 1
    bucket_bufs = ()
    if bucket and zero_stage in (1, 2):
        bucket_bufs = (Buffer(name="reduce bucket", bytes=int(bucket), phase="backward",
                              formula=(f"{copies} x " if copies > 1 else "")
                              + element_formula(buffers.reduce_bucket_size, w, "overlap_comm" if copies > 1 else "")),)
    gathered_b = gathered
    kept = kept or {}
    pipe_bucket = bucket_bufs if (pipeline and grad_accum > 1) else ()
    forward = dataclasses.replace(forward, buffers=forward.buffers + kept.get("forward", ()) + pipe_bucket)
    if pipeline and bucket_bufs:
        bucket_bufs = bucket_bufs + (Buffer(name="pipeline reduce bucket", bytes=int(w * buffers.reduce_bucket_size),
                                            phase="backward", formula=element_formula(
                                                buffers.reduce_bucket_size, w, "reduce_gradients(pipeline_parallel)")),)
    loss_grad = 8.0 * logits_elements
    start = PhasePeak(phase="backward", params_bytes=states.params_bytes, grads_bytes=base_grads + accum,
                      optimizer_bytes=states.optimizer_bytes, activations_bytes=act,
                      buffers=fixed + gathered_b + kept.get("backward", ()) + pipe_bucket
                      + ((Buffer(name="loss gradients", bytes=int(loss_grad), formula="2 x 4 B x logits",
                                 phase="backward"),) if loss_grad else ()))
    first = PhasePeak(phase="backward", params_bytes=states.params_bytes,
                      grads_bytes=base_grads + accum + w * largest_tensor, optimizer_bytes=states.optimizer_bytes,
                      activations_bytes=act, buffers=fixed + gathered_b + kept.get("backward", ())
                      + bucket_bufs[:1])
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
                    buffers=fixed + gathered_b + kept.get("step", ()) + bucket_bufs + (copy_buf,))
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
    if kept.get("step"):
        step = dataclasses.replace(step, buffers=step.buffers + kept["step"])
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
    """DeepSpeed 0.19.8's pipeline engine keeps **one** receive buffer of a micro-batch's hidden
    states, ``b s h w``, on every stage: ``_allocate_or_extend_buffers`` (``pipe/engine.py:1284-1294``)
    serves both the activation receive (``pipe_recv_buf``, ``:1000``) and the gradient receive
    (``grad_layer``, ``:1178-1181``) from the same ``_grad_layer_buf[idx]``, so a middle stage
    holds one, not one per direction; sends go out of the tensors themselves (``:1045-1049``,
    ``:1097-1108``), no buffer. (The mask and position ids of a non-first stage add ``16 b s``:
    left out.) Measured: ``tests/test_pipeline_memory_peak.py``."""
    return 0.0 if pp == 1 else float(tokens * hidden * act_bytes)


FP32_NAMES = frozenset({"fp32", "float32", "float", "torch.float32"})
"""The names DeepSpeed 0.19.8's ``DtypeEnum.fp32`` accepts (``runtime/config.py:147``)."""


def accumulates_in_fp32(grad_accum_dtype: str | None) -> bool:
    """Whether ``data_types.grad_accum_dtype`` names fp32 (any of DeepSpeed's spellings)."""
    return isinstance(grad_accum_dtype, str) and grad_accum_dtype.lower() in FP32_NAMES


def bf16_optimizer_in_pipeline(*, pp: int, zero_stage: int, precision: str, grad_accum_dtype: str | None = None,
                               offload_optimizer: str = "none") -> bool:
    """Whether DeepSpeed 0.19.8 wraps a pipeline's optimizer in ``BF16_Optimizer``
    (``engine.py:2294-2323``, ``_do_optimizer_sanity_check``): bf16 ZeRO-0 with the model's
    accumulation dtype (the default, ``get_data_types``, ``engine.py:1806``: it then logs "BF16
    gradient accumulation is not safe numerically with large number of accumulation steps",
    ``:2316-2319``), or bf16 ZeRO-1 with ``data_types.grad_accum_dtype: "fp32"`` and no offload
    (``:2305-2310``). bf16 ZeRO-0 with fp32 accumulation is refused (``NotImplementedError``, ``:2323``)."""
    if pp <= 1 or precision != "bf16":
        return False
    fp32 = accumulates_in_fp32(grad_accum_dtype)
    return (zero_stage == 0 and not fp32) or (zero_stage == 1 and fp32 and offload_optimizer == "none")


def pipeline_grad_accum_dtype(*, pp: int, zero_stage: int, precision: str | None, grad_accum: int,
                              offload_optimizer: str = "none") -> str | None:
    """What dstk writes as ``data_types.grad_accum_dtype`` (None: leave DeepSpeed's default, the
    model's dtype): ``"fp32"`` for a bf16 DeepSpeed pipeline with ZeRO-1, no offload and more than
    one micro-batch. With the default, DeepSpeed 0.19.8 sums the micro-batches' gradients in bf16
    (ZeRO-1 in ``param.grad``; ZeRO-0 in ``BF16_Optimizer``'s bf16 buffer, with the warning of
    ``engine.py:2316-2319``); fp32 sends ZeRO-1 to ``BF16_Optimizer`` with an fp32 buffer
    (``engine.py:2305-2310``), as Megatron accumulates into fp32 ``main_grad``. The price, in
    ``bf16_optimizer_states`` / ``bf16_optimizer_peaks`` and ``steptime.bf16_pipe_grad_bytes_per_param``:
    ``4P`` of buffer beside the ``2P`` bf16 grads (the ZeRO-1 buckets go), and 22 B/param (20 on the
    last stage) per micro-batch. ZeRO-0 cannot take it (``NotImplementedError``, ``engine.py:2323``)."""
    if pp > 1 and (precision or "bf16") == "bf16" and zero_stage == 1 and offload_optimizer == "none" \
            and grad_accum > 1:
        return "fp32"
    return None


def bf16_optimizer_states(*, params: float, dp: int, k: float, grad_accum_dtype: str | None = None) -> ModelStates:
    """Model states of DeepSpeed 0.19.8's ``BF16_Optimizer`` (``bf16_optimizer.py:152-236``,
    ``_setup_for_real_optimizer``), ``P`` = this stage's parameters, ``n`` = dp, ``a`` = 2 bytes
    (bf16 accumulation, the default) or 4 (``grad_accum_dtype: "fp32"``):

    - the bf16 parameters, flattened into one buffer per group (``:166-171``): ``2P``;
    - an fp32 master partition (``:182``): ``4P/n``; Adam's states over it: ``4K P/n``;
    - the **accumulation buffer** ``fp32_groups_gradients_flat`` (``:191``), ``aP``, whole on
      every rank and from initialize on: what ``update_hp_grads`` adds each micro-batch's bf16
      gradients into (``:508-540``). ``grads_bytes`` is this buffer;
    - at the step, with bf16 accumulation, the partition is cast to fp32 for the optimizer
      (``step``, ``:414-417``): ``4P/n`` (``step_grads_bytes``); fp32 accumulation hands the
      buffer over as it is.

    The bf16 ``.grad`` of each parameter (``2P``) is not in here: ``bf16_optimizer_peaks`` holds
    it from the first backward to the step's ``zero_grad``."""
    shard = params / dp
    accum = 4.0 if accumulates_in_fp32(grad_accum_dtype) else 2.0
    return ModelStates(params_bytes=2.0 * params, grads_bytes=accum * params,
                       step_grads_bytes=0.0 if accum == 4 else 4.0 * shard, master_bytes=4.0 * shard,
                       states_bytes=4.0 * k * shard)


def last_stage_outputs_bytes(*, tokens: int, hidden: int, vocab: float, act_bytes: int) -> float:
    """What the last stage keeps of one earlier micro-batch: its ``_exec_backward_pass`` returns
    right after ``backward(loss)`` (``pipe/engine.py:797-799``) and never clears
    ``pipe_buffers['outputs']`` (only other stages do, ``:865-866``), so each of the stage's
    ``max(2, ...)`` buffers (``schedule.py:255-256``) keeps the logits (``w b s V``) and, through
    their autograd graph, the received hidden state and its gradient (``2 b s h w``) until the
    buffer is reused: ``w b s V + 2 w b s h`` per kept micro-batch, between steps too.
    Measured: ``tests/test_pipeline_memory_peak.py``."""
    return float(act_bytes * tokens * (vocab + 2 * hidden))


def pipeline_kept_outputs(*, last: bool, grad_accum: int) -> dict[str, int]:
    """Earlier micro-batches whose outputs the last stage keeps (``last_stage_outputs_bytes``) in
    each phase: in forward both buffers still hold their previous micro-batches (the new outputs
    replace one only after the forward, ``pipe/engine.py:751``); in backward the other buffer's;
    at the step both. 0 on other stages."""
    if not last:
        return {"forward": 0, "backward": 0, "step": 0}
    kept = min(2, grad_accum)
    return {"forward": kept, "backward": min(1, grad_accum - 1), "step": kept}


def bf16_optimizer_peaks(*, params: float, dp: int, largest_tensor: float, states: ModelStates,
                         activations_bytes: float | None, logits_elements: float = 0.0, grad_accum: int = 1,
                         fixed: tuple[Buffer, ...] = (), kept: dict[str, tuple[Buffer, ...]] | None = None,
                         cpu_rank: bool = False, adam: bool = True) -> tuple[PhasePeak, ...]:
    """The fullest moment of forward, backward and step of a pipeline stage under
    ``BF16_Optimizer`` (``bf16_optimizer_states``; ``immediate_grad_update`` false, DeepSpeed
    0.19.8's default, ``precision_config.py:51``). Each stage holds its bf16 parameters, master,
    states and accumulation buffer ``aP`` throughout, and:

    - the bf16 ``.grad`` of every parameter (``2P``) from the first backward on: ``clear_lp_grads``
      zeroes them before each micro-batch's backward (``pipe/engine.py:844-846``,
      ``bf16_optimizer.py:612-623``) without freeing them; only the step's ``zero_grad``
      (``engine.py:3524-3526``, ``set_to_none=True``) frees them. With ``m > 1`` they are live in
      forward; with ``m = 1`` only the largest tensor's at backward's first gradient;
    - forward: the activations and the last stage's loss transient (``(2 + 4) L``, as ``phase_peaks``);
    - backward: the activations plus the loss gradients (``8 L``) at its start;
    - the end of backward reduces the one flat accumulation buffer per group, which
      ``_flatten_dense_tensors`` hands over as a view (no copy; ``_bf16_reduce_grads``,
      ``pipe/engine.py:296-298``);
    - step: the bf16 grads, the fp32 cast of the partition (``step_grads_bytes``), and on CPU
      ranks torch AdamW's ``2 x 4`` bytes per element of the optimizer's one flat fp32 partition
      (``P/n``; see ``phase_peaks``).

    ``kept`` adds, per phase, the last stage's kept outputs (``pipeline_kept_outputs``).
    Measured on 2 gloo ranks: ``tests/test_pipeline_memory_peak.py``."""
    kept = kept or {}
    shard = params / dp
    act = activations_bytes
    hp = states.grads_bytes
    lp = 2.0 * params
    held = lp if grad_accum > 1 else 0.0
    logits_fwd = 6.0 * logits_elements
    fwd_bufs = (Buffer(name="logits and their fp32 upcast", bytes=int(logits_fwd), formula="(2 + 4) B x logits",
                       phase="forward"),) if logits_fwd else ()
    forward = PhasePeak(phase="forward", params_bytes=states.params_bytes, grads_bytes=hp + held,
                        optimizer_bytes=states.optimizer_bytes, activations_bytes=act,
                        buffers=fixed + kept.get("forward", ()) + fwd_bufs)
    loss_grad = 8.0 * logits_elements
    start = PhasePeak(phase="backward", params_bytes=states.params_bytes, grads_bytes=hp + held,
                      optimizer_bytes=states.optimizer_bytes, activations_bytes=act,
                      buffers=fixed + kept.get("backward", ()) + ((Buffer(
                          name="loss gradients", bytes=int(loss_grad), formula="2 x 4 B x logits",
                          phase="backward"),) if loss_grad else ()))
    first = dataclasses.replace(start, grads_bytes=hp + max(held, 2.0 * largest_tensor),
                                buffers=fixed + kept.get("backward", ()))
    backward = max((start, first), key=lambda p: p.total_bytes)
    temps = 8.0 * shard if (cpu_rank and adam) else 0.0
    step = PhasePeak(phase="step", params_bytes=states.params_bytes, grads_bytes=hp + lp + states.step_grads_bytes,
                     optimizer_bytes=states.optimizer_bytes, activations_bytes=0.0 if act is not None else None,
                     buffers=fixed + kept.get("step", ()) + ((Buffer(
                         name="AdamW temporaries", bytes=int(temps), phase="step",
                         formula="2 x 4 B x fp32 partition"),) if temps else ()))
    return forward, backward, step


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
