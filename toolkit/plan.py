"""The planner: every consistent layout for a model on a cluster, the ones that fit, ranked.

    plan(search=Search(...), estimate=fn) -> PlanResult

1. **Enumerate** (``candidate_layouts``): dp x tp x pp = GPUs; tp divides the attention and KV
   heads and stays inside a node (unless allowed); pp <= layers (uneven splits allowed);
   global batch = micro x grad-accum x dp; ZeRO 0-3 (0/1 with a pipeline: DeepSpeed's
   ``PipelineEngine`` asserts it); optimizer/parameter offload (ZeRO >= 1 / ZeRO-3, pp = 1);
   recompute; interleaved stages (Megatron only). With a pipeline, at least 4 x pp micro-batches
   per step unless the batch is too small for that (then the most micro-batches possible).
2. **Drop** what does not fit: predicted per-GPU bytes > overhead + (GPU memory - overhead) x
   (1 - headroom), the overhead being the estimate's fixed CUDA context and NCCL term. Memory
   grows with the micro-batch, so the micro-batch loop stops at the first one that does not fit.
3. **Rank** by predicted step time, then apply the playbook as tie-breaker: the simplest layout
   within 3% of the fastest wins (plain DP before ZeRO, ZeRO before TP, TP before PP), since the
   estimate is not 3% accurate and simpler layouts fail less (Narayanan et al. 2021, takeaways 1-2;
   HF's "which ZeRO stage" guide).
4. **Explain**: why the winner wins and why the best of each other kind loses, with figures;
   when nothing fits, the smallest changes that would (``suggest_fixes``).

The estimator is passed in (``estimate(layout) -> Estimate``), so this module is pure and knows
nothing of DeepSpeed key names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from dstk.intent import Constraints
from dstk.layout import Layout

TIE_FRACTION = 0.03
"""Layouts within 3% of the fastest count as tied; the simplest of them wins."""
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
    constraints: Constraints = dataclasses.field(default_factory=Constraints)

    @property
    def usable_bytes(self) -> int:
        """``overhead + (capacity - overhead) x (1 - headroom)``.

        The headroom is a margin for allocator fragmentation and estimate error, so it is a fraction
        of what PyTorch's allocator can hand out. The fixed overhead is already one term of every
        estimate's total; taking the headroom of it as well would reserve the CUDA context twice.
        """
        free = self.capacity_bytes - self.overhead_bytes
        return int(self.overhead_bytes + free * (1.0 - self.constraints.memory_headroom))


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

    def to_dict(self) -> dict:
        est = self.estimate.to_dict()
        return {"layout": self.layout.to_dict(), "memory": est["memory"], "time": est["time"], "why": list(self.why)}


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Rejection:
    layout: Layout
    reason: str
    total_bytes: int | None = None

    def to_dict(self) -> dict:
        return {"layout": self.layout.to_dict(), "reason": self.reason, "total_bytes": self.total_bytes}


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
        if tp > s.gpus_per_node and not c.tp_across_nodes:
            continue  # TP all-reduces every layer: keep it on the intra-node links
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
    return [z for z in stages if c.zero_stage is None or z == c.zero_stage]


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
        # Megatron's interleaved schedule: layers split evenly into pp x v chunks, micro-batches a multiple of pp.
        out = [v for v in (1, 2, 4, 8) if v == 1 or (s.num_layers % (pp * v) == 0 and grad_accum % pp == 0)]
    return [v for v in out if c.virtual_stages is None or v == c.virtual_stages]


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
    less recompute and fewer interleaved chunks before more."""
    return (
        layout.pp > 1,
        layout.tp > 1,
        layout.offload_params != "none",
        layout.offload_optimizer != "none",
        layout.zero_stage,
        ("none", "selective", "full").index(layout.recompute),
        layout.virtual_stages,
        layout.pp,
        layout.tp,
    )


def pick(candidates: list[Candidate], *, tie_fraction: float = TIE_FRACTION) -> list[Candidate]:
    """Order fitting candidates best first: the simplest within ``tie_fraction`` of the fastest,
    then everything else by step time."""
    if not candidates:
        return []
    by_time = sorted(candidates, key=lambda c: (c.step_seconds, simplicity(c.layout)))
    fastest = by_time[0].step_seconds
    tied = [c for c in by_time if c.step_seconds <= fastest * (1 + tie_fraction)]
    # Equal predictions: the larger micro-batch (fewer accumulation rounds; real kernels like it).
    winner = min(tied, key=lambda c: (simplicity(c.layout), c.step_seconds, -c.layout.micro_batch))
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
    return "fewer moving parts"


def _time(est) -> Any:
    return est.time


def loss_reason(alt: Candidate, winner: Candidate) -> str:
    """One line: why ``alt`` (the best of its kind) loses to ``winner``, with the figure that matters."""
    t = _time(alt.estimate)
    ratio = alt.step_seconds / winner.step_seconds if winner.step_seconds else float("inf")
    head = f"{kind(alt.layout)} ({describe(alt.layout)}): {alt.step_seconds:.3g} s/step, {ratio:.2f}x the winner"
    if ratio < 1:  # faster, but inside the tie band: the playbook chose the simpler layout
        return f"{head}; within {TIE_FRACTION:.0%}, and {_simpler_reason(winner.layout, alt.layout)} wins the tie"
    layout = alt.layout
    compute = getattr(t, "compute_seconds", None) or 0.0
    comm = getattr(t, "comm_seconds", None) or 0.0
    by_kind = dict(getattr(t, "comm", None) or {})
    bubble = getattr(t, "bubble_fraction", None) or 0.0
    if layout.pp > 1 and bubble >= 0.05:
        return f"{head}; pp={layout.pp} with {layout.grad_accum} micro-batches: bubble {bubble:.0%}"
    if layout.offload_optimizer != "none" or layout.offload_params != "none":
        moved = by_kind.get("offload", 0.0)
        extra = f" ({moved:.3g} s of PCIe traffic per step)" if moved else ""
        return f"{head}; offload runs the optimizer step on the {layout.offload_optimizer} side of PCIe{extra}"
    named = [("zero3_gather", "parameter gathers"), ("tp", f"TP all-reduces over {layout.tp} GPUs"),
             ("dp", "gradient reduction"), ("pp", "pipeline sends")]
    if compute:
        for key, words in named:
            seconds = by_kind.get(key, 0.0)
            if seconds > 0.1 * compute:
                hidden = " (partly hidden behind compute)" if comm < seconds else ""
                return f"{head}; {words} take {seconds / compute:.1f}x the compute ({seconds:.3g} s vs {compute:.3g} s){hidden}"
        if comm > 0.1 * compute:
            return f"{head}; exposed communication takes {comm / compute:.1f}x the compute"
    if layout.recompute != "none" and winner.layout.recompute == "none":
        return f"{head}; recompute={layout.recompute} repeats the forward pass"
    if layout.recompute != "none":
        return f"{head}; it needs recompute={layout.recompute} to fit"
    return head


def why_lines(ordered: list[Candidate], *, usable_bytes: int, capacity_bytes: int, num_fitting: int,
              tie_fraction: float = TIE_FRACTION, by_kind_missing: dict[str, Rejection] | None = None) -> list[str]:
    """Why the winner wins and why the best of each other kind loses."""
    winner = ordered[0]
    t = _time(winner.estimate)
    fastest = min(ordered, key=lambda c: c.step_seconds)
    lines = []
    mfu = getattr(t, "mfu", None)
    tps = getattr(t, "tokens_per_second", None)
    figures = f"{winner.step_seconds:.3g} s/step"
    if tps:
        figures += f", {tps:,.0f} tokens/s"
    if mfu:
        figures += f", MFU {mfu:.0%}"
    lead = "fastest" if fastest is winner else "simplest within 3% of the fastest"
    lines.append(
        f"{describe(winner.layout)}: {lead} of {num_fitting} layouts that fit: {figures}; "
        f"{gib(winner.total_bytes)} of {gib(usable_bytes)} usable per GPU ({gib(capacity_bytes)} total)"
    )
    if fastest is not winner:
        gain = winner.step_seconds / fastest.step_seconds - 1
        lines.append(
            f"chosen over {describe(fastest.layout)} ({gain:.1%} faster, within {tie_fraction:.0%}): "
            f"{_simpler_reason(winner.layout, fastest.layout)}"
        )
    seen = {kind(winner.layout)}
    for alt in ordered[1:]:
        k = kind(alt.layout)
        if k in seen:
            continue
        seen.add(k)
        lines.append(loss_reason(alt, winner))
    for k, miss in (by_kind_missing or {}).items():
        if k not in seen and miss.total_bytes is not None:
            seen.add(k)
            lines.append(f"{k} does not fit: {describe(miss.layout)} needs {gib(miss.total_bytes)} "
                         f"of {gib(usable_bytes)} usable")
    return lines


# --- the search ---------------------------------------------------------------------------------


def plan(*, search: Search, estimate: Callable[[Layout], Any], top: int | None = None) -> PlanResult:
    """Search, filter, rank, explain. ``estimate(layout)`` is ``dstk.estimate.estimate`` bound to
    the model, training and cluster."""
    usable = search.usable_bytes
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
                if k not in closest or total < closest[k].total_bytes:
                    closest[k] = Rejection(
                        layout=layout,
                        reason=f"needs {gib(total)} per GPU, {gib(usable)} usable "
                        f"({search.constraints.memory_headroom:.0%} headroom)",
                        total_bytes=total,
                    )
                break  # larger micro-batches need more memory still
            fitting.append(Candidate(layout=layout, estimate=est))
    ordered = pick(fitting)
    plans = []
    if ordered:
        why = why_lines(ordered, usable_bytes=usable, capacity_bytes=search.capacity_bytes,
                        num_fitting=len(fitting), by_kind_missing=closest)
        plans.append(Plan(layout=ordered[0].layout, estimate=ordered[0].estimate, why=tuple(why)))
        rest = ordered[1:] if top is None else ordered[1:top]
        for c in rest:
            plans.append(Plan(layout=c.layout, estimate=c.estimate, why=(loss_reason(c, ordered[0]),)))
    return PlanResult(
        plans=tuple(plans),
        rejected=tuple(sorted(closest.values(), key=lambda r: r.total_bytes or 0)),
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

    def estimate(self, layout: Layout):
        from dstk.estimate import estimate

        return estimate(model=self.model, layout=layout, training=self.training, cluster=self.cluster)


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
        changes.update(bf16_flops=cl.gpu_tflops * 1e12, fp16_flops=cl.gpu_tflops * 1e12)
    if changes:
        gpu = dc.replace(gpu, **changes)
    net = hardware.get_interconnect(cl.interconnect or hardware.default_interconnect(gpu.slug), catalog=nets)
    cluster = hardware.Cluster(num_nodes=cl.num_nodes, gpus_per_node=cl.gpus_per_node, gpu=gpu, interconnect=net)
    training = intent.training.to_training()
    search = Search(
        world_size=cl.world_size, gpus_per_node=cl.gpus_per_node, num_layers=spec.num_layers,
        num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, global_batch=training.global_batch,
        capacity_bytes=gpu.memory_bytes, overhead_bytes=gpu.overhead_bytes, constraints=intent.constraints,
    )
    return Context(intent=intent, model=spec, cluster=cluster, training=training, search=search,
                   capacity_bytes=gpu.memory_bytes)


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
    return plan(search=ctx.search, estimate=ctx.estimate, top=top)


def nothing_fits_message(ctx: Context, result: PlanResult) -> str:
    s = ctx.search
    world = f"{ctx.intent.cluster.num_nodes} x {ctx.intent.cluster.gpus_per_node} {ctx.intent.cluster.gpu}"
    if result.rejected:
        best = result.rejected[0]
        return (f"nothing fits on {world}: the smallest of {result.num_considered} layouts, "
                f"{describe(best.layout)}, needs {gib(best.total_bytes)} per GPU; {gib(s.usable_bytes)} usable")
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
            out.append(f"{label}: {describe(best.layout)} fits, {gib(best.estimate.memory.per_gpu.total_bytes)} "
                       f"of {gib(result.usable_bytes)} usable, {best.estimate.time.step_seconds:.3g} s/step")
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
        entry["why"] = [f"picked by hand (--pick {index + 1}); the planner's choice was "
                        f"{describe(result.plans[0].layout)}"] + entry["why"]
    cl = ctx.intent.cluster
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
        norm=getattr(spec, "norm", "rmsnorm"),
        rotary=not learned_positions,
        tied_embeddings=bool(getattr(spec, "tied_embeddings", False)),
        bias=family in ("gpt2", "opt", "bloom", "gpt_neox", "falcon", "phi"),
    )


def run_dir_files(ctx: Context, result: PlanResult, *, index: int = 0) -> dict[str, str]:
    """Every file of the run directory, rendered and validated (nothing is written here)."""
    from dstk import render

    doc = plan_document(ctx, result, index=index)
    layout = result.plans[index].layout
    files = render.run_files(
        plan=doc, layout=layout, training=ctx.intent.training, model=model_dims(doc["model"], ctx.model),
        num_nodes=ctx.intent.cluster.num_nodes, gpus_per_node=ctx.intent.cluster.gpus_per_node,
        cpu=ctx.intent.cluster.gpu == "cpu", nvme_path=ctx.intent.constraints.nvme_path,
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
