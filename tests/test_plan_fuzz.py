"""Fuzz the planner: random models, clusters and constraints; every layout it offers satisfies
the constraints it claims to know, and the search never crashes."""

from __future__ import annotations

from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from dstk.errors import DstkError
from dstk.intent import Constraints
from dstk.plan import MIN_MICRO_PER_STAGE, Search, candidate_layouts, empty_search_reason, micro_batches, shards_nothing

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
    kv = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16]))
    try:
        c = Constraints(**draw(constraint_kwargs))
    except ValueError:
        assume(False)
    return Search(
        world_size=draw(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128])),
        gpus_per_node=draw(st.sampled_from([1, 2, 4, 6, 8])),
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
            assert s.gpus_per_node % l.tp == 0 or c.tp_across_nodes  # a TP group never straddles nodes
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
                counts = l.stage_layers(s.num_layers)  # raises where megatron-core would refuse the split
                assert sum(counts) == s.num_layers and min(counts) >= 1 and len(counts) == l.pp
                assert all(n % l.virtual_stages == 0 for n in counts)
                assert len(set(counts[1:-1])) <= 1
                assert l.uneven_stages == (s.num_layers % (l.pp * l.virtual_stages) != 0)
            if not c.offload:
                assert l.offload_optimizer == "none" and l.offload_params == "none"
            for pin in ("tp", "pp", "zero_stage", "recompute"):
                assert getattr(c, pin) is None or getattr(l, pin) == getattr(c, pin)
    if count == 0:
        assert empty_search_reason(s) is not None or c.zero_stage is not None or c.recompute is not None


@st.composite
def intents(draw):
    from dstk.intent import intent_from_dict

    model = draw(st.one_of(
        st.sampled_from([{"name": "llama-3-8b"}, {"name": "gpt2-xl"}, {"name": "qwen2.5-7b"}, {"name": "llama-2-70b"}]),
        st.fixed_dictionaries({"num_layers": st.integers(1, 48), "hidden_size": st.sampled_from([64, 256, 1024, 4096]),
                               "num_heads": st.sampled_from([1, 2, 4, 8, 16]), "vocab_size": st.integers(100, 60000)}),
    ))
    data = {
        "model": model,
        "cluster": {"num_nodes": draw(st.sampled_from([1, 2, 4, 16])), "gpus_per_node": draw(st.sampled_from([1, 2, 8])),
                    "gpu": draw(st.sampled_from(["h100-sxm", "a10", "a100-40gb", "v100-32gb", "cpu"])),
                    "host_memory_gib": draw(st.sampled_from([None, 16, 512]))},
        "training": {"seq_len": draw(st.sampled_from([128, 1024, 4096])),
                     "global_batch": draw(st.sampled_from([1, 8, 30, 64, 256])),
                     "precision": draw(st.sampled_from(["bf16", "fp32", None]))},
        "constraints": {k: v for k, v in draw(constraint_kwargs).items() if v is not None},
    }
    data["cluster"] = {k: v for k, v in data["cluster"].items() if v is not None}
    data["training"] = {k: v for k, v in data["training"].items() if v is not None}
    try:
        return intent_from_dict(data)
    except DstkError:
        assume(False)


@settings(max_examples=60, deadline=None)
@given(intents())
def test_planner_on_random_intents_keeps_its_own_rules(intent):
    from dstk import plan as planner

    try:
        ctx = planner.resolve(intent)
        result = planner.plan_intent(ctx, top=None)
    except DstkError as exc:
        assert exc.hint
        event("refused with a hint")
        return
    event("plans" if result.plans else "nothing fits")
    c, cl = intent.constraints, intent.cluster
    for p in result.plans:
        l = p.layout
        assert l.world_size == cl.world_size and l.global_batch == ctx.training.global_batch
        assert p.estimate.memory.per_gpu.total_bytes <= result.usable_bytes
        assert ctx.model.num_heads % l.tp == 0 and ctx.model.num_kv_heads % l.tp == 0
        assert cl.gpus_per_node % l.tp == 0 or c.tp_across_nodes
        assert l.pp == 1 or l.zero_stage <= 1
        host = ctx.search.usable_host_bytes
        assert host is None or p.host_bytes_per_node <= host
        for pin in ("tp", "pp", "dp", "zero_stage", "recompute"):
            assert getattr(c, pin) is None or getattr(l, pin) == getattr(c, pin)
        assert p.why
    if cl.gpu == "v100-32gb":  # no bf16: fp16 by default, an explicit bf16 is refused above
        assert ctx.training.precision in ("fp16", "fp32") and intent.training.precision != "bf16"
    elif intent.training.precision is None:
        assert ctx.training.precision == "bf16"
    if result.plans:
        pool = result.plans
        if c.zero_stage:  # a pinned ZeRO picks among the layouts where it shards, when one fits (test_plan_dp1)
            pool = [p for p in result.plans if not shards_nothing(p.layout)] or pool
        fastest = min(p.estimate.time.step_seconds for p in pool)
        assert result.plans[0].estimate.time.step_seconds <= fastest * 1.03 + 1e-12
