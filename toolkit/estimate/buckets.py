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
                               fraction: float = TARGET_BANDWIDTH_FRACTION) -> float:
    """Smallest bucket (elements) whose ring collective over ``ranks`` reaches ``fraction`` of the
    link's bandwidth.

    A ring all-reduce of ``S`` bytes over ``n`` ranks runs ``2(n-1)`` steps of ``alpha + S/(n beta)``
    (the alpha-beta model of Thakur, Rabenseifner & Gropp 2005; NCCL's PERFORMANCE.md gives the
    ``2(n-1)/n`` bus factor; ``dstk.estimate.timing.ring_allreduce_seconds`` uses the same). The
    bandwidth term is a fraction ``f`` of the step when ``S >= f/(1-f) * n * alpha * beta``: nine
    latency-bandwidth products per rank for 90%. A reduce-scatter or all-gather (ZeRO-2/3) has half
    the steps and half the bytes, so the same size. With one rank nothing is reduced; the rule is
    taken at two ranks."""
    n = max(2, ranks)
    return fraction / (1.0 - fraction) * n * latency_s * bytes_per_s / element_bytes


def choose_buffers(*, model, layout, training, cluster) -> tuple[mem.ZeroBuffers, tuple[str, ...]]:
    """DeepSpeed ZeRO buffer settings for ``layout`` and the why lines that explain them.

    - ``reduce_bucket_size`` (and ``allgather_bucket_size``, the same): the latency-bandwidth
      floor of ``latency_bandwidth_elements`` over the data-parallel group (the link and latency
      of ``dstk.estimate._bandwidth``: NVLink inside a node, the NIC share across nodes), then
      capped by the parameters one GPU holds (a bucket larger than all the gradients it collects
      is memory for nothing: DeepSpeed does not cap it) and by ``MEMORY_FRACTION`` of the GPU.
      DeepSpeed passes a gradient larger than the bucket around it (``extra_large_param_to_reduce``),
      so a small bucket never breaks a large tensor.
    - ``overlap_comm`` on for ZeRO-2/3 (reduction overlaps backward; the estimator's time model
      assumes it), off for ZeRO-0/1 (DeepSpeed's default); ``contiguous_gradients`` on.
    - ZeRO-3: ``stage3_prefetch_bucket_size`` the largest weight of a layer (``/ tp``: the next
      module gathers while the current one computes), at least the latency-bandwidth floor of an
      all-gather, capped like the reduce bucket;
      ``stage3_param_persistence_threshold`` ``10 x hidden`` (transformers' "auto" rule,
      ``integrations/deepspeed.py``): norm weights and biases stay whole, the matrices are sharded;
      ``stage3_max_live_parameters`` the working set ZeRO-3 needs, the largest module or a weight
      plus the prefetch, instead of DeepSpeed's 1e9 (up to 2 GB of gathered bf16 parameters);
      ``stage3_max_reuse_distance`` the same: DeepSpeed keeps a gathered parameter whose next use
      lies within that many elements of modules (``partitioned_param_coordinator.py``
      ``__params_to_release``), so with 1e9 a model under 1e9 parameters is never released.
    """
    from dstk.estimate import _bandwidth, _model_facts, rank_params

    f = _model_facts(model)
    w = mem.param_bytes(training.precision)
    gpu = cluster.gpu
    params = max(rank_params(model, layout, stage=i) for i in range(layout.pp))
    bandwidth, latency = _bandwidth(group=layout.dp, stride=layout.tp, cluster=cluster)
    floor = latency_bandwidth_elements(ranks=layout.dp, latency_s=latency, bytes_per_s=bandwidth, element_bytes=w)
    memory_cap = MEMORY_FRACTION * gpu.memory_bytes / w
    overlap = layout.zero_stage >= 2
    gather_cap = _round_down(min(params, memory_cap))
    grads, what = params, "parameters"
    if training.lora is not None:  # LoRA: only the adapters' gradients fill the bucket (dstk.estimate.lora)
        from dstk.estimate.lora import lora_facts

        grads, what = lora_facts(model=model, lora=training.lora).trainable, "trainable (LoRA) parameters"
    cap = _round_down(min(grads, memory_cap))
    bucket = min(_round_up(floor), cap)
    defaults = mem.ZeroBuffers()
    why = []
    if layout.zero_stage == 0:
        return defaults, ()
    # ZeRO-1/2 double the bucket with overlap_comm (``setup_buckets``); ZeRO-3 keeps one (``stage3.py``).
    copies = 2 if overlap and layout.zero_stage < 3 else 1
    if floor <= min(grads, memory_cap):
        reason = (f"a ring over {layout.dp} GPUs at {bandwidth / 1e9:.0f} GB/s and {latency * 1e6:.0f} us reaches "
                  f"{TARGET_BANDWIDTH_FRACTION:.0%} of the bandwidth from {elements_text(floor)} elements")
    else:
        bound = (f"all {elements_text(grads)} {what} of one GPU" if grads <= memory_cap
                 else f"{MEMORY_FRACTION:.0%} of the GPU's {_mib(gpu.memory_bytes)}")
        reason = (f"capped by {bound} (a ring over {layout.dp} GPUs would reach {TARGET_BANDWIDTH_FRACTION:.0%} "
                  f"of the bandwidth from {elements_text(floor)})")
    why.append(
        f"reduce_bucket_size {elements_text(bucket)} elements ({copies} x {elements_text(bucket)} x {w} B = "
        f"{_mib(copies * bucket * w)}"
        f"{', overlap_comm' if copies == 2 else ''}): {reason}; DeepSpeed's default 5e8 would take "
        f"{_mib(copies * defaults.reduce_bucket_size * w)}")
    if layout.zero_stage < 3:
        return mem.ZeroBuffers(reduce_bucket_size=bucket, allgather_bucket_size=bucket, overlap_comm=overlap,
                               contiguous_gradients=True), tuple(why)
    layer_weight = (max(f.layer_persistent) if f.layer_persistent else f.layer_sharded) / layout.tp
    largest = max(f.largest_tensor / layout.tp, layer_weight)
    prefetch = min(_round_up(max(layer_weight, floor)), gather_cap)
    hidden = getattr(model, "hidden_size", None)
    persistence = PERSISTENCE_HIDDEN_MULTIPLE * hidden if hidden else int(defaults.param_persistence_threshold)
    live = _round_up(min(max(largest, layer_weight + prefetch), params))
    why.append(f"stage3_prefetch_bucket_size {elements_text(prefetch)}: the next weight "
               f"({elements_text(layer_weight)} elements per GPU) "
               f"gathers while the current one computes, no less than the latency floor; "
               f"stage3_max_live_parameters and stage3_max_reuse_distance {elements_text(live)}: the largest module "
               f"({elements_text(largest)}) or a weight plus the prefetch, {_mib(live * w)} gathered at most "
               f"(DeepSpeed's 1e9 keeps up to {_mib(min(1e9, params) * w)}); "
               f"stage3_param_persistence_threshold {persistence:,}: 10 x hidden, norms and biases stay whole")
    return mem.ZeroBuffers(reduce_bucket_size=bucket, allgather_bucket_size=bucket, overlap_comm=True,
                           contiguous_gradients=True, prefetch_bucket_size=prefetch,
                           param_persistence_threshold=persistence, max_live_parameters=live,
                           max_reuse_distance=live), tuple(why)


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
