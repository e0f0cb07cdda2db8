"""A hardware profile from measurements: what ``dstk doctor --calibrate`` writes.

Pure functions, no torch: the rank script ``dstk.launch.measure`` measures, this module turns its
figures into a ``gpus:`` entry of the ``--hardware FILE`` format (``dstk.hardware.load_catalog``)
that ``plan``/``estimate``/``generate`` read, and says which field was measured and which came
from the catalog. The entry keeps the base slug (an intent naming ``gpu: cpu`` picks it up) and
says ``base: SLUG``, so every field not written stays the catalog's.

How each measurement becomes a field (training is synchronous: every figure is the slowest
rank's, as ``dstk.launch.allreduce`` reports the slowest rank's time):

- ``gemm_efficiency``: achieved FLOP/s of the three GEMMs of a ``d x d`` linear layer over ``m``
  tokens in training (forward, input and weight gradients: ``dstk.launch.measure``) over the
  dense peak, keyed by ``d`` = min(m, n, k) (``GPU.gemm_fraction``); each shape's fastest of
  interleaved rounds, so a burst of load on a shared host cannot sink one point of the curve.
  The peak is the catalog's datasheet figure on a GPU; a CPU rank has no datasheet peak, so its peak (``bf16_tflops`` etc. for the precision
  measured) is the best GEMM of the sweep and the curve is relative to it. A GPU GEMM above the
  catalog peak means the catalog entry is not this device: the peak is raised to the measured
  figure and the report says so. Where the entry has ``num_sms`` (A100), each shape's share is
  divided by its wave share (``efficiency_curve``): the time model applies wave quantization on
  top of the curve, and a measured time already holds it.
- ``hbm_gbps``: copy bandwidth, 2 bytes moved per byte copied (STREAM "Copy", McCalpin).
- ``intra_node_efficiency``: all-reduce bus bandwidth (nccl-tests' ``busbw = algbw * 2(n-1)/n``,
  NVIDIA/nccl-tests doc/PERFORMANCE.md) at the largest size, over the catalog's link bandwidth;
  where the bus bandwidth exceeds the catalog link (a CPU's shared memory has no datasheet
  figure), the link becomes the measured bus bandwidth at efficiency 1.
- ``collective_latency_seconds``: the per-call cost of a collective (``fit_latency``: the least
  time an all-reduce of at most 1 MiB took beyond its bytes at the largest size's bus bandwidth).
- ``layer_overhead_seconds``: the layer floor the ranks measured (``dstk.launch.measure``).
- ``step_overhead_seconds``: the measured 1-layer step less what the time model prices for that
  step with the profile's other figures (``priced_floor_step_seconds``: its layer, embedding,
  head and loss, optimizer, gradient all-reduce), so that no part of a plan's step is priced twice.
- ``zero_tensor_seconds`` / ``zero3_tensor_seconds`` (CPU ranks): DeepSpeed steps of the floor's
  Llama at two depths under ZeRO 0, 1 and 3 (``dstk.launch.zero_cost``), each stage's step less
  ZeRO-0's less the collectives the time model prices, per parameter tensor by least squares
  (``fit_zero_tensor_seconds``). On GPUs the catalog's (0).
- Not measured, kept from the catalog: memory, ``achievable_fraction`` (the fallback for GEMMs
  when there is no curve), host link, overhead. The operator floor (one small operator's time)
  is reported but is not a catalog field.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Literal

from dstk.hardware import GB, TFLOP, GPU

Source = Literal["measured", "catalog"]
_PEAK_KEY = {"bf16": ("bf16_tflops", "bf16_flops"), "fp16": ("fp16_tflops", "fp16_flops"),
             "fp32": ("fp32_tflops", "fp32_flops")}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class GemmPoint:
    """One GEMM of the sweep: ``(m x k) @ (k x n)``, its slowest rank's FLOP/s."""

    m: int
    n: int
    k: int
    flops_per_s: float

    @property
    def dim(self) -> int:
        return min(self.m, self.n, self.k)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class BusPoint:
    """One all-reduce size: nccl-tests' bus bandwidth (slowest rank's time)."""

    size_bytes: int
    busbw_bytes_per_s: float


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ZeroStep:
    """One DeepSpeed step of the floor's Llama under one ZeRO stage (``dstk.launch.zero_cost``): the
    fastest batch's seconds per step, slowest rank."""

    zero_stage: int
    num_layers: int
    seconds: float


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Measurements:
    """What the ranks measured (``dstk.launch.measure`` and ``dstk.launch.allreduce``)."""

    precision: str
    """The compute precision of the GEMM sweep: ``bf16``, ``fp16`` or ``fp32``."""
    num_ranks: int
    device: str
    """``cpu`` or ``cuda``."""
    backend: str
    gemm: tuple[GemmPoint, ...]
    memory_bytes_per_s: float | None = None
    op_seconds: float | None = None
    """One small elementwise operator's time (dispatch + launch), slowest rank."""
    allreduce: tuple[BusPoint, ...] = ()
    device_name: str | None = None
    layer_overhead_seconds: float | None = None
    """What one more (negligibly small) transformer layer adds to a training step, slowest rank."""
    step_fixed_seconds: float | None = None
    """A 1-layer step minus the layer floor: embedding, head, loss and the engine's fixed work."""
    step_spread: float | None = None
    """The 1-layer step's median batch over its fastest, slowest rank: how much other load slowed
    the measurement (``LOADED_SPREAD``)."""
    threads: int | None = None
    """Intra-op threads of a rank (``torch.get_num_threads()``)."""
    zero_steps: tuple[ZeroStep, ...] = ()
    """ZeRO 0/1/3 steps of the floor's Llama at two depths (CPU ranks; empty on GPUs)."""
    zero_wall_seconds: float | None = None
    """What measuring ``zero_steps`` took (engines built, warmed and timed), slowest rank."""

    def __post_init__(self) -> None:
        if self.precision not in _PEAK_KEY:
            raise ValueError(f"precision: expected bf16, fp16 or fp32, got {self.precision!r}")
        if not self.gemm or any(not p.flops_per_s > 0 for p in self.gemm):
            raise ValueError(f"gemm: expected measured points with positive FLOP/s, got {self.gemm!r}")


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Figure:
    """One field of the profile and where it came from."""

    key: str
    """The key in the hardware file (``hbm_gbps``), or the ``GPU`` field name for catalog ones."""
    value: object
    source: Source
    note: str


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Profile:
    slug: str
    base: str
    gpu: GPU
    """The entry as ``load_catalog`` will read it back."""
    figures: tuple[Figure, ...]
    """The measured fields (written) and the catalog fields (kept), in report order."""
    warnings: tuple[str, ...] = ()
    measurements: Measurements | None = None


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def from_rank_reports(*, measure: dict, allreduce: list[dict]) -> Measurements:
    """``Measurements`` from the ``DSTK_MEASURE`` line (every rank's figures) and the
    ``DSTK_ALLREDUCE`` lines: per figure, the slowest rank."""
    ranks = [r for r in measure["ranks"] if r is not None]
    if not ranks:
        raise ValueError("the measurement holds no rank")
    points = []
    for i, first in enumerate(ranks[0]["gemm"]):
        slowest = min(r["gemm"][i]["flops_per_s"] for r in ranks)
        points.append(GemmPoint(m=first["m"], n=first["n"], k=first["k"], flops_per_s=slowest))
    bus = tuple(BusPoint(size_bytes=r["size_bytes"], busbw_bytes_per_s=r["busbw_bytes_per_s"])
                for r in sorted(allreduce, key=lambda r: r["size_bytes"]) if r.get("correct", True))
    floors = [r["layer_overhead_seconds"] for r in ranks if r.get("layer_overhead_seconds") is not None]
    floor = max(floors) if floors else None
    fixed = spread = None
    if floor is not None:
        fixed = max(0.0, max(r["layer_steps"]["1"] for r in ranks if r.get("layer_steps")) - floor)
        spreads = [r["layer_steps"]["median"]["1"] / r["layer_steps"]["1"] for r in ranks
                   if (r.get("layer_steps") or {}).get("median") and r["layer_steps"]["1"] > 0]
        spread = max(spreads) if spreads else None
    zero: list[ZeroStep] = []
    reports = [r["zero_steps"] for r in ranks if r.get("zero_steps")]
    if reports and len(reports) == len(ranks):
        for stage in reports[0]["seconds"]:
            for i, layers in enumerate(reports[0]["layers"]):
                zero.append(ZeroStep(zero_stage=int(stage), num_layers=int(layers),
                                     seconds=max(r["seconds"][stage][i] for r in reports)))
    return Measurements(precision=measure["precision"], num_ranks=measure["world_size"], device=ranks[0]["device"],
                        backend=measure["backend"], gemm=tuple(points),
                        memory_bytes_per_s=min(r["memory_bytes_per_s"] for r in ranks),
                        op_seconds=max(r["op_seconds"] for r in ranks), allreduce=bus,
                        device_name=ranks[0].get("device_name"), layer_overhead_seconds=floor,
                        step_fixed_seconds=fixed, step_spread=spread, threads=ranks[0].get("threads"),
                        zero_steps=tuple(zero),
                        zero_wall_seconds=max((r.get("wall_seconds") or 0.0 for r in reports), default=None))


def _allreduce_seconds(point: BusPoint, num_ranks: int) -> float:
    """The measured time of one all-reduce back from its bus bandwidth (``busbw = S/t * 2(n-1)/n``)."""
    return point.size_bytes * 2 * (num_ranks - 1) / num_ranks / point.busbw_bytes_per_s


def fit_latency(*, points: tuple[BusPoint, ...], num_ranks: int) -> float | None:
    """Per-call latency of a collective, the alpha of ``t = alpha + S * 2(n-1)/n / busbw`` (Hockney's
    model, as nccl-tests' small sizes show it): the bus bandwidth from the largest size, alpha the
    least that any size up to ``LATENCY_MAX_BYTES`` took beyond its bytes at that bandwidth (never
    below 0). Load from other processes only adds time, so the least excess is the least disturbed
    figure; a least-squares line through a few 5-iteration timings swings negative under load. None
    without such a size and a larger one."""
    if num_ranks < 2 or len({p.size_bytes for p in points}) < 2:
        return None
    high = max(points, key=lambda p: p.size_bytes)
    small = [p for p in points if p.size_bytes <= LATENCY_MAX_BYTES and p.size_bytes < high.size_bytes]
    if not small:
        return None
    factor = 2 * (num_ranks - 1) / num_ranks
    return max(0.0, min(_allreduce_seconds(p, num_ranks) - p.size_bytes * factor / high.busbw_bytes_per_s
                        for p in small))


LOADED_SPREAD = 2.0
"""A 1-layer step whose median batch took over this many times its fastest was measured beside other
load: the profile keeps the fastest (the host unloaded) and says that a run under that load is
slower. Seen on this 2-core machine under load average 2 from other work: 1.2-1.5x with one thread a
rank, 7x with one rank of two OpenMP threads, whose every operator waits for the thread another
process holds (the tiny Llama's step 10.7 ms with one thread, 465 ms with two)."""

LATENCY_MAX_BYTES = 2**20
"""Sizes up to 1 MiB give the latency: there the fixed cost is most of the time (a gloo all-reduce of
16 KiB-1 MiB: 0.3-0.8 ms, nearly flat; NCCL's 8 KiB on NVLink ~10 us, 1 MiB ~15 us)."""


def _floor_model() -> str:
    from dstk.launch.measure import FLOOR_MODEL as f

    return (f"hidden {f['hidden_size']}, ffn {f['intermediate_size']}, vocab {f['vocab_size']}, "
            f"{f['micro_batch']} x {f['seq_len']} tokens")


def priced_floor_step_seconds(*, gpu: GPU, num_ranks: int, precision: str, num_layers: int = 1,
                              zero_stage: int = 0) -> float:
    """What the step time model (``dstk.estimate.estimate``, the planner's) prices for the ``num_layers``
    step of ``dstk.launch.measure.FLOOR_MODEL`` that the ranks timed (ZeRO ``zero_stage`` with DeepSpeed's
    default buckets over ``num_ranks`` ranks, one micro-batch of ``micro_batch x seq_len`` tokens), with
    ``gpu``'s figures: its layers at the floor, the embedding, the head and loss, the optimizer step,
    the gradient all-reduce (ZeRO's collectives and its per-tensor host work)."""
    from dstk.estimate import estimate
    from dstk.hardware import Cluster, get_interconnect, default_interconnect
    from dstk.layout import Layout
    from dstk.launch.measure import FLOOR_MODEL as f
    from dstk.models.spec import ModelSpec
    from dstk.intent import intent_from_dict

    spec = ModelSpec.generic(num_layers=num_layers, hidden_size=f["hidden_size"], num_heads=f["num_attention_heads"],
                             vocab_size=f["vocab_size"], ffn_hidden_size=f["intermediate_size"],
                             num_kv_heads=f["num_key_value_heads"])
    training = intent_from_dict({
        "model": {"num_layers": num_layers, "hidden_size": f["hidden_size"], "num_heads": f["num_attention_heads"],
                  "num_kv_heads": f["num_key_value_heads"], "ffn_hidden_size": f["intermediate_size"],
                  "vocab_size": f["vocab_size"]},
        "cluster": {"num_nodes": 1, "gpus_per_node": num_ranks, "gpu": gpu.slug},
        "training": {"seq_len": f["seq_len"], "global_batch": f["micro_batch"] * num_ranks, "precision": precision,
                     "train_steps": 2, "warmup_steps": 1}}, source="dstk.calibrate").training.to_training()
    cluster = Cluster(num_nodes=1, gpus_per_node=num_ranks, gpu=gpu,
                      interconnect=get_interconnect(default_interconnect(gpu.slug)))
    layout = Layout(dp=num_ranks, micro_batch=f["micro_batch"], grad_accum=1, zero_stage=zero_stage)
    return estimate(model=spec, layout=layout, training=training, cluster=cluster).time.step_seconds


def wave_share(*, point: GemmPoint, num_sms: int | None) -> float:
    """The share of the time model's full-wave rate at which it runs ``point``'s three training GEMMs:
    ``3 / sum(1 / w)`` over the wave fractions ``w`` (``dstk.estimate.steptime.wave_fraction``) of
    their outputs, forward ``m x n``, input gradient ``m x k`` and weight gradient ``k x n`` (over
    ``K = m``), as ``steptime.layer_seconds`` shapes them; the three have the same FLOPs, so their
    summed time is the mean of ``1 / w``. 1 without ``num_sms`` (the CPU entry)."""
    from dstk.estimate.steptime import wave_fraction

    if not num_sms:
        return 1.0
    inverse = sum(1.0 / wave_fraction(m=a, n=b, num_sms=num_sms)
                  for a, b in ((point.m, point.n), (point.m, point.k), (point.k, point.n)))
    return 3.0 / inverse


def efficiency_curve(*, gemm: tuple[GemmPoint, ...], peak_flops: float,
                     num_sms: int | None) -> tuple[tuple[tuple[float, float], ...], tuple[str, ...]]:
    """The ``gemm_efficiency`` curve of a sweep: per ``d`` (``GemmPoint.dim``; the least of shapes
    sharing one), the measured share of ``peak_flops`` over the shape's ``wave_share``, capped at 1;
    and the shapes the cap bit (faster than full waves allow).

    Why the waves are divided out rather than ``num_sms`` dropped from the profile: the time model
    prices a GEMM at ``gemm_fraction(min dim) x wave_fraction(its output)``
    (``steptime._gemm_seconds``), with the curve standing for full waves (Bekman's MAMF, the best
    rate over shapes). A measured GEMM already holds its own shape's partial last wave (NVIDIA's
    Matrix Multiplication Background User's Guide, "Wave quantization"), so the raw share of peak
    would be quantized twice: an A100's d = 2048 sweep point (m = 8192) has a 2048 x 2048 weight
    gradient of 128 tiles of 256 x 128, two waves of 108 SMs at 59% busy, priced at 0.59 x 0.59.
    Divided out, each swept shape is priced at its measured time, and a model's GEMMs between the
    sweep's widths keep the quantization of their own outputs, which a curve keyed by one dimension
    cannot hold; without ``num_sms`` in the profile every GEMM would instead take the swept shapes'
    quantization, interpolated by ``d``. Not divided: a CPU (no ``num_sms``)."""
    curve: dict[int, float] = {}
    beyond: list[str] = []
    for p in gemm:
        raw = p.flops_per_s / peak_flops
        full = raw / wave_share(point=p, num_sms=num_sms)
        if full > 1.0 and raw <= 1.0 and num_sms:
            beyond.append(f"{p.m} x {p.n} x {p.k} at {raw:.3g} of the peak")
        curve[p.dim] = min(curve.get(p.dim, 1.0), min(1.0, _sig(full, 3)))
    return tuple((float(d), f) for d, f in sorted(curve.items())), tuple(beyond)


_ZERO_FIELD = {1: "zero_tensor_seconds", 3: "zero3_tensor_seconds"}


def fit_zero_tensor_seconds(*, gpu: GPU, steps: tuple[ZeroStep, ...], num_ranks: int,
                            precision: str) -> dict[int, tuple[float, str]]:
    """Per ZeRO stage measured (1 and 3): ``(seconds per parameter tensor and micro-batch, how)``, the
    ``GPU.zero_tensor_seconds`` / ``zero3_tensor_seconds`` that make the time model
    (``steptime.zero_overhead_seconds``) price the measured steps.

    For each depth ``i`` (1 and 3 layers, ``dstk.launch.zero_cost.DEPTHS``), ``D_i`` is the measured
    ZeRO-Z step less the same depth's ZeRO-0 step (what the stage adds, the load of the run
    cancelling in part, as the "over Z0" columns of ``benchmarks/zero_dp1_cost.py``), ``P_i`` what
    the time model prices for that difference with ``gpu``'s figures and no per-tensor work (ZeRO's
    collectives and their per-call latency over ``num_ranks`` gloo ranks,
    ``priced_floor_step_seconds``), and ``N_i`` the parameter tensors it charges per step (the
    priced step's slope in the per-tensor figure). The figure is the least-squares slope through
    the origin, ``sum N_i (D_i - P_i) / sum N_i^2``, as the catalog's 0.57 ms for ZeRO-3 was fitted
    over three shapes; never below 0 (the time model already prices all that was measured). Each
    step is its fastest batch (``dstk.launch.zero_cost``): the least disturbed figure on a shared
    host. The steps run over every calibrating rank (dp = ``num_ranks``, as plans on those ranks
    run), not over one: the figure then also takes up what the time model misses of ZeRO's
    collectives there, as ``step_overhead_seconds`` takes up the rest of the step; over one rank
    it is the catalog's measurement (``benchmarks/zero_dp1_cost.py --one-rank``)."""
    seconds = {(s.zero_stage, s.num_layers): s.seconds for s in steps}
    out: dict[int, tuple[float, str]] = {}
    unit = 1e-3
    for stage, field in _ZERO_FIELD.items():
        depths = sorted(n for z, n in seconds if z == stage and (0, n) in seconds)
        if not depths:
            continue
        zero = dict.fromkeys(_ZERO_FIELD.values(), 0.0)
        num = den = 0.0
        parts = []
        for n in depths:
            base0 = priced_floor_step_seconds(gpu=gpu.replace(**zero), num_ranks=num_ranks, precision=precision,
                                              num_layers=n)
            priced = priced_floor_step_seconds(gpu=gpu.replace(**zero), num_ranks=num_ranks, precision=precision,
                                               num_layers=n, zero_stage=stage) - base0
            tensors = (priced_floor_step_seconds(gpu=gpu.replace(**{**zero, field: unit}), num_ranks=num_ranks,
                                                 precision=precision, num_layers=n, zero_stage=stage)
                       - base0 - priced) / unit
            added = seconds[(stage, n)] - seconds[(0, n)]
            num += tensors * (added - priced)
            den += tensors * tensors
            parts.append(f"{n} layer(s): {tensors:.0f} tensors, measured {added * 1e3:+.3g} ms over ZeRO-0, priced "
                         f"{priced * 1e3:+.3g} ms without per-tensor work (collectives)")
        if den > 0:
            out[stage] = (max(0.0, num / den), "; ".join(parts))
    return out


def build_profile(*, base: GPU, measured: Measurements, name: str | None = None) -> Profile:
    """The calibrated entry for ``base`` (module docstring: how each figure is derived)."""
    figures: list[Figure] = []
    warnings: list[str] = []
    changes: dict = {}
    key, field = _PEAK_KEY[measured.precision]
    best = max(measured.gemm, key=lambda p: p.flops_per_s)
    catalog_peak = getattr(base, field)
    if base.is_cpu or catalog_peak is None:
        peak = best.flops_per_s
        figures.append(Figure(key=key, value=_sig(peak / TFLOP), source="measured",
                              note=f"{measured.precision} peak: the best GEMM of the sweep ({best.m} x {best.n} x "
                                   f"{best.k}), slowest rank (a CPU has no datasheet peak)"))
    elif best.flops_per_s > catalog_peak:
        peak = best.flops_per_s
        warnings.append(f"a {best.m} x {best.n} x {best.k} GEMM ran at {best.flops_per_s / TFLOP:.1f} TFLOP/s, above "
                        f"the catalog's {measured.precision} peak of {base.slug} ({catalog_peak / TFLOP:.1f}): "
                        f"is --gpu {base.slug} this device? The peak is raised to the measured figure")
        figures.append(Figure(key=key, value=_sig(peak / TFLOP), source="measured",
                              note=f"{measured.precision} peak raised to the best GEMM measured "
                                   f"(catalog: {catalog_peak / TFLOP:g} TFLOP/s)"))
    else:
        peak = catalog_peak
    changes[field] = peak
    points, beyond = efficiency_curve(gemm=measured.gemm, peak_flops=peak, num_sms=base.num_sms)
    changes["gemm_efficiency"] = points
    m_note = ", ".join(str(m) for m in sorted({p.m for p in measured.gemm}))
    waves = (f"; the wave quantization of each shape on {base.num_sms} SMs (which the time model applies on top "
             "of the curve) divided out, so that each swept shape is priced at its measured time"
             if base.num_sms else "")
    figures.append(Figure(key="gemm_efficiency", value=[[int(d), f] for d, f in points], source="measured",
                          note=f"share of the {measured.precision} peak ({peak / TFLOP:.4g} TFLOP/s"
                               f"{', catalog' if peak == catalog_peak and not base.is_cpu else ''}) of a d x d "
                               f"linear layer's forward + backward GEMMs over m = {m_note} tokens, keyed by d; "
                               f"fastest of interleaved rounds, slowest of {measured.num_ranks} rank(s){waves}"))
    if beyond:
        warnings.append("GEMMs faster than full waves of the catalog's tiles allow (cuBLAS took other tiles or "
                        f"split K): {', '.join(beyond)}; their curve points are capped at 1, so the profile prices "
                        "them slower than measured")
    if measured.memory_bytes_per_s:
        changes["hbm_bytes_per_s"] = measured.memory_bytes_per_s
        figures.append(Figure(key="hbm_gbps", value=_sig(measured.memory_bytes_per_s / GB), source="measured",
                              note="device memory bandwidth: a large copy, 2 bytes moved per byte copied, "
                                   "slowest rank"))
    if measured.layer_overhead_seconds is not None and "layer_overhead_seconds" in GPU.__dataclass_fields__:
        changes["layer_overhead_seconds"] = _sig(measured.layer_overhead_seconds, 3)
        figures.append(Figure(key="layer_overhead_seconds", value=changes["layer_overhead_seconds"],
                              source="measured",
                              note=f"what one more layer adds to a DeepSpeed step of a small Llama ({_floor_model()}; "
                                   "1 vs 5 layers), its FLOPs a few percent of it: operator dispatch/launch, "
                                   "slowest rank"))
    step_fixed_index = None
    if measured.step_fixed_seconds is not None:
        changes["step_overhead_seconds"] = _sig(measured.step_fixed_seconds, 3)
        step_fixed_index = len(figures)
        figures.append(Figure(key="step_overhead_seconds", value=changes["step_overhead_seconds"], source="measured",
                              note="a 1-layer DeepSpeed step minus the layer floor: embedding, head, loss and the "
                                   "engine's fixed work, slowest rank"))
    if measured.allreduce and measured.num_ranks > 1:
        top = max(measured.allreduce, key=lambda b: b.size_bytes)
        link = base.intra_node_bytes_per_s
        what = (f"all-reduce bus bandwidth {top.busbw_bytes_per_s / GB:.4g} GB/s at {top.size_bytes / 2**20:g} MiB "
                f"over {measured.num_ranks} ranks ({measured.backend})")
        if top.busbw_bytes_per_s <= link:
            eff = max(1e-4, _sig(top.busbw_bytes_per_s / link, 3))
            changes["intra_node_efficiency"] = eff
            figures.append(Figure(key="intra_node_efficiency", value=eff, source="measured",
                                  note=f"{what} over the catalog link of {link / GB:g} GB/s"))
        else:
            changes["intra_node_bytes_per_s"] = top.busbw_bytes_per_s
            changes["intra_node_efficiency"] = 1.0
            figures.append(Figure(key="intra_node_gbps", value=_sig(top.busbw_bytes_per_s / GB), source="measured",
                                  note=f"{what}: above the catalog link ({link / GB:g} GB/s), so the link is the "
                                       "measured bus bandwidth"))
            figures.append(Figure(key="intra_node_efficiency", value=1.0, source="measured",
                                  note="the link above is what the collective reached"))
        latency = fit_latency(points=measured.allreduce, num_ranks=measured.num_ranks)
        if latency is not None:
            small = ", ".join(f"{b.size_bytes / 2**10:g} KiB {_allreduce_seconds(b, measured.num_ranks) * 1e6:.4g} us"
                              for b in measured.allreduce if b.size_bytes <= LATENCY_MAX_BYTES)
            changes["collective_latency_seconds"] = _sig(latency, 3)
            figures.append(Figure(key="collective_latency_seconds", value=changes["collective_latency_seconds"],
                                  source="measured",
                                  note=f"fixed cost of one all-reduce: the least of ({small}) less its bytes at "
                                       f"the {top.size_bytes / 2**20:g} MiB bus bandwidth"))
    else:
        figures.append(Figure(key="intra_node_efficiency", value=base.intra_node_efficiency, source="catalog",
                              note="one rank: no all-reduce to time"))
    if "collective_latency_seconds" not in changes:
        figures.append(Figure(key="collective_latency_seconds", value=base.collective_latency_seconds, source="catalog",
                              note="per-call collective latency, not measured (one rank, or one all-reduce size)"))
    if measured.step_spread is not None and measured.step_spread > LOADED_SPREAD:
        threads = (f"; each of the {measured.num_ranks} rank(s) ran {measured.threads} threads: where ranks x threads "
                   "fill the cores, every operator waits for a thread another process holds (OMP_NUM_THREADS=1 "
                   "avoids it)" if measured.device == "cpu" and measured.threads and measured.threads > 1 else "")
        warnings.append(f"other load slowed the measurement (the 1-layer step's median {measured.step_spread:.1f}x its "
                        f"fastest): the profile keeps the fastest figures, the host unloaded; a run beside that load "
                        f"will be up to that much slower{threads}. Calibrate on an idle host for figures that hold")
    label = name or f"{base.name}, calibrated"
    gpu = base.replace(name=label, **changes)
    if step_fixed_index is not None and measured.layer_overhead_seconds is not None:
        # The step's fixed cost is what the measured 1-layer step leaves once the time model has priced
        # the rest of that step with this profile's other figures (its layer, head, loss, optimizer and
        # gradient all-reduce): those parts are priced again in every plan, so they must not sit in the
        # step's fixed cost too.
        from dstk.errors import DstkError

        one = measured.step_fixed_seconds + measured.layer_overhead_seconds
        try:
            priced = priced_floor_step_seconds(gpu=gpu.replace(step_overhead_seconds=0.0),
                                               num_ranks=measured.num_ranks, precision=measured.precision)
        except (ValueError, DstkError) as exc:  # keep the plain difference rather than lose the measurement
            priced = None
            warnings.append(f"step_overhead_seconds: the time model could not price the floor's step ({exc}); "
                            "kept the 1-layer step minus the layer floor")
    if step_fixed_index is not None and measured.layer_overhead_seconds is not None and priced is not None:
        fixed = _sig(max(0.0, one - priced), 3)
        gpu = gpu.replace(step_overhead_seconds=fixed)
        figures[step_fixed_index] = Figure(
            key="step_overhead_seconds", value=fixed, source="measured",
            note=f"the measured 1-layer DeepSpeed step of the floor's Llama ({one * 1e3:.4g} ms, slowest rank) less "
                 f"what the time model prices for it with the figures above ({priced * 1e3:.4g} ms: its layer, "
                 "embedding, head and loss, optimizer, gradient all-reduce): the engine's fixed work")
    if measured.zero_steps and measured.device == "cpu":
        # After the link, latency and floors: the collectives the fit subtracts are priced with them.
        from dstk.errors import DstkError

        try:
            fitted = fit_zero_tensor_seconds(gpu=gpu, steps=measured.zero_steps, num_ranks=measured.num_ranks,
                                             precision=measured.precision)
        except (ValueError, DstkError) as exc:
            fitted = {}
            warnings.append(f"zero_tensor_seconds: the time model could not price the ZeRO steps ({exc}); kept the "
                            "catalog's")
        for stage, (per_tensor, how) in fitted.items():
            field = _ZERO_FIELD[stage]
            value = _sig(per_tensor, 3)
            gpu = gpu.replace(**{field: value})
            figures.append(Figure(key=field, value=value, source="measured",
                                  note=f"ZeRO-{stage}'s host work per parameter tensor and micro-batch: DeepSpeed "
                                       f"steps of the floor's Llama under ZeRO-{stage} less ZeRO-0 ({how}), less the "
                                       "collectives the time model prices, least squares per tensor; fastest batch, "
                                       "slowest rank" + ("" if measured.zero_wall_seconds is None else
                                                         f"; building and timing the {len(measured.zero_steps)} "
                                                         f"engines took {measured.zero_wall_seconds:.1f} s")))
            if per_tensor == 0.0:
                warnings.append(f"{field}: ZeRO-{stage} added no more than the time model prices for its collectives "
                                "(0 written)")
    if measured.memory_bytes_per_s and measured.device == "cpu":
        # A CPU rank's tensors and an offloaded optimizer's states are in the same DRAM, which the ranks
        # copied at once: the node's bandwidth that their CPU optimizer steps share
        # (``hardware.host_optimizer_seconds``) is what they reached together, not a DGX A100's.
        node = measured.memory_bytes_per_s * measured.num_ranks
        gpu = gpu.replace(host_dram_bytes_per_s=node)
        figures.append(Figure(key="host_dram_gbps", value=_sig(node / GB), source="measured",
                              note=f"node DRAM bandwidth that offloaded optimizer steps share: the copy above, run "
                                   f"on all {measured.num_ranks} rank(s) at once, x {measured.num_ranks}"))
    written = {f.key for f in figures}
    for key_, value, note in (("memory_gib", gpu.memory_bytes / 2**30, "device memory"),
                              ("achievable_fraction", gpu.achievable_fraction, "share of peak where no curve applies"),
                              ("intra_node_gbps", gpu.intra_node_bytes_per_s / GB, "link to node peers"),
                              ("host_gbps", gpu.host_bytes_per_s / GB, "host link (offload)"),
                              ("overhead_gib", gpu.overhead_bytes / 2**30, "framework memory overhead"),
                              ("zero_tensor_seconds", gpu.zero_tensor_seconds,
                               "ZeRO-1/2 host work per tensor, not measured (a GPU, or no transformers)"),
                              ("zero3_tensor_seconds", gpu.zero3_tensor_seconds,
                               "ZeRO-3 host work per tensor, not measured (a GPU, or no transformers)")):
        if key_ not in written:
            figures.append(Figure(key=key_, value=_sig(value), source="catalog", note=note))
    if "host_dram_gbps" not in written:
        from dstk.hardware import HOST_DRAM_FALLBACK_BYTES_PER_S

        own = gpu.host_dram_bytes_per_s
        figures.append(Figure(key="host_dram_gbps", value=_sig((own or HOST_DRAM_FALLBACK_BYTES_PER_S) / GB),
                              source="catalog",
                              note="node DRAM bandwidth for offloaded optimizer steps, not measured (the copy timed "
                                   "device memory)" + ("" if own else ": no reference node for this GPU, an assumed "
                                                       "DGX A100's; set host_dram_gbps in the profile")))
    if "layer_overhead_seconds" not in written and "layer_overhead_seconds" in GPU.__dataclass_fields__:
        figures.append(Figure(key="layer_overhead_seconds", value=gpu.layer_overhead_seconds, source="catalog",
                              note="per-layer floor, not measured (transformers is not installed)"))
    for p_name in ("bf16", "fp16", "fp32"):
        if p_name != measured.precision:
            k_, fld = _PEAK_KEY[p_name]
            peak_ = getattr(gpu, fld)
            figures.append(Figure(key=k_, value=None if peak_ is None else _sig(peak_ / TFLOP), source="catalog",
                                  note=f"{p_name} peak, not measured (the sweep ran in {measured.precision})"))
    return Profile(slug=base.slug, base=base.slug, gpu=gpu, figures=tuple(figures), warnings=tuple(warnings),
                   measurements=measured)


_JSON_EXPONENT = re.compile(r"(?<![\w.])(-?\d+)([eE][-+]?\d+)")


def yaml_number_text(value) -> str:
    """``value`` (a number, or lists of them) as JSON text that PyYAML reads back as the same numbers
    (pure). PyYAML follows YAML 1.1, where a float needs a dot: ``2e-05`` (what ``json.dumps`` writes
    for 0.00002) is read as the *string* "2e-05", so the mantissa gets one (``2.0e-05``)."""
    return _JSON_EXPONENT.sub(r"\1.0\2", json.dumps(value))


def render_yaml(profile: Profile, *, header: tuple[str, ...] = ()) -> str:
    """The profile as a ``--hardware FILE``: the measured fields, each after a comment saying how
    it was measured, and a list of the fields kept from the catalog (``base:``). Values are JSON
    scalars and lists, which YAML reads as they are."""
    lines = [f"# {h}" for h in header]
    catalog = [f.key for f in profile.figures if f.source == "catalog"]
    lines += [f"# measured: {', '.join(f.key for f in profile.figures if f.source == 'measured')}",
              f"# from the catalog entry {profile.base!r} (base:, not written here): {', '.join(catalog)}",
              "gpus:", f"  {profile.slug}:", f"    base: {profile.base}", f"    name: {json.dumps(profile.gpu.name)}"]
    for f in profile.figures:
        if f.source == "measured":
            lines.append(f"    # {f.note}")
            lines.append(f"    {f.key}: {yaml_number_text(f.value)}")
    m = profile.measurements
    if m is not None:
        if m.allreduce:
            lines.append("# all-reduce bus bandwidth by size: " + ", ".join(
                f"{b.size_bytes / 2**20:g} MiB {b.busbw_bytes_per_s / GB:.3g} GB/s" for b in m.allreduce))
        lines.append("# GEMM FLOP/s by d: " + ", ".join(f"{p.dim} {p.flops_per_s / TFLOP:.3g} TFLOP/s" for p in m.gemm))
        if m.op_seconds is not None:
            lines.append(f"# one small operator: {m.op_seconds * 1e6:.2f} us (the floor of every operator's time; "
                         "not a catalog field)")
    for w in profile.warnings:
        lines.append(f"# warning: {w}")
    return "\n".join(lines) + "\n"


def render_json(profile: Profile) -> str:
    """The profile as a JSON ``--hardware FILE`` (no comments: ``render_report`` says the sources)."""
    entry = {"base": profile.base, "name": profile.gpu.name}
    entry.update({f.key: f.value for f in profile.figures if f.source == "measured"})
    return json.dumps({"gpus": {profile.slug: entry}}, indent=2) + "\n"


def to_dict(profile: Profile) -> dict:
    """For ``--format json``: every figure with its source, and the raw measurements."""
    return {"slug": profile.slug, "base": profile.base, "name": profile.gpu.name,
            "figures": [dataclasses.asdict(f) for f in profile.figures], "warnings": list(profile.warnings),
            "measurements": None if profile.measurements is None else dataclasses.asdict(profile.measurements)}


def render_report(profile: Profile, *, path: str | None) -> str:
    """For people: every field, its value and its source."""
    out = [f"calibrated {profile.slug!r} (base: catalog {profile.base!r})" + (f" -> {path}" if path else "")]
    for f in profile.figures:
        value = f.value
        if isinstance(value, float):
            value = f"{value:.4g}"
        elif isinstance(value, list):
            value = " ".join(f"{int(d)}:{x:.3g}" for d, x in value)
        out.append(f"  {f.source:<8} {f.key:<22} {value}  ({f.note})")
    m = profile.measurements
    if m is not None and m.op_seconds is not None:
        out.append(f"  measured one small operator: {m.op_seconds * 1e6:.2f} us (informational)")
    out += [f"  warning: {w}" for w in profile.warnings]
    return "\n".join(out)


# Substrings of torch.cuda.get_device_name() -> catalog slug, most specific first.
_DEVICE_NAMES = (("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"), ("b200", "b200"),
                 ("a100-sxm4-40gb", "a100-40gb"), ("a100-pcie-40gb", "a100-40gb"), ("a100", "a100-80gb"),
                 ("l40s", "l40s"), ("a10", "a10"), ("v100", "v100-32gb"), ("mi300x", "mi300x"), ("mi250x", "mi250x"))


def guess_gpu_slug(device_name: str | None, *, cpu: bool) -> str | None:
    """The catalog entry for a device torch names (``NVIDIA H200`` -> ``h200``); ``cpu`` for CPU
    ranks; None when the name matches no entry (then ``--gpu SLUG`` says which)."""
    if cpu:
        return "cpu"
    name = (device_name or "").lower()
    for needle, slug in _DEVICE_NAMES:
        if needle in name and not (needle == "a10" and "a100" in name):
            return slug
    return None


HEADER = "dstk hardware profile"
"""The first comment of a YAML profile: marks a file this command may overwrite."""


def written_by_calibrate(path: str) -> bool:
    """Whether ``path`` holds a profile ``doctor --calibrate`` wrote (so overwriting it loses
    nothing a person wrote): a YAML file that starts with ``# dstk hardware profile``, or a JSON
    file holding one ``gpus`` entry named ``..., calibrated``."""
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError):
        return False
    if not path.endswith(".json"):
        return text.startswith(f"# {HEADER}")
    try:
        data = json.loads(text)
        (entry,) = data["gpus"].values()
        return set(data) == {"gpus"} and str(entry.get("name", "")).endswith(", calibrated")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def check_output_path(path: str, *, force: bool = False) -> None:
    """Refuse, before a minute of measuring, an output the profile cannot be written to, or a
    file someone else wrote (a hand-written hardware file) unless ``force``."""
    import os

    from dstk.errors import DstkError

    if os.path.isdir(path):
        raise DstkError(f"{path}: is a directory", hint="give a file name, e.g. --output hardware.yaml")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise DstkError(f"{path}: directory {parent} does not exist", hint=f"create it (mkdir -p {parent}) or "
                        "give another --output")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise DstkError(f"{path}: not writable", hint="give a path you can write, e.g. --output ./hardware.yaml")
    if not path.endswith((".yaml", ".yml", ".json")):
        raise DstkError(f"{path}: the hardware file must end in .yaml, .yml or .json (load_catalog reads it by "
                        "its suffix)", hint="e.g. --output hardware.yaml")
    if os.path.exists(path) and not force and not written_by_calibrate(path):
        raise DstkError(f"{path}: exists and is not a profile doctor --calibrate wrote",
                        hint="give another --output (then copy the entry you want into it), or --force to replace it")


def write_profile(path: str, text: str) -> None:
    """Write through a temporary file in the same directory and rename it: never a half-written
    profile. An OS error becomes a ``DstkError``."""
    import os
    import tempfile

    from dstk.errors import DstkError

    parent = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise DstkError(f"{path}: cannot write the profile: {exc.strerror or exc}",
                        hint="give a writable --output path") from None
