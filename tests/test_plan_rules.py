"""Planner rules from issue 11: TP inside a node, uneven first/last pipeline stages (with
interleaving) rendered for megatron-core, precision that follows the GPU, ties that prefer
headroom, and the host RAM that CPU offload needs."""

from __future__ import annotations

import json

import pytest
from test_generate_oracles import megatron_config

from dstk import plan as planner
from dstk import render
from dstk.cli import main
from dstk.errors import DstkError
from dstk.intent import Constraints, TrainingIntent, intent_from_dict
from dstk.layout import Layout, stage_layer_counts
from dstk.plan import Candidate, Search, candidate_layouts, pick, stage_splits, tensor_degrees

GIB = 2**30


def _search(**kw) -> Search:
    base = dict(world_size=16, gpus_per_node=8, num_layers=32, num_heads=48, num_kv_heads=24, global_batch=96,
                capacity_bytes=80 * GIB)
    base.update(kw)
    return Search(**base)


# --- TP stays inside a node ---------------------------------------------------------------------


@pytest.mark.parametrize("per_node", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
@pytest.mark.parametrize("engine", ["deepspeed", "megatron"])
def test_tp_divides_the_gpus_per_node(per_node, nodes, engine):
    # 48 heads / 24 KV heads: tp 1, 2, 3, 4, 6, 8, 12, 24 all divide the heads, so only the node rule is tested
    s = _search(world_size=per_node * nodes, gpus_per_node=per_node, global_batch=96,
                constraints=Constraints(engine=engine))
    degrees = {layout.tp for group in candidate_layouts(s) for layout in group}
    assert degrees, "something is offered"
    assert all(per_node % tp == 0 for tp in degrees), (per_node, nodes, degrees)
    assert set(tensor_degrees(s)) == {tp for tp in (1, 2, 3, 4, 6, 8, 12, 24) if per_node % tp == 0}


def test_tp_3_on_8_gpu_nodes_only_when_allowed():
    s = _search(world_size=24, gpus_per_node=8)
    assert 3 not in tensor_degrees(s) and 6 not in tensor_degrees(s)  # a group of 3 would straddle two nodes
    allowed = _search(world_size=24, gpus_per_node=8, constraints=Constraints(tp_across_nodes=True))
    assert {3, 6, 12, 24} <= set(tensor_degrees(allowed))


def test_a_pinned_tp_that_straddles_nodes_is_refused_with_the_fix():
    data = {"model": {"name": "llama-3-8b"}, "cluster": {"num_nodes": 3, "gpus_per_node": 8},
            "constraints": {"tp": 3}}
    with pytest.raises(DstkError, match="tp=3 does not divide the GPUs of a node") as exc:
        intent_from_dict(data)
    assert "1, 2, 4, 8" in exc.value.hint and "tp_across_nodes" in exc.value.hint
    data["constraints"]["tp_across_nodes"] = True
    assert intent_from_dict(data).constraints.tp == 3


# --- uneven first/last stages -------------------------------------------------------------------


def test_layout_checks_its_stage_fields():
    with pytest.raises(ValueError, match="^first_stage_layers:"):
        Layout(first_stage_layers=3)  # pp = 1
    with pytest.raises(ValueError, match="^last_stage_layers:"):
        Layout(dp=1, pp=2, last_stage_layers=0)
    with pytest.raises(ValueError, match="^first_stage_layers:"):
        Layout(pp=4, virtual_stages=2, grad_accum=8, first_stage_layers=5)  # not a multiple of v
    layout = Layout(pp=16, virtual_stages=2, grad_accum=64, first_stage_layers=6)
    assert layout.stage_layers(126) == (6,) + (8,) * 15
    with pytest.raises(ValueError):
        layout.stage_layers(128)  # 122 layers do not split over 15 stages


@pytest.mark.parametrize("layers, pp, v", [(126, 16, 2), (126, 16, 1), (30, 4, 1), (80, 6, 2), (61, 8, 1),
                                           (5, 4, 1), (31, 2, 1), (96, 12, 2), (105, 35, 1), (100, 8, 4),
                                           (35, 16, 1)])
def test_stage_splits_are_ones_megatron_can_build(layers, pp, v):
    splits = stage_splits(layers, pp, v)
    assert splits
    for first, last in splits:
        counts = stage_layer_counts(num_layers=layers, pp=pp, virtual_stages=v, first=first, last=last)
        assert sum(counts) == layers and len(counts) == pp and min(counts) >= 1
        assert all(n % v == 0 for n in counts) and len(set(counts[1:-1])) <= 1
        if v > 1:  # interleaving is not offered where it would overfill a stage
            assert max(counts) <= -(-layers // (pp * v)) * v
        assert (first, last) == (None, None) or layers % (pp * v)
    if layers % (pp * v) == 0:
        assert splits == ((None, None),)
    else:  # the first stage (embedding, the most micro-batches in flight) is never the heavier end
        for f, l in splits:
            counts = stage_layer_counts(num_layers=layers, pp=pp, virtual_stages=v, first=f, last=l)
            assert counts[0] <= counts[-1]


def test_126_layers_on_pp16_can_interleave_now():
    assert stage_splits(126, 16, 2) == ((6, None),)  # 6 + 15 x 8: the lighter first stage
    assert stage_splits(126, 16, 4) == ()  # 126 is not a multiple of 4
    assert stage_splits(126, 16, 3) == ()  # 3-layer chunks: some stage would hold 21 layers, not 9
    s = _search(world_size=32, num_layers=126, num_heads=16, num_kv_heads=16, global_batch=256,
                constraints=Constraints(engine="megatron", pp=16))
    interleaved = [lay for group in candidate_layouts(s) for lay in group if lay.virtual_stages > 1]
    assert interleaved and {lay.virtual_stages for lay in interleaved} == {2}
    assert {(lay.first_stage_layers, lay.last_stage_layers) for lay in interleaved} == {(6, None)}


def _uneven_layouts():
    return [
        Layout(dp=2, pp=16, virtual_stages=2, grad_accum=64, first_stage_layers=6),
        Layout(dp=1, tp=2, pp=4, virtual_stages=2, grad_accum=16, first_stage_layers=28, last_stage_layers=30,
               sequence_parallel=True),
        Layout(dp=2, pp=4, grad_accum=16, first_stage_layers=30, last_stage_layers=32),
        Layout(dp=2, pp=2, virtual_stages=3, grad_accum=8, first_stage_layers=60),
    ]


@pytest.mark.parametrize("layout", _uneven_layouts(), ids=lambda lay: planner.describe(lay))
def test_uneven_interleaved_stages_render_to_arguments_megatron_core_accepts(layout):
    layers = 126
    dims = render.ModelDims(num_layers=layers, hidden_size=1024, num_heads=16, num_kv_heads=16,
                            ffn_hidden_size=2816, vocab_size=32000)
    args = render.megatron_args(layout=layout, training=TrainingIntent(seq_len=1024), model=dims)
    config, opts = megatron_config(args)
    assert config.pipeline_model_parallel_size == layout.pp
    assert config.num_layers_in_first_pipeline_stage == layout.first_stage_layers
    assert config.num_layers_in_last_pipeline_stage == layout.last_stage_layers
    if layout.virtual_stages > 1:
        assert config.virtual_pipeline_model_parallel_size == layout.virtual_stages
        # Megatron-LM's arguments.py refuses --num-layers-per-virtual-pipeline-stage with uneven stages
        assert "--num-layers-per-virtual-pipeline-stage" not in opts
    counts = layout.stage_layers(layers)
    middle = (layers - sum(n for n in (layout.first_stage_layers, layout.last_stage_layers) if n)) // max(
        1, layout.pp - sum(n is not None for n in (layout.first_stage_layers, layout.last_stage_layers)))
    assert sum(counts) == layers == int(opts["--num-layers"])
    assert counts[0] == (config.num_layers_in_first_pipeline_stage or middle)
    assert counts[-1] == (config.num_layers_in_last_pipeline_stage or middle)


def test_megatron_core_refuses_a_split_that_does_not_add_up():
    """The oracle can fail: the same arguments with one layer too many on the first stage."""
    layout = _uneven_layouts()[0]
    dims = render.ModelDims(num_layers=126, hidden_size=1024, num_heads=16, num_kv_heads=16,
                            ffn_hidden_size=2816, vocab_size=32000)
    args = render.megatron_args(layout=layout, training=TrainingIntent(seq_len=1024), model=dims)
    bad = [a.replace("--decoder-first-pipeline-num-layers 6", "--decoder-first-pipeline-num-layers 8") for a in args]
    with pytest.raises(ValueError):
        megatron_config(bad)
    with pytest.raises(ValueError):  # and the renderer itself refuses a layout that does not fit the model
        render.megatron_args(layout=layout, training=TrainingIntent(seq_len=1024),
                             model=dataclass_replace(dims, num_layers=128))


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def _intent_126(**constraints):
    return intent_from_dict({
        "model": {"num_layers": 126, "hidden_size": 2048, "num_heads": 16, "vocab_size": 32000},
        "cluster": {"num_nodes": 4, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "training": {"seq_len": 2048, "global_batch": 256},
        "constraints": {"engine": "megatron", **constraints},
    })


def test_the_estimate_and_the_generated_files_follow_the_planned_split():
    ctx = planner.resolve(_intent_126(pp=16, virtual_stages=2))
    result = planner.plan_intent(ctx, top=3)
    best = result.plans[0]
    assert (best.layout.first_stage_layers, best.layout.last_stage_layers) == (6, None)
    assert [s.num_layers for s in best.estimate.memory.per_stage] == [6] + [8] * 15
    files = planner.run_dir_files(ctx, result)
    config, _ = megatron_config(files["megatron.args"].strip().splitlines())
    assert config.num_layers_in_first_pipeline_stage == 6 and config.virtual_pipeline_model_parallel_size == 2
    assert json.loads(files["plan.json"])["layout"]["first_stage_layers"] == 6


# --- precision follows the GPU ------------------------------------------------------------------


def _intent(gpu: str, **training):
    return intent_from_dict({"model": {"name": "llama-3-8b"}, "cluster": {"num_nodes": 1, "gpus_per_node": 8,
                                                                          "gpu": gpu},
                             "training": {"seq_len": 2048, "global_batch": 64, **training}})


def test_v100_defaults_to_fp16_and_says_why():
    ctx = planner.resolve(_intent("v100-32gb"))
    assert ctx.training.precision == "fp16" and ctx.intent.training.precision == "fp16"
    result = planner.plan_intent(ctx, top=1)
    assert any("precision fp16" in line and "no bf16" in line for line in result.plans[0].why)
    files = planner.run_dir_files(ctx, result)
    ds = json.loads(files["ds_config.json"])
    assert ds["fp16"]["enabled"] is True and "bf16" not in ds
    assert "--fp16" in files["megatron.args"].split("\n") and "--bf16" not in files["megatron.args"]
    assert json.loads(files["plan.json"])["training"]["precision"] == "fp16"


def test_gpus_with_bf16_default_to_it():
    ctx = planner.resolve(_intent("a100-80gb"))
    assert ctx.training.precision == "bf16"
    assert any("precision bf16 (the default)" in n for n in ctx.notes)
    assert planner.resolve(_intent("v100-32gb", precision="fp32")).training.precision == "fp32"


def test_explicit_bf16_on_v100_is_refused_with_the_fix(capsys):
    with pytest.raises(DstkError, match="no bf16") as exc:
        planner.resolve(_intent("v100-32gb", precision="bf16"))
    assert "fp16" in exc.value.hint
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "v100-32gb", "--precision", "bf16"]) == 1
    err = capsys.readouterr().err
    assert "no bf16" in err and "--precision fp16" in err and "Traceback" not in err


# --- ties prefer headroom -----------------------------------------------------------------------


class _Est:
    def __init__(self, seconds, total_gib):
        self.time = type("T", (), {"step_seconds": seconds})()
        self.memory = type("M", (), {"per_gpu": type("P", (), {"total_bytes": int(total_gib * GIB)})(),
                                     "cpu_bytes": 0})()


def _cand(seconds, total_gib, **layout):
    return Candidate(layout=Layout(**layout), estimate=_Est(seconds, total_gib))


def test_ties_prefer_headroom():
    usable = 72 * GIB
    full = _cand(1.0, 70.6, dp=8, zero_stage=3, micro_batch=8)
    roomy = _cand(1.0, 27.1, dp=8, zero_stage=3, micro_batch=2, grad_accum=4)
    middle = _cand(1.0, 41.6, dp=8, zero_stage=3, micro_batch=4, grad_accum=2)
    assert pick([full, middle, roomy], usable_bytes=usable)[0] is roomy
    # a tight layout (over 90% of usable) yields to a less simple one that is not, inside the band
    tight_simple = _cand(1.0, 70.0, dp=8, zero_stage=2)
    roomy_zero3 = _cand(1.02, 40.0, dp=8, zero_stage=3)
    assert pick([tight_simple, roomy_zero3], usable_bytes=usable)[0] is roomy_zero3
    # outside the band speed still wins, and without tightness the playbook's order still does
    assert pick([tight_simple, _cand(1.05, 40.0, dp=8, zero_stage=3)], usable_bytes=usable)[0] is tight_simple
    assert pick([_cand(1.0, 60.0, dp=8, zero_stage=2), roomy_zero3], usable_bytes=usable)[0].layout.zero_stage == 2


def test_the_pick_follows_the_tie_rule_on_a_real_search():
    """70B on 128 A100s: inside the tie band the winner is not tight unless every tied layout is,
    and no tied layout of the same shape keeps more memory free (whatever the time model predicts)."""
    from pathlib import Path

    from dstk.intent import load_intent

    intent = load_intent(Path(__file__).resolve().parent.parent / "examples" / "intents" / "llama-2-70b-128gpu.yaml")
    result = planner.plan_intent(planner.resolve(intent), top=None)
    best, usable = result.plans[0], result.usable_bytes
    fastest = min(p.estimate.time.step_seconds for p in result.plans)
    tied = [p for p in result.plans if p.estimate.time.step_seconds <= fastest * 1.03]
    total = lambda p: p.estimate.memory.per_gpu.total_bytes  # noqa: E731
    assert best in tied
    if any(total(p) <= 0.9 * usable for p in tied):
        assert total(best) <= 0.9 * usable
    same_shape = [p for p in tied if planner.simplicity(p.layout) == planner.simplicity(best.layout)
                  and (total(p) <= 0.9 * usable) == (total(best) <= 0.9 * usable)]
    assert total(best) == min(total(p) for p in same_shape)
    for p in tied[1:]:
        if p.estimate.time.step_seconds <= best.estimate.time.step_seconds:
            assert "wins the tie" in p.why[0], p.why


# --- host RAM for CPU offload -------------------------------------------------------------------


def _offload_intent(host_gib=None):
    cluster = {"num_nodes": 1, "gpus_per_node": 2, "gpu": "a10"}
    if host_gib is not None:
        cluster["host_memory_gib"] = host_gib
    return intent_from_dict({"model": {"name": "llama-3-8b"}, "cluster": cluster,
                             "training": {"seq_len": 1024, "global_batch": 16}})


def test_offload_host_ram_is_in_the_plan_and_unchecked_when_unknown():
    ctx = planner.resolve(_offload_intent())
    best = planner.plan_intent(ctx, top=3).plans[0]
    assert best.layout.offload_optimizer == "cpu"  # 8B on two 24 GB GPUs needs offload
    assert best.host_bytes_per_node == best.estimate.memory.cpu_bytes * 2 > 0
    assert any("host RAM per node" in line and "unchecked" in line for line in best.why)
    host = best.to_dict()["memory"]["host"]
    assert host == {"per_node_bytes": best.host_bytes_per_node, "node_memory_bytes": None, "checked": False}
    doc = json.loads(planner.run_dir_files(ctx, planner.plan_intent(ctx, top=1))["plan.json"])
    assert doc["memory"]["host"]["per_node_bytes"] == best.host_bytes_per_node
    assert doc["cluster"]["host_memory_bytes"] is None


def test_offload_that_does_not_fit_in_host_ram_is_rejected_with_the_reason():
    roomy = planner.plan_intent(planner.resolve(_offload_intent(1024)), top=None)
    need = roomy.plans[0].host_bytes_per_node
    assert need > 0 and any("fits in" in line and "host RAM" in line for line in roomy.plans[0].why)
    assert roomy.plans[0].to_dict()["memory"]["host"]["checked"] is True
    # a node with less host RAM than the cheapest offload needs: nothing fits, and the reason says host RAM
    smallest = min(p.host_bytes_per_node for p in roomy.plans if p.host_bytes_per_node)
    tight_gib = smallest / GIB * 0.5
    ctx = planner.resolve(_offload_intent(tight_gib))
    result = planner.plan_intent(ctx)
    assert not any(p.host_bytes_per_node > ctx.search.usable_host_bytes for p in result.plans)
    assert not result.plans
    assert result.rejected[0].host_bytes_per_node is not None
    host_misses = [r.host_bytes_per_node for r in result.rejected if r.host_bytes_per_node is not None]
    assert result.rejected[0].host_bytes_per_node == min(host_misses)  # the closest miss comes first
    assert "host RAM" in planner.nothing_fits_message(ctx, result)
    assert any(f.startswith("more host RAM") for f in planner.suggest_fixes(ctx.intent))


def test_host_memory_flag(capsys):
    argv = ["plan", "--model", "llama-3-8b", "--gpus", "2", "--gpu", "a10", "--seq-len", "1024",
            "--global-batch", "16", "--format", "json"]
    assert main(argv + ["--host-memory", "1024"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plans"][0]["memory"]["host"]["node_memory_bytes"] == 1024 * GIB
    assert main(argv + ["--host-memory", "8"]) == 1
    assert "host RAM" in capsys.readouterr().err
