"""The hardware catalog: GPUs, networks and the ``Cluster`` the estimator takes as input.

Every figure here is an input to the estimator, never a constant inside a formula: a user
overrides any field from a YAML/JSON file (``load_catalog``) or a flag (``GPU.replace``), and
``dstk doctor --calibrate`` writes measured ones.

Sources of the default figures:

- peaks, memory, links: vendor datasheets (dense, i.e. without 2:4 sparsity, tensor-core peaks;
  NVLink/Infinity Fabric per-GPU bandwidth as one direction = half the bidirectional figure the
  datasheets print; memory as ``nvidia-smi``/``rocm-smi`` report it);
- ``hbm_bytes_per_s``: the datasheet bandwidth x ``HBM_SUSTAINED`` (0.9: what STREAM-style copies
  sustain, Deakin et al. 2018, BabelStream);
- ``gemm_efficiency``: one curve per GPU type, ``roofline_curve`` of the datasheet peak and HBM
  bandwidth with the measured Maximum Achievable Matmul FLOPS as its asymptote (Bekman,
  ml-engineering ``compute/accelerator`` MAMF table, bf16 ``matmul``: A100 SXM 267.9 of 312
  TFLOP/s = 85.9%, H100 SXM 80.1%, H100/H200 SXM 80.3%, B200 77.6%, MI250X 76.7%, MI300X 60.1%;
  ``ASSUMED_MAMF`` = 0.75 for V100, A10, L40S and H100 PCIe, which the table lacks: for V100 between
  the published cuBLAS measurements, 0.66-0.90; none found for the others). Nothing in it is fitted to
  the published runs the time model is checked against (``benchmarks/estimate_published.py``);
- ``num_sms``: the SM count of the datasheet, for wave quantization (NVIDIA's Matrix Multiplication
  Background User's Guide counts waves of 108 tiles of 256 x 128 on A100); set for A100 only;
- ``flash_attention_efficiency`` / ``sdpa_attention_efficiency``: the published FlashAttention-2
  and cuDNN attention benchmarks (``ATTENTION_BENCHMARKS``: Dao 2023 Fig. 4 for A100, Shah et al.
  2024 Figs. 5-6 for H100), causal forward + backward at head dim 128 (``attention_curve``). H200
  takes H100's curves (the same sm90 die, clocks and 16-bit peak; attention at these lengths is
  bound by the tensor cores, not HBM), A100 40GB takes the 80GB's; other GPUs have no published
  curve (``FLASH_GEMM_SHARE`` of the GEMM curve). Head dim 64 runs 9-13% below 128 in forward +
  backward (Dao 2023 Figs. 4c/4d, 7c/7d: ``HEAD_DIM_64_SHARE``); SDPA handed an explicit mask
  (Falcon) runs a kernel that computes every block, at the published unmasked rates
  (``MASKED_SDPA_EFFICIENCY``);
- ``host_dram_bytes_per_s``: the CPU memory bandwidth of the node the GPU usually comes in
  (``NODE_HOST_DRAM``: DGX A100, DGX H100/H200), ``sockets x channels x MT/s x 8`` x a published
  STREAM triad share (``STREAM_TRIAD_FRACTION``); what offloaded optimizer steps share;
- ``Interconnect.efficiency`` of InfiniBand: ``IB_EFFICIENCY`` (the large-message bus bandwidth
  NCCL's maintainers state per NIC over the line rate, issues cited there);
- ``achievable_fraction``: the share of peak for a model known only by its parameter count (no
  GEMM shapes): Korthikanti et al. 2022 Table 5 measured 51-56% MFU on A100; Megatron/Llama-3
  reports give 38-45% on H100.

No torch here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

GiB = 2**30
GB = 10**9
TFLOP = 10**12


def _log_linear(points: tuple[tuple[float, float], ...], x: float) -> float:
    """A curve of ``(x, y)`` points sorted by ``x`` read at ``x``: linear in ``log x`` between
    points, clamped to the end points outside them."""
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0)) * (y1 - y0)
    return points[-1][1]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class GPU:
    """One accelerator (or one CPU rank, ``slug == "cpu"``)."""

    slug: str
    name: str
    memory_bytes: int
    """Device memory as the driver reports it."""
    bf16_flops: float | None
    """Dense bf16 peak, FLOP/s; None where the device has no bf16 tensor cores (V100)."""
    fp16_flops: float
    """Dense fp16 peak, FLOP/s."""
    fp32_flops: float
    """Dense fp32 peak (no TF32), FLOP/s."""
    intra_node_bytes_per_s: float
    """Per-GPU bandwidth to its node peers, one direction (NVLink, Infinity Fabric or PCIe)."""
    host_bytes_per_s: float
    """Per-GPU link to host memory (PCIe), one direction: what offload moves over."""
    achievable_fraction: float = 0.5
    """Share of peak FLOP/s a well-tuned transformer step reaches on this device: the time model's
    rate where it has no GEMM shapes (a model given by its parameter count) or no curve."""
    intra_node_efficiency: float = 0.8
    """Share of the link bandwidth NCCL's collectives reach (nccl-tests bus bandwidth)."""
    overhead_bytes: int = 2**30
    """Memory the framework takes before any tensor: CUDA context, cuBLAS/NCCL workspaces,
    allocator fragmentation (~0.5-1.5 GiB seen on A100/H100; an input, override it)."""
    hbm_bytes_per_s: float | None = None
    """Sustained device memory bandwidth, bytes/s (a streaming copy's, ~0.9 of the datasheet): what
    memory-bound operators (norms, elementwise, softmax, the optimizer step) run at. None: unknown
    (the time model then prices them at zero)."""
    host_dram_bytes_per_s: float | None = None
    """Sustained CPU memory (DRAM) bandwidth of the whole node this GPU usually comes in, all
    sockets, bytes/s (``NODE_HOST_DRAM``): what the node's ranks share when their CPU optimizer
    steps run at once under optimizer offload (``host_optimizer_seconds``). None: not known for
    this GPU's node; ``HOST_DRAM_FALLBACK_BYTES_PER_S`` is used."""
    gemm_efficiency: tuple[tuple[float, float], ...] | None = None
    """Share of the dense peak a matrix multiply reaches, as ``(dim, fraction)`` points sorted by
    ``dim``, the smallest of the GEMM's three dimensions (m, n, k); read log-linearly between
    points and clamped outside them (``gemm_fraction``). None: ``achievable_fraction`` for every
    GEMM."""
    num_sms: int | None = None
    """Streaming multiprocessors: how many output tiles of a GEMM run at once (one wave), what
    wave quantization counts (``dstk.estimate.steptime.wave_fraction``). None: not priced (the
    ``gemm_efficiency`` curve alone). A calibrated profile keeps it, its curve measured with the
    swept shapes' waves divided out (``dstk.calibrate.efficiency_curve``)."""
    layer_overhead_seconds: float = 0.0
    """Floor on one transformer layer's forward + backward per micro-batch, whatever its FLOPs and
    bytes: operator dispatch and kernel launches (~100 operators a layer). Negligible on a GPU
    at training sizes (launches are asynchronous and ~5 us each: 0 in the catalog); it is what a
    tiny model on a CPU rank spends its time on (measured for the ``cpu`` entry)."""
    step_overhead_seconds: float = 0.0
    """Fixed cost of one optimizer step beyond its layers, whatever the model's size: dispatching the
    embedding, head and loss, and the engine's own bookkeeping (measured at one micro-batch per step,
    so priced once per step). 0 in the catalog: negligible on a GPU, and the ``cpu`` entry folds it
    into ``layer_overhead_seconds``; ``dstk doctor --calibrate`` measures both."""
    zero_tensor_seconds: float = 0.0
    """ZeRO-1/2's own host work per parameter tensor and micro-batch, apart from communication:
    DeepSpeed 0.19.8's gradient hook per parameter (``stage_1_and_2.py``
    ``create_gradient_handling_hooks`` -> ``reduce_ready_partitions_and_remove_grads``) copying
    each gradient into the flat bucket and partition (``steptime.zero_overhead_seconds``). 0 in
    the catalog for GPUs (host Python beside asynchronous kernels at training sizes); measured
    for the ``cpu`` entry (``benchmarks/zero_dp1_cost.py --one-rank``); ``dstk doctor --calibrate``
    measures it on CPU ranks (``dstk.calibrate.fit_zero_tensor_seconds``)."""
    zero3_tensor_seconds: float = 0.0
    """ZeRO-3's own host work per parameter tensor and micro-batch, apart from its collectives:
    the module hooks' fetch/release bookkeeping (``parameter_offload.py``
    ``_register_deepspeed_module``: pre/post forward and backward hooks on every module;
    ``partitioned_param_coordinator.py`` ``fetch_sub_module``/``release_sub_module``), the
    partition/gather copies and the gradient hook per parameter; paid even over one
    data-parallel rank. 0 in the catalog for GPUs (see ``zero_tensor_seconds``); measured for
    the ``cpu`` entry, and by ``dstk doctor --calibrate`` on CPU ranks."""

    flash_attention_efficiency: tuple[tuple[float, float], ...] | None = None
    """Share of the dense 16-bit peak the FlashAttention-2 kernel (the ``flash-attn`` package, HF's
    ``flash_attention_2``; also torch SDPA's flash backend) reaches over one causal forward +
    backward, as ``(seq_len, fraction)`` points sorted by ``seq_len``, read log-linearly between
    points and clamped outside them (``attention_fraction``). FLOPs are counted as its authors count
    them (Dao 2023 §4.1): ``4 s^2 d h / 2`` forward under the causal mask, 2.5x that backward. From
    the published benchmarks (``ATTENTION_BENCHMARKS``, head dim 128). One rate for both passes: the
    forward alone runs faster (FlashAttention-2 causal on H100 at 8k: 333 TFLOP/s against 298 for
    forward + backward), so a full recompute's second forward is priced ~10% slow. None:
    ``FLASH_GEMM_SHARE`` of the ``gemm_efficiency`` curve at ``seq_len`` (no published figure for
    the GPU)."""
    sdpa_attention_efficiency: tuple[tuple[float, float], ...] | None = None
    """The same for the kernel torch's ``scaled_dot_product_attention`` picks on this GPU, where it
    is not FlashAttention-2: cuDNN's fused attention on sm90/sm100 (H100, H200, B200) with torch
    2.11+ (``check_prefer_cudnn_attention`` in ``aten/.../cuda/sdp_utils.cpp`` puts cuDNN first when
    the bundled cuDNN is above 9.15; older torch runs FlashAttention-2 there: set this to the
    flash curve in a ``--hardware`` file). None: ``flash_attention_efficiency``."""

    collective_latency_seconds: float = 10e-6
    """Fixed cost of one collective call inside the node, whatever its size (the alpha of
    ``alpha + bytes/bandwidth``): what many small buckets pay. NCCL over NVLink: nccl-tests'
    all-reduce of a few KiB takes ~6 us on 2 H100s with CUDA graphs (NVIDIA/nccl#1259) and 10-20 us
    on 8 GPUs without (NVIDIA/nccl-tests#68, #149 outputs): 10 us in the catalog. A CPU rank on gloo:
    measured (``dstk doctor --calibrate`` fits it from the all-reduce sweep)."""

    def __post_init__(self) -> None:
        if self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes: expected a positive size, got {self.memory_bytes!r}")
        for name in ("fp16_flops", "fp32_flops", "intra_node_bytes_per_s", "host_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected a positive number, got {getattr(self, name)!r}")
        if self.gemm_efficiency is not None:
            try:  # a bare number (gemm_efficiency: 0.5) or a ragged list: said below, not a TypeError
                points = tuple((float(d), float(f)) for d, f in self.gemm_efficiency)
            except (TypeError, ValueError):
                points = ()
            if not points or any(d <= 0 or not 0 < f <= 1 for d, f in points) \
                    or any(a[0] >= b[0] for a, b in zip(points, points[1:])):
                raise ValueError("gemm_efficiency: expected [dim, fraction] points with dim > 0 increasing "
                                 f"and fraction in (0, 1], got {self.gemm_efficiency!r}")
            object.__setattr__(self, "gemm_efficiency", points)
        for name in ("flash_attention_efficiency", "sdpa_attention_efficiency"):
            curve = getattr(self, name)
            if curve is None:
                continue
            try:
                points = tuple((float(s), float(f)) for s, f in curve)
            except (TypeError, ValueError):
                points = ()
            if not points or any(not 0 < s < math.inf or not 0 < f <= 1 for s, f in points) \
                    or any(a[0] >= b[0] for a, b in zip(points, points[1:])):
                raise ValueError(f"{name}: expected [seq_len, fraction] points with seq_len > 0 increasing "
                                 f"and fraction in (0, 1], got {curve!r}")
            object.__setattr__(self, name, points)
        for name in ("layer_overhead_seconds", "step_overhead_seconds", "collective_latency_seconds",
                     "zero_tensor_seconds", "zero3_tensor_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected a number >= 0, got {getattr(self, name)!r}")
        if self.num_sms is not None and (isinstance(self.num_sms, bool) or not isinstance(self.num_sms, int)
                                         or self.num_sms <= 0):
            raise ValueError(f"num_sms: expected a positive whole number, got {self.num_sms!r}")
        if self.hbm_bytes_per_s is not None and not self.hbm_bytes_per_s > 0:
            raise ValueError(f"hbm_bytes_per_s: expected a positive number, got {self.hbm_bytes_per_s!r}")
        if self.host_dram_bytes_per_s is not None and not 0 < self.host_dram_bytes_per_s < math.inf:
            raise ValueError(f"host_dram_bytes_per_s: expected a positive number, got {self.host_dram_bytes_per_s!r}")
        for name in ("achievable_fraction", "intra_node_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: expected a fraction in (0, 1], got {getattr(self, name)!r}")

    def gemm_fraction(self, dim: float) -> float:
        """Share of peak for a GEMM whose smallest dimension is ``dim`` (``gemm_efficiency``)."""
        if not self.gemm_efficiency:
            return self.achievable_fraction
        return _log_linear(self.gemm_efficiency, dim)

    def attention_fraction(self, *, kernel: str, seq_len: float, head_dim: float = 128) -> float:
        """Share of peak of the fused attention kernel ``kernel`` (``flash`` or ``sdpa``) over a
        causal forward + backward of ``seq_len``-long sequences, FLOPs counted as
        ``flash_attention_efficiency`` says: the ``sdpa_attention_efficiency`` curve for ``sdpa``
        where the catalog has one, else ``flash_attention_efficiency``, read log-linearly in
        ``seq_len`` and clamped at its ends, times the head-dim share (``HEAD_DIM_64_SHARE``: 1 at
        head dim 128 and above, the published head-dim-64 share at 64 and below, linear between);
        with neither curve, ``FLASH_GEMM_SHARE`` x ``gemm_fraction`` of ``seq_len`` (the rule before
        the published curves). ``sdpa_masked``: SDPA handed an explicit mask, every score block
        computed (``MASKED_SDPA_EFFICIENCY``, linear in head dim between its 64 and 128 curves)."""
        t = min(max((float(head_dim) - 64.0) / 64.0, 0.0), 1.0)
        if kernel == "sdpa_masked":
            curves = MASKED_SDPA_EFFICIENCY.get(self.slug)
            if not curves:
                return FLASH_GEMM_SHARE * self.gemm_fraction(seq_len)
            low, high = _log_linear(curves[64], seq_len), _log_linear(curves[128], seq_len)
            return low + (high - low) * t
        curve = self.flash_attention_efficiency
        if kernel == "sdpa" and self.sdpa_attention_efficiency:
            curve = self.sdpa_attention_efficiency
        if not curve:
            return FLASH_GEMM_SHARE * self.gemm_fraction(seq_len)
        share = HEAD_DIM_64_SHARE.get(self.slug)
        low = _log_linear(share, seq_len) if share else 1.0
        return _log_linear(curve, seq_len) * (low + (1.0 - low) * t)

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; bf16 falls back to fp16 where bf16 is missing
        (V100 runs bf16 through the fp32 path in reality: use fp16 there)."""
        if precision == "fp32":
            return self.fp32_flops
        if precision == "bf16":
            return self.bf16_flops if self.bf16_flops is not None else self.fp32_flops
        return self.fp16_flops

    def replace(self, **changes: Any) -> "GPU":
        return dataclasses.replace(self, **changes)

    @property
    def is_cpu(self) -> bool:
        return self.slug == "cpu"


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Interconnect:
    """The network between nodes."""

    slug: str
    name: str
    node_bytes_per_s: float
    """Bandwidth out of one node, one direction, summed over its NICs."""
    latency_s: float = 5e-6
    """Per-message latency (alpha term)."""
    efficiency: float = 0.8
    """Share of the line rate collectives reach."""
    collective_latency_seconds: float = 25e-6
    """Fixed cost of one collective call across nodes (``GPU.collective_latency_seconds`` inside
    one): NCCL's own tuning model puts a 4-8 KiB all-reduce between H100 nodes over InfiniBand at
    25.9 us (NCCL_DEBUG output in NVIDIA/nccl#1453); 25 us for InfiniBand, more for TCP. On GPUs it
    is a floor: a call over many nodes costs what NCCL's model says for its ring or tree
    (``dstk.estimate.steptime.collective_latency``: ~2-5 ms for a ring over 128 nodes); a
    pipeline send pays this figure."""

    def __post_init__(self) -> None:
        if not self.node_bytes_per_s > 0:
            raise ValueError(f"node_bytes_per_s: expected a positive number, got {self.node_bytes_per_s!r}")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency: expected a fraction in (0, 1], got {self.efficiency!r}")
        if not self.collective_latency_seconds >= 0:
            raise ValueError("collective_latency_seconds: expected a number >= 0, got "
                             f"{self.collective_latency_seconds!r}")


GEMM_DIMS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
"""Smallest GEMM dimensions at which the catalog's curves are tabulated."""

HBM_SUSTAINED = 0.9
"""Share of the datasheet HBM bandwidth a streaming kernel sustains (BabelStream/STREAM-style
copies reach ~88-92% on A100/H100/MI250X, Deakin et al. 2018, and vendors' own STREAM figures)."""


def roofline_curve(*, peak_tflops: float, hbm_gbps: float, mamf: float,
                   dims: tuple[int, ...] = GEMM_DIMS) -> tuple[tuple[float, float], ...]:
    """``(dim, fraction)`` points of a GEMM efficiency curve from three published figures: the
    dense peak, the sustained HBM bandwidth ``B`` and the Maximum Achievable Matmul FLOPS share
    ``mamf`` (the best large-GEMM rate, measured). A GEMM whose smallest dimension is ``d`` does
    ``2 m n k`` FLOPs over at least ``~2 m n`` bytes (the two large operands' product, in 16-bit),
    so it needs ``2mnk / (mamf P)`` seconds of math and ``2mn / B`` of memory; adding the two
    (a roofline with no overlap at the knee, Williams et al. 2009) gives
    ``fraction(d) = mamf * d / (d + mamf * P / B)``: half the asymptote at ``d = mamf P/B``
    (131 on A100-80GB, 210 on H100 SXM)."""
    knee = mamf * peak_tflops * 1e12 / (hbm_gbps * 1e9 * HBM_SUSTAINED)
    return tuple((float(d), round(mamf * d / (d + knee), 4)) for d in dims)


ASSUMED_MAMF = 0.75
"""The large-GEMM asymptote (``roofline_curve``'s ``mamf``) of the GPUs Bekman's MAMF table lacks: V100,
A10, L40S, H100 PCIe. An assumption, bracketed for V100 by the published fp16 measurements: cuBLAS
(CUDA 9) "up to 83 Tflops/s ... on a Tesla V100" of 125 = 0.66 (Markidis et al. 2018, "NVIDIA Tensor
Core Programmability, Performance & Precision", IPDPSW, abstract), and a V100 PCIe's cuBLAS/cublasLt
8192^3 HGEMM at ~101 of its 112 TFLOP/s = 0.90 (NVIDIA developer forum, "Understanding IPC and issue
slot utilization when using Tensor Cores", 2019, a user's measurement); end to end, Megatron-LM's 1.2B
on one DGX-2H V100 sustains 62.4 TFLOP/s, 48% of 130, recompute and memory-bound work included
(NVIDIA ADLR, "MegatronLM's Supercharged V1.0"), so its GEMMs average above 0.48 at h = 1536. Priced
as that run, 0.75 gives 1.44 s an iteration against its 1.288 (``benchmarks/estimate_published.py``,
not fitted); 0.66 would give more. No published large-GEMM rate was found for A10, L40S or H100 PCIe."""

FLASH_GEMM_SHARE = 0.75
"""A fused attention kernel's rate as a share of the ``gemm_efficiency`` curve at its sequence
length, where the catalog has no published curve for the GPU: FlashAttention-2 reaches 50-73% of
A100's peak forward (Dao 2023, abstract) where cuBLAS reaches ~86% (Bekman's MAMF). Optimistic for
a causal training step: on A100 and H100 the published causal forward + backward is 0.32-0.61 and
0.15-0.31 of peak (``ATTENTION_BENCHMARKS``)."""

ATTENTION_SEQ_LENS: tuple[int, ...] = (512, 1024, 2048, 4096, 8192, 16384)
"""Sequence lengths of the FlashAttention benchmarks (batch x length = 16k tokens, hidden 2048)."""

ATTENTION_BENCHMARKS: dict[str, dict[str, tuple[float, ...]]] = {
    # H100 SXM5, FP16, head dim 128: Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608) Fig. 5
    # (forward, without / with causal mask) and Fig. 6 (backward, without causal mask), values as
    # printed on the bars, at ATTENTION_SEQ_LENS. Their FlashAttention-2 bars reproduce the
    # FlashAttention-2 paper's "up to 335 TFLOPs/s" forward + backward on H100 (Dao 2023 §4.1,
    # Fig. 7): 3.5 / (1/370 + 2.5/322) = 334 at 16k without the mask.
    "h100-fa2": {"forward_causal": (191, 260, 298, 319, 333, 335), "forward": (309, 350, 362, 368, 370, 370),
                 "backward": (214, 260, 291, 310, 318, 322)},
    "h100-cudnn": {"forward_causal": (315, 410, 484, 518, 529, 539), "forward": (497, 574, 617, 609, 600, 595),
                   "backward": (305, 408, 465, 499, 518, 516)},
    # A100 80GB SXM4, FP16, forward + backward: Dao 2023 (FlashAttention-2, arXiv 2307.08691) Fig. 4,
    # the numbers printed on the bars, read from the figure as the flash-attention repository ships it
    # (Dao-AILab/flash-attention ``assets/flash2_a100_fwd_bwd_benchmark.png``, the README's A100
    # benchmark; read 3 December 2026). FlashAttention-2 with the causal mask, head dim 128 (Fig. 4d)
    # and 64 (Fig. 4c); "xformers" (its cutlass kernel, the one torch's memory-efficient SDPA backend
    # is built from) without the mask, head dim 128 (Fig. 4b) and 64 (Fig. 4a): what a kernel that
    # computes every score block runs at (``MASKED_SDPA_EFFICIENCY``).
    "a100-fa2": {"forward_backward_causal": (99, 133, 155, 173, 182, 189)},
    "a100-fa2-hd64": {"forward_backward_causal": (88, 119, 140, 156, 165, 171)},
    "a100-xformers": {"forward_backward": (83, 91, 95, 96, 97, 98)},
    "a100-xformers-hd64": {"forward_backward": (68, 73, 76, 77, 75, 75)},
    # H100 80GB SXM5, FP16, forward + backward, FlashAttention-2: Dao 2023 Fig. 7 (the repository's
    # ``assets/flash2_h100_fwd_bwd_benchmark.png``): with the causal mask, head dim 128 (7d) and 64
    # (7c); without it, 128 (7b) and 64 (7a). Used for the head-dim-64 share on sm90
    # (``HEAD_DIM_64_SHARE``, ``MASKED_SDPA_EFFICIENCY``); the hd-128 curves stay the FlashAttention-3
    # paper's above (a later FlashAttention-2 release; 7d runs 3-12% above that derived curve, whose
    # causal backward is an assumption: 163/265/294/308/328 against 145/254/281/298/303).
    "h100-fa2-fig7": {"forward_backward_causal": (163, 221, 265, 294, 308, 328)},
    "h100-fa2-fig7-hd64": {"forward_backward_causal": (141, 192, 232, 257, 273, 284)},
    "h100-fa2-fig7-nomask": {"forward_backward": (248, 294, 320, 326, 335, 338)},
    "h100-fa2-fig7-nomask-hd64": {"forward_backward": (215, 254, 274, 288, 294, 296)},
}
"""Published TFLOP/s of fused attention kernels (FLOPs as ``GPU.flash_attention_efficiency``
counts them), the figures the catalog's attention curves come from (``attention_curve``)."""


def attention_curve(*, peak_tflops: float, forward_causal: tuple[float, ...] = (), forward: tuple[float, ...] = (),
                    backward: tuple[float, ...] = (), forward_backward_causal: tuple[float, ...] = (),
                    forward_backward: tuple[float, ...] = (),
                    seq_lens: tuple[int, ...] = ATTENTION_SEQ_LENS) -> tuple[tuple[float, float], ...]:
    """``(seq_len, fraction)`` points of a causal forward + backward from published per-length
    TFLOP/s: ``forward_backward_causal`` as it is, or the causal forward ``F_c`` and the
    backward, which the benchmarks give without the mask only (``B``): the causal backward is taken
    as ``B F_c / F`` (the mask costing backward the share it costs forward; on A100 the forward +
    backward with/without the mask is 0.66 at 512 and 0.93 at 16k, Dao 2023 Fig. 4b/4d, the H100
    forward's 0.62 and 0.91), and forward + backward runs ``3.5 / (1/F_c + 2.5/B_c)``: the
    forward's FLOPs at its rate, the backward's 2.5x at its own. Divided by ``peak_tflops``.

    Without the mask (every score block computed, ``MASKED_SDPA_EFFICIENCY``): ``forward_backward``
    as it is, or ``3.5 / (1/F + 2.5/B)`` from the plain forward and backward."""
    if forward_backward_causal or forward_backward:
        rates = forward_backward_causal or forward_backward
    elif not forward_causal:
        rates = tuple(3.5 / (1.0 / f + 2.5 / b) for f, b in zip(forward, backward))
    else:
        rates = tuple(3.5 / (1.0 / fc + 2.5 / (b * fc / f)) for fc, f, b in zip(forward_causal, forward, backward))
    return tuple((float(s), round(r / peak_tflops, 4)) for s, r in zip(seq_lens, rates))


_H100_FLASH = attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-fa2"])
_H100_CUDNN = attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-cudnn"])
_A100_FLASH = attention_curve(peak_tflops=312, **ATTENTION_BENCHMARKS["a100-fa2"])


def _share(numerator: tuple[tuple[float, float], ...], denominator: tuple[tuple[float, float], ...],
           ) -> tuple[tuple[float, float], ...]:
    """Point by point ratio of two curves at the same lengths."""
    return tuple((s, round(a / b, 4)) for (s, a), (_, b) in zip(numerator, denominator))


_H100_FA2_HD64_SHARE = _share(attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-fa2-fig7-hd64"]),
                              attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-fa2-fig7"]))
HEAD_DIM_64_SHARE: dict[str, tuple[tuple[float, float], ...]] = {
    "a100-40gb": _share(attention_curve(peak_tflops=312, **ATTENTION_BENCHMARKS["a100-fa2-hd64"]), _A100_FLASH),
    "a100-80gb": _share(attention_curve(peak_tflops=312, **ATTENTION_BENCHMARKS["a100-fa2-hd64"]), _A100_FLASH),
    "h100-sxm": _H100_FA2_HD64_SHARE,
    "h200": _H100_FA2_HD64_SHARE,
}
"""A causal fused kernel's rate at head dim 64 over its rate at 128, per sequence length: the
published FlashAttention-2 forward + backward pairs (A100: Dao 2023 Fig. 4c over 4d, 0.89 at 512,
0.90 at 16k; H100: Fig. 7c over 7d, 0.87-0.89). With fewer FLOPs per score a head-dim-64 block
spends a larger share on the softmax and on loading tiles. Applied to both the ``flash`` and the
``sdpa`` curves (H100's cuDNN has no published causal head-dim-64 forward + backward: the
FlashAttention-2 share is assumed). ``GPU.attention_fraction`` reads it linearly in head dim between
64 and 128 (80 and 96, GPT-NeoX/Pythia and Phi-3: between, an assumption) and clamps outside: 32
runs at 64's share, 256 (Gemma) at 128's rate (Dao 2023 publishes no other head dim). Keyed by the
catalog slug: a ``--hardware`` profile's curves for these GPUs keep the share; a GPU of another
slug runs every head dim at its curve's rate."""

_H100_CUDNN_NOMASK = attention_curve(peak_tflops=989, forward=ATTENTION_BENCHMARKS["h100-cudnn"]["forward"],
                                     backward=ATTENTION_BENCHMARKS["h100-cudnn"]["backward"])
_H100_MASKED = {
    128: _H100_CUDNN_NOMASK,
    64: tuple((s, round(f * r, 4)) for (s, f), (_, r) in zip(_H100_CUDNN_NOMASK, _share(
        attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-fa2-fig7-nomask-hd64"]),
        attention_curve(peak_tflops=989, **ATTENTION_BENCHMARKS["h100-fa2-fig7-nomask"])))),
}
_A100_MASKED = {128: attention_curve(peak_tflops=312, **ATTENTION_BENCHMARKS["a100-xformers"]),
                64: attention_curve(peak_tflops=312, **ATTENTION_BENCHMARKS["a100-xformers-hd64"])}
MASKED_SDPA_EFFICIENCY: dict[str, dict[int, tuple[tuple[float, float], ...]]] = {
    "a100-40gb": _A100_MASKED, "a100-80gb": _A100_MASKED, "h100-sxm": _H100_MASKED, "h200": _H100_MASKED}
"""Share of peak, by head dim, of the kernel torch's SDPA runs when it is handed an explicit
``attn_mask`` (transformers' Falcon always builds one: ``FalconModel`` calls ``create_causal_mask``
with ``allow_is_causal_skip=False``, and ``sdpa_attention_forward`` then passes ``is_causal=False``).
FlashAttention-2 refuses a mask (``check_for_attn_mask`` in ``aten/.../sdp_utils_cpp.h``), so sm80
runs the memory-efficient kernel (xformers' cutlass kernel; torch 2.13's default priority is flash,
efficient, math, cuDNN: ``sdp_priority_order`` in ``ATen/Context.h``), and
sm90 with torch 2.11+ cuDNN, which takes a mask (``can_use_cudnn_attention`` checks only its shape,
``check_attn_mask_shape``). Neither is told the bias is causal (``is_causal=False``), so neither
skips the blocks above the diagonal (read from their interfaces, not measured on a GPU here):
every score block runs, at the published rates *without* the causal mask, on the
full ``4 s^2 d h`` forward FLOPs. A100: Dao 2023 Fig. 4b/4a, xformers' bars; H100/H200: cuDNN's
forward and backward without the mask (Shah et al. 2024 Figs. 5-6) at head dim 128, times
FlashAttention-2's head-dim-64 share without the mask (Dao 2023 Fig. 7a over 7b) at 64 (an
assumption). The bias tile each block reads (``b s^2 w`` a head, from L2 when heads share it) is
not priced beyond what these rates include: none, as the benchmarks ran without one. Other GPUs:
``FLASH_GEMM_SHARE`` of the GEMM curve, on the full FLOPs."""


def dram_peak_bytes_per_s(*, sockets: int, channels_per_socket: int, mega_transfers_per_s: float) -> float:
    """Peak DRAM bandwidth of a node: ``sockets x channels per socket x MT/s x 8`` bytes (a 64-bit
    DDR4 channel, or DDR5's two 32-bit subchannels, moves 8 bytes a transfer)."""
    return sockets * channels_per_socket * mega_transfers_per_s * 1e6 * 8


STREAM_TRIAD_FRACTION = {"xeon-8480": 372.228 * GiB / 614.4e9, "epyc-7742": 206.751 * GiB / 409.6e9,
                         "xeon-e5-v4": 89.076 * GiB / 153.6e9}
"""STREAM triad over the DRAM peak, two-socket nodes with all cores (one MPI rank a core), as
published in simon-r/My_Stream_Benchmark ``RESULTS.md`` (commit 11d386cd), whose "GB/s" are GiB/s
(``src/my_stream_MPI.c`` divides by 1024^3) and whose triad ``d = s a + b`` counts 3 words an
element: 2 x Xeon Platinum 8480+ 372.2 GiB/s = 399.7 GB/s of 614.4 (8 x DDR5-4800 a socket) =
0.65; 2 x EPYC 7742 206.8 GiB/s = 222.0 GB/s of 409.6 (8 x DDR4-3200 a socket) = 0.54; 2 x Xeon
E5-2695 v4 (Broadwell-EP) 89.1 GiB/s = 95.6 GB/s of 153.6 (4 x DDR4-2400 a socket, the part's top
speed) = 0.62. The DIMM population is not stated. A node of a newer CPU of the same platform takes
its predecessor's share (Emerald Rapids the Sapphire Rapids 8480's, Zen 3 EPYC the Zen 2 7742's).
A conservative figure for CPU Adam: the triad's ordinary stores to a third array also read each
line first (write-allocate, not in STREAM's count), while CPU Adam
writes only lines it has just read, so it can move up to 4/3 of these bytes per second
(``benchmarks/cpu_adam.py`` on the project's machine: 1.06-1.97x faster than a triad's count
predicts, medians of three loaded runs; docs/estimate.md "Offloaded optimizer step")."""

NODE_HOST_DRAM: dict[str, float] = {
    # DGX A100 (and HGX A100 boards built like it): 2 x AMD EPYC 7742, 8 x DDR4-3200 a socket.
    "a100-40gb": dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=3200)
    * STREAM_TRIAD_FRACTION["epyc-7742"],
    "a100-80gb": dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=3200)
    * STREAM_TRIAD_FRACTION["epyc-7742"],
    # DGX H100 and DGX H200: 2 x Intel Xeon Platinum 8480C, 2 TB as 32 x 64 GB DDR5-4800 RDIMMs (Micron
    # MTC40F2046S1RC48BA1: NVIDIA's own MLPerf Inference v4.1 system descriptions, mlcommons/
    # inference_results_v4.1 closed/NVIDIA/systems/DGX-H100_H100-SXM-80GBx8_TRT.json and
    # H200-SXM-141GBx8_TRT_MaxQ.json): 2 DIMMs on each of 8 channels a socket, which 4th-gen Xeon runs at
    # DDR5-4400 (4800 with one a channel: Dell InfoHub, "Memory Bandwidth for Next-Gen PowerEdge
    # Servers ... Sapphire Rapids", 2023: "4800MTS (1DPC)/4400MTS(2DPC)").
    "h100-sxm": dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=4400)
    * STREAM_TRIAD_FRACTION["xeon-8480"],
    "h200": dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=4400)
    * STREAM_TRIAD_FRACTION["xeon-8480"],
    # DGX-1 (V100): 2 x Intel Xeon E5-2698 v4 (4 channels a socket), 512 GB of DDR4-2133 (NVIDIA's
    # DGX-1 datasheet). The 16-GPU DGX-2 (2 x Xeon Platinum 8168, 6 x DDR4-2666 a socket) is not the
    # catalog's 8-GPU node.
    "v100-32gb": dram_peak_bytes_per_s(sockets=2, channels_per_socket=4, mega_transfers_per_s=2133)
    * STREAM_TRIAD_FRACTION["xeon-e5-v4"],
    # DGX B200: 2 x Intel Xeon Platinum 8570, 2 TB on 32 DIMMs (NVIDIA DGX B200 User Guide, "Hardware
    # Overview"): 2 DIMMs on each of 8 channels a socket, where Intel rates 5th-gen Xeon at DDR5-4400
    # (5600 with one DIMM a channel).
    "b200": dram_peak_bytes_per_s(sockets=2, channels_per_socket=8, mega_transfers_per_s=4400)
    * STREAM_TRIAD_FRACTION["xeon-8480"],
    # HPE Cray EX235a (Frontier / Crusher, 8 GCDs a node, OLCF's system guides): 1 x AMD EPYC 7A53
    # "Trento" (Zen 3), 512 GB of DDR4-3200 on 8 channels (OLCF: 205 GB/s peak).
    "mi250x": dram_peak_bytes_per_s(sockets=1, channels_per_socket=8, mega_transfers_per_s=3200)
    * STREAM_TRIAD_FRACTION["epyc-7742"],
    # The project's 2-core machine: torch triads of `benchmarks/cpu_adam.py` and its earlier
    # versions, 15-70 GB/s over nine runs at load 3-8 (other sessions' tests running); the cpu
    # entry's streaming figure (hbm_bytes_per_s), as the ranks and their host are one memory.
    "cpu": 35 * GB,
}
"""Sustained DRAM bandwidth of the node each GPU usually comes in (``GPU.host_dram_bytes_per_s``):
``dram_peak_bytes_per_s x STREAM_TRIAD_FRACTION``, for GPUs with a vendor reference node (DGX-1,
DGX A100, DGX H100/H200, DGX B200, HPE Cray EX235a). GPUs sold in many different servers (A10,
L40S, H100 PCIe, and MI300X, whose 8-GPU platform AMD ships to server makers without a host of its
own) have none: ``HOST_DRAM_FALLBACK_BYTES_PER_S``, and the estimate says so
(``host_optimizer_note``); set ``host_dram_gbps`` in a ``--hardware`` file for your node."""

HOST_DRAM_NODES = {"a100-40gb": "DGX A100", "a100-80gb": "DGX A100", "h100-sxm": "DGX H100", "h200": "DGX H200",
                   "v100-32gb": "DGX-1", "b200": "DGX B200", "mi250x": "HPE Cray EX235a", "cpu": "this machine"}
"""The reference node behind each ``NODE_HOST_DRAM`` row, named in the estimate's note."""

HOST_DRAM_FALLBACK_BYTES_PER_S = NODE_HOST_DRAM["a100-80gb"]
"""Where the node is not known: the DGX A100's 222.0 GB/s, the least of the catalog's 8-GPU nodes."""

CPU_ADAM_BYTES_PER_PARAM = 28
"""DRAM bytes per parameter of DeepSpeed's CPU Adam (``csrc/includes/cpu_adam.h``
``Step_AVX``, fp32 parameters and states): it loads the gradient, ``exp_avg``, ``exp_avg_sq`` and
the parameter (16) and stores the last three (12), in place, with ordinary stores to lines it has
just read (no extra read for ownership)."""


GRADIENT_CLIPPING_DEFAULT = 1.0
"""DeepSpeed 0.19.8's ``gradient_clipping`` where a config leaves it out (``runtime/constants.py``
``GRADIENT_CLIPPING_DEFAULT``: clipping on, at 1.0), and dstk's own default (``--grad-clip``)."""


def host_unscale_runs(*, zero_stage: int, precision: str, gradient_clipping: float = GRADIENT_CLIPPING_DEFAULT,
                      loss_scale: float = 0.0) -> bool:
    """Whether DeepSpeed 0.19.8's offloaded step rescales the fp32 CPU gradient partition before the
    CPU optimizer (``unscale_and_clip_grads``: ``grad.mul_(1 / combined_scale)``, read 4, write 4):

    - ZeRO-3 (``stage3.py``): always; its ``unscale_and_clip_grads`` has no early return, so it
      multiplies by 1 / 1 in bf16 with clipping off;
    - ZeRO-1/2 (``stage_1_and_2.py``): unless ``clip_grad == 0.0 and loss_scale == 1.0``. The loss
      scale is 1 in bf16 and fp32 (``fp16/loss_scaler.py`` ``CreateLossScaler``: a static scaler of
      1.0 for every dtype but fp16); in fp16 it is ``fp16.loss_scale``, or ``2^initial_scale_power``
      (65536 at first) where that is 0, dynamic, the default. So bf16/fp32 with ``gradient_clipping``
      0 skip it, and fp16 skips it only with a static loss scale of 1 and clipping 0.

    ``loss_scale``: the config's ``fp16.loss_scale`` (0: dynamic); read in fp16 only."""
    if zero_stage >= 3:
        return True
    scale = loss_scale if precision == "fp16" else 1.0  # 0 (dynamic) starts at 2^16: never 1 here
    return gradient_clipping > 0 or scale != 1.0


def host_overflow_check_bytes_per_param(*, zero_stage: int, precision: str) -> float:
    """Host DRAM bytes per parameter of the overflow check before an offloaded step (DeepSpeed 0.19.8):

    - ZeRO-3 in fp16 only (``_overflow_check_and_loss_scale_update`` calls ``check_overflow`` when
      ``self.dtype == torch.float16``; bf16's ``check_grad_overflow`` is not read there).
      ``has_overflow`` runs ``torch.isinf(buf).any()`` and ``torch.isnan(buf).any()`` on
      ``grad_partitions_flat_buffer``, which lives on the host under offload (``self.device`` is
      cpu) in the gradient accumulation dtype (the model's, g = 2 B, unless
      ``data_types.grad_accum_dtype`` says otherwise). torch 2.13 runs ``isinf`` as ``abs`` then
      ``eq`` and ``isnan`` as ``ne`` (its profiler lists ``aten::abs``, ``aten::eq``, ``aten::ne``):
      abs reads g and writes g, eq and ne each read g and write a 1-byte mask, the two ``any``
      read 1 each: 4 g + 4 = 12 B. A floor: ``abs``, ``eq`` and ``ne`` allocate their outputs, and
      fresh host pages fault in far below DRAM speed; ``benchmarks/cpu_adam.py``'s ``z3 fp16``
      step ran 2.5-7x slower than its 54 B predict on the project's machine (``abs`` of 50M fp32
      into a new tensor 172 ms, into an existing one 23 ms), where the other steps are within
      0.6-2x. Not priced beyond the bytes: no node measurement.
    - ZeRO-1/2: nothing on the host. ``local_overflow`` is set on the GPU gradient of each
      parameter as it is copied down (``update_offload_overflow_tracker_for_param_grad``:
      ``has_inf_or_nan``, an ``amax`` and an ``amin`` on the GPU), and only a flag is all-reduced.

    The gradient norm is not taken on the host either: both stages take each parameter's norm on
    the GPU (``set_norm_for_param_grad_in_gpu``; ZeRO-3's ``_constant_buffered_norm2`` of the
    partition moved back to the GPU) and add them up with one ``.item()`` a parameter
    (``complete_grad_norm_calculation_for_cpu_offload``); those GPU reads are not priced."""
    return 4 * 2 + 4.0 if zero_stage >= 3 and precision == "fp16" else 0.0


def host_optimizer_bytes_per_param(*, optimizer: str, precision: str, zero_stage: int,
                                   gradient_clipping: float = GRADIENT_CLIPPING_DEFAULT,
                                   loss_scale: float = 0.0) -> float:
    """DRAM bytes per parameter of one offloaded optimizer step on the host, as DeepSpeed 0.19.8
    runs it (``stage_1_and_2.py`` ``step`` under ``cpu_offload``; ``stage3.py`` ``step``):

    - the overflow check, ZeRO-3 in fp16 only: 12 (``host_overflow_check_bytes_per_param``);
    - ``unscale_and_clip_grads`` on the fp32 CPU gradient, read 4 and write 4, where it runs
      (``host_unscale_runs``: always under ZeRO-3; under ZeRO-1/2 unless clipping is 0 and the loss
      scale 1);
    - the CPU optimizer: Adam 28 (``CPU_ADAM_BYTES_PER_PARAM``); a one-state optimizer
      (Lion, SGD with momentum) reads and writes one state less, 20;
    - the fp32 master copied into the 16-bit buffer (``bit16_partition_buffer.data.copy_``;
      ZeRO-3's ``fp16_partitioned_groups_flat[...].copy_`` converts on the host before the
      transfer): read 4, write ``w`` (2, or 4 in fp32 training).

    Adam: bf16 42 (34 under ZeRO-1/2 with ``gradient_clipping`` 0); fp16 42 under ZeRO-1/2 and 54
    under ZeRO-3."""
    states = {"adamw": 2, "adam": 2, "sgd": 1, "lion": 1, "adafactor": 1}.get(optimizer, 2)
    update = 4 * (2 + states) + 4 * (1 + states)
    cast = 4 + (4 if precision == "fp32" else 2)
    unscale = host_unscale_runs(zero_stage=zero_stage, precision=precision, gradient_clipping=gradient_clipping,
                                loss_scale=loss_scale)
    return ((8.0 if unscale else 0.0) + update + cast
            + host_overflow_check_bytes_per_param(zero_stage=zero_stage, precision=precision))


def host_optimizer_seconds(*, params_per_rank: float, ranks_per_node: int, host_dram_bytes_per_s: float,
                           bytes_per_param: float) -> float:
    """Seconds of the offloaded optimizer step: every rank of a node steps its shard at the same
    moment (the end of the step), and the CPU optimizer is bound by DRAM bandwidth (AVX512/AVX2 over
    OpenMP threads, a few FLOPs per 28-42 bytes), so the ranks share the node's bandwidth:
    ``params_per_rank x bytes_per_param x ranks_per_node / host_dram_bytes_per_s``.
    ``benchmarks/cpu_adam.py`` checks it against DeepSpeed's CPU Adam with 1 and 2 processes.

    Not priced, for want of a source that measures them (``host_optimizer_note`` says so):
    threads and NUMA. DeepSpeed's runner sets ``OMP_NUM_THREADS`` (to cores / ranks, with a
    ``numactl`` binding) only under ``--bind_cores_to_rank`` (``launcher/launch.py``); without it
    each rank's ``#pragma omp parallel for`` (``csrc/includes/cpu_adam.h``) runs torch's default
    of one thread a physical core, so 8 ranks stepping at once put 8 threads on each core, and
    unbound threads read the other socket's memory half the time. torchrun sets
    ``OMP_NUM_THREADS=1`` where it starts more than one process a node (``torch/distributed/run.py``):
    one core a rank, which may not reach the node's bandwidth."""
    return params_per_rank * bytes_per_param * ranks_per_node / host_dram_bytes_per_s


def host_optimizer_note(*, cluster: "Cluster") -> str | None:
    """One line for an offloaded step's why lines and notes: which node bandwidth the CPU optimizer
    step was priced at (the reference node's, a ``--hardware`` file's, or the fallback, assumed),
    and that a default ``deepspeed`` launch oversubscribes the node's cores (not priced), with the
    fix. None for CPU ranks (their host is the machine the catalog measured)."""
    gpu = cluster.gpu
    if gpu.is_cpu:
        return None
    bw, own, ranks = cluster.host_dram_bytes_per_s, gpu.host_dram_bytes_per_s, cluster.gpus_per_node
    if own is None:
        head = (f"CPU optimizer step priced at an assumed {bw / GB:.0f} GB/s of node DRAM (a DGX A100's): "
                f"no reference node for the {gpu.name}; set gpus.{gpu.slug}.host_dram_gbps in a --hardware file")
    elif own == NODE_HOST_DRAM.get(gpu.slug) and gpu.slug in HOST_DRAM_NODES:
        head = (f"CPU optimizer step priced at the {HOST_DRAM_NODES[gpu.slug]}'s {bw / GB:.0f} GB/s of DRAM "
                f"(STREAM triad share of its channels' peak)" + (f", shared by its {ranks} ranks" if ranks > 1 else ""))
    else:
        head = f"CPU optimizer step priced at the --hardware file's {bw / GB:.0f} GB/s of node DRAM"
    if ranks < 2:
        return head
    return (f"{head}; a `deepspeed` launch without --bind_cores_to_rank leaves OMP_NUM_THREADS unset, so each "
            f"rank's CPU Adam runs a thread on every core, {ranks} threads a core at the step (not priced); "
            f"fix: dstk launch --env OMP_NUM_THREADS=<physical cores / {ranks}>")


def _gpu(slug, name, mem_gib, bf16, fp16, fp32, link_gb, host_gb, frac=0.5, link_eff=0.8, overhead_gib=1.0,
         hbm_gb=None, mamf=None, sms=None, flash=None, sdpa=None):
    curve = None
    if hbm_gb is not None and mamf is not None:
        curve = roofline_curve(peak_tflops=bf16 if bf16 is not None else fp16, hbm_gbps=hbm_gb, mamf=mamf)
    return GPU(slug=slug, name=name, memory_bytes=int(mem_gib * GiB), bf16_flops=None if bf16 is None else bf16 * TFLOP,
               fp16_flops=fp16 * TFLOP, fp32_flops=fp32 * TFLOP, intra_node_bytes_per_s=link_gb * GB,
               host_bytes_per_s=host_gb * GB, achievable_fraction=frac, intra_node_efficiency=link_eff,
               overhead_bytes=int(overhead_gib * GiB),
               hbm_bytes_per_s=None if hbm_gb is None else hbm_gb * GB * HBM_SUSTAINED, gemm_efficiency=curve,
               num_sms=sms, flash_attention_efficiency=flash, sdpa_attention_efficiency=sdpa,
               host_dram_bytes_per_s=NODE_HOST_DRAM.get(slug))


# hbm_gb: datasheet bandwidth (GB/s); mamf: Bekman's MAMF table (ml-engineering, compute/accelerator,
# bf16 matmul: A100 SXM 85.9%, H100 SXM 80.1%, H100/H200 SXM 80.3%, B200 77.6%, MI250X 76.7%,
# MI300X 60.1%); where the table has no row (V100, A10, L40S, H100 PCIe) ASSUMED_MAMF (0.75, bracketed for
# V100 by published measurements; none found for the other three: see its docstring).
# sms: the A100's 108 SMs, the wave NVIDIA's Matrix Multiplication Background User's Guide
# ("Wave quantization") counts with 256 x 128 tiles; the other GPUs' waves are not priced (None).
# flash / sdpa: the attention curves of ATTENTION_BENCHMARKS (A100: FlashAttention-2 for both, torch's
# SDPA runs its flash backend on sm80; H100/H200: FlashAttention-2, and cuDNN for SDPA on torch 2.11+).
GPUS: dict[str, GPU] = {g.slug: g for g in (
    _gpu("v100-32gb", "NVIDIA V100 SXM2 32GB", 32, None, 125, 15.7, 150, 16, frac=0.45, hbm_gb=900,
         mamf=ASSUMED_MAMF),
    _gpu("a10", "NVIDIA A10 24GB", 22.5, 125, 125, 31.2, 32, 32, frac=0.4, link_eff=0.7, hbm_gb=600,
         mamf=ASSUMED_MAMF),
    _gpu("l40s", "NVIDIA L40S 48GB", 45, 362, 362, 91.6, 32, 32, frac=0.4, link_eff=0.7, hbm_gb=864,
         mamf=ASSUMED_MAMF),
    _gpu("a100-40gb", "NVIDIA A100 SXM4 40GB", 40, 312, 312, 19.5, 300, 32, frac=0.55, hbm_gb=1555, mamf=0.859,
         sms=108, flash=_A100_FLASH),
    _gpu("a100-80gb", "NVIDIA A100 SXM4 80GB", 80, 312, 312, 19.5, 300, 32, frac=0.55, hbm_gb=2039, mamf=0.859,
         sms=108, flash=_A100_FLASH),
    _gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", 79.6, 989, 989, 67, 450, 64, frac=0.45, hbm_gb=3350, mamf=0.801,
         flash=_H100_FLASH, sdpa=_H100_CUDNN),
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", 79.6, 756, 756, 51, 64, 64, frac=0.42, link_eff=0.7, hbm_gb=2000,
         mamf=ASSUMED_MAMF),
    _gpu("h200", "NVIDIA H200 SXM 141GB", 140.4, 989, 989, 67, 450, 64, frac=0.47, hbm_gb=4800, mamf=0.803,
         flash=_H100_FLASH, sdpa=_H100_CUDNN),
    _gpu("b200", "NVIDIA B200 180GB", 179, 2250, 2250, 80, 900, 64, frac=0.4, hbm_gb=8000, mamf=0.776),
    _gpu("mi250x", "AMD MI250X (one GCD)", 64, 191.5, 191.5, 47.9, 100, 32, frac=0.35, link_eff=0.7, hbm_gb=1638,
         mamf=0.767),
    _gpu("mi300x", "AMD MI300X 192GB", 192, 1307.4, 1307.4, 163.4, 448, 64, frac=0.35, link_eff=0.7, hbm_gb=5300,
         mamf=0.601),
    # One CPU rank on gloo (the CPU demo), measured on the project's 2-core machine with torch
    # 2.13, one thread a rank (`benchmarks/cpu_rank_figures.py`, three runs under varying load):
    # bf16 matmul 16-35 / 132-397 / 203-448 GFLOP/s at n = 64 / 256 / 512, fp32 47-103, a copy at
    # 25-58 GB/s, and the tiny Llama's layer (h = 64, 256 tokens) at 6-15 ms forward + backward
    # in one process whatever its FLOPs; two DeepSpeed ranks sharing the two cores (the README's
    # fine-tune, ZeRO-0, micro-batch 4) ran 32.6 ms a step, ~14 ms a layer: the floor is that
    # figure. A gloo all-reduce of 4 KiB-1 MiB between the two ranks took 0.3-0.8 ms alone (dstk.launch.allreduce)
    # and 3.1 ms inside a DeepSpeed step (cProfile, load ~10), where each call waits for the other rank.
    # At load 3, 300 back-to-back calls of 4 KiB took a median 0.19-0.28 ms (all-reduce, all-gather,
    # reduce-scatter); inside a step a call also waits out the ranks' skew: dp=2 ZeRO-3 minus ZeRO-0,
    # less ZeRO-3's own work (below), over its ~18-23 calls, gave 0.3-0.9 ms a call in four runs
    # (mean 0.55): 0.5 ms per collective (it was 1 ms, from the loaded runs).
    # Orders of magnitude: `dstk doctor --calibrate` or --hardware FILE replaces them.
    # ZeRO's own work on one rank with no collective (`benchmarks/zero_dp1_cost.py --one-rank`, best of
    # 20 rounds, three runs at load 2-4, tiny / 4-layer / h=128 Llamas): ZeRO-3 over ZeRO-0 +10-22 ms,
    # 0.57 ms a parameter tensor (least squares through 0): 0.6; ZeRO-1/2 -1.5 to +6 ms: 0.05 ms a tensor.
    dataclasses.replace(
        _gpu("cpu", "CPU rank (gloo)", 8, 0.3, 0.3, 0.075, 2, 10, frac=0.5, link_eff=0.5, overhead_gib=0.5),
        hbm_bytes_per_s=35 * GB, gemm_efficiency=((64.0, 0.08), (256.0, 0.8), (512.0, 1.0)),
        layer_overhead_seconds=0.014, collective_latency_seconds=5e-4,
        zero_tensor_seconds=5e-5, zero3_tensor_seconds=6e-4),
)}

IB_EFFICIENCY = 0.96
"""Share of the InfiniBand line rate a large NCCL ring collective reaches between nodes: the bandwidth
(beta) of dstk's alpha-beta pricing, whose alpha (per-call, per-hop latency) is priced apart
(``steptime.collective_latency``), so it is the large-message figure, not an average over sizes.
NCCL's maintainers state it per NIC: "at a size of 8G ... 24GB/s inter-node" over one HDR 200 Gb/s
NIC (NVIDIA/nccl#412, 0.96), "~12 GB/s with each NIC" of 100 Gb/s EDR (NVIDIA/nccl#307, 0.96),
"46-48GB/s per NIC" and "up to 48-49GB/s per NIC" at NDR 400 Gb/s (nccl-tests#290, #267: 0.92-0.98).
Users' two-node all-reduce runs report 0.86-0.96 of the line rate (91 GB/s over 4 x HDR,
nccl-tests#100; 84.8 GB/s on average and 96 at peak, nccl-tests#119; 86 of 96 GB/s, NVIDIA/nccl#1048):
a fabric below the maintainers' figure: ``dstk doctor --hostfile`` prints its all-reduce bus
bandwidth, and an ``interconnects:`` entry of a ``--hardware`` file gives it to the estimator. Was
0.92 (the user's 91 GB/s of nccl-tests#100) until 2026-12-04."""

INTERCONNECTS: dict[str, Interconnect] = {i.slug: i for i in (
    Interconnect(slug="ib-hdr", name="InfiniBand HDR, 8 x 200 Gb/s per node", node_bytes_per_s=8 * 25 * GB,
                 latency_s=5e-6, efficiency=IB_EFFICIENCY),
    Interconnect(slug="ib-ndr", name="InfiniBand NDR, 8 x 400 Gb/s per node", node_bytes_per_s=8 * 50 * GB,
                 latency_s=5e-6, efficiency=IB_EFFICIENCY),
    Interconnect(slug="ib-xdr", name="InfiniBand XDR, 8 x 800 Gb/s per node", node_bytes_per_s=8 * 100 * GB,
                 latency_s=5e-6, efficiency=IB_EFFICIENCY),
    Interconnect(slug="roce-400", name="RoCE v2, 8 x 400 Gb/s per node", node_bytes_per_s=8 * 50 * GB,
                 latency_s=8e-6, efficiency=0.7),
    Interconnect(slug="roce-200", name="RoCE v2, 8 x 200 Gb/s per node", node_bytes_per_s=8 * 25 * GB,
                 latency_s=8e-6, efficiency=0.7),
    Interconnect(slug="efa", name="AWS EFA v2, 32 x 100 Gb/s per node (p5)", node_bytes_per_s=32 * 12.5 * GB,
                 latency_s=15e-6, efficiency=0.6),
    Interconnect(slug="eth-100g", name="Ethernet 100 Gb/s per node (TCP)", node_bytes_per_s=12.5 * GB,
                 latency_s=30e-6, efficiency=0.6, collective_latency_seconds=60e-6),
    Interconnect(slug="eth-25g", name="Ethernet 25 Gb/s per node (TCP)", node_bytes_per_s=3.125 * GB,
                 latency_s=50e-6, efficiency=0.6, collective_latency_seconds=100e-6),
    Interconnect(slug="loopback", name="one host (gloo over loopback)", node_bytes_per_s=2 * GB,
                 latency_s=50e-6, efficiency=0.5, collective_latency_seconds=1e-3),
)}

DEFAULT_INTERCONNECT = {"v100-32gb": "ib-hdr", "a10": "eth-100g", "l40s": "roce-200", "a100-40gb": "ib-hdr",
                        "a100-80gb": "ib-hdr", "h100-pcie": "roce-400", "mi250x": "roce-200", "cpu": "loopback"}
"""What a cluster of that GPU usually has; anything else defaults to ib-ndr."""


def _catalog_error(what: str, slug: str, known) -> Exception:
    from dstk.errors import DstkError

    import difflib

    near = difflib.get_close_matches(slug, list(known), n=3, cutoff=0.4)
    return DstkError(f"unknown {what} {slug!r}",
                     hint=(f"did you mean {', '.join(near)}? " if near else "")
                     + f"known: {', '.join(known)}; or add it with --hardware FILE")


def get_gpu(slug: str, *, catalog: dict[str, GPU] | None = None) -> GPU:
    """A GPU by slug (``dstk gpus`` lists them)."""
    gpus = GPUS if catalog is None else catalog
    key = slug.strip().lower()
    if key not in gpus:
        raise _catalog_error("GPU", slug, gpus)
    return gpus[key]


def get_interconnect(slug: str, *, catalog: dict[str, Interconnect] | None = None) -> Interconnect:
    """An inter-node network by slug."""
    nets = INTERCONNECTS if catalog is None else catalog
    key = slug.strip().lower()
    if key not in nets:
        raise _catalog_error("interconnect", slug, nets)
    return nets[key]


def default_interconnect(gpu_slug: str) -> str:
    return DEFAULT_INTERCONNECT.get(gpu_slug, "ib-ndr")


# --- user overrides --------------------------------------------------------------------------

_GPU_UNITS = {"memory_gib": ("memory_bytes", GiB), "overhead_gib": ("overhead_bytes", GiB), "bf16_tflops": ("bf16_flops", TFLOP),
              "fp16_tflops": ("fp16_flops", TFLOP), "fp32_tflops": ("fp32_flops", TFLOP),
              "intra_node_gbps": ("intra_node_bytes_per_s", GB), "host_gbps": ("host_bytes_per_s", GB),
              "hbm_gbps": ("hbm_bytes_per_s", GB), "host_dram_gbps": ("host_dram_bytes_per_s", GB)}
_NET_UNITS = {"node_gbps": ("node_bytes_per_s", GB)}


_EXPONENT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
"""A number in exponent form: JSON and YAML 1.2 read ``2e-05`` as one, PyYAML (YAML 1.1) as a string."""


def _near(word: str, known) -> str:
    """``did you mean X? `` for a misspelt key or slug (difflib's close matches), or nothing."""
    import difflib

    known = [str(k) for k in known]
    # a slug's family first (h100 -> h100-sxm, h100-pcie), then difflib's closest
    near = [k for k in known if k.startswith(str(word)) and k != word]
    near += [k for k in difflib.get_close_matches(str(word), known, n=3, cutoff=0.6) if k not in near]
    return f"did you mean {' or '.join(near[:3])}? " if near else ""


def _entry(cls, slug: str, fields: dict, units: dict, base, *, key: str, location: str,
           lines: dict[str, int] | None = None, written_by: str | None = None):
    """One catalog entry from a hardware file's ``fields`` (over ``base``'s, if it extends one).
    Errors say ``key`` (``gpus.SLUG``) and the field, at ``location`` (the file and the entry's
    line; the field's own line where ``lines``, the parser's ``{"gpus.SLUG.field": line}``, has
    it), in the file's units (``memory_gib: -5``, not the bytes it becomes). ``written_by``: the
    dstk version a ``doctor --calibrate`` profile names in its header, so that a field this
    version does not know is said to come from another version."""
    from dstk import __version__
    from dstk.errors import DstkError

    if not isinstance(fields, dict):
        raise DstkError(f"{key}: expected a mapping of fields", location=location)
    path = location.rsplit(":", 1)[0]

    def where(name: str) -> str:
        line = (lines or {}).get(f"{key}.{name}")
        return f"{path}:{line}" if line else location

    values = dataclasses.asdict(base) if base is not None else {}
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    allowed = set(defaults) - {"slug"}
    given: dict[str, tuple[str, Any]] = {}  # dataclass field -> (the file's key, the file's value)
    for name, value in fields.items():
        if name not in units and name not in allowed:
            other = (f"this profile was written by dstk {written_by} and this is dstk {__version__}: "
                     "recalibrate with `dstk doctor --calibrate`, or delete the field; "
                     if written_by and written_by != __version__ else "")
            raise DstkError(f"{key}.{name}: unknown field",
                            hint=f"{_near(name, allowed | set(units))}{other}fields: "
                                 f"{', '.join(sorted(allowed | set(units)))}",
                            location=where(name))
        current = values.get(name, defaults.get(name))
        numeric = name in units or (isinstance(current, (int, float)) and not isinstance(current, bool))
        if numeric and isinstance(value, str) and _EXPONENT_NUMBER.fullmatch(value.strip()):
            value = float(value)  # YAML 1.2's 2e-05, a string to PyYAML (YAML 1.1 wants 2.0e-05)
        if numeric and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            # checked before any arithmetic: "abc" * GiB would build a 3 GB string
            raise DstkError(f"{key}.{name}: expected a number, got {value!r}", location=where(name),
                            hint=f"write a bare number, e.g. {name}: "
                                 f"{_example(values.get(units[name][0]) if name in units else current, name, units) or 1}")
        if name in ("name",) and value is not None and not isinstance(value, str):
            raise DstkError(f"{key}.{name}: expected text, got {value!r}", location=where(name),
                            hint=f'quote it: {name}: "{value}"')
        if name in units:
            field, scale = units[name]
            values[field] = None if value is None else value * scale
            if field in ("memory_bytes", "overhead_bytes") and value is not None:
                values[field] = int(values[field])
            given[field] = (name, value)
        else:
            values[name] = value
            given[name] = (name, value)
    values.setdefault("name", slug)
    values["slug"] = slug
    file_key = {field: file for file, (field, _) in units.items()}
    missing = [file_key.get(f.name, f.name) for f in dataclasses.fields(cls)
               if f.name not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        near = _near(slug, GPUS if cls is GPU else INTERCONNECTS).removesuffix("? ")
        raise DstkError(f"{key}: a new entry needs {', '.join(missing)}",
                        hint=(f"{near} (to change that entry)? " if near else "")
                        + "give every field of a new entry, or extend an existing slug with 'base: SLUG'",
                        location=location)
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:  # a field out of range (the dataclass checks name it)
        field, _, why = str(exc).partition(": ")
        if field in given:  # said as the file says it: memory_gib -5, not memory_bytes -5368709120
            name, value = given[field]
            why = why.split(", got ")[0].replace("positive size", "positive number")
            example = _example(getattr(base, field, None), name, units)
            raise DstkError(f"{key}.{name}: {why}, got {value!r}", location=where(name),
                            hint=f"e.g. {name}: {example} (the {base.slug} entry's)" if example and base is not None
                            else f"give {why.removeprefix('expected ')}") from None
        raise DstkError(f"{key}.{exc}", location=location) from None


def _example(current, name: str, units: dict) -> str | None:
    """A value to show in a fix: the base entry's, in the file's units; None where it has none."""
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        scale = units[name][1] if name in units else 1
        return f"{current / scale:.4g}"
    if isinstance(current, tuple):
        import json

        return json.dumps([[int(a) if float(a).is_integer() else a, b] for a, b in current])
    return None


MAX_HARDWARE_BYTES = 1 << 20
"""A hardware file is a few entries; a larger file is not one (and /dev/zero would never end)."""


def load_catalog(path: str | os.PathLike) -> tuple[dict[str, GPU], dict[str, Interconnect]]:
    """The built-in catalog merged with a user file (YAML or JSON)::

        gpus:
          h100-sxm: {achievable_fraction: 0.4}          # change one field of an entry
          my-gpu: {base: a100-80gb, memory_gib: 64}     # a new entry from an old one
        interconnects:
          my-net: {node_gbps: 100, efficiency: 0.7}

    Units in the keys: ``*_gib`` GiB, ``*_tflops`` 10^12 FLOP/s, ``*_gbps`` 10^9 bytes/s.
    """
    from dstk.errors import DstkError, UsageError
    from dstk.intent import parse_user_text

    shape = "a YAML or JSON file with gpus: / interconnects: (see docs/estimate.md)"
    try:  # an unreadable path is a usage error (exit 2), as an intent file's is
        with open(path, "rb") as fh:
            raw = fh.read(MAX_HARDWARE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such hardware file",
                         hint=f"give {shape}, or write one with `dstk doctor --calibrate --output {path}`") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the hardware file: {exc.strerror}", hint=f"give {shape}") from None
    if len(raw) > MAX_HARDWARE_BYTES:
        raise DstkError(f"larger than {MAX_HARDWARE_BYTES >> 20} MiB, not a hardware file",
                        location=str(path), hint=f"give {shape}")
    # strict, as the intent: duplicate keys, aliases, deep nesting, NaN, non-UTF-8 are refused with file:line
    data, lines = parse_user_text(raw, source=str(path), what="hardware file", example=shape)
    if not isinstance(data, dict) or not data or set(data) - {"gpus", "interconnects"}:
        stray = sorted(map(str, set(data) - {"gpus", "interconnects"})) if isinstance(data, dict) else []
        what = (f"unknown top-level key {stray[0]!r}" if stray else "empty" if not data
                else f"a {type(data).__name__}, not a mapping")
        raise DstkError(f"{what}: expected top-level keys gpus and/or interconnects",
                        location=f"{path}:{lines.get(stray[0], 1)}" if stray else str(path),
                        hint=(f"an entry goes under gpus: or interconnects: ({'gpus' if stray[0].lower() in GPUS else 'interconnects'}:"
                              f" then {stray[0]}: indented below it); " if stray and (stray[0].lower() in GPUS
                                                                                  or stray[0].lower() in INTERCONNECTS)
                              else _near(stray[0], ("gpus", "interconnects")) if stray else "") + f"give {shape}")
    written_by = written_by_version(raw)
    gpus, nets = dict(GPUS), dict(INTERCONNECTS)
    for table, cls, units, out in (("gpus", GPU, _GPU_UNITS, gpus), ("interconnects", Interconnect, _NET_UNITS, nets)):
        entries = data.get(table) or {}
        if not isinstance(entries, dict):
            raise DstkError(f"{table}: a mapping of slug -> fields, got {type(entries).__name__}",
                            location=f"{path}:{lines.get(table, 1)}", hint=f"give {shape}")
        for slug, fields in entries.items():
            if fields is not None and not isinstance(fields, dict):
                raise DstkError(f"{table}.{slug}: a mapping of fields, got {type(fields).__name__}",
                                location=f"{path}:{lines.get(f'{table}.{slug}', 1)}",
                                hint=f"write it as {slug}: {{base: SLUG, memory_gib: ...}}")
            slug = str(slug).lower()
            fields = dict(fields or {})
            base_slug = fields.pop("base", None)
            where = f"{path}:{lines.get(f'{table}.{slug}', 1)}"
            base = out.get(str(base_slug).lower() if base_slug else slug)
            if base_slug and base is None:
                line = lines.get(f"{table}.{slug}.base")
                raise DstkError(f"{table}.{slug}.base: unknown {'GPU' if table == 'gpus' else 'network'} "
                                f"{base_slug!r}", location=f"{path}:{line}" if line else where,
                                hint=f"{_near(str(base_slug).lower(), out)}known: {', '.join(out)}")
            out[slug] = _entry(cls, slug, fields, units, base, key=f"{table}.{slug}", location=where, lines=lines,
                               written_by=written_by)
    return gpus, nets


_PROFILE_VERSION = re.compile(rb"\A# dstk hardware profile: .*?\(dstk ([\w.+-]+)\)")


def written_by_version(raw: bytes | str) -> str | None:
    """The dstk version a ``doctor --calibrate`` profile names on its first line
    (``# dstk hardware profile: ... (dstk 0.1.0)``); None for any other file (pure)."""
    text = raw.encode() if isinstance(raw, str) else raw
    match = _PROFILE_VERSION.match(text[:400])
    return match.group(1).decode() if match else None


def file_gpu_slugs(path: str | os.PathLike) -> tuple[str, ...]:
    """The GPU slugs a hardware file adds or changes (its ``gpus:`` keys, lower-cased), read as
    ``load_catalog`` reads them; a file it refuses raises its error."""
    import json

    from dstk.intent import parse_user_text

    load_catalog(path)  # the file's own errors first, with file:line
    with open(path, "rb") as fh:
        data, _ = parse_user_text(fh.read(MAX_HARDWARE_BYTES), source=str(path), what="hardware file",
                                  example=json.dumps({"gpus": {}}))
    return tuple(str(slug).lower() for slug in (data.get("gpus") or {}))


def hardware_gpu_note(*, path: str | os.PathLike, gpu_slug: str) -> str | None:
    """A warning for ``--hardware FILE`` when ``gpu_slug`` is none of the file's GPU entries (a
    profile calibrated on one device, planned for another: the catalog's figures are used, not
    the file's); None when the file describes it, or describes no GPU (networks only)."""
    slugs = file_gpu_slugs(path)
    if not slugs or gpu_slug.strip().lower() in slugs:
        return None
    return (f"--hardware {path} describes {', '.join(slugs)}, not {gpu_slug}: the catalog's {gpu_slug} figures "
            f"are used; give --gpu {slugs[0]} to use the file's")


def file_fields(gpu: GPU) -> dict[str, Any]:
    """The fields of ``gpu`` that differ from the built-in entry of its slug (all of them for a slug
    the catalog lacks), keyed and scaled as a hardware file writes them (``memory_gib``, ``hbm_gbps``):
    what a ``--hardware`` file changed, so that a plan records the figures it was priced with."""
    base = GPUS.get(gpu.slug)
    to_file = {field: (key, scale) for key, (field, scale) in _GPU_UNITS.items()}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(GPU):
        value = getattr(gpu, f.name)
        if f.name == "slug" or (base is not None and value == getattr(base, f.name)):
            continue
        key, scale = to_file.get(f.name, (f.name, 1))
        if isinstance(value, tuple):
            value = [list(p) for p in value]
        elif value is not None and scale != 1:
            value = float(f"{value / scale:.6g}")
        out[key] = value
    return out


def hardware_record(*, path: str | os.PathLike | None, gpu: GPU) -> dict | None:
    """What ``plan.json`` says of a ``--hardware`` file (None without one): its absolute path, the
    first line of a ``doctor --calibrate`` profile (where and when it was measured, with which
    dstk), and the GPU figures it changed (``file_fields``), so that the plan's figures can be
    reproduced without the file and `dstk estimate --config` can ask for it."""
    if not path:
        return None
    header = None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(400).decode("utf-8", "replace").strip()
        header = first.removeprefix("# ") if first.startswith("# dstk hardware profile") else None
    except OSError:
        pass
    return {"file": os.path.abspath(path), "profile": header, "gpu": gpu.slug, "gpu_name": gpu.name,
            "gpu_fields": file_fields(gpu)}


def hardware_why(*, path: str | os.PathLike | None, gpu: GPU) -> str | None:
    """The why line of a plan priced with a ``--hardware`` file that changed ``gpu`` (a calibrated
    profile): which file, where it was measured, and which figures are its own rather than the
    catalog's. None without a file, or when it changed nothing of this GPU."""
    record = hardware_record(path=path, gpu=gpu)
    changed = [k for k in (record or {}).get("gpu_fields") or {} if k != "name"]
    if not changed:
        return None
    made = f" ({record['profile'].removeprefix('dstk hardware profile: ')})" if record.get("profile") else ""
    return (f"GPU: {gpu.slug} ({gpu.name}) with the figures of --hardware {path}{made}: {', '.join(changed)}; "
            "the rest are the catalog's")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Cluster:
    """Machines the job runs on; world size = ``num_nodes * gpus_per_node``."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    gpu: GPU
    interconnect: Interconnect | None = None
    """Between nodes; None is allowed on one node (and means ``ib-ndr`` if used)."""
    host_memory_bytes: int | None = None
    """CPU memory per node (for offload); None if unknown."""

    def __post_init__(self) -> None:
        for name in ("num_nodes", "gpus_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.num_nodes > 1 and self.interconnect is None:
            raise ValueError("interconnect: a cluster of more than one node needs one (e.g. ib-ndr)")
        if self.host_memory_bytes is not None and (not isinstance(self.host_memory_bytes, int)
                                                   or self.host_memory_bytes <= 0):
            raise ValueError(f"host_memory_bytes: expected a positive byte count, got {self.host_memory_bytes!r}")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def host_dram_bytes_per_s(self) -> float:
        """Sustained DRAM bandwidth of one node, shared by its ``gpus_per_node`` ranks' CPU
        optimizer steps: the GPU entry's ``host_dram_bytes_per_s`` (its usual node; a ``--hardware``
        file's ``host_dram_gbps``), else ``HOST_DRAM_FALLBACK_BYTES_PER_S``."""
        own = self.gpu.host_dram_bytes_per_s
        return HOST_DRAM_FALLBACK_BYTES_PER_S if own is None else own

    def to_dict(self) -> dict:
        return {"num_nodes": self.num_nodes, "gpus_per_node": self.gpus_per_node, "gpu": self.gpu.slug,
                "interconnect": self.interconnect.slug if self.interconnect else None,
                "gpu_memory_bytes": self.gpu.memory_bytes}
