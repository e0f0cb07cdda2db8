"""ZeRO bucket sizes chosen for a model, a GPU and a network: what ``dstk generate`` writes.

DeepSpeed's defaults (``reduce_bucket_size`` = ``allgather_bucket_size`` = 5e8 elements,
``deepspeed/runtime/zero/config.py``) are sized for billion-parameter models on fast links and are
never capped by the model: ZeRO-1/2 allocate ``reduce_bucket_size`` elements in the first
gradient hook, twice with ``overlap_comm`` (``stage_1_and_2.py`` ``setup_buckets``), and ZeRO-3
allocates it at ``initialize`` (``stage3.py``). On a 3.7M-parameter model that is 1-2 GB of
buffer for 7 MB of gradients. ``choose_buffers`` picks sizes from the alpha-beta cost of the
collective instead, and bounds them by the model and the GPU.

Pure arithmetic, no torch: the planner calls it once per layout it estimates.
"""

from __future__ import annotations

import math

from dstk.estimate import memory as mem

TARGET_BANDWIDTH_FRACTION = 0.9
"""Share of the link's bandwidth a bucket's collective should reach."""
MEMORY_FRACTION = 0.01
"""Largest share of one GPU's memory a single bucket may take (two with ``overlap_comm``)."""
PERSISTENCE_HIDDEN_MULTIPLE = 10
"""ZeRO-3 keeps tensors of at most ``10 x hidden`` elements whole (transformers' "auto" rule)."""


def _round_down(elements: float) -> int:
    """Two significant digits, rounded down, even (ZeRO-1/2 assert that ``allgather_bucket_size``
    is a multiple of ``nccl_start_alignment_factor`` = 2, ``stage_1_and_2.py``), at least 2."""
    if elements < 2:
        return 2
    scale = 10 ** max(0, int(math.floor(math.log10(elements))) - 1)
    value = int(elements // scale) * scale
    return max(2, value - value % 2)


def latency_bandwidth_elements(*, ranks: int, latency_s: float, bytes_per_s: float, element_bytes: int,
                               call_latency_s: float = 0.0, fraction: float = TARGET_BANDWIDTH_FRACTION) -> float:
    """Smallest bucket (elements) whose ring collective over ``ranks`` reaches ``fraction`` of the
    link's bandwidth.

    A ring all-reduce of ``S`` bytes over ``n`` ranks runs ``2(n-1)`` steps of ``alpha + S/(n beta)``
    (the alpha-beta model of Thakur, Rabenseifner & Gropp 2005; NCCL's PERFORMANCE.md gives the
    ``2(n-1)/n`` bus factor; ``dstk.estimate.timing.ring_allreduce_seconds`` uses the same). The
    bandwidth term is a fraction ``f`` of the step when ``S >= f/(1-f) * n * alpha * beta``: nine
    latency-bandwidth products per rank for 90%. A reduce-scatter or all-gather (ZeRO-2/3) has half
    the steps and half the bytes, so the same size. With one rank nothing is reduced; the rule is
    taken at two ranks.

    ``call_latency_s`` is the fixed cost of one collective call whatever its size
    (``dstk.estimate.steptime.collective_latency``: 10-25 us for NCCL, ~1 ms for gloo on CPU ranks).
    The step-time model charges a call ``max(2(n-1) alpha, L)`` of latency
    (``steptime.latency_extra_seconds``), so the same rule holds with ``alpha`` raised to
    ``L / (2(n-1))`` where the call costs more than its ring steps: on 2 gloo ranks (1 ms a call,
    1 GB/s) that is 4.5e6 bf16 elements instead of the 4.5e4 the 5 us step alone gives."""
    n = max(2, ranks)
    alpha = max(latency_s, call_latency_s / (2 * (n - 1)))
    return fraction / (1.0 - fraction) * n * alpha * bytes_per_s / element_bytes


def choose_buffers(*, model, layout, training, cluster,
                   engine: str = "deepspeed") -> tuple[mem.ZeroBuffers, tuple[str, ...]]:
    """DeepSpeed ZeRO buffer settings for ``layout`` and the why lines that explain them.

    The parameters of one GPU are those of the fullest pipeline stage as ``engine`` splits the
    layers (``dstk.estimate.stage_layers`` at ``training.seq_len``: DeepSpeed's balanced cut, or
    Megatron's split), the same count the estimate prices.

    - ``reduce_bucket_size`` (and ``allgather_bucket_size``, the same): the latency-bandwidth
      floor of ``latency_bandwidth_elements`` over the data-parallel group (the link and latency
      of ``dstk.estimate._bandwidth``: NVLink inside a node, the NIC share across nodes; the
      per-call cost of ``steptime.collective_latency``, which the step time charges every call),
      then capped by the gradients one GPU holds, exactly (a bucket larger than all the gradients
      it collects is memory for nothing: DeepSpeed does not cap it; one two-digit step smaller
      would leave a second call) and by ``MEMORY_FRACTION`` of the GPU. DeepSpeed passes a
      gradient larger than the bucket around it (``extra_large_param_to_reduce``), so a small
      bucket never breaks a large tensor. On 2 gloo ranks (1 ms a call) the tiny Llama gets one
      bucket: ZeRO-1/2 issue 3 all-reduces a step instead of 6, ZeRO-3 1 reduce-scatter instead
      of 4 (``benchmarks/zero_cpu_cost.py``); the GPU presets' buckets do not change (NCCL's
      10-25 us a call is below the ring's ``2(n-1)`` steps of 5 us).
    - ``overlap_comm`` on for ZeRO-2/3 (reduction overlaps backward; the estimator's time model
      assumes it), off for ZeRO-0/1 (DeepSpeed's default), and off for ZeRO-2 when one bucket holds
      every gradient: its one reduction starts when backward ends, and ``setup_buckets`` would
      allocate the second buffer for nothing; ``contiguous_gradients`` on.
    - ZeRO-3: ``stage3_prefetch_bucket_size`` the largest weight of a layer (``/ tp``: the next
      module gathers while the current one computes), at least the latency-bandwidth floor of an
      all-gather over the ring's steps alone (the call latency would make it, and the working set
      below, the whole model on CPU ranks: measured 15 -> 6 all-gathers a step, but the memory
      estimate's gathered-parameter term then over-counts, +6% on the 20M LoRA peak), capped like
      the reduce bucket;
      ``stage3_param_persistence_threshold`` ``10 x hidden`` (transformers' "auto" rule,
      ``integrations/deepspeed.py``): norm weights and biases stay whole, the matrices are sharded;
      ``stage3_max_live_parameters`` the working set ZeRO-3 needs, the largest module or a weight
      plus the prefetch, instead of DeepSpeed's 1e9 (up to 2 GB of gathered bf16 parameters);
      ``stage3_max_reuse_distance`` the same: DeepSpeed keeps a gathered parameter whose next use
      lies within that many elements of modules (``partitioned_param_coordinator.py``
      ``__params_to_release``), so with 1e9 a model under 5e8 parameters is never released.
      ``max_live`` caps only the prefetch: the gathered working set is ``mem.gathered_params``.
    """
    from dstk.estimate import _bandwidth, _model_facts, rank_params
    from dstk.estimate.steptime import collective_latency

    f = _model_facts(model)
    w = mem.param_bytes(training.precision)
    gpu = cluster.gpu
    tp_style = "megatron" if engine == "megatron" else "autotp"
    params = max(rank_params(model, layout, stage=i, seq_len=training.seq_len, tp_style=tp_style)
                 for i in range(layout.pp))
    bandwidth, latency = _bandwidth(group=layout.dp, stride=layout.tp, cluster=cluster)
    call = collective_latency(group=layout.dp, stride=layout.tp, cluster=cluster)
    floor = latency_bandwidth_elements(ranks=layout.dp, latency_s=latency, bytes_per_s=bandwidth, element_bytes=w,
                                       call_latency_s=call)
    gather_floor = latency_bandwidth_elements(ranks=layout.dp, latency_s=latency, bytes_per_s=bandwidth,
                                              element_bytes=w)
    memory_cap = MEMORY_FRACTION * gpu.memory_bytes / w
    gather_cap = _model_cap(params, memory_cap=memory_cap)
    grads, what = params, "parameters"
    if training.lora is not None:  # LoRA: only the adapters' gradients fill the bucket (dstk.estimate.lora)
        from dstk.estimate.lora import lora_facts

        grads, what = lora_facts(model=model, lora=training.lora).trainable, "trainable (LoRA) parameters"
    cap = _model_cap(grads, memory_cap=memory_cap)
    bucket = min(_round_up(floor), cap)
    # One bucket holds every gradient: its one reduction starts when backward ends, so there is
    # nothing to overlap, and ZeRO-1/2 would allocate the second buffer for nothing.
    overlap = layout.zero_stage == 3 or (layout.zero_stage == 2 and bucket < grads)
    defaults = mem.ZeroBuffers()
    why = []
    if layout.zero_stage == 0:
        return defaults, ()
    # ZeRO-1/2 double the bucket with overlap_comm (``setup_buckets``); ZeRO-3 keeps one (``stage3.py``).
    copies = 2 if overlap and layout.zero_stage < 3 else 1
    link = f"{bandwidth / 1e9:.0f} GB/s and {latency * 1e6:.0f} us"
    if call > 2 * (max(2, layout.dp) - 1) * latency:  # the call's fixed cost, not the ring's steps, sets the floor
        link = f"{bandwidth / 1e9:.0f} GB/s and {_seconds_text(call)} a call"
    if layout.dp == 1 and floor <= min(grads, memory_cap):  # a pipeline's stages: nothing crosses a link
        reason = ("one data-parallel rank: its reductions cross no link, so the bucket only sizes the "
                  "gradient staging copies")
    elif floor <= min(grads, memory_cap):
        reason = (f"a ring over {layout.dp} GPUs at {link} reaches "
                  f"{TARGET_BANDWIDTH_FRACTION:.0%} of the bandwidth from {elements_text(floor)} elements")
    else:
        bound = (f"all {elements_text(grads)} {what} of one GPU" if grads <= memory_cap
                 else f"{MEMORY_FRACTION:.0%} of the GPU's {_mib(gpu.memory_bytes)}")
        reason = (f"capped by {bound} (a ring over {layout.dp} GPUs at {link} would reach "
                  f"{TARGET_BANDWIDTH_FRACTION:.0%} of the bandwidth from {elements_text(floor)})" if layout.dp > 1
                  else f"capped by {bound} (one data-parallel rank: one call of {_seconds_text(call)} a "
                       "reduction, however many elements it holds)")
    why.append(
        f"reduce_bucket_size {elements_text(bucket)} elements ({copies} x {elements_text(bucket)} x {w} B = "
        f"{_mib(copies * bucket * w)}"
        f"{', overlap_comm' if copies == 2 else ''}): {reason}; DeepSpeed's default 5e8 would take "
        f"{_mib(copies * defaults.reduce_bucket_size * w)}")
    if layout.zero_stage < 3:
        # What render.ds_config writes as data_types.grad_accum_dtype (fp32 for bf16 ZeRO-1 pipelines).
        accum = mem.pipeline_grad_accum_dtype(pp=layout.pp, zero_stage=layout.zero_stage,
                                              precision=training.precision, grad_accum=layout.grad_accum,
                                              offload_optimizer=layout.offload_optimizer)
        return mem.ZeroBuffers(reduce_bucket_size=bucket, allgather_bucket_size=bucket, overlap_comm=overlap,
                               contiguous_gradients=True, grad_accum_dtype=accum), tuple(why)
    layer_weight = (max(f.layer_persistent) if f.layer_persistent else f.layer_sharded) / layout.tp
    largest = max(f.largest_tensor / layout.tp, layer_weight)
    prefetch = min(_round_up(max(layer_weight, gather_floor)), gather_cap)
    hidden = getattr(model, "hidden_size", None)
    persistence = PERSISTENCE_HIDDEN_MULTIPLE * hidden if hidden else int(defaults.param_persistence_threshold)
    live = _round_up(min(max(largest, layer_weight + prefetch), params))
    ahead = ("gathers while the current one computes, no less than the latency floor" if prefetch >= layer_weight
             else f"is more than the cap ({MEMORY_FRACTION:.0%} of the GPU's memory), so only that much of it "
                  "gathers ahead")  # Mixtral's 9.4e8-element layer against a 4.2e8 cap on an 80 GB GPU
    # The figures of the estimate's "ZeRO-3 gathered parameters" line (mem.gathered_params), same inputs.
    persistent = f.layers * sum(t for t in f.layer_persistent if (t if t == f.hidden else t / layout.tp) <= persistence)
    if training.lora is not None:  # as dstk.estimate prices it: the adapters too, an untied frozen embedding not
        from dstk.estimate.lora import gathered_params as lora_gathered

        gathered = lora_gathered(params=params, trainable=grads,
                                 embedding=0 if f.tied or not f.embed_tensors else f.embed_tensors[0])
    else:
        gathered = params
    held = dict(params=gathered, persistent=persistent, largest_tensor=f.largest_tensor / layout.tp,
                largest_layer_tensor=max(f.layer_persistent, default=f.largest_tensor) / layout.tp)
    ours = mem.gathered_params(**held, buffers=mem.ZeroBuffers(max_live_parameters=live, max_reuse_distance=live))
    theirs = mem.gathered_params(**held, buffers=defaults)
    why.append(f"stage3_prefetch_bucket_size {elements_text(prefetch)}: the next weight "
               f"({elements_text(layer_weight)} elements per GPU) {ahead}; "
               f"stage3_max_live_parameters and stage3_max_reuse_distance {elements_text(live)}: the largest module "
               f"({elements_text(largest)}) or a weight plus the prefetch; max_live caps only the prefetch, so "
               f"{_mib(ours.at_loss * w)} stay gathered at the loss, {_mib(ours.most * w)} at most "
               f"(DeepSpeed's 1e9: {_mib(theirs.at_loss * w)}, {_mib(theirs.most * w)}); "
               f"stage3_param_persistence_threshold {persistence:,}: 10 x hidden, norms and biases stay whole")
    return mem.ZeroBuffers(reduce_bucket_size=bucket, allgather_bucket_size=bucket, overlap_comm=True,
                           contiguous_gradients=True, prefetch_bucket_size=prefetch,
                           param_persistence_threshold=persistence, max_live_parameters=live,
                           max_reuse_distance=live), tuple(why)


def _model_cap(elements: float, *, memory_cap: float) -> int:
    """The largest useful bucket: every element the model gives it, exactly (even, for ZeRO-1/2's
    alignment assert), so that one bucket holds them all (rounded to two digits it would leave a
    second call for the last few percent, a full call's latency on gloo); or ``MEMORY_FRACTION``
    of the GPU, rounded down, when that is smaller."""
    if elements > memory_cap:
        return _round_down(memory_cap)
    count = max(2, int(math.ceil(elements)))
    return count + count % 2


def _round_up(elements: float) -> int:
    """Two significant digits, rounded up, even (a bound must not fall below what it bounds)."""
    if elements <= 2:
        return 2
    scale = 10 ** max(0, int(math.floor(math.log10(elements))) - 1)
    value = int(math.ceil(elements / scale)) * scale
    return value + value % 2


def elements_text(elements: float) -> str:
    """``45000`` -> ``4.5e4``; small counts as they are."""
    if elements < 1e4:
        return f"{elements:,.0f}"
    mantissa, exponent = f"{elements:.2g}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _mib(nbytes: float) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**10:.0f} KiB"


def _seconds_text(seconds: float) -> str:
    """``1e-3`` -> ``1 ms``, ``2.5e-5`` -> ``25 us``."""
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} us"
