"""Fuzz the planner: random models, clusters and constraints; every layout it offers satisfies
the constraints it claims to know, and the search never crashes."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dstk.intent import Constraints
from dstk.plan import MIN_MICRO_PER_STAGE, Search, candidate_layouts, empty_search_reason, micro_batches

constraint_kwargs = st.fixed_dictionaries(dict(
    engine=st.sampled_from(["deepspeed", "megatron"]),
    offload=st.booleans(),
    max_tp=st.sampled_from([None, 1, 2, 4, 8]),
    tp_across_nodes=st.booleans(),
    tp=st.sampled_from([None, None, 1, 2, 4]),
    pp=st.sampled_from([None, None, 1, 2, 3]),
    zero_stage=st.sampled_from([None, None, 0, 1]),
    recompute=st.sampled_from([None, "none", "full"]),
))


@st.composite
def searches(draw):
    kv = draw(st.sampled_from([1, 2, 4, 8, 16]))
    try:
        c = Constraints(**draw(constraint_kwargs))
    except ValueError:
        assume(False)
    return Search(
        world_size=draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 96, 128])),
        gpus_per_node=draw(st.sampled_from([1, 2, 4, 8])),
        num_layers=draw(st.integers(1, 96)),
        num_heads=kv * draw(st.sampled_from([1, 2, 4, 8])),
        num_kv_heads=kv,
        global_batch=draw(st.integers(1, 2048)),
        capacity_bytes=80 * 2**30,
        constraints=c,
    )


@settings(max_examples=300, deadline=None)
@given(searches())
def test_every_offered_layout_keeps_the_rules(s):
    c = s.constraints
    count = 0
    for group in candidate_layouts(s):
        for l in group:
            count += 1
            assert l.world_size == s.world_size
            assert l.global_batch == s.global_batch
            assert s.num_heads % l.tp == 0 and s.num_kv_heads % l.tp == 0
            assert l.tp <= s.gpus_per_node or c.tp_across_nodes
            assert c.max_tp is None or l.tp <= c.max_tp
            assert l.pp <= s.num_layers
            if l.pp > 1:
                assert l.zero_stage <= 1
                per_replica = s.global_batch // l.dp
                assert l.grad_accum >= MIN_MICRO_PER_STAGE * l.pp or l.micro_batch == min(
                    micro_batches(s, dp=l.dp, pp=l.pp))
                assert per_replica == l.micro_batch * l.grad_accum
            if c.engine == "deepspeed":
                assert l.virtual_stages == 1 and not l.sequence_parallel
                assert l.tp == 1 or l.pp == 1
            else:
                assert l.offload_optimizer == "none" and l.zero_stage <= 1
                assert l.sequence_parallel == (l.tp > 1)
                if l.virtual_stages > 1:
                    assert s.num_layers % (l.pp * l.virtual_stages) == 0
            if not c.offload:
                assert l.offload_optimizer == "none" and l.offload_params == "none"
            for pin in ("tp", "pp", "zero_stage", "recompute"):
                assert getattr(c, pin) is None or getattr(l, pin) == getattr(c, pin)
    if count == 0:
        assert empty_search_reason(s) is not None or c.zero_stage is not None or c.recompute is not None
