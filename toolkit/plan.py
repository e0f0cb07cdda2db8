"""The planner: every consistent layout for a model on a cluster, the ones that fit, ranked.

    plan(search=Search(...), estimate=fn) -> PlanResult

1. **Enumerate** (``candidate_layouts``): dp x tp x pp = GPUs; tp divides the attention and KV
   heads and the GPUs per node, so a TP group never spans nodes (unless allowed); pp <= layers
   (Megatron's uneven first/last stages where the layers do not split evenly: ``stage_splits``);
   global batch = micro x grad-accum x dp; ZeRO 0-3 (0/1 with a pipeline: DeepSpeed's
   ``PipelineEngine`` asserts it); optimizer/parameter offload (ZeRO >= 1 / ZeRO-3, pp = 1);
   recompute; interleaved stages (Megatron only). With a pipeline, at least 4 x pp micro-batches
   per step unless the batch is too small for that (then the most micro-batches possible).
2. **Drop** what does not fit: predicted per-GPU bytes > overhead + (GPU memory - overhead) x
   (1 - headroom), the overhead being the estimate's fixed CUDA context and NCCL term; and, when
   the node's memory is known, offload whose host RAM per node exceeds it x (1 - headroom). Memory
   grows with the micro-batch, so the micro-batch loop stops at the first one that does not fit.
3. **Rank** by predicted step time, then apply the playbook as tie-breaker within 3% of the
   fastest (``tie_key``): not tight (<= 90% of usable memory) first, then the simplest (plain DP
   before ZeRO, ZeRO before TP, TP before PP), then the most free memory, since the estimate is
   not 3% accurate and simpler, roomier layouts fail less (Narayanan et al. 2021, takeaways 1-2;
   HF's "which ZeRO stage" guide).
4. **Explain**: why the winner wins and why the best of each other kind loses, with figures;
   when nothing fits, the smallest changes that would (``suggest_fixes``).

The estimator is passed in (``estimate(layout) -> Estimate``), so this module is pure and knows
nothing of DeepSpeed key names.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

from dstk.intent import Constraints
from dstk.layout import Layout

TIE_FRACTION = 0.03
"""Layouts within 3% of the fastest count as tied; ``tie_key`` orders them."""
TIGHT_FRACTION = 0.9
"""In the tie band, a layout using more than 90% of the usable memory counts as tight and yields to
one that does not: the memory estimate and the allocator both err, and a run at 99% of its budget
is the one that dies of an out-of-memory error at step 1,000 on a longer batch."""
VIRTUAL_STAGES = (1, 2, 3, 4, 6, 8)
"""Interleaved chunks per pipeline rank the megatron engine considers (3 is what Korthikanti et al.
2022 ran for 175B and 530B: 96 and 105 layers)."""
MIN_MICRO_PER_STAGE = 4
"""With a pipeline, aim for >= 4 x pp micro-batches per step (bubble (p-1)/m <= 25%)."""


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Search:
    """What the search needs to know, and nothing else (no model or GPU objects)."""

    world_size: int
    gpus_per_node: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    global_batch: int
    """Sequences per optimizer step."""
    capacity_bytes: int
    """Memory of one GPU."""
    overhead_bytes: int = 0
    """The fixed per-GPU overhead (CUDA context, NCCL) that every estimate's total already holds."""
    host_memory_bytes: int | None = None
    """CPU memory of one node, for the host RAM that offload needs; None: unknown (not checked)."""
    constraints: Constraints = dataclasses.field(default_factory=Constraints)
    max_zero_stage: int = 3
    """The highest ZeRO stage the run can take (QLoRA: 2, DeepSpeed cannot partition 4-bit weights)."""
    bf16: bool = False
    """bf16 training: a DeepSpeed pipeline then skips ZeRO-0 unless pinned (it can only sum gradients in
    bf16, ``memory.pipeline_grad_accum_dtype``; ZeRO-1 gets fp32 accumulation)."""

    @property
    def usable_bytes(self) -> int:
        """``overhead + (capacity - overhead) x (1 - headroom)``.

        The headroom is a margin for allocator fragmentation and estimate error, so it is a fraction
        of what PyTorch's allocator can hand out. The fixed overhead is already one term of every
        estimate's total; taking the headroom of it as well would reserve the CUDA context twice.
        """
        return usable_gpu_bytes(capacity_bytes=self.capacity_bytes, overhead_bytes=self.overhead_bytes,
                                headroom=self.constraints.memory_headroom)

    @property
    def usable_host_bytes(self) -> int | None:
        """``host_memory x (1 - headroom)``: the same margin as on the GPU, for the OS, the data
        loaders and the framework's own host memory. None when the node's memory is unknown."""
        if self.host_memory_bytes is None:
            return None
        return int(self.host_memory_bytes * (1.0 - self.constraints.memory_headroom))

    def host_bytes_per_node(self, estimate: Any) -> int:
        """Host RAM a node needs for offload: the estimate's per-rank CPU bytes x ranks per node."""
        return int(getattr(estimate.memory, "cpu_bytes", 0) or 0) * min(self.gpus_per_node, self.world_size)


def usable_gpu_bytes(*, capacity_bytes: int, overhead_bytes: int, headroom: float) -> int:
    """``overhead + (capacity - overhead) x (1 - headroom)`` (``Search.usable_bytes``), also the
    line ``dstk estimate`` draws between "fits" and "fits only without headroom"."""
    return int(overhead_bytes + (capacity_bytes - overhead_bytes) * (1.0 - headroom))


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Candidate:
    """One estimated layout."""

    layout: Layout
    estimate: Any
    """A ``dstk.estimate.Estimate``."""

    @property
    def total_bytes(self) -> int:
        return self.estimate.memory.per_gpu.total_bytes

    @property
    def step_seconds(self) -> float:
        return self.estimate.time.step_seconds


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Plan:
    layout: Layout
    estimate: Any
    why: tuple[str, ...]
    host_bytes_per_node: int = 0
    """Host RAM the layout's offload needs on each node (per-rank CPU bytes x ranks per node)."""
    host_memory_bytes: int | None = None
    """The node's memory it was checked against; None: unknown, not checked."""

    def to_dict(self) -> dict:
        est = self.estimate.to_dict()
        memory = dict(est["memory"])
        memory["host"] = {"per_node_bytes": self.host_bytes_per_node, "node_memory_bytes": self.host_memory_bytes,
                          "checked": self.host_memory_bytes is not None}
        return {"layout": self.layout.to_dict(), "memory": memory, "time": est["time"], "why": list(self.why)}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Rejection:
    layout: Layout
    reason: str
    total_bytes: int | None = None
    host_bytes_per_node: int | None = None
    """Set when the layout fits on the GPU but its offload does not fit in the node's host RAM."""
    terms: str = ""
    """Where the GPU memory goes, largest first (``memory_terms``), for the nothing-fits message."""

    def to_dict(self) -> dict:
        return {"layout": self.layout.to_dict(), "reason": self.reason, "total_bytes": self.total_bytes,
                "host_bytes_per_node": self.host_bytes_per_node}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class PlanResult:
    plans: tuple[Plan, ...]
    """Best first: the playbook's pick, then the rest by step time."""
    rejected: tuple[Rejection, ...]
    """The closest misses of each kind (not every layout that did not fit)."""
    num_considered: int
    num_fitting: int
    usable_bytes: int

    def to_dict(self, *, top: int | None = None) -> dict:
        plans = self.plans if top is None else self.plans[:top]
        return {
            "plans": [p.to_dict() for p in plans],
            "rejected": [r.to_dict() for r in self.rejected],
            "num_considered": self.num_considered,
            "num_fitting": self.num_fitting,
            "usable_bytes_per_gpu": self.usable_bytes,
        }


# --- enumeration --------------------------------------------------------------------------------


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def tensor_degrees(s: Search) -> list[int]:
    c = s.constraints
    out = []
    for tp in divisors(s.world_size):
        if s.num_heads % tp or s.num_kv_heads % tp:
            continue  # AutoTP and Megatron both split whole heads (and KV heads) per rank
        if s.gpus_per_node % tp and not c.tp_across_nodes:
            continue  # TP all-reduces every layer: a group must sit inside one node (tp=3 on 8 would straddle two)
        if c.max_tp is not None and tp > c.max_tp:
            continue
        if c.tp is not None and tp != c.tp:
            continue
        out.append(tp)
    return out


def pipeline_degrees(s: Search, tp: int) -> list[int]:
    c = s.constraints
    out = []
    for pp in divisors(s.world_size // tp):
        if pp > s.num_layers:
            break
        if c.engine == "deepspeed" and tp > 1 and pp > 1:
            continue  # DeepSpeed's AutoTP mesh is dp x tp only; its pipeline engine has no TP here
        if c.pp is not None and pp != c.pp:
            continue
        if c.dp is not None and s.world_size // (tp * pp) != c.dp:
            continue
        out.append(pp)
    return out


def micro_batches(s: Search, *, dp: int, pp: int) -> list[int]:
    """Micro-batch sizes, ascending; with pp > 1 only those leaving >= 4 x pp micro-batches,
    unless none does (then the one that leaves the most)."""
    if s.global_batch % dp:
        return []
    per_replica = s.global_batch // dp
    sizes = divisors(per_replica)
    if s.constraints.micro_batch is not None:
        sizes = [m for m in sizes if m == s.constraints.micro_batch]
    if pp > 1:
        enough = [m for m in sizes if per_replica // m >= MIN_MICRO_PER_STAGE * pp]
        sizes = enough or sizes[:1]
    return sizes


def zero_stages(s: Search, *, pp: int) -> list[int]:
    c = s.constraints
    stages = [0, 1] if pp > 1 or c.engine == "megatron" else [0, 1, 2, 3]
    if pp > 1 and s.bf16 and c.engine != "megatron" and c.zero_stage is None:
        stages = [1]  # ZeRO-0 would sum the micro-batches' gradients in bf16 (DeepSpeed warns)
    return [z for z in stages if (c.zero_stage is None or z == c.zero_stage) and z <= s.max_zero_stage]


def offload_choices(s: Search, *, zero: int, pp: int) -> list[tuple[str, str]]:
    """(optimizer, params) placements. Parameter offload only together with optimizer offload:
    moving parameters off the GPU while their optimizer states stay is never the better trade."""
    c = s.constraints
    devices = ["none"]
    if c.offload and c.engine == "deepspeed" and pp == 1 and zero >= 1:
        devices.append("cpu")
        if c.nvme_path:
            devices.append("nvme")
    out = []
    for opt in devices:
        for par in (devices if zero == 3 and opt != "none" else ["none"]):
            if c.offload_optimizer is not None and opt != c.offload_optimizer:
                continue
            if c.offload_params is not None and par != c.offload_params:
                continue
            out.append((opt, par))
    return out


def recompute_choices(s: Search) -> list[str]:
    # Selective (attention-only) recompute is Megatron's; HF models under DeepSpeed checkpoint
    # whole layers (gradient_checkpointing_enable), so the deepspeed engine offers none/full.
    choices = ["none", "selective", "full"] if s.constraints.engine == "megatron" else ["none", "full"]
    pinned = s.constraints.recompute
    return [r for r in choices if pinned is None or r == pinned] or ([pinned] if pinned else [])


def virtual_choices(s: Search, *, pp: int, grad_accum: int) -> list[int]:
    c = s.constraints
    if c.engine != "megatron" or pp == 1:
        out = [1]
    else:
        # Megatron's interleaved schedule: every stage's layers split into v chunks (evenly, or with
        # uneven first/last stages: stage_splits), micro-batches a multiple of pp.
        out = [v for v in VIRTUAL_STAGES if v == 1 or (stage_splits(s.num_layers, pp, v) and grad_accum % pp == 0)]
    return [v for v in out if c.virtual_stages is None or v == c.virtual_stages]


@functools.lru_cache(maxsize=4096)
def stage_splits(num_layers: int, pp: int, v: int = 1) -> tuple[tuple[int | None, int | None], ...]:
    """(first, last) stage layer counts to consider for ``pp`` stages of ``v`` chunks each, for the
    megatron engine; ``(None, None)`` is the even split. Empty when Megatron cannot build any.

    Even when ``num_layers`` divides into pp x v chunks. Otherwise megatron-core 0.16.1's uneven
    stages (``num_layers_in_first/last_pipeline_stage``): the middle stages even, every count a
    multiple of v. The middle count is the one that makes the fullest stage smallest (the step runs
    at the pace of the slowest stage), and the ends share the rest two ways: balanced (the last stage
    also computes the output layer) and lighter-first (the first stage holds the embedding and, in
    1F1B, the most in-flight micro-batches: pp of them against one on the last). The estimator ranks
    the two; on a tie the planner prefers the one with more free memory, usually the lighter first.
    126 layers on pp 16 with v = 2: first 6, then 15 stages of 8.
    """
    if num_layers < pp:
        return ()
    if num_layers % (pp * v) == 0 or pp == 1:
        return ((None, None),)
    if num_layers % v:
        return ()
    best = None
    for middle in (range(v, num_layers + 1, v) if pp > 2 else (0,)):
        rest = num_layers - (pp - 2) * middle
        if rest < 2 * v:
            break
        fullest = max(middle, -(-rest // (2 * v)) * v)
        if best is None or (fullest, -middle) < best[0]:
            best = ((fullest, -middle), middle, rest)
    if best is None or (v > 1 and best[0][0] > -(-num_layers // (pp * v)) * v):
        return ()  # interleaving that would overfill a stage beyond the even share in whole chunks
    (fullest, _), middle, rest = best
    out = []
    for last in (rest - (rest // 2) // v * v, min(fullest, rest - v)):  # balanced, then lighter-first
        first = rest - last
        if pp == 2:
            split = (first, None)
        else:
            split = (None if first == middle else first, None if last == middle else last)
        if split not in out:
            out.append(split)
    return tuple(out)


def candidate_layouts(s: Search) -> Iterator[list[Layout]]:
    """Every consistent layout, grouped: within a group only the micro-batch changes (ascending),
    so a caller may stop a group at the first micro-batch that does not fit."""
    megatron = s.constraints.engine == "megatron"
    for tp in tensor_degrees(s):
        for pp in pipeline_degrees(s, tp):
            dp = s.world_size // (tp * pp)
            micros = micro_batches(s, dp=dp, pp=pp)
            if not micros:
                continue
            for zero in zero_stages(s, pp=pp):
                for opt, par in offload_choices(s, zero=zero, pp=pp):
                    for recompute in recompute_choices(s):
                        for v in sorted({v for m in micros for v in virtual_choices(
                                s, pp=pp, grad_accum=s.global_batch // (dp * m))}):
                            splits = stage_splits(s.num_layers, pp, v) if megatron else ((None, None),)
                            for first, last in splits:
                                group = []
                                for micro in micros:
                                    grad_accum = s.global_batch // (dp * micro)
                                    if v not in virtual_choices(s, pp=pp, grad_accum=grad_accum):
                                        continue
                                    group.append(Layout(
                                        dp=dp, tp=tp, pp=pp, zero_stage=zero, offload_optimizer=opt,
                                        offload_params=par, micro_batch=micro, grad_accum=grad_accum,
                                        recompute=recompute, virtual_stages=v,
                                        sequence_parallel=megatron and tp > 1,
                                        first_stage_layers=first, last_stage_layers=last,
                                    ))
                                if group:
                                    yield group


def empty_search_reason(s: Search) -> str | None:
    """Why no layout is consistent at all (before any estimate), with the fix."""
    if not tensor_degrees(s):
        return (f"no tensor-parallel degree divides both {s.num_heads} heads and {s.num_kv_heads} KV heads "
                f"within the constraints; relax max_tp/tp")
    if all(not micro_batches(s, dp=s.world_size // (tp * pp), pp=pp)
           for tp in tensor_degrees(s) for pp in pipeline_degrees(s, tp)):
        dps = sorted({s.world_size // (tp * pp) for tp in tensor_degrees(s) for pp in pipeline_degrees(s, tp)})
        if not dps:
            return "no pipeline degree fits the pins (dp/pp) and the layer count"
        near = sorted({d * max(1, round(s.global_batch / d)) for d in dps})[:4]
        return (f"the global batch {s.global_batch} is not divisible by any possible data-parallel size "
                f"({', '.join(map(str, dps))}); nearest global batches: {', '.join(map(str, near))}")
    return None


# --- ranking ------------------------------------------------------------------------------------


def simplicity(layout: Layout) -> tuple:
    """Sort key of the playbook: plain DP, then ZeRO 1-3, then offload, then TP, then PP;
    less recompute, fewer interleaved chunks and even pipeline stages before the rest."""
    return (
        layout.pp > 1,
        layout.tp > 1,
        layout.offload_params != "none",
        layout.offload_optimizer != "none",
        layout.zero_stage,
        ("none", "selective", "full").index(layout.recompute),
        layout.virtual_stages,
        layout.uneven_stages,
        layout.pp,
        layout.tp,
    )


def is_tight(candidate: Candidate, usable_bytes: int | None) -> bool:
    """More than ``TIGHT_FRACTION`` of the usable memory per GPU."""
    return usable_bytes is not None and candidate.total_bytes > TIGHT_FRACTION * usable_bytes


def tie_key(candidate: Candidate, usable_bytes: int | None) -> tuple:
    """How the playbook orders layouts inside the tie band: a tight layout last, then the
    simplicity order, then the one with the most free memory (the smaller total), then the faster."""
    return (is_tight(candidate, usable_bytes), simplicity(candidate.layout), candidate.total_bytes,
            candidate.step_seconds)


def shards_nothing(layout: Layout) -> bool:
    """ZeRO over one data-parallel rank: one partition, so ZeRO shards nothing, yet DeepSpeed still
    runs its hooks, flat-buffer copies and (ZeRO-3) gather bookkeeping, which the estimate does not
    price. Measured (``benchmarks/zero_dp1_cost.py``, tiny Llama, 2 gloo ranks, tp=2 dp=1, two runs
    under load): ZeRO-1/2 0-41% slower than ZeRO-0 on the same layout, ZeRO-3 34-84% slower, and
    dp=2 ZeRO-3 ran 15-20% faster than tp=2 dp=1 ZeRO-3, which the estimate rates 25% slower. What
    such a layout can buy is memory: CPU offload, or (bf16/fp16) no fp32 gradient copy of
    DeepSpeed's ZeRO-0 optimizer wrapper."""
    return layout.zero_stage > 0 and layout.dp == 1


def pick(candidates: list[Candidate], *, tie_fraction: float = TIE_FRACTION,
         usable_bytes: int | None = None, prefer_sharded: bool = False) -> list[Candidate]:
    """Order fitting candidates best first: among those within ``tie_fraction`` of the fastest,
    the first by ``tie_key`` (not tight, simplest, most free memory); then everything else by step time.

    ``prefer_sharded`` (the user pinned ZeRO > 0): the winner comes from the layouts where ZeRO
    shards something (``not shards_nothing``) whenever one fits; a layout over one data-parallel
    rank wins only when nothing else fits (``why_lines`` and ``dp1_zero_line`` say so). Unpinned,
    ZeRO-0 at the same layout is a candidate with the same predicted time and is simpler, so ZeRO
    over one rank wins only on memory; except under a DeepSpeed pipeline in bf16, where ZeRO-0 runs
    ``BF16_Optimizer``'s per micro-batch gradient passes (``steptime.bf16_pipe_grad_bytes_per_param``)
    and ZeRO-1 can win on time (``dp1_zero_line`` says so)."""
    if not candidates:
        return []
    by_time = sorted(candidates, key=lambda c: (c.step_seconds, simplicity(c.layout), c.total_bytes))
    pool = [c for c in by_time if not shards_nothing(c.layout)] if prefer_sharded else by_time
    pool = pool or by_time
    fastest = pool[0].step_seconds
    tied = [c for c in pool if c.step_seconds <= fastest * (1 + tie_fraction)]
    winner = min(tied, key=lambda c: tie_key(c, usable_bytes))
    return [winner] + [c for c in by_time if c is not winner]


# --- words and figures --------------------------------------------------------------------------


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def describe(layout: Layout) -> str:
    """``dp=8 ZeRO-1 micro 2 x 4``, the short name of a layout used in every why line."""
    parts = [f"dp={layout.dp}"]
    if layout.tp > 1:
        parts.append(f"tp={layout.tp}" + ("+sp" if layout.sequence_parallel else ""))
    if layout.pp > 1:
        parts.append(f"pp={layout.pp}" + (f"x{layout.virtual_stages}" if layout.virtual_stages > 1 else ""))
        if layout.first_stage_layers is not None:
            parts.append(f"first={layout.first_stage_layers}")
        if layout.last_stage_layers is not None:
            parts.append(f"last={layout.last_stage_layers}")
    parts.append(f"ZeRO-{layout.zero_stage}")
    if layout.offload_optimizer != "none":
        parts.append(f"opt->{layout.offload_optimizer}")
    if layout.offload_params != "none":
        parts.append(f"params->{layout.offload_params}")
    if layout.recompute != "none":
        parts.append(f"recompute={layout.recompute}")
    parts.append(f"micro {layout.micro_batch} x {layout.grad_accum}")
    return " ".join(parts)


def kind(layout: Layout) -> str:
    """The family a layout belongs to, for "why the obvious alternatives lose"."""
    if layout.pp > 1:
        return "pipeline"
    if layout.tp > 1:
        return "tensor parallel"
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        return "offload"
    return f"ZeRO-{layout.zero_stage}" if layout.zero_stage else "plain DP"


def _simpler_reason(a: Layout, b: Layout) -> str:
    """Why ``a`` counts as simpler than ``b`` in the playbook's words."""
    if (a.pp > 1) != (b.pp > 1):
        return "no pipeline"
    if (a.tp > 1) != (b.tp > 1):
        return "no tensor parallelism"
    if (a.offload_optimizer, a.offload_params) != (b.offload_optimizer, b.offload_params):
        return "no offload"
    if a.zero_stage != b.zero_stage:
        return f"ZeRO-{a.zero_stage} instead of ZeRO-{b.zero_stage}"
    if a.recompute != b.recompute:
        return f"recompute {a.recompute} instead of {b.recompute}"
    if a.virtual_stages != b.virtual_stages:
        return f"{a.virtual_stages} interleaved chunk(s) instead of {b.virtual_stages}"
    if a.uneven_stages != b.uneven_stages:
        return "even pipeline stages"
    return "fewer moving parts"


def tie_reason(winner: Candidate, other: Candidate, *, usable_bytes: int | None) -> str:
    """Why ``winner`` beats ``other`` inside the tie band, in the order of ``tie_key``."""
    from dstk.tables import percent_text

    def free(c: Candidate) -> str:
        return gib(usable_bytes - c.total_bytes) if usable_bytes is not None else "?"

    if is_tight(winner, usable_bytes) != is_tight(other, usable_bytes):
        return (f"headroom: {free(winner)} free per GPU instead of {free(other)} (the other uses "
                f"{percent_text(other.total_bytes / usable_bytes)} of the usable memory; "
                f"over {TIGHT_FRACTION:.0%} counts as tight)")
    if simplicity(winner.layout) != simplicity(other.layout):
        return _simpler_reason(winner.layout, other.layout)
    if winner.total_bytes != other.total_bytes:
        return f"more headroom: {free(winner)} free per GPU instead of {free(other)}"
    return "fewer moving parts"


def idle_zero_text(layout: Layout) -> str:
    """Why a faster layout with ZeRO over one data-parallel rank (``shards_nothing``) was passed over."""
    return (f"ZeRO-{layout.zero_stage} over one data-parallel rank shards nothing and still runs its hooks and "
            f"copies (the estimate prices them on CPU ranks only); pin --dp 1 to run it anyway, or --zero 0 for that layout")


def dp1_zero_line(layout: Layout, *, twin_bytes: int | None, usable_bytes: int, zero_pinned: bool,
                  twin_step_seconds: float | None = None, step_seconds: float | None = None,
                  fp32_sums: bool = False) -> str | None:
    """The why line of a winner with ZeRO over one data-parallel rank: what it buys and what to drop.
    ``fp32_sums``: a bf16 DeepSpeed pipeline the search gave ZeRO-1 only (``zero_stages``), because
    only ZeRO-1 can sum its micro-batches' gradients in fp32 (``memory.pipeline_grad_accum_dtype``).
    ``twin_bytes``: per-GPU bytes of the same layout with ZeRO-0 and no offload (None: unknown);
    ``twin_step_seconds``/``step_seconds``: that twin's and the winner's step (a twin over 0.5% slower
    is named: under a pipeline DeepSpeed runs ZeRO-0 in bf16 through ``BF16_Optimizer``, which
    ``steptime.bf16_pipe_grad_bytes_per_param`` prices every micro-batch)."""
    if not shards_nothing(layout):
        return None
    z = layout.zero_stage
    offload = next((d for d in (layout.offload_optimizer, layout.offload_params) if d != "none"), None)
    line = f"ZeRO-{z} over one data-parallel rank (dp=1) shards nothing"
    pins = "; no layout with dp > 1 fits the pins" if zero_pinned else ""
    twin = (f"ZeRO-0 at the same layout needs {gib(twin_bytes)} of {gib(usable_bytes)} usable"
            if twin_bytes is not None else None)
    if offload:
        return f"{line}: its value here is the {offload} offload{pins}"
    if twin is not None and twin_bytes > usable_bytes:
        return f"{line}: it is kept for memory ({twin}){pins}"
    if fp32_sums:
        cost = (f", {twin_step_seconds:.3g} s/step against {step_seconds:.3g}"
                if twin_step_seconds is not None and step_seconds else "")
        needs = f"{gib(twin_bytes)} of {gib(usable_bytes)} usable" if twin_bytes is not None else ""
        return (f"{line}; it is what sums the micro-batches' gradients in fp32 (data_types.grad_accum_dtype: "
                f"fp32): DeepSpeed's ZeRO-0 pipeline would sum them in bf16; pin --zero 0 to accept that"
                + (f" (ZeRO-0 at the same layout: {needs}{cost})" if needs else ""))
    line += " and still runs its hooks and copies (the estimate prices them on CPU ranks only)"
    if (not zero_pinned and twin_step_seconds is not None and step_seconds
            and twin_step_seconds > 1.005 * step_seconds):
        why = (": under a pipeline DeepSpeed runs ZeRO-0 in bf16 through BF16_Optimizer, which zeroes and copies "
               "every gradient once a micro-batch" if layout.pp > 1 else "")
        return (f"{line}; it wins on time: ZeRO-0 at the same layout takes {twin_step_seconds:.3g} s/step "
                f"against {step_seconds:.3g}{why}")
    if twin is None:
        return line + pins
    return f"{line}{pins}: drop --zero {z} ({twin})" if zero_pinned else f"{line}; it wins on headroom only ({twin})"


def _time(est) -> Any:
    return est.time


def tp_against_pipeline_text(alt: Candidate, winner: Candidate) -> str | None:
    """Why tensor parallelism (``alt``, no pipeline) lost to a pipeline without TP (``winner``), when
    the playbook would put TP inside a node first: what each gives up, in seconds per step. TP: its
    all-reduces on the critical path (AutoTP overlaps none) and the rest of its compute beyond the
    pipeline's, net of the pipeline's slowest stage (AutoTP splits the matrices, not the memory-bound
    norms and residual adds, which run whole on every rank); the pipeline: its bubble and its blocking
    sends. None otherwise, or when those figures do not show the pipeline losing less."""
    if not (alt.layout.tp > 1 and alt.layout.pp == 1 and winner.layout.pp > 1 and winner.layout.tp == 1
            and alt.layout.recompute == winner.layout.recompute):
        return None
    t, w = _time(alt.estimate), _time(winner.estimate)
    tp_comm = dict(getattr(t, "comm", None) or {}).get("tp", 0.0)
    sends = dict(getattr(w, "comm", None) or {}).get("pp", 0.0)
    bubble = getattr(w, "bubble_seconds", None) or 0.0
    more = (getattr(t, "compute_seconds", 0.0) - tp_comm) - (getattr(w, "compute_seconds", 0.0) - sends)
    if bubble + sends >= tp_comm + max(more, 0.0):
        return None
    extra = (f" and {more:.3g} s more compute (its norms and residual adds run whole on each of its "
             f"{alt.layout.tp} GPUs)") if more > 0.005 * winner.step_seconds else ""
    return (f"inside a node the pipeline lost less: bubble {bubble:.3g} s and blocking sends {sends:.3g} s a step, "
            f"against TP's all-reduces {tp_comm:.3g} s on the critical path{extra}")


def loss_reason(alt: Candidate, winner: Candidate, *, usable_bytes: int | None = None) -> str:
    """One line: why ``alt`` (the best of its kind) loses to ``winner``, with the figure that matters."""
    from dstk.tables import percent_text, seconds_text

    t = _time(alt.estimate)
    ratio = alt.step_seconds / winner.step_seconds if winner.step_seconds else float("inf")
    head = (f"{kind(alt.layout)} ({describe(alt.layout)}): {seconds_text(alt.step_seconds)} s/step, "
            f"{ratio:.2f}x the winner")
    if ratio * (1 + TIE_FRACTION) < 1 and shards_nothing(alt.layout) and not shards_nothing(winner.layout):
        return f"{head}; {idle_zero_text(alt.layout)}"  # passed over by ``pick(prefer_sharded=True)``
    if ratio <= 1:  # as fast or faster, but inside the tie band: the playbook's order decided
        reason = tie_reason(winner, alt, usable_bytes=usable_bytes)
        return f"{head}; within {TIE_FRACTION:.0%}, and {reason} wins the tie"
    layout = alt.layout
    compute = getattr(t, "compute_seconds", None) or 0.0
    comm = getattr(t, "comm_seconds", None) or 0.0
    by_kind = dict(getattr(t, "comm", None) or {})
    bubble = getattr(t, "bubble_fraction", None) or 0.0
    if layout.pp > 1 and bubble >= 0.05:
        return f"{head}; pp={layout.pp} with {layout.grad_accum} micro-batches: bubble {percent_text(bubble)}"
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        moved = by_kind.get("offload", 0.0)
        cluster = getattr(alt.estimate, "cluster", None)
        if getattr(getattr(cluster, "gpu", None), "is_cpu", False):  # a CPU rank's tensors are in host memory already
            extra = f" ({moved:.3g} s of memory copies per step)" if moved else ""
            return (f"{head}; a CPU rank has no PCIe link: its tensors and the offloaded states share host "
                    f"memory, so offload only adds copies of gradients and parameters between them{extra}")
        extra = f" ({moved:.3g} s of PCIe traffic per step)" if moved else ""
        return f"{head}; offload runs the optimizer step on the {layout.offload_optimizer} side of PCIe{extra}"
    named = [("zero3_gather", "parameter gathers"), ("tp", f"TP all-reduces over {layout.tp} GPUs"),
             ("dp", "gradient reductions"), ("pp", "pipeline sends")]
    if compute:
        for key, words in named:
            seconds = by_kind.get(key, 0.0)
            if seconds > 0.1 * compute:
                if key in ("tp", "pp"):  # priced inside compute, on the critical path: never hidden
                    hidden = " (on the critical path)"
                else:
                    hidden = " (partly hidden behind compute)" if comm < seconds else ""
                return f"{head}; {words} take {seconds / compute:.1f}x the compute ({seconds:.3g} s vs {compute:.3g} s){hidden}"
        if comm > 0.1 * compute:
            return f"{head}; exposed communication takes {comm / compute:.1f}x the compute"
    if layout.recompute != "none" and winner.layout.recompute == "none":
        return f"{head}; recompute={layout.recompute} repeats the forward pass"
    if layout.recompute != "none" and winner.layout.recompute != layout.recompute:
        return f"{head}; it needs recompute={layout.recompute} to fit"
    tp_vs_pp = tp_against_pipeline_text(alt, winner)
    if tp_vs_pp:
        return f"{head}; {tp_vs_pp}"
    # Both recompute alike (or neither does): name the terms where the time went, from the figures.
    w = _time(winner.estimate)
    terms = [(what, mine, getattr(w, key, None) or 0.0) for what, key, mine in
             (("compute", "compute_seconds", compute), ("exposed communication", "comm_seconds", comm),
              ("bubble", "bubble_seconds", getattr(t, "bubble_seconds", None) or 0.0))]
    slower = [f"{what} {seconds_text(mine)} s" for what, mine, theirs in terms
              if mine - theirs > 0.01 * winner.step_seconds]
    theirs = ", ".join(f"{seconds_text(theirs)} s" for what, mine, theirs in terms
                       if mine - theirs > 0.01 * winner.step_seconds)
    return f"{head}; {', '.join(slower)} (the winner: {theirs})" if slower else head


def why_lines(ordered: list[Candidate], *, usable_bytes: int, capacity_bytes: int, num_fitting: int,
              tie_fraction: float = TIE_FRACTION, by_kind_missing: dict[str, Rejection] | None = None,
              prefer_sharded: bool = False) -> list[str]:
    """Why the winner wins and why the best of each other kind loses. Percentages go through
    ``dstk.tables.percent_text``: a small MFU reads 0.48%, never 0%. ``prefer_sharded``: as
    ``pick``'s; a faster layout over one data-parallel rank that it passed over gets its own line."""
    from dstk.tables import percent_text, seconds_text

    winner = ordered[0]
    t = _time(winner.estimate)
    # The fastest layout the playbook passed over, if any was at least as fast as the winner.
    faster = [c for c in ordered[1:] if c.step_seconds <= winner.step_seconds]
    idle = ([c for c in faster if shards_nothing(c.layout)]
            if prefer_sharded and not shards_nothing(winner.layout) else [])
    faster = [c for c in faster if not any(c is i for i in idle)]
    fastest = min(faster, key=lambda c: c.step_seconds) if faster else winner
    lines = []
    mfu = getattr(t, "mfu", None)
    tps = getattr(t, "tokens_per_second", None)
    figures = f"{seconds_text(winner.step_seconds)} s/step"
    if tps:
        figures += f", {tps:,.0f} tokens/s"
    if mfu:
        figures += f", MFU {percent_text(mfu)}"
    lead = ("fastest" if fastest is winner or fastest.step_seconds == winner.step_seconds
            else f"the playbook's pick within {tie_fraction:.0%} of the fastest")
    scope = f" (of those where ZeRO-{winner.layout.zero_stage} shards: dp > 1)" if idle else ""
    lines.append(
        f"{describe(winner.layout)}: {lead} of {num_fitting} layouts that fit{scope}: {figures}; "
        f"{gib(winner.total_bytes)} of {gib(usable_bytes)} usable per GPU ({gib(capacity_bytes)} total)"
    )
    if fastest is not winner:
        gain = winner.step_seconds / fastest.step_seconds - 1
        speed = "as fast" if gain < 5e-4 else f"{percent_text(gain)} faster"
        lines.append(
            f"chosen over {describe(fastest.layout)} ({speed}, within {tie_fraction:.0%}): "
            f"{tie_reason(winner, fastest, usable_bytes=usable_bytes)}"
        )
    if idle:
        best_idle = min(idle, key=lambda c: c.step_seconds)
        gain = winner.step_seconds / best_idle.step_seconds - 1
        speed = "as fast" if gain < 5e-4 else f"predicted {percent_text(gain)} faster"
        lines.append(f"chosen over {describe(best_idle.layout)} ({speed}): {idle_zero_text(best_idle.layout)}")
    seen = {kind(winner.layout)}
    for alt in ordered[1:]:
        k = kind(alt.layout)
        if k in seen:
            continue
        seen.add(k)
        if any(alt is i for i in idle) or alt is not winner and alt is fastest:
            continue  # the "chosen over" line above says why
        lines.append(loss_reason(alt, winner, usable_bytes=usable_bytes))
    for k, miss in (by_kind_missing or {}).items():
        if k in seen:
            continue
        if miss.host_bytes_per_node is not None:
            seen.add(k)
            lines.append(f"{k} does not fit: {describe(miss.layout)} {miss.reason}")
        elif miss.total_bytes is not None:
            seen.add(k)
            lines.append(f"{k} does not fit: {describe(miss.layout)} needs {gib(miss.total_bytes)} "
                         f"of {gib(usable_bytes)} usable")
    return lines


# --- the search ---------------------------------------------------------------------------------


def split_line(layout: Layout, estimate: Any, *, engine: str) -> str | None:
    """The why line of an uneven pipeline split: decoder layers per stage as the estimate priced them
    (``memory.per_stage[].num_layers``, ``dstk.estimate.stage_layers``) and the Megatron-LM arguments
    ``generate`` writes for them (``dstk.render.megatron_args``: the layout's first/last stages; else
    first/last when the middle stages are even, else ``--pipeline-model-parallel-layout``). Why: the
    deepspeed engine's ``to_pipeline`` cuts ``partition="balanced"``, which weighs the embedding and
    the output layer with its fp32 logits like decoder layers (``dstk.pipeline.partition``); Megatron
    keeps the middle stages even and gives the ends the rest (``stage_splits``). None when even."""
    from dstk.render import pipeline_layout_text

    counts = [s.num_layers for s in estimate.memory.per_stage]
    if layout.pp == 1 or len(counts) != layout.pp or len(set(counts)) <= 1:
        return None
    if layout.uneven_stages:
        ends = (("first", layout.first_stage_layers), ("last", layout.last_stage_layers))
    elif len(set(counts[1:-1])) <= 1:
        ends = (("first", counts[0]), ("last", counts[-1]))
    else:
        ends = ()
    args = (" ".join(f"--decoder-{end}-pipeline-num-layers {n}" for end, n in ends if n is not None) if ends
            else f"--pipeline-model-parallel-layout {pipeline_layout_text(counts)}")
    text = "/".join(map(str, counts)) if len(counts) <= 8 else ", ".join(
        f"{len(run)} x {run[0]}" if len(run) > 1 else str(run[0])
        for run in _runs(counts))
    head = f"pipeline stages {text} layers"
    if engine == "megatron":
        chunks = f" x {layout.virtual_stages} chunks" if layout.virtual_stages > 1 else ""
        return (f"{head} ({args}): {sum(counts)} layers do not split evenly over {layout.pp} stages{chunks}; "
                f"Megatron keeps the middle stages even and the ends, which also hold the embedding (first) "
                f"and the output layer (last), take the rest")
    return (f"{head}: to_pipeline's balanced cut weighs the embedding (first stage) and the output layer "
            f"with its fp32 logits (last stage) like decoder layers; megatron.args says it as {args}")


def _runs(counts: list[int]) -> list[list[int]]:
    """``[6, 8, 8, 8]`` -> ``[[6], [8, 8, 8]]``."""
    out: list[list[int]] = []
    for n in counts:
        if out and out[-1][0] == n:
            out[-1].append(n)
        else:
            out.append([n])
    return out


def host_line(search: Search, estimate: Any) -> str | None:
    """The why line about host RAM for a layout that offloads: the figure per node, and whether it
    was checked against the node's memory."""
    need = search.host_bytes_per_node(estimate)
    if not need:
        return None
    ranks = min(search.gpus_per_node, search.world_size)
    figure = f"offload needs {gib(need)} of host RAM per node ({gib(need / ranks)} per rank x {ranks})"
    if search.host_memory_bytes is None:
        return (f"{figure}; the node's memory is unknown, so this is unchecked "
                f"(set cluster.host_memory_gib or --host-memory GIB)")
    return (f"{figure}: fits in {gib(search.usable_host_bytes)} usable of the node's "
            f"{gib(search.host_memory_bytes)}")


def plan(*, search: Search, estimate: Callable[[Layout], Any], top: int | None = None,
         notes: tuple[str, ...] = ()) -> PlanResult:
    """Search, filter, rank, explain. ``estimate(layout)`` is ``dstk.estimate.estimate`` bound to
    the model, training and cluster; ``notes`` are why lines the caller adds to the winner's
    (choices made before the search, such as the precision)."""
    usable = search.usable_bytes
    usable_host = search.usable_host_bytes
    fitting: list[Candidate] = []
    closest: dict[str, Rejection] = {}
    considered = 0
    for group in candidate_layouts(search):
        for layout in group:
            considered += 1
            est = estimate(layout)
            total = est.memory.per_gpu.total_bytes
            if total > usable:
                k = kind(layout)
                prior = closest.get(k)  # a layout that fits the GPU but not the host is the closer miss
                if prior is None or (prior.host_bytes_per_node is None and total < (prior.total_bytes or 0)):
                    closest[k] = Rejection(
                        layout=layout,
                        reason=f"needs {gib(total)} per GPU, {gib(usable)} usable "
                        f"({search.constraints.memory_headroom:.0%} headroom)",
                        total_bytes=total, terms=memory_terms(est.memory.per_gpu),
                    )
                break  # larger micro-batches need more memory still
            host = search.host_bytes_per_node(est)
            if usable_host is not None and host > usable_host:
                k = kind(layout)
                prior = closest.get(k)
                if prior is None or prior.host_bytes_per_node is None or prior.host_bytes_per_node > host:
                    ranks = min(search.gpus_per_node, search.world_size)
                    closest[k] = Rejection(
                        layout=layout,
                        reason=f"needs {gib(host)} of host RAM per node for offload ({gib(host / ranks)} per rank "
                        f"x {ranks}), {gib(usable_host)} usable of the node's {gib(search.host_memory_bytes)}",
                        total_bytes=total, host_bytes_per_node=host,
                    )
                break  # the host RAM offload needs does not shrink with a larger micro-batch
            fitting.append(Candidate(layout=layout, estimate=est))
    zero_pinned = bool(search.constraints.zero_stage)  # the user asked for ZeRO: prefer where it shards
    ordered = pick(fitting, usable_bytes=usable, prefer_sharded=zero_pinned)
    plans = []
    if ordered:
        why = why_lines(ordered, usable_bytes=usable, capacity_bytes=search.capacity_bytes,
                        num_fitting=len(fitting), by_kind_missing=closest, prefer_sharded=zero_pinned)
        best = ordered[0].layout
        if shards_nothing(best):  # say what ZeRO over one rank buys, against ZeRO-0 at the same layout
            twin = dataclasses.replace(best, zero_stage=0, offload_optimizer="none", offload_params="none")
            twin_est = estimate(twin)
            why.append(dp1_zero_line(best, twin_bytes=twin_est.memory.per_gpu.total_bytes, usable_bytes=usable,
                                     zero_pinned=zero_pinned, twin_step_seconds=twin_est.time.step_seconds,
                                     step_seconds=ordered[0].step_seconds,
                                     fp32_sums=search.bf16 and best.pp > 1 and best.grad_accum > 1 and not zero_pinned
                                     and search.constraints.engine != "megatron"))
        split = split_line(best, ordered[0].estimate, engine=search.constraints.engine)
        extra = host_line(search, ordered[0].estimate)
        cluster, host_step = getattr(ordered[0].estimate, "cluster", None), None
        if cluster is not None and (best.offload_optimizer != "none" or best.offload_params != "none"):
            from dstk.hardware import host_optimizer_note  # the bandwidth it was priced at, and threads

            host_step = host_optimizer_note(cluster=cluster)
        why += [line for line in (split, extra, host_step) if line] + list(notes)
        host = {"host_memory_bytes": search.host_memory_bytes}
        plans.append(Plan(layout=ordered[0].layout, estimate=ordered[0].estimate, why=tuple(why),
                          host_bytes_per_node=search.host_bytes_per_node(ordered[0].estimate), **host))
        rest = ordered[1:] if top is None else ordered[1:top]
        for c in rest:
            plans.append(Plan(layout=c.layout, estimate=c.estimate,
                              why=(loss_reason(c, ordered[0], usable_bytes=usable),),
                              host_bytes_per_node=search.host_bytes_per_node(c.estimate), **host))
    return PlanResult(
        plans=tuple(plans),
        rejected=tuple(sorted(closest.values(), key=lambda r: (r.host_bytes_per_node is None,
                                                                r.host_bytes_per_node or r.total_bytes or 0))),
        num_considered=considered,
        num_fitting=len(fitting),
        usable_bytes=usable,
    )


# --- from an intent: binding the model catalog, the hardware catalog and the estimator ----------


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Context:
    """An intent resolved into the objects the estimator takes, and the search it implies."""

    intent: Any
    model: Any
    """``dstk.models.ModelSpec``."""
    cluster: Any
    """``dstk.hardware.Cluster``."""
    training: Any
    """``dstk.layout.Training``."""
    search: Search
    capacity_bytes: int
    notes: tuple[str, ...] = ()
    """Why lines about choices made while resolving (the precision)."""

    def buffers(self, layout: Layout):
        """(ZeRO buffers, why lines) that ``dstk generate`` writes for ``layout`` (``dstk.estimate.buckets``)."""
        from dstk.estimate.buckets import choose_buffers

        return choose_buffers(model=self.model, layout=layout, training=self.training, cluster=self.cluster,
                              engine=self.intent.constraints.engine)

    def estimate(self, layout: Layout):
        """The estimate of ``layout`` with the buffers its generated config carries: the plan's figure
        is the estimate of exactly that file."""
        from dstk.estimate import estimate

        return estimate(model=self.model, layout=layout, training=self.training, cluster=self.cluster,
                        buffers=self.buffers(layout)[0], engine=self.intent.constraints.engine)


def resolve(intent) -> Context:
    """Look the model and the hardware up in their catalogs and set up the search."""
    import dataclasses as dc

    from dstk import hardware
    from dstk.errors import DstkError
    from dstk.models import get_model
    from dstk.models.spec import ModelSpec

    m = intent.model
    if m.name is not None:
        spec = get_model(m.name)
    else:
        try:
            spec = ModelSpec.generic(num_layers=m.num_layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
                                     vocab_size=m.vocab_size, ffn_hidden_size=m.ffn_hidden_size,
                                     num_kv_heads=m.num_kv_heads)
        except ValueError as exc:
            raise DstkError(f"model: {exc}", hint="fix the model dimensions") from None
    cl = intent.cluster
    gpus, nets = hardware.load_catalog(cl.hardware) if cl.hardware else (None, None)
    gpu = hardware.get_gpu(cl.gpu, catalog=gpus)
    changes = {}
    if cl.gpu_memory_gib is not None:
        changes["memory_bytes"] = int(cl.gpu_memory_gib * 2**30)
    if cl.gpu_tflops is not None:
        changes.update(bf16_flops=None if gpu.bf16_flops is None else cl.gpu_tflops * 1e12,
                       fp16_flops=cl.gpu_tflops * 1e12)
    if changes:
        gpu = dc.replace(gpu, **changes)
    net = hardware.get_interconnect(cl.interconnect or hardware.default_interconnect(gpu.slug), catalog=nets)
    host = None if cl.host_memory_gib is None else int(cl.host_memory_gib * 2**30)
    cluster = hardware.Cluster(num_nodes=cl.num_nodes, gpus_per_node=cl.gpus_per_node, gpu=gpu, interconnect=net,
                               host_memory_bytes=host)
    precision, note = choose_precision(requested=intent.training.precision, gpu=gpu)
    if precision != intent.training.precision:
        intent = dc.replace(intent, training=dc.replace(intent.training, precision=precision))
    attention, attention_note = choose_attention(requested=intent.training.attention, spec=spec, precision=precision,
                                                 gpu=gpu, engine=intent.constraints.engine)
    if attention != intent.training.attention:
        intent = dc.replace(intent, training=dc.replace(intent.training, attention=attention))
    training = intent.training.to_training()
    max_zero = 3
    if training.lora is not None:
        intent, max_zero = _lora_constraints(intent, family=spec.family)
    search = Search(
        world_size=cl.world_size, gpus_per_node=cl.gpus_per_node, num_layers=spec.num_layers,
        num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, global_batch=training.global_batch,
        capacity_bytes=gpu.memory_bytes, overhead_bytes=gpu.overhead_bytes, host_memory_bytes=host,
        constraints=intent.constraints, max_zero_stage=max_zero, bf16=precision == "bf16",
    )
    notes = (note,) if not changes else (note, override_note(cluster=cl, gpu=gpu))
    measured = hardware.hardware_why(path=cl.hardware, gpu=gpu)  # a calibrated profile: say it priced the plan
    notes += (measured,) if measured else ()
    notes += (attention_note,) if attention_note else ()
    longer = context_note(spec=spec, seq_len=training.seq_len)
    notes += (longer,) if longer else ()
    warm = warmup_note(warmup_steps=intent.training.warmup_steps, steps=intent.training.steps,
                       schedule=intent.training.schedule)
    notes += (warm,) if warm else ()
    return Context(intent=intent, model=spec, cluster=cluster, training=training, search=search,
                   capacity_bytes=gpu.memory_bytes, notes=notes)


def warmup_note(*, warmup_steps: int, steps: int, schedule: str) -> str | None:
    """The why line of a warmup at least as long as the run: the renderers clip it to the run's
    steps (DeepSpeed's ``WarmupCosineLR``, the Trainer's ``warmup_steps``, Megatron's
    ``--lr-warmup-iters``), so the learning rate only climbs and the cosine or linear decay never
    runs. It was clipped without a word (``--num-tokens 2e9 --warmup-steps 5000``: 1,908 steps,
    all warmup)."""
    if warmup_steps < steps:
        return None
    decay = "" if schedule == "constant" else f", and the {schedule} decay never runs"
    return (f"warmup_steps {warmup_steps:,} is not shorter than the run's {steps:,} steps: the configs clip it to "
            f"{steps:,}, so the learning rate only warms up{decay}; give --warmup-steps below {steps:,} (e.g. "
            f"{max(1, steps // 10):,}, a tenth) or more steps")


def context_note(*, spec: Any, seq_len: int) -> str | None:
    """The why line of a sequence longer than the model's positions (``max_position_embeddings``):
    from scratch the position table simply grows (``dstk finetune`` does that for presets), but a
    pretrained checkpoint with learned positions (GPT-2, OPT) fails on the first long batch (an
    index past the table), and a rotary one runs beyond the length it was trained at unless its
    ``rope_scaling`` extends it."""
    limit = getattr(spec, "seq_len", None)
    if not limit or seq_len <= limit:
        return None
    head = f"seq_len {seq_len:,} is longer than {spec.name}'s {limit:,} positions: fine from scratch"
    if getattr(spec, "rotary", True):
        return (f"{head}; from its pretrained weights RoPE runs past the length they were trained at: set "
                "rope_scaling in their config.json, or keep --seq-len within it")
    return (f"{head} (the position table grows); its pretrained weights have only {limit:,} learned positions "
            f"and fail on a longer batch: keep --seq-len {limit} to fine-tune them")


def override_note(*, cluster: Any, gpu: Any) -> str:
    """The why line of a catalog GPU whose memory or peak the intent overrides: everything else (its
    links, HBM bandwidth, GEMM efficiency, bf16 support) is still the catalog entry's, which matters
    when the entry is only the default (h100-sxm) and the user meant another card."""
    given = [f"{cluster.gpu_memory_gib:g} GiB of memory" if cluster.gpu_memory_gib is not None else "",
             f"a {cluster.gpu_tflops:g} TFLOP/s peak" if cluster.gpu_tflops is not None else ""]
    return (f"GPU: {cluster.gpu} ({gpu.name}) with {' and '.join(g for g in given if g)} as the intent says "
            f"(--gpu-memory-gib, --gpu-tflops); its links, HBM bandwidth "
            f"and GEMM efficiency are still the {cluster.gpu}'s: for another card pick the nearest with --gpu "
            "(`dstk gpus`) or describe it with --hardware FILE")


def _lora_constraints(intent, *, family: str):
    """(intent, highest ZeRO stage) for a LoRA run: what ``dstk finetune`` can run it on (peft's
    layers on DeepSpeed's data parallelism and ZeRO: tp = pp = 1; QLoRA's 4-bit base not under
    ZeRO-3), the targets checked against the family (a wrong name lists the right ones)."""
    import dataclasses as dc

    from dstk.errors import DstkError
    from dstk.train.lora import resolve_targets

    resolve_targets(family=family, targets=intent.training.lora_targets)
    c = intent.constraints
    if c.engine == "megatron":
        raise DstkError("training.lora_rank: LoRA runs on the deepspeed engine (peft's layers over ZeRO)",
                        hint="drop --engine megatron, or drop --lora-rank")
    pinned = [f"{n}={getattr(c, n)}" for n in ("tp", "pp") if getattr(c, n) not in (None, 1)]
    if pinned:
        raise DstkError(f"training.lora_rank: LoRA with {', '.join(pinned)}: AutoTP and the pipeline engine rebuild the "
                        "model's layers and do not know peft's LoRA layers",
                        hint="drop --tp/--pp: LoRA runs on data parallelism and ZeRO (ZeRO-3 partitions the frozen base)")
    max_zero = 3
    if intent.training.lora_bits == 4:
        if c.zero_stage == 3:
            raise DstkError("training.lora_bits: QLoRA with ZeRO-3: DeepSpeed cannot partition bitsandbytes' 4-bit "
                            "weights", hint="pin --zero 2 or lower, or drop --lora-bits")
        max_zero = 2
    return dc.replace(intent, constraints=dc.replace(c, tp=1, pp=1)), max_zero


def lora_why(ctx: Context, layout: Layout) -> str:
    """The LoRA why line of a plan, with the same layout's memory as a full fine-tune beside it."""
    import dataclasses as dc

    from dstk.estimate import estimate
    from dstk.estimate.buckets import choose_buffers
    from dstk.estimate.lora import lora_facts, why_line

    training = ctx.training
    lf = lora_facts(model=ctx.model, lora=training.lora)
    line = why_line(lf=lf, lora=training.lora, precision=training.precision, zero_stage=layout.zero_stage)
    plain = dc.replace(training, lora=None)
    buffers = choose_buffers(model=ctx.model, layout=layout, training=plain, cluster=ctx.cluster)[0]
    full = estimate(model=ctx.model, layout=layout, training=plain, cluster=ctx.cluster,
                    buffers=buffers).memory.per_gpu.total_bytes
    return f"{line}; the same layout as a full fine-tune would need {gib(full)} per GPU"


def choose_precision(*, requested: str | None, gpu: Any) -> tuple[str, str]:
    """The training precision for ``gpu`` and the why line that says so.

    Unset: bf16 where the GPU has bf16 arithmetic (``GPU.bf16_flops`` is not None: Ampere and later,
    MI200 and later, CPU ranks), else fp16 with dynamic loss scaling (V100 has no bf16 tensor cores;
    NVIDIA's V100 datasheet lists fp16/fp32/fp64 only). An explicit bf16 on such a GPU is refused.
    """
    from dstk.errors import DstkError

    has_bf16 = gpu.bf16_flops is not None
    if requested == "bf16" and not has_bf16:
        raise DstkError(f"training.precision: bf16 on {gpu.name}, which has no bf16 tensor cores (bf16 would "
                        "run emulated, far below the GPU's fp16 peak, if at all)",
                        hint="use --precision fp16 (dynamic loss scaling) or fp32, or leave the precision unset: "
                             "dstk then picks fp16 on this GPU")
    if requested is not None:
        return requested, f"precision {requested}: as the intent asks"
    if has_bf16:
        return "bf16", f"precision bf16 (the default): {gpu.name} has bf16, which needs no loss scaling"
    return "fp16", (f"precision fp16 (the default): {gpu.name} has no bf16, so fp16 with dynamic loss "
                    f"scaling; --precision fp32 for full precision")


HF_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}
"""``--attention`` kernel -> transformers' ``attn_implementation`` (what the fine-tune requests)."""

HF_SUPPORT_FLAG = {"sdpa": "_supports_sdpa", "flash": "_supports_flash_attn"}
"""The class attribute by which a transformers model declares the kernel (eager always runs)."""

_HF_KIND = {"sdpa": "SDPA", "flash": "FlashAttention-2"}


def _hf_class(spec: Any) -> str:
    """The family's HF class name (``BloomForCausalLM``), or its family name where unknown."""
    from dstk.models import family_module

    try:
        return family_module(spec.family).HF_ARCHITECTURE
    except Exception:  # generic or an unknown family: its name says enough
        return f"the {spec.family} model"


def choose_attention(*, requested: str | None, spec: Any, precision: str, gpu: Any,
                     engine: str = "deepspeed") -> tuple[str, str | None]:
    """(attention kernel, why line or None): the intent's kernel, checked (``check_attention``);
    unset, sdpa where the family's HF class has it, else eager with a why line, which is what
    transformers runs when ``from_pretrained`` gets no ``attn_implementation``
    (``PreTrainedModel.get_correct_attn_implementation``: sdpa, falling back to eager when the class
    does not declare ``_supports_sdpa``; BLOOM in transformers 5.25). Megatron runs its own
    attention, so the HF class does not limit it."""
    if requested is not None:
        check_attention(attention=requested, precision=precision, gpu=gpu, spec=spec, engine=engine)
        return requested, None
    kernels = getattr(spec, "attention_kernels", ("eager", "sdpa", "flash"))
    if engine == "megatron" or "sdpa" in kernels:
        return "sdpa", None
    return "eager", (f"attention eager (the default sdpa is not there): transformers' {_hf_class(spec)} has no "
                     "SDPA path (no _supports_sdpa), so it runs eager attention, materialising the scores; "
                     "priced as eager")


def check_attention(*, attention: str, precision: str, gpu: Any, spec: Any = None,
                    engine: str = "deepspeed") -> None:
    """Refuse an attention kernel where it cannot run. The model's HF class (``spec``; the
    ``deepspeed`` engine runs transformers' modeling code) must declare it
    (``ModelSpec.attention_kernels``): transformers raises at ``from_pretrained`` for an
    ``attn_implementation`` the class lacks (``_sdpa_can_dispatch``, ``_flash_attn_can_dispatch``).
    FlashAttention where ``flash_attn`` would fail at the first step: FlashAttention-2 (its README)
    needs NVIDIA Ampere, Ada or Hopper (sm80+: in dstk's catalog, the GPUs with bf16), AMD
    MI200/MI300 (its ROCm build), fp16 and bf16 only; never a CPU rank."""
    from dstk.errors import DstkError

    kernels = getattr(spec, "attention_kernels", None)
    if kernels is not None and engine != "megatron" and attention not in kernels:
        kind, flag, hf_name = _HF_KIND[attention], HF_SUPPORT_FLAG[attention], HF_ATTENTION[attention]
        raise DstkError(f"training.attention: {attention} for {spec.name}: transformers' {_hf_class(spec)} has no "
                        f"{kind} attention (no {flag}): from_pretrained(attn_implementation=\"{hf_name}\") raises",
                        hint="use --attention eager (what transformers runs for it), or leave --attention unset: "
                             "dstk then picks what the model has")
    if attention != "flash":
        return
    if gpu.is_cpu:
        raise DstkError("training.attention: flash on CPU ranks: FlashAttention runs on GPUs only",
                        hint="use --attention sdpa (torch's own CPU kernel) or eager")
    if gpu.bf16_flops is None:
        raise DstkError(f"training.attention: flash on {gpu.name}: FlashAttention-2 needs an NVIDIA Ampere, Ada "
                        "or Hopper GPU (or AMD MI200/MI300)",
                        hint="use --attention sdpa (torch picks its memory-efficient kernel there) or eager")
    if precision == "fp32":
        raise DstkError("training.attention: flash with fp32: FlashAttention-2 takes fp16 and bf16 only",
                        hint="train in bf16 (--precision bf16), or use --attention sdpa for fp32")


def _spec_value(spec: Any, *names: str) -> Any:
    for name in names:
        value = getattr(spec, name, None)
        if value is not None:
            return value
    return None


def model_facts(spec: Any) -> dict:
    """The model as plan.json records it: name, family, parameter count and dimensions."""
    heads = _spec_value(spec, "num_heads", "num_attention_heads")
    facts = {
        "name": _spec_value(spec, "name"),
        "family": _spec_value(spec, "family"),
        "num_params": _spec_value(spec, "num_params"),
        "num_layers": _spec_value(spec, "num_layers", "num_hidden_layers"),
        "hidden_size": _spec_value(spec, "hidden_size"),
        "num_heads": heads,
        "num_kv_heads": _spec_value(spec, "num_kv_heads", "num_key_value_heads") or heads,
        "ffn_hidden_size": _spec_value(spec, "ffn_hidden_size", "intermediate_size"),
        "vocab_size": _spec_value(spec, "vocab_size"),
    }
    hf_config = getattr(spec, "hf_config", None)
    if hf_config:  # lets `dstk finetune` and tests build the very model that was planned
        facts["hf_config"] = dict(hf_config)
    return facts


def plan_intent(ctx: Context, *, top: int | None = None) -> PlanResult:
    """``plan`` for a resolved intent; an impossible search (nothing consistent) is a user error."""
    from dstk.errors import DstkError

    reason = empty_search_reason(ctx.search)
    if reason is not None:
        raise DstkError(f"no layout is consistent with the intent: {reason.split('; ')[0]}",
                        hint=reason.split("; ", 1)[-1])
    result = plan(search=ctx.search, estimate=ctx.estimate, top=top, notes=ctx.notes)
    if result.plans:  # the winner's why lines also say which buffer sizes its config carries
        best = result.plans[0]
        lora = (lora_why(ctx, best.layout),) if ctx.training.lora is not None else ()
        best = dataclasses.replace(best, why=lora + best.why + ctx.buffers(best.layout)[1])
        result = dataclasses.replace(result, plans=(best,) + result.plans[1:])
    return result


def memory_terms(per_gpu: Any) -> str:
    """``activations 33.8 GiB, model states 2.1 GiB, ...``: a GPU's peak by term, largest first, so
    that a layout which does not fit says what to shrink (activations: shorter sequences, recompute,
    more TP/SP; model states: more GPUs, ZeRO, offload)."""
    terms = [("activations", per_gpu.activations_bytes or 0), ("model states", per_gpu.model_states_bytes),
             ("buffers", per_gpu.buffers_bytes), ("CUDA context and NCCL", per_gpu.overhead_bytes)]
    return ", ".join(f"{name} {gib(n)}" for name, n in sorted(terms, key=lambda t: -t[1]) if n >= 2**30 / 20)


def nothing_fits_message(ctx: Context, result: PlanResult) -> str:
    s = ctx.search
    world = f"{ctx.intent.cluster.num_nodes} x {ctx.intent.cluster.gpus_per_node} {ctx.intent.cluster.gpu}"
    if result.rejected and result.rejected[0].host_bytes_per_node is not None:
        best = result.rejected[0]
        return (f"nothing fits on {world}: of {result.num_considered} layouts, the closest, {describe(best.layout)}, "
                f"fits on the GPU but {best.reason}")
    if result.rejected:
        best = result.rejected[0]
        return (f"nothing fits on {world}: the smallest of {result.num_considered} layouts, "
                f"{describe(best.layout)}, needs {gib(best.total_bytes)} per GPU"
                + (f" ({best.terms})" if best.terms else "") + f"; {gib(s.usable_bytes)} usable")
    return f"nothing fits on {world} ({result.num_considered} layouts tried)"


def _variants(intent) -> Iterator[tuple[str, Any]]:
    """Changed intents, each one step away from the user's, smallest change first."""
    from dstk.intent import Intent

    c, cl, t = intent.constraints, intent.cluster, intent.training

    def with_(**sections):
        return Intent(**{name: sections.get(name, getattr(intent, name))
                         for name in ("model", "cluster", "training", "constraints")})

    unpinned = {k: None for k in ("dp", "tp", "pp", "zero_stage", "micro_batch", "virtual_stages")
                if getattr(c, k) is not None}
    if unpinned:
        yield f"unpin {', '.join(k for k in unpinned)}", with_(constraints=dataclasses.replace(c, **unpinned))
    if c.recompute not in (None, "full"):
        yield "recompute full (drop the recompute pin)", with_(constraints=dataclasses.replace(c, recompute=None))
    if c.engine == "deepspeed" and (not c.offload or c.offload_optimizer == "none" or c.offload_params == "none"):
        yield "allow CPU offload", with_(constraints=dataclasses.replace(
            c, offload=True, offload_optimizer=None, offload_params=None))
    if c.max_tp is not None:
        yield "drop max_tp", with_(constraints=dataclasses.replace(c, max_tp=None))
    if cl.host_memory_gib is not None:
        for factor in (2, 4, 8):
            gib_ = cl.host_memory_gib * factor
            yield (f"more host RAM: {gib_:g} GiB per node",
                   with_(cluster=dataclasses.replace(cl, host_memory_gib=gib_)))
    per_node = cl.gpus_per_node
    while per_node < 8:  # fill the node first: more GPUs on the fast intra-node links
        per_node *= 2
        yield (f"more GPUs: {cl.num_nodes} node(s) x {per_node} ({cl.num_nodes * per_node} GPUs)",
               with_(cluster=dataclasses.replace(cl, gpus_per_node=per_node)))
    for factor in (2, 4, 8, 16, 32, 64):
        if cl.num_nodes * factor > 4096:
            break
        yield (f"more GPUs: {cl.num_nodes * factor} nodes x {per_node} ({cl.num_nodes * factor * per_node} GPUs)",
               with_(cluster=dataclasses.replace(cl, num_nodes=cl.num_nodes * factor, gpus_per_node=per_node)))
    seq = t.seq_len
    while seq > 256:
        seq //= 2
        yield (f"shorter sequences: seq_len {seq} ({t.sequences_per_step} sequences per step)",
               with_(training=dataclasses.replace(t, seq_len=seq, global_batch=t.sequences_per_step,
                                                  global_batch_tokens=None)))


def suggest_fixes(intent, *, limit: int = 4) -> list[str]:
    """The smallest changes that make something fit, one per kind, with the figures of the plan each gives."""
    out, kinds_done = [], set()
    for label, variant in _variants(intent):
        head = label.split(":")[0]
        if head in kinds_done:
            continue
        try:
            ctx = resolve(variant)
            result = plan_intent(ctx, top=1)
        except Exception:  # a variant that is itself inconsistent is simply not a suggestion
            continue
        if result.plans:
            kinds_done.add(head)
            best = result.plans[0]
            host = ""
            if best.host_bytes_per_node and best.host_memory_bytes is None:  # checked ones fit already
                host = (f", and {gib(best.host_bytes_per_node)} of host RAM per node for its offload "
                        f"(unchecked: give --host-memory GIB)")
            out.append(f"{label}: {describe(best.layout)} fits, {gib(best.estimate.memory.per_gpu.total_bytes)} "
                       f"of {gib(result.usable_bytes)} usable, {best.estimate.time.step_seconds:.3g} s/step{host}")
            if len(out) >= limit:
                break
    return out


def plan_document(ctx: Context, result: PlanResult, *, index: int = 0) -> dict:
    """``plan.json`` (docs/contracts.md): one plan entry plus model, cluster, training and the
    alternatives it beat."""
    from dstk import __version__

    chosen = result.plans[index]
    entry = chosen.to_dict()
    if index != 0:
        split = split_line(chosen.layout, chosen.estimate, engine=ctx.intent.constraints.engine)
        entry["why"] = ([f"picked by hand (--pick {index + 1}); the planner's choice was "
                         f"{describe(result.plans[0].layout)}"] + entry["why"] + ([split] if split else [])
                        + list(ctx.buffers(chosen.layout)[1]))
    cl = ctx.intent.cluster
    from dstk.hardware import hardware_record  # the --hardware file the figures came from (None: the catalog)

    doc = {
        "dstk_version": __version__,
        "model": model_facts(ctx.model),
        "cluster": {
            "num_nodes": cl.num_nodes,
            "gpus_per_node": cl.gpus_per_node,
            "gpu": cl.gpu,
            "interconnect": cl.interconnect,
            "gpu_memory_bytes": ctx.capacity_bytes,
            "usable_bytes": result.usable_bytes,
            "memory_headroom": ctx.intent.constraints.memory_headroom,
            "host_memory_bytes": ctx.search.host_memory_bytes,
            "hardware": hardware_record(path=cl.hardware, gpu=ctx.cluster.gpu),
        },
        "training": {**ctx.training.to_dict(), "train_steps": ctx.intent.training.steps,
                     "lr": ctx.intent.training.lr, "schedule": ctx.intent.training.schedule},
        "engine": ctx.intent.constraints.engine,
        **entry,
        "alternatives": [
            {"layout": p.layout.to_dict(), "step_seconds": p.estimate.time.step_seconds,
             "total_bytes": p.estimate.memory.per_gpu.total_bytes, "why": list(p.why)}
            for i, p in enumerate(result.plans[:10]) if i != index
        ],
    }
    return doc


def model_dims(facts: dict, spec: Any):
    """What the Megatron renderer needs: the dimensions plus the family's traits from the spec."""
    from dstk.render import ModelDims

    family = (facts.get("family") or "").lower()
    learned_positions = family in ("gpt2", "opt")  # the rest of the catalog uses rotary or ALiBi
    return ModelDims(
        num_layers=facts["num_layers"],
        hidden_size=facts["hidden_size"],
        num_heads=facts["num_heads"],
        num_kv_heads=facts["num_kv_heads"],
        ffn_hidden_size=facts["ffn_hidden_size"],
        vocab_size=facts["vocab_size"],
        max_position_embeddings=_spec_value(spec, "seq_len"),
        gated_mlp=bool(getattr(spec, "gated_mlp", True)),
        activation=str(getattr(spec, "activation", None) or "silu"),
        norm=getattr(spec, "norm", "rmsnorm"),
        rotary=not learned_positions,
        tied_embeddings=bool(getattr(spec, "tied_embeddings", False)),
        **_megatron_traits(spec),
    )


def _megatron_traits(spec: Any) -> dict:
    """The traits beyond the dimensions that make Megatron-LM build the same model as the HF one:
    the linear biases (``_linear_biases``), QK-norm (the family's ``SHAPE``), the head width, RoPE theta and the
    experts (``dstk.render.ModelDims``)."""
    from dstk.models import FAMILIES, family_module

    family = getattr(spec, "family", None)
    shape = getattr(family_module(family), "SHAPE", None) if family in FAMILIES else None
    cfg = getattr(spec, "hf_config", None) or {}
    qkv, o_bias, mlp = _linear_biases(family, cfg, shape)
    theta = cfg.get("rope_theta")
    return {"bias": qkv and o_bias and mlp, "qkv_bias": qkv, "o_bias": o_bias, "mlp_bias": mlp,
            "qk_norm": bool(getattr(shape, "qk_norm", False)),
            "head_dim": getattr(spec, "head_dim", None), "rotary_base": None if theta is None else float(theta),
            "num_experts": int(getattr(spec, "num_experts", 1) or 1),
            "experts_per_token": int(getattr(spec, "experts_per_token", 1) or 1),
            "sliding_window": getattr(spec, "sliding_window", None),
            "sliding_layers": getattr(spec, "sliding_layers", None)}


def _linear_biases(family: str | None, cfg: dict, shape: Any) -> tuple[bool, bool, bool]:
    """(q/k/v, o, MLP) biases as each family's HF module builds them (the ``read`` of
    ``dstk.models.<family>``): GPT-2 and BLOOM on every linear; OPT ``enable_bias`` (default true);
    Falcon ``bias`` (default false: Falcon-7B/40B have none); GPT-NeoX ``attention_bias`` (default
    true) on q/k/v and o, always on the MLP; Llama-shaped families their ``SHAPE`` (Qwen2: q/k/v
    only) else ``attention_bias`` on q/k/v and o and ``mlp_bias`` on the MLP (default false)."""
    if family in ("gpt2", "bloom"):
        return True, True, True
    if family in ("opt", "falcon"):
        on = bool(cfg.get("enable_bias", True)) if family == "opt" else bool(cfg.get("bias", False))
        return on, on, on
    attention = bool(cfg.get("attention_bias", family == "gpt_neox"))
    qkv = getattr(shape, "qkv_bias", None)
    o_bias = getattr(shape, "o_bias", None)
    return (attention if qkv is None else bool(qkv), attention if o_bias is None else bool(o_bias),
            family == "gpt_neox" or bool(cfg.get("mlp_bias", False)))


def run_dir_files(ctx: Context, result: PlanResult, *, index: int = 0) -> dict[str, str]:
    """Every file of the run directory, rendered and validated (nothing is written here)."""
    from dstk import render

    doc = plan_document(ctx, result, index=index)
    layout = result.plans[index].layout
    files = render.run_files(
        plan=doc, layout=layout, training=ctx.intent.training, model=model_dims(doc["model"], ctx.model),
        num_nodes=ctx.intent.cluster.num_nodes, gpus_per_node=ctx.intent.cluster.gpus_per_node,
        cpu=ctx.intent.cluster.gpu == "cpu", nvme_path=ctx.intent.constraints.nvme_path,
        buffers=ctx.buffers(layout)[0],
        megatron_layout=None if ctx.intent.constraints.engine == "megatron" else render.megatron_layout_note(
            model=ctx.model, layout=layout, training=ctx.training, cluster=ctx.cluster,
            usable_bytes=result.usable_bytes),
    )
    validate_run_files(files, layout=layout)
    return files


def validate_run_files(files: dict[str, str], *, layout: Layout) -> None:
    """Run dstk's validator over both DeepSpeed configs; an error here is a bug in dstk, and
    nothing is written."""
    import json

    from dstk.errors import DstkError
    from dstk.validate import validate_config

    for name, hf in (("ds_config.json", False), ("ds_config.hf.json", True)):
        findings = validate_config(json.loads(files[name]), world_size=layout.world_size,
                                   tensor_parallel=layout.tp, pipeline_stages=layout.pp, hf=hf)
        errors = [f for f in findings if f.severity == "error"]
        if errors:
            detail = "; ".join(f"{f.pointer or '/'}: {f.message}" for f in errors)
            raise DstkError(f"the generated {name} does not validate: {detail}",
                            hint="this is a bug in dstk; rerun with --debug and report it")


def check_written(directory, files: dict[str, str]) -> None:
    """Round trip: what is on disk is what was rendered."""
    from pathlib import Path

    from dstk.errors import DstkError

    for name, text in files.items():
        if (Path(directory) / name).read_text(encoding="utf-8") != text:
            raise DstkError(f"{directory}/{name} does not read back as written", hint="check the disk and retry")
