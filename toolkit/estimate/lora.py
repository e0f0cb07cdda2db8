"""LoRA and QLoRA in the estimates: what a frozen base changes in memory and step time.

LoRA (Hu et al. 2021) trains ``A: r x fan_in`` and ``B: fan_out x r`` beside each adapted linear
and freezes the rest (``dstk.train.lora``; peft's ``get_peft_model`` sets ``requires_grad=False``
on every base parameter). What DeepSpeed 0.19.8 then holds (``dstk.train.worker`` hands
``deepspeed.initialize`` the trainable parameters only, as the peak test's ranks do):

- the frozen base in the compute dtype (``engine.py:1860``, ``_cast_module_mixed_precision`` casts
  every float parameter), with no gradient, fp32 master or optimizer state: ZeRO-1/2 build their
  flat groups from ``requires_grad`` parameters only (``stage_1_and_2.py:428-434``,
  ``trainable_parameters``), so the frozen base stays whole on every rank; ZeRO-3 partitions every
  parameter of the module, frozen ones too (``parameter_offload.py``), and sizes its gradient
  partition buffer by the optimizer's groups (``stage3.py:789-793``, ``grad_partitions_flat_buffer``
  over ``fp16_groups``);
- the adapters as any trainable parameters (``memory.model_states`` of the adapter count);
- the reduce bucket at ``reduce_bucket_size`` whatever the trainable count: ZeRO-1/2 allocate
  ``torch.empty(int(self.reduce_bucket_size))`` in ``setup_buckets`` (``stage_1_and_2.py:3266``,
  twice with ``overlap_comm``) and ZeRO-3 at initialize (``stage3.py:782``), never
  ``min(reduce_bucket_size, trainable)`` (``memory.reduce_bucket_bytes``); dstk's generated configs
  cap their bucket at the trainable count (``buckets.choose_buffers``).

QLoRA (Dettmers et al. 2023) stores each adapted model's linear weights in 4-bit NF4
(``nf4_bytes_per_param``); dstk loads with double quantization (``dstk.train.worker._qlora_base``).
"""

from __future__ import annotations

import dataclasses

from dstk.estimate import memory as mem

NF4_BLOCK = 64
"""bitsandbytes' default 4-bit block: one absmax per 64 weights (``bnb.functional.quantize_4bit``,
``blocksize=64``; QLoRA §2 "blocksize 64")."""
DOUBLE_QUANT_BLOCK = 256
"""Double quantization: the absmax constants themselves quantized to 8 bits in blocks of 256 with
an fp32 constant per block (QLoRA §3, "Double Quantization": 32/64 -> 8/64 + 32/(64*256) bits)."""


def nf4_bytes_per_param(*, double_quant: bool = True) -> float:
    """Bytes of one NF4 weight with its quantization constants: 4 bits, plus an fp32 absmax per
    block of 64 (``4/64`` B); with double quantization an 8-bit absmax per 64 and an fp32 constant
    per 256 of those (``1/64 + 4/(64*256)`` B): 0.5156 B/param, 0.5625 without (Dettmers et al. 2023 §3:
    0.5 bits/param of constants -> 0.127)."""
    constants = (1.0 / NF4_BLOCK + 4.0 / (NF4_BLOCK * DOUBLE_QUANT_BLOCK)) if double_quant else 4.0 / NF4_BLOCK
    return 0.5 + constants


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class LoraFacts:
    """What the estimator needs of one model's adapters (element counts, no TP: LoRA runs at tp=1)."""

    trainable: int
    """Adapter parameters of the whole model (``dstk.train.lora_size.num_lora_params``)."""
    layer_adapter_tensors: tuple[int, ...]
    """Sizes of one layer's adapter matrices (``r x fan_in``, ``fan_out x r`` per module)."""
    adapted_shapes: tuple[tuple[int, int], ...]
    """(fan_in, fan_out) of each adapted module of a layer."""
    largest_adapter: int
    quantized: int
    """Elements QLoRA stores in NF4: every linear weight of the layers (bitsandbytes replaces the
    ``nn.Linear`` modules; the embedding, the lm_head and the norms stay in the compute dtype)."""
    adapted_fan_in: int
    """Sum of the adapted modules' fan_in in one layer (the dropout masks' width)."""
    num_adapted: int
    """Adapted modules per layer."""
    saves_attention_input: bool
    """Some module reading the attention's input norm is adapted (q, k, v or a fused qkv)."""
    saves_mlp_input: bool
    """Some module reading the MLP's input norm is adapted (gate, up)."""
    saves_mlp_inner: bool
    """The MLP's down projection is adapted (it keeps the MLP's inner activation)."""
    saves_attention_output: bool
    """The attention's output projection (o) is adapted."""
    has_mlp: bool
    """The family's MLP is linear modules (not MoE experts)."""
    fraction: float
    """Trainable over base parameters."""


_CACHE: dict[tuple, tuple[object, LoraFacts]] = {}


def lora_facts(*, model, lora) -> LoraFacts:
    """``LoraFacts`` of ``model`` (a ``ModelSpec``) with ``lora`` (``dstk.layout.Lora``), computed once."""
    key = (id(model), lora.rank, lora.targets)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is model:
        return hit[1]
    if isinstance(model, int):
        raise ValueError("lora: the adapters' size needs the model's shape, not a bare parameter count")
    from dstk.train.lora import lora_modules, resolve_targets
    from dstk.train.lora_size import linear_shapes, num_lora_params

    paths = resolve_targets(family=model.family, targets=lora.targets)
    shapes = linear_shapes(model)
    groups = lora_modules(model.family)
    attention, mlp = groups["attention"], groups["mlp"]
    tensors = tuple(t for p in paths for t in (lora.rank * shapes[p][0], lora.rank * shapes[p][1]))
    trainable = num_lora_params(model=model, rank=lora.rank, targets=paths)
    facts = LoraFacts(
        trainable=trainable, layer_adapter_tensors=tensors, largest_adapter=max(tensors),
        adapted_shapes=tuple(shapes[p] for p in paths),
        quantized=model.num_layers * sum(fi * fo for fi, fo in shapes.values()),
        adapted_fan_in=sum(shapes[p][0] for p in paths), num_adapted=len(paths),
        saves_attention_input=any(p in paths for p in attention[:-1]),
        saves_mlp_input=any(p in paths for p in mlp[:-1]), saves_mlp_inner=bool(mlp) and mlp[-1] in paths,
        saves_attention_output=attention[-1] in paths,
        has_mlp=bool(mlp), fraction=trainable / model.num_params)
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[key] = (model, facts)
    return facts


def frozen_param_bytes(*, params: float, quantized: float, precision: str, bits: int | None) -> float:
    """Bytes of the frozen base before ZeRO: ``w`` per parameter, QLoRA's quantized linears at
    ``nf4_bytes_per_param`` (DeepSpeed's cast leaves the uint8 NF4 storage alone: only float
    dtypes are cast, ``engine.py`` ``CASTABLE_DTYPES``)."""
    w = mem.param_bytes(precision)
    if bits == 4:
        return quantized * nf4_bytes_per_param() + (params - quantized) * w
    return w * params


def model_states(*, base_params: float, base_persistent: float, lf: LoraFacts, lora, precision: str,
                 optimizer: str, zero_stage: int, dp: int, offload_optimizer: str = "none",
                 offload_params: str = "none", adapter_persistent: float = 0.0) -> mem.ModelStates:
    """Model-state bytes on one GPU with LoRA: the adapters as ``memory.model_states`` holds any
    trainable parameters (their bit16 copy, gradient partition, fp32 master and states), plus the
    frozen base (``F`` elements, ``frozen_param_bytes``): whole on every rank under ZeRO 0-2,
    partitioned ``F/n`` under ZeRO-3 with its persistent small tensors (norms) whole, moved to the
    CPU/NVMe with parameter offload. No gradient, master or state for ``F``."""
    states = mem.model_states(params=lf.trainable, persistent=adapter_persistent, precision=precision,
                              optimizer=optimizer, zero_stage=zero_stage, dp=dp,
                              offload_optimizer=offload_optimizer, offload_params=offload_params)
    frozen = frozen_param_bytes(params=base_params, quantized=lf.quantized, precision=precision, bits=lora.bits)
    if zero_stage != 3:
        return dataclasses.replace(states, params_bytes=states.params_bytes + frozen)
    w = mem.param_bytes(precision)
    shard = frozen / dp
    if offload_params == "cpu":
        return dataclasses.replace(states, params_bytes=states.params_bytes + w * base_persistent,
                                   cpu_bytes=states.cpu_bytes + shard)
    if offload_params == "nvme":
        return dataclasses.replace(states, params_bytes=states.params_bytes + w * base_persistent,
                                   nvme_bytes=states.nvme_bytes + shard)
    return dataclasses.replace(states, params_bytes=states.params_bytes + shard + w * base_persistent)


def gathered_params(*, params: float, trainable: float, embedding: float) -> float:
    """Elements ZeRO-3 can hold gathered at once with LoRA: the base and the adapters, less an
    untied frozen input embedding. Its lookup needs no gradient, so its module never runs in
    backward and the trace DeepSpeed records (``partitioned_param_coordinator.py``
    ``__params_to_release``: a parameter is kept only if it recurs within
    ``stage3_max_reuse_distance`` of the trace) has no later use of it: it is released right after
    its forward (measured: the gathered bytes at the peak of a 20M Llama fall by its 4.2M elements)."""
    return params + trainable - embedding


def activation_delta_bytes(*, lf: LoraFacts, lora, tokens: int, shape: mem.LayerShape,
                           act_bytes: int, seq_len: int | None = None, attention: str = "sdpa") -> tuple[float, float]:
    """(per layer, once per model) bytes that a LoRA forward saves beyond a full fine-tune's
    (``memory.layer_activation_bytes`` and ``model_io_bytes``), for ``tokens`` tokens. Autograd
    keeps a linear's input only when its weight needs a gradient, so the frozen base keeps less,
    and the adapters keep their own (measured on a Llama with ``saved_tensors_hooks``,
    ``tests/test_estimate_lora.py``, exact without dropout):

    - per layer, ``w`` bytes per element: each RMSNorm's weight multiply keeps nothing
      (``-2wh``: frozen weight); the attention's input norm output is kept only by an adapted
      q/k/v (``-wh`` otherwise), the MLP's by an adapted gate/up (``-wh``), the MLP's inner
      activation by an adapted down projection (``-wf``); each adapter keeps ``x A^T`` for ``B``
      (``+rw``); with dropout each adapter keeps its dropped input and the mask (``+(w + 1) fan_in``,
      an upper bound: measured 8% less on all-linear, where the undropped input is no longer kept);
    - once: the first layer's norm input needs no gradient (``-(4h + 4)``), the final norm's
      weight multiply and the frozen lm_head keep nothing (``-2wh``), and the frozen embedding
      not the token ids (``-8``); with no adapter before it (no q/k/v), the first layer's fused
      attention needs no gradient and keeps nothing (``-(w(2q + 2kv) + 4a)``; SDPA handed a mask,
      ``shape.sdpa_mask`` for the first layer under ``attention="sdpa"``: what that layer saves,
      ``-(4wq + 4a + ws)`` with K/V repeated and the mask, ``memory.layer_activation_bytes``; ``seq_len``
      needed then) but the input an adapted o keeps (``+wq``).
    LayerNorm models (GPT-2) keep their fused norm's input either way (no ``-2wh`` per layer).
    """
    w, h, ffn, rmsnorm = act_bytes, shape.hidden, shape.ffn, shape.rmsnorm
    layer = lora.rank * w * lf.num_adapted
    if lora.dropout > 0:
        layer += (w + 1) * lf.adapted_fan_in
    if rmsnorm:
        layer -= 2 * w * h
    if not lf.saves_attention_input:
        layer -= w * h
    if lf.has_mlp and not lf.saves_mlp_input:
        layer -= w * h
    if lf.has_mlp and not lf.saves_mlp_inner:
        layer -= w * ffn
    once = (4 * h + 4 + 2 * w * h + 8) if rmsnorm else (w * h + 8 + w * h + 8)
    if not lf.saves_attention_input:
        if attention == "sdpa" and shape.sdpa_mask:
            if seq_len is None:
                raise ValueError("seq_len: needed for the first layer's masked SDPA (shape.sdpa_mask)")
            once += 4 * w * shape.q_width + 4 * shape.heads + w * seq_len
        else:
            once += w * (2 * shape.q_width + 2 * shape.kv_width) + 4 * shape.heads
        once -= w * shape.q_width if lf.saves_attention_output else 0
    return float(layer * tokens), float(-once * tokens)


def why_line(*, lf: LoraFacts, lora, precision: str, zero_stage: int) -> str:
    """The plan's why line for LoRA: the share that trains and what the frozen base costs."""
    share = f"{100 * lf.fraction:.2g}%" if lf.fraction >= 0.001 else f"{100 * lf.fraction:.1g}%"
    base = "in 4-bit NF4 (QLoRA)" if lora.bits == 4 else f"in {precision}"
    where = "partitioned by ZeRO-3" if zero_stage == 3 else "whole on every GPU (ZeRO-1/2 shard only the adapters)" \
        if zero_stage else "whole on every GPU"
    return (f"LoRA: {share} of parameters train (rank {lora.rank}, {lora.targets}); base weights frozen {base}: "
            f"no gradients or optimizer states for them, {where}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class StepTerms:
    """What LoRA changes in ``steptime.step_time`` (seconds per micro-batch, deltas to a full fine-tune)."""

    trainable: float
    """Parameters DP reduces and the optimizer updates: the adapters."""
    layer_backward_seconds: float
    """Per layer: no weight-gradient GEMMs for the base, the adapters' GEMMs and their elementwise
    update, and only adapter gradients to land."""
    stage_backward_seconds: float
    """Once: no weight-gradient GEMM for the lm_head, no embedding/head gradients to land."""
    flops_per_token: float
    """Model FLOPs per token: ``-2N`` (no base weight gradients) ``+ 6 N_lora``."""


def step_terms(*, facts, lf: LoraFacts, lora, layout, training, cluster) -> StepTerms:
    """LoRA's step: the forward is unchanged (plus the adapters); backward computes input gradients
    through the frozen weights but no weight gradients for them, so the base GEMMs cost ``1x + 1x``
    instead of ``1x + 2x`` (2/3 of a full fine-tune's GEMM FLOPs: Hu et al. 2021 §4.2 report a 25%
    speed-up on GPT-3 175B, where attention and the rest do not shrink); each adapter adds
    ``x A^T`` (``T x fan_in x r``) and ``(x A^T) B^T`` (``T x r x fan_out``) forward and twice that
    in backward, at the GPU's rate for a GEMM whose smallest side is ``r`` (skinny GEMMs are
    bandwidth bound: ``GPU.gemm_fraction(r)``), and the scaled add of their output
    (``3 w fan_out`` bytes per token, forward and twice in backward). Data parallelism reduces only
    the adapters' gradients; ZeRO-3 still gathers the frozen weights (``step_time``)."""
    from dstk.estimate import timing as tm
    from dstk.estimate.steptime import layer_seconds

    gpu = cluster.gpu
    peak = gpu.peak_flops(training.precision)
    w = mem.param_bytes(training.precision)
    tokens = layout.micro_batch * training.seq_len
    base = layer_seconds(facts=facts, tokens=tokens, seq_len=training.seq_len, tp=1, sp=1, act_bytes=w,
                         attention=training.attention, gpu=gpu, peak_flops=peak)
    adapters = 0.0
    for fan_in, fan_out in lf.adapted_shapes:
        for m, k, n in ((tokens, fan_in, lora.rank), (tokens, lora.rank, fan_out)):
            adapters += 3 * tm.gemm_seconds(m=m, n=n, k=k, peak_flops=peak, fraction=gpu.gemm_fraction(min(m, n, k)))
        adapters += 3 * tm.memory_seconds(nbytes=3.0 * w * fan_out * tokens, hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    accumulate = tm.grad_accumulation_bytes_per_param(engine="deepspeed", precision=training.precision)
    layer_adapter = sum(lf.layer_adapter_tensors)
    landing = tm.memory_seconds(nbytes=accumulate * (layer_adapter - facts.layer_sharded - facts.layer_replicated),
                                hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    head = 0.0
    if facts.vocab:
        head = -tm.gemm_seconds(m=tokens, n=facts.vocab, k=facts.hidden, peak_flops=peak,
                                fraction=gpu.gemm_fraction(min(tokens, facts.vocab, facts.hidden)))
    head -= tm.memory_seconds(nbytes=accumulate * (facts.embed + facts.final + facts.lm_head),
                              hbm_bytes_per_s=gpu.hbm_bytes_per_s)
    matmul = facts.layers * facts.layer_matmul_active + facts.head_matmul
    frozen = base.gemm if base.weight_grad_gemm is None else base.weight_grad_gemm  # the skipped weight gradients
    return StepTerms(trainable=float(lf.trainable), layer_backward_seconds=adapters - frozen + landing,
                     stage_backward_seconds=head, flops_per_token=-2.0 * matmul + 6.0 * lf.trainable)
