"""The planner's enumeration and playbook, as pure functions of plain data."""

from __future__ import annotations

import dataclasses

import pytest

from dstk.intent import Constraints
from dstk.layout import Layout
from dstk.plan import (Candidate, Search, candidate_layouts, describe, divisors, empty_search_reason, kind,
                       micro_batches, pick, simplicity, tensor_degrees)


def search(**kw) -> Search:
    base = dict(world_size=16, gpus_per_node=8, num_layers=32, num_heads=32, num_kv_heads=8, global_batch=64,
                capacity_bytes=80 * 2**30)
    base.update(kw)
    return Search(**base)


def all_layouts(s: Search) -> list[Layout]:
    return [layout for group in candidate_layouts(s) for layout in group]


def test_divisors():
    assert divisors(1) == [1] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(1024)[-1] == 1024


def test_every_layout_is_consistent():
    s = search()
    layouts = all_layouts(s)
    assert len(layouts) > 50
    assert len(set(layouts)) == len(layouts), "no duplicates"
    for layout in layouts:
        assert layout.world_size == 16
        assert layout.global_batch == 64
        assert 32 % layout.tp == 0 and 8 % layout.tp == 0 and layout.tp <= 8
        assert layout.pp <= 32
        if layout.pp > 1:
            assert layout.zero_stage <= 1 and layout.tp == 1  # DeepSpeed: pipeline takes ZeRO 0/1, AutoTP no PP
            assert layout.grad_accum >= 4 * layout.pp or layout.micro_batch == 1
        assert layout.virtual_stages == 1 and not layout.sequence_parallel  # deepspeed engine
        assert layout.recompute in ("none", "full")


def test_groups_only_vary_the_micro_batch_ascending():
    for group in candidate_layouts(search()):
        micros = [l.micro_batch for l in group]
        assert micros == sorted(micros)
        assert len({dataclasses.replace(l, micro_batch=1, grad_accum=1) for l in group}) == 1


def test_tp_respects_heads_nodes_and_max():
    assert tensor_degrees(search(num_heads=12, num_kv_heads=4)) == [1, 2, 4]
    assert tensor_degrees(search(gpus_per_node=4)) == [1, 2, 4]
    assert tensor_degrees(search(constraints=Constraints(tp_across_nodes=True, max_tp=16))) == [1, 2, 4, 8]
    assert tensor_degrees(search(num_kv_heads=32, constraints=Constraints(tp_across_nodes=True))) == [1, 2, 4, 8, 16]
    assert tensor_degrees(search(constraints=Constraints(max_tp=2))) == [1, 2]


def test_pins_are_honoured():
    c = Constraints(tp=2, zero_stage=1, micro_batch=2, recompute="full")
    for layout in all_layouts(search(constraints=c)):
        assert (layout.tp, layout.zero_stage, layout.micro_batch, layout.recompute) == (2, 1, 2, "full")
    assert {l.pp for l in all_layouts(search(constraints=Constraints(pp=4)))} == {4}
    assert {l.dp for l in all_layouts(search(constraints=Constraints(dp=2)))} == {2}


def test_offload_only_when_allowed():
    layouts = all_layouts(search())
    assert any(l.offload_optimizer == "cpu" for l in layouts)
    assert any(l.offload_params == "cpu" for l in layouts)
    assert all(l.offload_params == "none" or l.offload_optimizer != "none" for l in layouts)
    assert not any(l.offload_optimizer == "nvme" for l in layouts), "nvme needs a path"
    assert any(l.offload_optimizer == "nvme" for l in all_layouts(search(constraints=Constraints(nvme_path="/nvme"))))
    assert all(l.offload_optimizer == "none" for l in all_layouts(search(constraints=Constraints(offload=False))))


def test_megatron_engine_interleaves_and_uses_sequence_parallel():
    layouts = all_layouts(search(constraints=Constraints(engine="megatron")))
    assert all(l.zero_stage <= 1 and l.offload_optimizer == "none" for l in layouts)
    inter = [l for l in layouts if l.virtual_stages > 1]
    assert inter
    for l in inter:
        assert 32 % (l.pp * l.virtual_stages) == 0 and l.grad_accum % l.pp == 0
    assert all(l.sequence_parallel == (l.tp > 1) for l in layouts)
    assert any(l.tp > 1 and l.pp > 1 for l in layouts)
    assert {l.recompute for l in layouts} == {"none", "selective", "full"}


def test_pipeline_micro_batch_rule():
    s = search(world_size=8, global_batch=64)
    # pp=4, dp=2: 32 sequences per replica; >= 16 micro-batches leaves micro 1 or 2
    assert micro_batches(s, dp=2, pp=4) == [1, 2]
    # a batch too small for 4 x pp: the most micro-batches possible (micro 1)
    assert micro_batches(search(global_batch=8), dp=2, pp=4) == [1]
    assert micro_batches(search(global_batch=10), dp=4, pp=1) == []


def test_empty_search_explains_itself():
    assert "not divisible" in empty_search_reason(search(global_batch=3, num_heads=1, num_kv_heads=1, num_layers=1))
    assert "heads" in empty_search_reason(search(num_heads=7, num_kv_heads=7, constraints=Constraints(tp=2)))
    assert empty_search_reason(search()) is None


class _Est:  # plain data standing in for an Estimate's two figures the playbook reads
    def __init__(self, seconds, total_bytes=2**30):
        self.time = type("T", (), {"step_seconds": seconds})()
        per_gpu = type("M", (), {"total_bytes": total_bytes})()
        self.memory = type("Mem", (), {"per_gpu": per_gpu, "cpu_bytes": 0})()


def _cand(seconds, total_gib=1.0, **layout):
    return Candidate(layout=Layout(**layout), estimate=_Est(seconds, int(total_gib * 2**30)))


def test_playbook_picks_the_simplest_within_3_percent():
    zero3 = _cand(1.00, dp=8, zero_stage=3)
    zero1 = _cand(1.015, dp=8, zero_stage=1)
    tp = _cand(0.99, dp=4, tp=2, zero_stage=1)
    ordered = pick([zero3, zero1, tp])
    assert ordered[0] is zero1  # within 3% of the fastest (tp, 0.99 s) and simplest
    assert ordered[1:] == [tp, zero3]
    far = _cand(1.10, dp=8)
    assert pick([far, tp])[0] is tp  # plain DP is 11% slower: speed wins


def test_simplicity_order_is_the_playbooks():
    ladder = [Layout(dp=8), Layout(dp=8, zero_stage=1), Layout(dp=8, zero_stage=3),
              Layout(dp=8, zero_stage=3, offload_optimizer="cpu"), Layout(dp=4, tp=2), Layout(dp=4, pp=2)]
    assert sorted(ladder, key=simplicity) == ladder
    assert [kind(l) for l in ladder] == ["plain DP", "ZeRO-1", "ZeRO-3", "offload", "tensor parallel", "pipeline"]
    assert describe(Layout(dp=4, tp=2, zero_stage=1, micro_batch=2, grad_accum=4)) == "dp=4 tp=2 ZeRO-1 micro 2 x 4"


@pytest.mark.parametrize("world", [1, 2, 8, 64, 1024])
def test_enumeration_scales(world):
    s = search(world_size=world, num_layers=80, num_heads=64, num_kv_heads=8, global_batch=1024)
    layouts = all_layouts(s)
    assert layouts and all(l.world_size == world for l in layouts)


def test_headroom_does_not_reserve_the_fixed_overhead_twice():
    """Every estimate's total holds the GPU's overhead_bytes (CUDA context, NCCL); the headroom is for
    fragmentation of what the allocator holds, so it is a fraction of the memory beyond the overhead."""
    gib = 2**30
    s = search(capacity_bytes=80 * gib, overhead_bytes=gib, constraints=Constraints(memory_headroom=0.1))
    assert s.usable_bytes == int(gib + 79 * gib * 0.9)
    assert search(capacity_bytes=80 * gib, overhead_bytes=gib,
                  constraints=Constraints(memory_headroom=0.0)).usable_bytes == 80 * gib
    assert search(capacity_bytes=80 * gib).usable_bytes == int(80 * gib * 0.9)  # no overhead: as before
