"""ZeRO over one data-parallel rank (``dstk.plan.shards_nothing``): with dp=1 ZeRO has one partition
and shards nothing, yet DeepSpeed still runs its hooks and copies, which the estimate does not
price. Measured with ``benchmarks/zero_dp1_cost.py`` (tiny Llama, 2 gloo ranks): tp=2 dp=1 ZeRO-3
took about a third longer than ZeRO-0 on the same layout and longer than dp=2 ZeRO-3, which the
estimate rates slower. So when the user pins ``--zero N`` the planner picks the best layout where
ZeRO shards (dp > 1) and says what it passed over; one over a single rank wins only when nothing
else fits the pins, with a why line saying what it buys (offload, memory) or what to drop.
Unpinned, ZeRO-0 on the same layout ties on time and is simpler, so ZeRO over one rank wins only
on memory. Pure planning, no torch."""

from __future__ import annotations

import re
from pathlib import Path

from dstk import plan as planner
from dstk.intent import intent_from_dict, load_intent
from dstk.layout import Layout
from dstk.plan import Candidate, dp1_zero_line, pick, shards_nothing

GIB = 2**30
TINY = Path(__file__).resolve().parent.parent / "examples" / "intents" / "tiny-llama-cpu.yaml"


class _Est:
    def __init__(self, seconds: float, total_gib: float):
        self.time = type("T", (), {"step_seconds": seconds})()
        self.memory = type("M", (), {"per_gpu": type("G", (), {"total_bytes": int(total_gib * GIB)})()})()


def _cand(seconds: float, total_gib: float = 1.0, **layout) -> Candidate:
    return Candidate(layout=Layout(**layout), estimate=_Est(seconds, total_gib))


def _plan(**constraints):
    intent = load_intent(TINY)
    data = {"model": {k: getattr(intent.model, k) for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                                            "ffn_hidden_size", "vocab_size")},
            "cluster": {"num_nodes": 1, "gpus_per_node": 2, "gpu": "cpu"},
            "training": {"seq_len": 64, "global_batch": 8, "precision": "bf16"}, "constraints": constraints}
    return planner.plan_intent(planner.resolve(intent_from_dict(data)), top=None)


def test_shards_nothing_is_zero_over_one_data_parallel_rank():
    assert shards_nothing(Layout(dp=1, tp=2, zero_stage=3))
    assert shards_nothing(Layout(dp=1, zero_stage=1, offload_optimizer="cpu"))
    assert not shards_nothing(Layout(dp=1, tp=2, zero_stage=0))
    assert not shards_nothing(Layout(dp=2, zero_stage=3))


def test_pinned_zero_prefers_a_layout_where_it_shards():
    idle = _cand(0.039, dp=1, tp=2, zero_stage=3, micro_batch=8)
    idle_offload = _cand(0.0391, dp=1, tp=2, zero_stage=3, offload_optimizer="cpu", micro_batch=8)
    sharded = _cand(0.049, dp=2, zero_stage=3, micro_batch=4)
    assert pick([idle, idle_offload, sharded])[0] is idle  # by predicted time alone
    ordered = pick([idle, idle_offload, sharded], prefer_sharded=True)
    assert ordered[0] is sharded and ordered[1:] == [idle, idle_offload]  # the rest stays by time
    # nothing shards within the pins: the fastest over one rank wins after all
    assert pick([idle_offload, idle], prefer_sharded=True)[0] is idle


def test_tiny_cpu_zero3_picks_dp2_and_says_what_it_passed_over():
    result = _plan(zero_stage=3)
    best = result.plans[0]
    assert (best.layout.dp, best.layout.tp, best.layout.zero_stage) == (2, 1, 3)
    faster = [p for p in result.plans if p.estimate.time.step_seconds < best.estimate.time.step_seconds]
    assert faster and all(shards_nothing(p.layout) for p in faster)  # the estimate rates tp=2 dp=1 faster
    why = " ".join(best.why)
    assert "of those where ZeRO-3 shards: dp > 1" in why
    assert "chosen over dp=1 tp=2 ZeRO-3" in why and "shards nothing" in why and "pin --dp 1" in why
    assert "within 3%" not in why  # it was not a tie
    assert "shards nothing" in faster[0].why[0] and "wins the tie" not in faster[0].why[0]


def test_pinned_dp1_keeps_zero3_and_says_to_drop_it():
    best = _plan(zero_stage=3, dp=1).plans[0]
    assert (best.layout.dp, best.layout.tp, best.layout.zero_stage) == (1, 2, 3)
    line = next(w for w in best.why if "over one data-parallel rank" in w)
    assert "no layout with dp > 1 fits the pins" in line and "drop --zero 3" in line
    assert "ZeRO-0 at the same layout needs 0.5 GiB" in line
    offload = _plan(zero_stage=3, dp=1, offload_optimizer="cpu").plans[0]
    assert any("its value here is the cpu offload" in w for w in offload.why)


def test_unpinned_never_picks_zero_over_one_rank_when_zero0_fits():
    for constraints in ({}, {"tp": 2}):
        best = _plan(**constraints).plans[0]
        assert not shards_nothing(best.layout), (constraints, planner.describe(best.layout))
        assert not any("over one data-parallel rank" in w for w in best.why)


def test_a_bf16_pipeline_over_one_rank_takes_zero1_for_fp32_sums_and_says_so():
    """bf16 DeepSpeed pipeline: ZeRO-0 would sum the micro-batches' gradients in bf16, so the search
    offers ZeRO-1 (which dstk renders with grad_accum_dtype fp32); the why line says so and how to opt out."""
    best = _plan(pp=2).plans[0]
    assert (best.layout.dp, best.layout.pp, best.layout.zero_stage) == (1, 2, 1)
    line = next(w for w in best.why if "over one data-parallel rank" in w)
    assert "sums the micro-batches' gradients in fp32" in line and "pin --zero 0" in line
    assert "wins on headroom only" not in line
    assert re.search(r"\(ZeRO-0 at the same layout: [\d.]+ GiB of [\d.]+ GiB usable, [\d.]+ s/step against [\d.]+\)$",
                     line), line
    pinned = _plan(pp=2, zero_stage=0).plans[0]
    assert (pinned.layout.pp, pinned.layout.zero_stage) == (2, 0)


def test_unpinned_zero_over_one_rank_wins_only_for_memory():
    """llama-2-7b on one 155 GiB GPU without offload: ZeRO-0 needs 151.6 GiB (DeepSpeed's bf16
    ZeRO-0 keeps fp32 gradients), ZeRO-1 126.5 GiB: ZeRO-1 over one rank is what fits, and says so."""
    intent = intent_from_dict({"model": {"name": "llama-2-7b"},
                               "cluster": {"num_nodes": 1, "gpus_per_node": 1, "gpu": "h200", "gpu_memory_gib": 155},
                               "training": {"seq_len": 2048, "global_batch": 8},
                               "constraints": {"offload": False}})
    best = planner.plan_intent(planner.resolve(intent)).plans[0]
    assert shards_nothing(best.layout) and best.layout.zero_stage == 1
    line = next(w for w in best.why if "over one data-parallel rank" in w)
    assert "it is kept for memory (ZeRO-0 at the same layout needs 151.6 GiB of 139.6 GiB usable)" in line


def test_dp1_zero_line_wording():
    layout = Layout(dp=1, tp=2, zero_stage=2)
    assert dp1_zero_line(Layout(dp=2, zero_stage=2), twin_bytes=GIB, usable_bytes=8 * GIB, zero_pinned=True) is None
    unpinned = dp1_zero_line(layout, twin_bytes=7 * GIB, usable_bytes=8 * GIB, zero_pinned=False)
    assert "wins on headroom only (ZeRO-0 at the same layout needs 7.0 GiB of 8.0 GiB usable)" in unpinned
    assert "drop --zero 2" in dp1_zero_line(layout, twin_bytes=GIB, usable_bytes=8 * GIB, zero_pinned=True)
