"""``estimate(model=, layout=, training=, cluster=)``: memory per GPU and step time of one layout.

Pure arithmetic (no torch): the planner calls it for thousands of layouts, so the quantities
that depend on the model alone are computed once per model (``_model_facts``) and one estimate
is a few hundred float operations. The formulas live in ``dstk.estimate.memory`` and
``dstk.estimate.timing``, each with its source; docs/estimate.md collects them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dstk.estimate import megatron as meg
from dstk.estimate import memory as mem
from dstk.estimate.steptime import sdpa_gets_mask, step_time
from dstk.layout import Layout, Training

__all__ = ["Estimate", "MemoryBreakdown", "Memory", "Time", "ZeroBuffers", "estimate", "saved_activation_bytes", "SOURCES"]

ZeroBuffers = mem.ZeroBuffers

SOURCES = {
    "params_bytes": "ZeRO (Rajbhandari et al. 2020) §5.1, as DeepSpeed 0.19.8 allocates it",
    "grads_bytes": "DeepSpeed 0.19.8 stage_1_and_2.py / stage3.py / bf16_optimizer.py",
    "optimizer_bytes": "fp32 master + K fp32 states (Adam K=2), sharded by ZeRO >= 1",
    "activations_bytes": "Korthikanti et al. 2022 Table 2, re-derived for HF modules; 1F1B in flight",
    "buffers_bytes": "named buffers live at the peak: ZeRO reduce buckets and flat copies, ZeRO-3 gathered "
                     "params, logits and loss gradients, optimizer temporaries, offload and pipeline buffers",
    "overhead_bytes": "CUDA context, NCCL and allocator (hardware catalog input)",
    "compute_seconds": "per operator: GEMMs on the GPU's MAMF curve, memory-bound ops at HBM bandwidth",
    "comm_seconds": "ring collectives, 2(n-1)/n S (NCCL PERFORMANCE.md); ZeRO-3 backward gathers exposed",
    "bubble_fraction": "(p-1)/(m v) (Narayanan et al. 2021 §2.2)",
}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class MemoryBreakdown:
    """Bytes on one GPU of one pipeline stage at its peak: every term is what is live at the
    fullest moment of the step (``dstk.estimate.memory.phase_peaks``), ``total_bytes`` is that
    peak. ``activations_bytes`` is None when unknown (a model given by its parameter count alone)."""

    stage: int
    num_layers: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int | None
    buffers_bytes: int
    """The GPU buffers live at the peak: the ``buffers`` whose names ``peak_buffers`` lists."""
    overhead_bytes: int
    peak_phase: str = "backward"
    """"forward", "backward" or "step": the phase the peak falls in."""
    buffers: tuple[mem.Buffer, ...] = ()
    """Every named buffer of this rank, on the GPU and (offload) on the CPU, each with the phase
    it is live in."""
    peak_buffers: tuple[str, ...] = ()
    """Names of the GPU ``buffers`` counted in ``buffers_bytes`` (live at the peak)."""
    phases: dict = dataclasses.field(default_factory=dict)
    """Phase -> the GPU's peak bytes in that phase (overhead included)."""

    @property
    def model_states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.model_states_bytes + (self.activations_bytes or 0) + self.buffers_bytes + self.overhead_bytes

    def to_dict(self) -> dict:
        return {"stage": self.stage, "num_layers": self.num_layers, "params_bytes": self.params_bytes,
                "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
                "activations_bytes": self.activations_bytes, "buffers_bytes": self.buffers_bytes,
                "overhead_bytes": self.overhead_bytes, "total_bytes": self.total_bytes,
                "peak_phase": self.peak_phase, "phases": dict(self.phases),
                "buffers": [b.to_dict() for b in self.buffers], "peak_buffers": list(self.peak_buffers)}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Memory:
    per_gpu: MemoryBreakdown
    """The fullest stage: what must fit on every GPU."""
    per_stage: tuple[MemoryBreakdown, ...]
    cpu_bytes: int
    """Host memory per GPU rank under offload."""
    nvme_bytes: int

    def to_dict(self) -> dict:
        per_gpu = self.per_gpu.to_dict()
        del per_gpu["stage"], per_gpu["num_layers"]
        return {"per_gpu": per_gpu, "per_stage": [s.to_dict() for s in self.per_stage],
                "cpu_bytes": self.cpu_bytes, "nvme_bytes": self.nvme_bytes}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Time:
    step_seconds: float
    compute_seconds: float
    """Pipeline compute of all micro-batches on the slowest stage (TP collectives and PP sends
    included) and the optimizer step (``dstk.estimate.steptime``)."""
    comm_seconds: float
    """Exposed (not overlapped) data-parallel, pipeline and offload communication."""
    comm: dict
    """Seconds per kind, before overlap: dp, zero3_gather, tp, pp, offload."""
    bubble_seconds: float
    bubble_fraction: float
    tokens_per_second: float
    tflops_per_gpu: float
    """Model TFLOP/s per GPU (no recompute counted)."""
    mfu: float
    hfu: float
    model_flops_per_step: float
    time_to_train_seconds: float | None

    def to_dict(self) -> dict:
        return {"step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
                "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "hfu": self.hfu,
                "compute_seconds": self.compute_seconds, "comm_seconds": self.comm_seconds,
                "comm": dict(self.comm), "bubble_seconds": self.bubble_seconds,
                "bubble_fraction": self.bubble_fraction, "model_flops_per_step": self.model_flops_per_step,
                "time_to_train_seconds": self.time_to_train_seconds}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Estimate:
    memory: Memory
    time: Time
    layout: Layout
    training: Training
    model: Any
    cluster: Any

    def to_dict(self) -> dict:
        model = self.model
        return {
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "layout": self.layout.to_dict(),
            "training": self.training.to_dict(),
            "model": {"name": getattr(model, "name", None), "family": getattr(model, "family", None),
                      "num_params": model if isinstance(model, int) else model.num_params,
                      "num_active_params": model if isinstance(model, int) else model.num_active_params},
            "cluster": self.cluster.to_dict(),
        }


# --- per-model facts, computed once -----------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class _Facts:
    """Element counts of a model split into what TP shards and what it replicates."""

    layers: int
    layer_sharded: int
    layer_replicated: int
    layer_matmul_active: int
    layer_persistent: tuple[int, ...]
    """Tensor sizes of a layer, kept to apply ZeRO-3's persistence threshold after TP."""
    embed: int
    embed_tensors: tuple[int, ...]
    final: int
    lm_head: int
    head_matmul: int
    tied: bool
    largest_tensor: int
    hidden: int
    vocab: int
    shape: mem.LayerShape | None
    attention_width: int
    rotary: bool = True
    head_dim: int = 1
    activation: str = "silu"
    """The MLP activation as HF names it (its eager bytes: ``timing.eager_elementwise_bytes_per_token``)."""
    bias: bool = False
    """The projections have biases (their gradients are summed over the tokens)."""
    fused_qkv: bool = False
    """One QKV projection (GPT-2's ``c_attn``) rather than three."""
    qk_norm: bool = False
    """RMSNorm over each head of q and k (Qwen3)."""
    eager_keywords: tuple = ()
    """The rest of what HF's layer code does eagerly, as (keyword, value) pairs of
    ``timing.eager_elementwise_bytes_per_token`` (``ModelSpec.eager_keywords``)."""
    sliding_window: int | None = None
    """``ModelSpec.sliding_window``: from that length on SDPA gets a mask (``steptime.sdpa_gets_mask``)."""
    sliding_layers: tuple[int, ...] | None = None
    """``ModelSpec.sliding_layers``: the layers that apply the window when only some do (None: all)."""


_CACHE: dict[int, tuple[Any, _Facts]] = {}


def _model_facts(model) -> _Facts:
    hit = _CACHE.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    if isinstance(model, int):
        facts = _Facts(layers=1, layer_sharded=model, layer_replicated=0, layer_matmul_active=model,
                       layer_persistent=(), embed=0, embed_tensors=(), final=0, lm_head=0, head_matmul=0,
                       tied=False, largest_tensor=0, hidden=1, vocab=0, shape=None, attention_width=0)
    else:
        h = model.hidden_size
        # Norm weights and biases of width h (or head_dim for QK-norm) are replicated by TP; every
        # matrix (and column-parallel bias) is sharded.
        small = {h, model.head_dim}
        replicated = sum(t for t in model.layer_tensors if t in small)
        active = model.layer_active_params - replicated
        facts = _Facts(
            layers=model.num_layers, layer_sharded=model.layer_params - replicated, layer_replicated=replicated,
            layer_matmul_active=active, layer_persistent=model.layer_tensors,
            embed=model.embedding_params, embed_tensors=model.embedding_tensors, final=model.final_params,
            lm_head=model.lm_head_params, head_matmul=model.vocab_size * h, tied=model.tied_embeddings,
            largest_tensor=model.largest_tensor, hidden=h, vocab=model.vocab_size,
            shape=mem.LayerShape(hidden=h, q_width=model.attention_width, kv_width=model.num_kv_heads * model.head_dim,
                                 ffn=model.ffn_hidden_size * model.experts_per_token, heads=model.num_heads,
                                 mlp_saved=4 if model.gated_mlp else mem.MLP_SAVED.get(model.activation, 2),
                                 rmsnorm=model.norm == "rmsnorm", dropout=model.dropout > 0,
                                 softmax_fp32=model.norm == "rmsnorm", sdpa_mask=model.eager.kv_repeated),
            rotary=model.rotary, head_dim=model.head_dim,
            attention_width=model.attention_width, activation=model.activation,
            # Biases and fusion read off the tensor sizes: an MLP bias has the inner width, a fused
            # QKV weight h (q + 2 kv) elements, a QK-norm weight head_dim (< h).
            bias=model.ffn_hidden_size in model.layer_tensors,
            fused_qkv=h * (model.attention_width + 2 * model.num_kv_heads * model.head_dim) in model.layer_tensors,
            qk_norm=model.head_dim != h and model.head_dim in model.layer_tensors,
            eager_keywords=tuple(model.eager_keywords().items()),
            sliding_window=getattr(model, "sliding_window", None),
            sliding_layers=getattr(model, "sliding_layers", None),
        )
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[id(model)] = (model, facts)
    return facts


def _shape_at(f: _Facts, *, seq_len: int) -> mem.LayerShape:
    """``f.shape`` with ``sdpa_mask`` for ``seq_len``: a sliding window masks only the sequences
    that reach it (``steptime.sdpa_gets_mask``)."""
    return dataclasses.replace(f.shape, sdpa_mask=sdpa_gets_mask(f, seq_len=seq_len))


def _sliding_layers_in(f: _Facts, *, start: int, count: int) -> int:
    """How many of layers ``start .. start + count - 1`` apply the model's sliding window."""
    if f.sliding_window is None:
        return 0
    if f.sliding_layers is None:
        return count
    return sum(1 for i in f.sliding_layers if start <= i < start + count)


def _full_layer_extra_bytes(f: _Facts, *, per_layer_bytes: float, seq_len: int, **kw) -> float:
    """What a layer applying the sliding window saves beyond a full-attention layer of the same
    model (SDPA's mask and K/V repeated, ``memory.layer_activation_bytes``): 0 unless only some
    layers slide (``ModelSpec.sliding_layers``), where the rest save ``per_layer_bytes`` less this."""
    if f.sliding_window is None or f.sliding_layers is None or f.shape is None:
        return 0.0
    full = dataclasses.replace(kw.pop("shape"), sdpa_mask=sdpa_gets_mask(
        dataclasses.replace(f, sliding_window=None, sliding_layers=None), seq_len=seq_len))
    return per_layer_bytes - mem.layer_activation_bytes(shape=full, seq_len=seq_len, **kw)


def _checkpointed_mask(f: _Facts, attention: str, recompute: str) -> bool:
    """GPT-style (LayerNorm) HF models hand eager attention a materialised mask, which full
    recompute keeps as a checkpoint input (``memory.model_io_bytes``)."""
    return recompute == "full" and attention == "eager" and f.shape is not None and not f.shape.rmsnorm


def stage_layers(num_layers: int, pp: int, *, layout: Layout | None = None, facts: _Facts | None = None,
                 seq_len: int | None = None, engine: str = "deepspeed") -> list[int]:
    """Decoder layers per stage, as the engine places them (what ``generate`` renders):

    - the layout's uneven first/last stages where it has them (Megatron's
      ``--decoder-first/last-pipeline-num-layers``, ``dstk.layout.stage_layer_counts``);
    - Megatron otherwise: ``dstk.layout.megatron_stage_layers`` (even, or the first/last arguments
      ``megatron.args`` then carries);
    - DeepSpeed with the model's ``facts`` and ``seq_len``: the cut ``dstk.models.to_pipeline`` gives
      its ``PipelineModule`` (``partition="balanced"``, ``dstk.pipeline.partition``), which weighs
      the output layer's FLOPs and logits and the embedding's bytes like layers, so the last (and
      first) stage hold fewer decoder layers when the vocabulary is large;
    - else (a bare parameter count) an even split, the remainder on the first stages
      (``to_pipeline``'s ``partition="uniform"``).
    """
    if layout is not None and layout.uneven_stages:
        return list(layout.stage_layers(num_layers))
    if pp == 1:
        return [num_layers]
    if engine == "megatron" and num_layers >= pp:
        from dstk.layout import megatron_stage_layers

        return list(megatron_stage_layers(num_layers=num_layers, pp=pp))
    if facts is not None and facts.shape is not None and seq_len is not None and num_layers >= pp:
        from dstk.pipeline.partition import decoder_layers_per_stage

        return list(decoder_layers_per_stage(
            num_layers=num_layers, layer_params=facts.layer_sharded + facts.layer_replicated,
            embed_params=facts.embed, final_params=facts.final, head_params=0 if facts.tied else facts.lm_head,
            tied_head=facts.tied, hidden_size=facts.hidden, num_heads=facts.shape.heads, vocab_size=facts.vocab,
            seq_len=seq_len, num_stages=pp))
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def _bandwidth(*, group: int, stride: int, cluster, share_nics: bool = True) -> tuple[float, float]:
    """(bytes/s per GPU, latency) of a collective over ``group`` ranks spaced ``stride`` apart
    (ranks are numbered TP fastest, then DP, then PP, as Megatron and DeepSpeed's topology do):
    inside one node it runs on the intra-node link; across nodes the group's ring gets the NICs of
    its members in each node: ``r = min(group, gpus_per_node / stride)`` members share the node
    with ``gpus_per_node / r`` concurrent groups, so each rank's bus bandwidth is the node's NIC
    bandwidth x efficiency x ``r / gpus_per_node`` (NCCL runs one ring channel per NIC: a 16-GPU
    ring over two HGX A100 reaches the whole node's 4 x HDR, 91 GB/s, NVIDIA/nccl-tests#100).
    A group with one member per node (DP over TP 8, pipeline sends) gets one GPU's share.

    Checked against published multi-node ZeRO-3/FSDP runs that one GPU's share could not have
    reached: PyTorch FSDP's GPT-175B on 512 A100 at batch 1 (Zhao et al. 2023, 173 TFLOP/s; needs
    ~62 GB/s per GPU, the share would give 31) and ZeRO++'s ZeRO-3 baseline on one 100 Gb/s link
    per 16 V100 (Wang et al. 2023). ``share_nics=False`` gives every rank one GPU's share whatever
    the group: DeepSpeed before 0.6 (``dstk.estimate.steptime.DEEPSPEED_2021``)."""
    gpu = cluster.gpu
    intra = gpu.intra_node_bytes_per_s * gpu.intra_node_efficiency
    if group * stride <= cluster.gpus_per_node or cluster.num_nodes == 1:
        return intra, 5e-6
    net = cluster.interconnect
    if net is None:
        from dstk.hardware import get_interconnect

        net = get_interconnect("ib-ndr")
    members = members_per_node(group=group, stride=stride, cluster=cluster) if share_nics else 1
    per_gpu = net.node_bytes_per_s * net.efficiency * members / min(cluster.gpus_per_node, cluster.world_size)
    return min(intra, per_gpu), net.latency_s


def members_per_node(*, group: int, stride: int, cluster) -> int:
    """Ranks of a group of ``group`` ranks ``stride`` apart (TP numbered fastest) in one node:
    ``min(group, gpus_per_node / stride)``, at least 1 (one a node once the stride spans a node)."""
    return max(1, min(group, min(cluster.gpus_per_node, cluster.world_size) // stride))


def stage_params(f: _Facts, *, layers: int, first: bool, last: bool, tp: int, pp: int,
                 tp_style: str = "autotp") -> float:
    """Parameter elements one GPU of a stage holds before ZeRO sharding.

    TP shards every matrix and replicates norms (Shoeybi et al. 2019 §3). The embedding: DeepSpeed's
    AutoTP (``tp_style="autotp"``) shards the linear layers and the lm_head but keeps the input
    embedding whole (measured on 2 ranks, tests/test_estimate_deepspeed.py); Megatron shards it
    by vocabulary (``"megatron"``: ``VocabParallelEmbedding``) and keeps learned position embeddings
    whole (``torch.nn.Embedding``, megatron-core ``language_model_embedding.py``). With pp > 1 a tied
    embedding lives on the first and the last stage (DeepSpeed's ``TiedLayerSpec``)."""
    embed_tp = tp if tp_style == "megatron" else 1
    params = layers * (f.layer_sharded / tp + f.layer_replicated)
    if first:
        word = f.embed_tensors[0] if f.embed_tensors else 0
        params += word / embed_tp + (f.embed - word)
    if last:
        params += f.final + f.lm_head / tp
        if f.tied and pp > 1:
            params += f.embed_tensors[0] / tp
    return params


def rank_params(model, layout: Layout, *, stage: int = 0, tp_style: str = "autotp",
                seq_len: int | None = None) -> float:
    """``stage_params`` for a model and a layout: what one GPU of ``stage`` holds before ZeRO
    (``seq_len``: the one ``to_pipeline`` cuts the stages for, see ``stage_layers``)."""
    f = _model_facts(model)
    counts = stage_layers(f.layers, layout.pp, layout=layout, facts=f, seq_len=seq_len,
                          engine="megatron" if tp_style == "megatron" else "deepspeed")
    return stage_params(f, layers=counts[stage], first=stage == 0, last=stage == layout.pp - 1, tp=layout.tp,
                        pp=layout.pp, tp_style=tp_style)


def estimate(*, model, layout: Layout, training: Training, cluster, buffers: mem.ZeroBuffers | None = None,
             tp_style: str = "autotp", engine: str = "deepspeed", fused_kernels: bool | None = None) -> Estimate:
    """Memory per GPU (per stage) and step time of ``layout`` for ``model`` on ``cluster``.

    ``model`` is a ``dstk.models.ModelSpec``, or an ``int`` parameter count (model states only:
    activations are None and per-layer quantities are approximated as one layer).
    ``buffers`` are DeepSpeed's bucket settings (default: DeepSpeed's defaults); ``tp_style``
    says how tensor parallelism treats the embedding (``stage_params``). ``engine="megatron"``
    prices the Megatron engine instead of DeepSpeed's (``dstk.estimate.megatron``: fp32 main
    gradients, the distributed optimizer as ZeRO 1, vocabulary-parallel embedding, Korthikanti et
    al.'s activations for its fused kernels). ``fused_kernels``: whether norms, residuals, activation
    and rotary run as fused kernels (None: the engine's own, fused for Megatron, HF transformers'
    eager modules for DeepSpeed; ``steptime.layer_pass_seconds``).
    """
    if engine not in ("deepspeed", "megatron"):
        raise ValueError(f"engine: expected deepspeed or megatron, got {engine!r}")
    if engine == "megatron":
        meg.check_layout(zero_stage=layout.zero_stage, offload_optimizer=layout.offload_optimizer,
                         offload_params=layout.offload_params)
    if layout.world_size != cluster.world_size:
        raise ValueError(f"layout: dp*tp*pp = {layout.world_size} but the cluster has {cluster.world_size} GPUs")
    kernels = getattr(model, "attention_kernels", None)
    if engine != "megatron" and kernels is not None and training.attention not in kernels:
        from dstk.plan import check_attention  # the kernel the HF class lacks: DstkError with the fix, as plan's

        check_attention(attention=training.attention, precision=training.precision, gpu=cluster.gpu, spec=model,
                        engine=engine)
    buffers = buffers or _DEFAULT_BUFFERS
    megatron = engine == "megatron"  # Megatron's own accounting: dstk.estimate.megatron
    tp_style = "megatron" if megatron else tp_style
    f = _model_facts(model)
    known = f.shape is not None
    tp, pp, dp = layout.tp, layout.pp, layout.dp
    lora, lf = training.lora, None
    if lora is not None:  # adapters on a frozen base: dstk.estimate.lora
        from dstk.estimate import lora as lora_est

        if megatron or tp > 1 or pp > 1:
            raise ValueError("lora: LoRA runs on DeepSpeed's data parallelism and ZeRO only (tp = pp = 1)")
        lf = lora_est.lora_facts(model=model, lora=lora)
    w = mem.param_bytes(training.precision)
    gpu = cluster.gpu
    tokens_mb = layout.micro_batch * training.seq_len
    m = layout.grad_accum
    threshold = buffers.param_persistence_threshold

    layer_persistent = sum(t for t in f.layer_persistent if (t if t in (f.hidden,) else t / tp) <= threshold) \
        if layout.zero_stage == 3 else 0
    per_layer_act = full_layer_act = window_extra = 0.0
    io_first = io_last = 0.0
    if known:
        shape = _shape_at(f, seq_len=training.seq_len)
        shape = shape if tp == 1 else dataclasses.replace(
            shape, q_width=f.shape.q_width // tp, kv_width=max(1, f.shape.kv_width // tp),
            ffn=f.shape.ffn // tp, heads=max(1, f.shape.heads // tp))
        sp = tp if layout.sequence_parallel else 1
        kw = dict(shape=shape, tokens=tokens_mb, seq_len=training.seq_len, act_bytes=w,
                  attention=training.attention, sequence_parallel_tp=sp, fused_dropout=not gpu.is_cpu)
        per_layer_act = mem.layer_activation_bytes(recompute=layout.recompute, **kw)
        if not megatron:
            window_extra = _full_layer_extra_bytes(f, per_layer_bytes=per_layer_act, recompute=layout.recompute,
                                                   **kw)
        if layout.recompute == "full":
            # Backward re-runs one layer at a time: one layer's activations are live on top of
            # the checkpointed inputs (Chen et al. 2016 §3).
            full_layer_act = mem.layer_activation_bytes(recompute="none", **kw)
        io_first, io_last = mem.model_io_bytes(tokens=tokens_mb, seq_len=training.seq_len, hidden=f.hidden,
                                               vocab=f.vocab, act_bytes=w, rmsnorm=shape.rmsnorm,
                                               dropout=shape.dropout, rotary=f.rotary, head_dim=f.head_dim, tp=tp,
                                               checkpointed_mask=_checkpointed_mask(f, training.attention,
                                                                                    layout.recompute))
        if megatron:  # Megatron's fused kernels save less than HF modules (Korthikanti et al. Table 2)
            terms = meg.activation_terms(shape=shape, gated=getattr(model, "gated_mlp", True), tokens=tokens_mb,
                                         seq_len=training.seq_len, vocab=f.vocab, act_bytes=w,
                                         attention=training.attention, recompute=layout.recompute, tp=tp,
                                         sequence_parallel_tp=sp)
            per_layer_act, full_layer_act = terms.layer_bytes, terms.recompute_layer_bytes
            io_first, io_last = terms.first_stage_bytes, terms.last_stage_bytes
        if lf is not None:  # what the frozen base no longer keeps, and what the adapters keep
            first_shape = shape if f.sliding_window is None or _sliding_layers_in(f, start=0, count=1) else \
                dataclasses.replace(shape, sdpa_mask=sdpa_gets_mask(  # layer 0 does not slide (Qwen2's first)
                    dataclasses.replace(f, sliding_window=None, sliding_layers=None), seq_len=training.seq_len))
            layer_delta, once_delta = lora_est.activation_delta_bytes(
                lf=lf, lora=lora, tokens=tokens_mb, shape=first_shape, act_bytes=w, seq_len=training.seq_len,
                attention=training.attention)
            if layout.recompute == "full":
                full_layer_act += layer_delta
            else:
                per_layer_act += layer_delta
            io_last += once_delta

    stages = []
    cpu_total = nvme_total = 0.0
    slowest_flops = 0.0
    fwd_layer_flops = 2.0 * f.layer_matmul_active + 4.0 * training.seq_len * f.attention_width
    counts = stage_layers(f.layers, pp, layout=layout, facts=f, seq_len=training.seq_len, engine=engine)
    for i, n in enumerate(counts):
        first, last = i == 0, i == pp - 1
        params = stage_params(f, layers=n, first=first, last=last, tp=tp, pp=pp, tp_style=tp_style)
        persistent = n * layer_persistent
        states = mem.model_states(params=params, persistent=persistent, precision=training.precision,
                                  optimizer=training.optimizer, zero_stage=layout.zero_stage, dp=dp,
                                  offload_optimizer=layout.offload_optimizer, offload_params=layout.offload_params,
                                  state_elements=mem.adafactor_state_elements(params, f.hidden)
                                  if training.optimizer == "adafactor" else None)
        trainable, largest = params, f.largest_tensor / tp
        if lf is not None:  # ZeRO's groups, buckets and copies hold the adapters; the base is frozen
            adapter_persistent = n * sum(t for t in lf.layer_adapter_tensors if t <= threshold) \
                if layout.zero_stage == 3 else 0
            states = lora_est.model_states(base_params=params, base_persistent=persistent, lf=lf, lora=lora,
                                           precision=training.precision, optimizer=training.optimizer,
                                           zero_stage=layout.zero_stage, dp=dp,
                                           offload_optimizer=layout.offload_optimizer,
                                           offload_params=layout.offload_params, adapter_persistent=adapter_persistent)
            trainable, largest = lf.trainable, lf.largest_adapter
        fixed, cpu_buffers = _fixed_buffers(layout=layout, training=training, params=trainable, dp=dp, f=f,
                                            buffers=buffers, tokens=tokens_mb,
                                            largest_tensor=None if lf is None else largest)
        offload_cpu = sum(b.bytes for b in cpu_buffers)
        gathered = params
        if lf is not None:
            # The adapters are gathered too; an untied frozen embedding never appears in backward's
            # trace, so ZeRO-3 releases it after its forward (``lora.gathered_params``).
            gathered = lora_est.gathered_params(params=params, trainable=trainable,
                                                embedding=0 if f.tied or not f.embed_tensors else f.embed_tensors[0])
        live = mem.live_param_bytes(zero_stage=layout.zero_stage, precision=training.precision, params=gathered,
                                    largest_module=f.largest_tensor / tp, buffers=buffers, persistent=persistent,
                                    largest_layer_tensor=max(f.layer_persistent, default=f.largest_tensor) / tp)
        if megatron:  # no ZeRO buckets: Megatron's states and buffers (dstk.estimate.megatron)
            states = meg.model_states(params=params, precision=training.precision, optimizer=training.optimizer,
                                      distributed_optimizer=layout.zero_stage >= 1, dp=dp)
            buf = meg.buffer_bytes(tp=tp, pp=pp, sequence_parallel=layout.sequence_parallel, tokens=tokens_mb,
                                   hidden=f.hidden, act_bytes=w)
            fixed = (mem.Buffer(name="Megatron buffers", bytes=int(buf), formula="dstk.estimate.megatron"),) \
                if buf else ()
        act = None
        if known:
            held = mem.in_flight_microbatches(pp=pp, stage=i, grad_accum=m, virtual_stages=layout.virtual_stages)
            full_layers = n - _sliding_layers_in(f, start=sum(counts[:i]), count=n) if window_extra else 0
            act = (n * per_layer_act - full_layers * window_extra) * held + full_layer_act
            if first:
                act += io_first * held
            if last:
                act += io_last
        if megatron:  # Megatron's accounting is one sum: states, the step's fp32 gradients, activations
            fullest = mem.PhasePeak(phase="backward", params_bytes=states.params_bytes,
                                    grads_bytes=states.grads_bytes + states.step_grads_bytes,
                                    optimizer_bytes=states.optimizer_bytes, activations_bytes=act, buffers=fixed)
            peaks = (fullest,)
        else:
            kept = _pipeline_kept(pp=pp, last=last and known, grad_accum=m, tokens=tokens_mb, hidden=f.hidden,
                                  vocab=f.vocab / tp, act_bytes=w)
            logits = tokens_mb * f.vocab / tp if (known and last) else 0.0
            if lf is None and mem.bf16_optimizer_in_pipeline(pp=pp, zero_stage=layout.zero_stage,
                                                             precision=training.precision,
                                                             grad_accum_dtype=buffers.grad_accum_dtype,
                                                             offload_optimizer=layout.offload_optimizer):
                k = (mem.adafactor_state_elements(params, f.hidden) / max(params, 1.0)
                     if training.optimizer == "adafactor" else mem.OPTIMIZER_STATES[training.optimizer])
                states = mem.bf16_optimizer_states(params=params, dp=dp, k=k,
                                                   grad_accum_dtype=buffers.grad_accum_dtype)
                peaks = mem.bf16_optimizer_peaks(params=params, dp=dp, largest_tensor=largest, states=states,
                                                 activations_bytes=act, logits_elements=logits, grad_accum=m,
                                                 fixed=fixed, kept=kept, cpu_rank=gpu.is_cpu,
                                                 adam=training.optimizer in ("adam", "adamw"))
            else:
                peaks = mem.phase_peaks(
                    zero_stage=layout.zero_stage, precision=training.precision, optimizer=training.optimizer, dp=dp,
                    params=trainable, largest_tensor=largest, states=states, buffers=buffers,
                    activations_bytes=act, logits_elements=logits,
                    grad_accum=m, offload_optimizer=layout.offload_optimizer, gathered_bytes=live, fixed=fixed,
                    cpu_rank=gpu.is_cpu, pipeline=pp > 1, kept=kept)
            fullest = max(peaks, key=lambda p: p.total_bytes)
        named = {b.name: b for p in peaks for b in p.buffers}
        stages.append(MemoryBreakdown(
            stage=i, num_layers=n, params_bytes=int(fullest.params_bytes), grads_bytes=int(fullest.grads_bytes),
            optimizer_bytes=int(fullest.optimizer_bytes),
            activations_bytes=None if fullest.activations_bytes is None else int(fullest.activations_bytes),
            buffers_bytes=int(fullest.buffers_bytes), overhead_bytes=int(gpu.overhead_bytes), peak_phase=fullest.phase,
            buffers=tuple(named.values()) + cpu_buffers, peak_buffers=tuple(b.name for b in fullest.buffers),
            phases={p.phase: int(p.total_bytes) + int(gpu.overhead_bytes) for p in peaks}))
        cpu_total = max(cpu_total, states.cpu_bytes + offload_cpu)
        nvme_total = max(nvme_total, states.nvme_bytes)
        stage_flops = n * fwd_layer_flops + (2.0 * f.head_matmul if last else 0.0)
        slowest_flops = max(slowest_flops, stage_flops)

    # --- time -------------------------------------------------------------------------------
    lora_terms = None if lf is None else lora_est.step_terms(facts=f, lf=lf, lora=lora, layout=layout,
                                                             training=training, cluster=cluster)
    time = step_time(facts=f, layout=layout, training=training, cluster=cluster, buffers=buffers, tp_style=tp_style,
                     lora=lora_terms, fused_kernels=fused_kernels)
    per_gpu = max(stages, key=lambda s: s.total_bytes)
    memory = Memory(per_gpu=per_gpu, per_stage=tuple(stages), cpu_bytes=int(cpu_total), nvme_bytes=int(nvme_total))
    return Estimate(memory=memory, time=time, layout=layout, training=training, model=model, cluster=cluster)


_DEFAULT_BUFFERS = mem.ZeroBuffers()


def _fixed_buffers(*, layout: Layout, training: Training, params: float, dp: int, f: _Facts,
                   buffers: mem.ZeroBuffers, tokens: int,
                   largest_tensor: float | None = None) -> tuple[tuple[mem.Buffer, ...], tuple[mem.Buffer, ...]]:
    """(GPU, CPU) buffers live through the whole step: ZeRO-3's reduce bucket (allocated at
    initialize, ``memory.reduce_bucket_bytes``), ZeRO-1/2's offload staging buffers
    (``memory.offload_buffer_bytes``) and the pipeline engine's send/receive buffers."""
    w = mem.param_bytes(training.precision)
    gpu: list[mem.Buffer] = []
    cpu: list[mem.Buffer] = []
    if layout.zero_stage == 3 and buffers.contiguous_gradients:
        gpu.append(mem.Buffer(name="reduce bucket", bytes=int(w * buffers.reduce_bucket_size),
                              formula=mem.element_formula(buffers.reduce_bucket_size, w, "ZeRO-3: from initialize")))
    on_gpu, on_cpu = mem.offload_buffer_bytes(zero_stage=layout.zero_stage, precision=training.precision,
                                              offload_optimizer=layout.offload_optimizer, params=params, dp=dp,
                                              largest_tensor=f.largest_tensor if largest_tensor is None
                                              else largest_tensor)
    if on_gpu:
        gpu.append(mem.Buffer(name="offload staging", bytes=int(on_gpu), formula="w x largest tensor"))
    if on_cpu:
        cpu.append(mem.Buffer(name="offload staging", bytes=int(on_cpu), formula="w x (P/n + largest tensor)",
                              device="cpu"))
    pipe = mem.pipeline_buffer_bytes(pp=layout.pp, tokens=tokens, hidden=f.hidden, act_bytes=w)
    if pipe:
        gpu.append(mem.Buffer(name="pipeline receive buffer", bytes=int(pipe),
                              formula="b s h w (one, both directions)"))
    return tuple(gpu), tuple(cpu)


def _pipeline_kept(*, pp: int, last: bool, grad_accum: int, tokens: int, hidden: int, vocab: float,
                   act_bytes: int) -> dict[str, tuple[mem.Buffer, ...]]:
    """The last stage's kept outputs per phase (``memory.pipeline_kept_outputs``,
    ``memory.last_stage_outputs_bytes``): nothing without a pipeline or on other stages."""
    if pp <= 1 or not last:
        return {}
    one = mem.last_stage_outputs_bytes(tokens=tokens, hidden=hidden, vocab=vocab, act_bytes=act_bytes)
    return {phase: (mem.Buffer(name="last stage's kept outputs", bytes=int(n * one), phase=phase,
                               formula=f"{n} x w b s (V + 2h) (pipe_buffers['outputs'])"),)
            for phase, n in mem.pipeline_kept_outputs(last=True, grad_accum=grad_accum).items() if n}


def saved_activation_bytes(*, model, micro_batch: int, seq_len: int, precision: str = "bf16", attention: str = "sdpa",
                           recompute: str = "none", cpu: bool = False) -> float:
    """Bytes autograd saves for backward in one forward of ``model`` (no parallelism): what
    ``torch.autograd.graph.saved_tensors_hooks`` sees. ``estimate`` adds the pipeline's in-flight
    micro-batches and, under full recompute, the one layer being recomputed."""
    f = _model_facts(model)
    w = mem.param_bytes(precision)
    tokens = micro_batch * seq_len
    layer = mem.layer_activation_bytes(shape=_shape_at(f, seq_len=seq_len), tokens=tokens, seq_len=seq_len,
                                       act_bytes=w, attention=attention,
                                       recompute=recompute, fused_dropout=not cpu)
    first, last = mem.model_io_bytes(tokens=tokens, seq_len=seq_len, hidden=f.hidden, vocab=f.vocab, act_bytes=w,
                                     rmsnorm=f.shape.rmsnorm, dropout=f.shape.dropout, rotary=f.rotary,
                                     head_dim=f.head_dim, checkpointed_mask=_checkpointed_mask(f, attention, recompute))
    extra = _full_layer_extra_bytes(f, per_layer_bytes=layer, shape=_shape_at(f, seq_len=seq_len), tokens=tokens,
                                    seq_len=seq_len, act_bytes=w, attention=attention, recompute=recompute,
                                    fused_dropout=not cpu)
    return f.layers * layer - (f.layers - _sliding_layers_in(f, start=0, count=f.layers)) * extra + first + last
