"""Per-collective latency in the step-time model (``dstk.estimate.steptime.collective_calls``):
the calls each layout issues, what their fixed cost adds to the step (all of it on CPU ranks,
the tail only where ``overlap_comm`` hides the buckets), and the calibrated profile carrying the
figure. Pure arithmetic, no torch, except the ``distributed`` test. The counts are the ones
``benchmarks/zero_cpu_cost.py`` measured on 2 gloo ranks by wrapping DeepSpeed 0.19.8's backend
(tiny Llama, 139,584 parameters, 46,000-element buckets): ZeRO-0 1 all-reduce; ZeRO-1/2 6
all-reduces + 1 all-gather. ZeRO-3's all-gathers follow the prefetch bucket, the live and reuse
limits and the persistence threshold (``steptime.zero3_gathers``; ``benchmarks/zero_cpu_cost.py
--zero3-calls`` measures 16 settings x 3 steps, all predicted exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dstk import calibrate as cal
from dstk.estimate import _model_facts, estimate
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.hardware import Cluster, get_gpu, get_interconnect, load_catalog
from dstk.layout import Layout, Training
from dstk.models import family_module

ROOT = Path(__file__).resolve().parent.parent

TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
           "tie_word_embeddings": False}
TINY_PARAMS = 139_584
BUCKET = 46_000  # what `dstk generate` writes for the tiny CPU intent


def _tiny():
    return family_module("llama").read(dict(TINY_HF), name="tiny")


def _calls(**kw):
    base = dict(zero_stage=0, dp=2, tp=1, pp=1, grad_accum=1, stage_layers=2, trainable_params=TINY_PARAMS,
                reduce_bucket_size=BUCKET)
    return st.collective_calls(**{**base, **kw})


# --- counts ----------------------------------------------------------------------------------


def test_zero_counts_match_what_deepspeed_issued_for_the_tiny_llama():
    assert _calls(zero_stage=0) == st.CollectiveCalls(dp_buckets=1)  # one flat 5e8-element all-reduce
    one = _calls(zero_stage=1)  # ceil(139584 / 46000) = 4 buckets + overflow + norm + all-gather
    assert (one.dp_buckets, one.dp_tail, one.total) == (4, 3, 7)
    assert _calls(zero_stage=2) == one
    three = _calls(zero_stage=3)  # model unknown: 2 layers x 7 projections + embedding + head per pass
    assert (three.zero3_gathers, three.dp_buckets, three.dp_tail) == (16, 4, 1)
    # Known: DeepSpeed's default settings keep every tiny tensor persistent (<= 1e5 elements): no
    # gathers in forward or backward, and 21 (one per tensor) after the step, beside the norm.
    known = _calls(zero_stage=3, zero3=st.zero3_gathers(facts=_model_facts(_tiny()), buffers=mem.ZeroBuffers()))
    assert (known.zero3_gathers, known.dp_buckets, known.dp_tail) == (0, 4, 22)
    # Forward and backward in every micro-batch, the persistent tensors once per step.
    short = st.zero3_gathers(facts=_model_facts(_tiny()), buffers=mem.ZeroBuffers(**SHORT_REUSE))
    assert _calls(zero_stage=3, grad_accum=2, zero3=short) == st.CollectiveCalls(dp_buckets=8, dp_tail=6,
                                                                                   zero3_gathers=2 * (8 + 4))
    # DeepSpeed's default buckets (5e8): one bucket, so ZeRO-1/2 issue 1 + 3 calls (measured: 3 + 1).
    assert _calls(zero_stage=1, reduce_bucket_size=5e8).total == 4
    assert _calls(zero_stage=0, trainable_params=1.2e9).dp_buckets == 3


def test_counts_scale_with_accumulation_layers_and_parallelism():
    # ZeRO-2 reduces in every micro-step, ZeRO-1 once at the boundary.
    assert _calls(zero_stage=2, grad_accum=3).dp_buckets == 12
    assert _calls(zero_stage=1, grad_accum=3).dp_buckets == 4
    assert _calls(zero_stage=3, grad_accum=2).zero3_gathers == 32
    # TP: 4 per layer (2 forward, 2 backward), +2 under full recompute, x2 as RS+AG pairs under SP.
    assert _calls(dp=1, tp=8, stage_layers=4, grad_accum=2).tp == 32
    assert _calls(dp=1, tp=8, stage_layers=4, grad_accum=2, recompute="full", sequence_parallel=True).tp == 96
    # PP: Megatron, a send each way per micro-batch and boundary, v times interleaved; DeepSpeed's
    # pipeline engine, each tensor's blocking send and receive on an inner stage (3 + 1 each way;
    # an end stage at pp=2 has one neighbour): tests/test_pipeline_costs.py counts them.
    assert _calls(dp=1, pp=4, grad_accum=8, virtual_stages=2, engine="megatron").pp == 32
    assert _calls(dp=1, pp=4, grad_accum=8).pp == 8 * 8
    assert _calls(dp=1, pp=2, grad_accum=8).pp == 8 * 4
    assert _calls(dp=1).total == 0
    assert _calls(zero_stage=1, engine="megatron").total == 1


# --- ZeRO-3's gathers, replayed (measured by ``benchmarks/zero_cpu_cost.py --zero3-calls``) ----

LARGER_HF = {**TINY_HF, "hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 688, "vocab_size": 4096}
"""Embedding and head of 1M elements, MLP weights of 176k, attention weights of 33-66k."""
GENERATED = {"tiny": dict(prefetch_bucket_size=139584, param_persistence_threshold=640, max_live_parameters=140000,
                          max_reuse_distance=140000),
             "larger": dict(prefetch_bucket_size=4.6e6, param_persistence_threshold=2560, max_live_parameters=4.8e6,
                            max_reuse_distance=4.8e6)}
SMALL_BUCKET = dict(prefetch_bucket_size=3000, param_persistence_threshold=0)
SHORT_REUSE = dict(prefetch_bucket_size=20000, max_live_parameters=60000, max_reuse_distance=10000,
                   param_persistence_threshold=100)
LOOKAHEAD = dict(prefetch_bucket_size=20000, max_reuse_distance=0, param_persistence_threshold=100)
MEASURED = [
    # shape, settings, recompute, (forward, backward, after-step) all-gathers at step 1, at steps 2-3
    ("tiny", "generated", "none", (21, 21, 5), (1, 0, 5)),
    ("tiny", "generated", "full", (21, 37, 5), (1, 0, 5)),
    ("tiny", "default", "none", (21, 21, 21), (0, 0, 21)),
    ("tiny", "default", "full", (21, 37, 21), (0, 0, 21)),
    ("tiny", "small-bucket", "none", (21, 21, 0), (14, 0, 0)),
    ("tiny", "short-reuse", "none", (21, 21, 5), (8, 4, 5)),
    ("tiny", "short-reuse", "full", (21, 37, 5), (10, 4, 5)),
    ("larger", "generated", "none", (39, 39, 9), (2, 0, 9)),
    ("larger", "default", "full", (39, 71, 25), (1, 0, 25)),
    ("larger", "small-bucket", "none", (39, 39, 0), (30, 0, 0)),
    ("larger", "small-bucket", "full", (39, 71, 0), (30, 0, 0)),
    ("larger", "short-reuse", "none", (39, 39, 0), (35, 37, 0)),
    ("larger", "short-reuse", "full", (39, 71, 0), (35, 69, 0)),
    ("larger", "lookahead", "none", (39, 39, 0), (45, 0, 0)),
    ("larger", "lookahead", "full", (39, 71, 0), (45, 0, 0)),
]


def _settings(shape: str, name: str) -> dict:
    return {"generated": GENERATED[shape], "default": {}, "small-bucket": SMALL_BUCKET,
            "short-reuse": SHORT_REUSE, "lookahead": LOOKAHEAD}[name]


def _facts(shape: str):
    return _model_facts(family_module("llama").read(dict(TINY_HF if shape == "tiny" else LARGER_HF), name=shape))


def _gathers(shape: str, settings: str, recompute: str, first_step: bool = False) -> tuple[int, int, int]:
    g = st.zero3_gathers(facts=_facts(shape), buffers=mem.ZeroBuffers(**_settings(shape, settings)),
                         recompute=recompute, first_step=first_step)
    return g.forward_calls, g.backward_calls, g.step_calls


@pytest.mark.parametrize("shape,settings,recompute,first,later", MEASURED,
                         ids=[f"{a}-{b}-{c}" for a, b, c, *_ in MEASURED])
def test_zero3_gathers_match_what_deepspeed_issued(shape, settings, recompute, first, later):
    assert _gathers(shape, settings, recompute, first_step=True) == first
    assert _gathers(shape, settings, recompute) == later


def test_zero3_layer_order_is_the_hook_order_deepspeed_recorded():
    """The order ``fetch_sub_module`` saw for one HF Llama layer on DeepSpeed 0.19.8 (spied on 2
    gloo ranks): forward ``LlamaDecoderLayer, RMSNorm, LlamaAttention, q, k, v, o, RMSNorm,
    LlamaMLP, gate, SiLUActivation, up, down``; backward ``LlamaDecoderLayer, LlamaMLP, down, up,
    SiLUActivation, gate, RMSNorm, LlamaAttention, o, v, k, q, RMSNorm``."""
    layer = st._zero3_modules(_facts("larger").layer_persistent, 256)
    matrices = tuple(max(m) > 8 * 256 for m in layer)
    assert matrices == (False, True, True, True, True, False, True, True, True)
    fwd, bwd = st._zero3_layer_order(matrices)
    assert fwd == [None, 0, None, 1, 2, 3, 4, 5, None, 6, None, 7, 8]
    assert bwd == [None, None, 8, 7, None, 6, 5, None, 4, 3, 2, 1, 0]


def test_zero3_gathers_bytes_and_published_scale():
    """The tiny model goes out whole in one call and stays for backward. A 70B Llama's modules
    exceed the default 5e7 bucket: one call per weight matrix, except k and v (8.4M each), which
    ride with the next (q alone, then k+v+o): 5 calls per layer and pass, plus embedding and head
    (the head stays gathered for backward). Under full recompute the default reuse distance (1e9)
    holds a whole 856M-element layer from its recompute forward to its backward: still one pass."""
    tiny = st.zero3_gathers(facts=_facts("tiny"), buffers=mem.ZeroBuffers(**GENERATED["tiny"]))
    assert tiny.forward_elements == TINY_PARAMS - 5 * 64 and tiny.backward_elements == 0
    assert tiny.model_elements == TINY_PARAMS
    big = _model_facts(family_module("llama").read({**TINY_HF, "hidden_size": 8192, "num_hidden_layers": 80,
                                                    "num_attention_heads": 64, "num_key_value_heads": 8,
                                                    "intermediate_size": 28672, "vocab_size": 128256}, name="70b"))
    plain = st.zero3_gathers(facts=big, buffers=mem.ZeroBuffers())
    assert (plain.forward_calls, plain.backward_calls, plain.step_calls) == (80 * 5 + 2, 80 * 5 + 1, 80 * 2 + 1)
    assert plain.forward_elements == pytest.approx(plain.model_elements, rel=1e-4)
    assert plain.backward_elements == pytest.approx(plain.model_elements - 128256 * 8192, rel=1e-4)
    full = st.zero3_gathers(facts=big, buffers=mem.ZeroBuffers(), recompute="full")
    assert full.backward_calls == plain.backward_calls
    # The prefetcher's look-ahead passes over the recomputed (gathered) weights and so keeps them
    # whatever the reuse distance; a live cap stops the look-ahead, and with a reuse distance
    # below a layer three weights per layer are released and gathered again for backward.
    assert st.zero3_gathers(facts=big, buffers=mem.ZeroBuffers(max_reuse_distance=1e8),
                            recompute="full").backward_calls == plain.backward_calls
    capped = st.zero3_gathers(facts=big, buffers=mem.ZeroBuffers(max_reuse_distance=1e8, max_live_parameters=5e8),
                              recompute="full")
    assert capped.backward_calls == plain.backward_calls + 80 * 3


def test_zero3_latency_follows_the_calls():
    """CPU ranks pay every call: the defaults (everything persistent) cost 21 post-step gathers,
    the short reuse distance 8 + 4 per micro-batch and 5 after the step, the generated settings 1 + 5."""
    lat = get_gpu("cpu").collective_latency_seconds

    def step(settings):
        cluster = Cluster(num_nodes=1, gpus_per_node=2, gpu=get_gpu("cpu"))
        zero = mem.ZeroBuffers(reduce_bucket_size=5e8, allgather_bucket_size=5e8, **_settings("tiny", settings))
        return estimate(model=_tiny(), layout=Layout(dp=2, zero_stage=3, micro_batch=4),
                        training=Training(seq_len=64, global_batch=8, precision="bf16"), cluster=cluster,
                        buffers=zero).time

    default, short, generated = step("default"), step("short-reuse"), step("generated")
    assert default.step_seconds - generated.step_seconds == pytest.approx((21 - 6) * lat, abs=2e-3)
    assert short.step_seconds - generated.step_seconds == pytest.approx((12 - 1) * lat, abs=2e-3)
    assert default.comm["zero3_gather"] == 0.0


@pytest.mark.distributed
def test_zero3_gathers_on_real_deepspeed():
    """Two of the measured settings on 2 gloo ranks (about 30 s), steps 1-3, each phase counted,
    both under full recompute: the short reuse distance and live cap (released and gathered again
    in backward and in the recompute forward), and the larger shape with every module over the
    bucket and a reuse distance of 0 (what stays gathered is what the prefetcher looked past)."""
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import zero_cpu_cost as bench

    base = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4,
            "bf16": {"enabled": True}, "steps_per_print": 2**30,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    keys = {"prefetch_bucket_size": "stage3_prefetch_bucket_size", "max_live_parameters": "stage3_max_live_parameters",
            "max_reuse_distance": "stage3_max_reuse_distance",
            "param_persistence_threshold": "stage3_param_persistence_threshold"}
    specs = []
    for shape, settings, recompute in (("tiny", "short-reuse", "full"), ("larger", "lookahead", "full")):
        zero = {"stage": 3, **{keys[k]: v for k, v in _settings(shape, settings).items()}}
        specs.append({"name": f"{shape} {settings} {recompute}", "config": {**base, "zero_optimization": zero},
                      "hf_config": TINY_HF if shape == "tiny" else LARGER_HF, "seq_len": 32,
                      "recompute": recompute == "full"})
    measured, _ = bench.count_on_ranks(specs, timeout=300)
    assert len(measured) == 2
    for spec in specs:
        steps = measured[spec["name"]]
        assert len(steps) == 3
        for i, phases in enumerate(steps):
            assert bench.measured_zero3(phases) == bench.predicted_zero3(spec, first_step=i == 0), (spec["name"], i)


def test_modules_per_layer_counts_weight_matrices():
    assert st.modules_per_layer(_model_facts(_tiny())) == 7
    assert st.modules_per_layer(_model_facts(7_000_000_000)) == 7


# --- the step ----------------------------------------------------------------------------------


def _tiny_step(zero: int, *, latency: float | None = None, bucket: float = BUCKET) -> float:
    # the calls alone: ZeRO's own hooks are priced apart (tests/test_estimate_zero_overhead.py)
    gpu = get_gpu("cpu").replace(zero_tensor_seconds=0.0, zero3_tensor_seconds=0.0)
    if latency is not None:
        gpu = gpu.replace(collective_latency_seconds=latency)
    cluster = Cluster(num_nodes=1, gpus_per_node=2, gpu=gpu)
    layout = Layout(dp=2, zero_stage=zero, micro_batch=4)
    training = Training(seq_len=64, global_batch=8, precision="bf16")
    buffers = mem.ZeroBuffers(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    return estimate(model=_tiny(), layout=layout, training=training, cluster=cluster,
                    buffers=buffers).time.step_seconds


def test_cpu_ranks_pay_every_call():
    """On CPU ranks nothing overlaps: ZeRO-1 pays 6 more calls than ZeRO-0, ZeRO-3 25 more (4
    reduce-scatters, the norm, and, DeepSpeed's 1e5 persistence threshold keeping every tiny tensor
    whole, no module gathers but 21 all-gathers of the persistent tensors after the step). With
    latency 0 (the mutation) the stages price within a bucket's bytes of each other."""
    lat = get_gpu("cpu").collective_latency_seconds
    assert lat == pytest.approx(5e-4)
    z0, z1, z2, z3 = (_tiny_step(z) for z in range(4))
    assert z1 - z0 == pytest.approx(6 * lat, rel=0.05)
    assert z2 == pytest.approx(z1, rel=0.01)
    assert z3 - z0 == pytest.approx(25 * lat, rel=0.05)
    assert z0 < z1 < z3
    # Default buckets: one bucket, 3 fewer calls than the generated config's 4.
    assert _tiny_step(1) - _tiny_step(1, bucket=5e8) == pytest.approx(3 * lat, rel=0.05)
    flat = [_tiny_step(z, latency=0.0) for z in range(3)]
    assert max(flat) - min(flat) < 0.5e-3


def test_gpu_hides_bucket_latency_under_backward_and_exposes_the_tail():
    """An 8B Llama on 8 H100s, ZeRO-2 with overlap_comm, 8 micro-batches: its 17 x 8 bucket
    reductions run beside backward: only the last bucket of each micro-step (filled when backward
    ends) and the 3 tail calls reach the step, 8 + 3 calls of the 17 x 8 + 3, each less the ring
    alpha its bytes already priced (ZeRO-2's buckets are all-reduces: 2 (n - 1) alpha steps; the
    tail's all-gather n - 1)."""
    model = family_module("llama").read({**TINY_HF, "hidden_size": 4096, "num_hidden_layers": 32,
                                         "num_attention_heads": 32, "num_key_value_heads": 8,
                                         "intermediate_size": 14336, "vocab_size": 128256}, name="8b")
    training = Training(seq_len=4096, global_batch=64, precision="bf16")
    layout = Layout(dp=8, zero_stage=2, micro_batch=1, grad_accum=8)
    buffers = mem.ZeroBuffers(reduce_bucket_size=5e8, allgather_bucket_size=5e8, overlap_comm=True)

    def step(latency):
        cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm").replace(
            collective_latency_seconds=latency))
        return estimate(model=model, layout=layout, training=training, cluster=cluster,
                        buffers=buffers).time.step_seconds

    from dstk.estimate import _bandwidth

    _, alpha = _bandwidth(group=8, stride=1, cluster=Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("h100-sxm")))
    assert step(1e-3) - step(0.0) == pytest.approx((8 + 3) * 1e-3 - (8 * 14 + 7) * alpha, rel=0.02)


def test_tp_and_pp_add_only_what_the_ring_alpha_did_not_price():
    """On GPUs the ring formulas' alpha steps already exceed the catalog's 10 us call: nothing
    changes there. On CPU ranks each TP all-reduce costs the call's 1 ms."""
    assert st.latency_extra_seconds(call_seconds=10e-6, priced_seconds=70e-6) == 0.0
    assert st.latency_extra_seconds(call_seconds=1e-3, priced_seconds=10e-6) == pytest.approx(0.99e-3)
    facts = _model_facts(_tiny())
    training = Training(seq_len=64, global_batch=8, precision="bf16")
    layout = Layout(tp=2, micro_batch=4, grad_accum=2)

    def tp(latency):
        gpu = get_gpu("cpu").replace(collective_latency_seconds=latency)
        return st.layer_pass_seconds(facts=facts, layout=layout, training=training,
                                     cluster=Cluster(num_nodes=1, gpus_per_node=2, gpu=gpu)).tp

    assert tp(1e-3) - tp(0.0) == pytest.approx(4 * (1e-3 - 10e-6), rel=0.01)


def test_catalog_latencies():
    assert get_gpu("h100-sxm").collective_latency_seconds == pytest.approx(10e-6)
    assert get_interconnect("ib-ndr").collective_latency_seconds == pytest.approx(25e-6)
    many = Cluster(num_nodes=2, gpus_per_node=8, gpu=get_gpu("h100-sxm"), interconnect=get_interconnect("ib-ndr"))
    # A tiny all-reduce at NCCL's model, above the catalog floor (tests/test_estimate_ringlat.py):
    # tree LL over 2 nodes 6.8 + 2 (7 x 0.6 + 1 x 5.0) us; ring LL in a node 6.6 + 14 x 0.6 us.
    assert st.collective_latency(group=16, stride=1, cluster=many) == pytest.approx(25.2e-6)
    assert st.collective_latency(group=8, stride=1, cluster=many) == pytest.approx(15.0e-6)


# --- calibration -------------------------------------------------------------------------------


def test_fit_latency_from_the_sweep():
    small, large = cal.BusPoint(size_bytes=2**14, busbw_bytes_per_s=2**14 / 0.5e-3), \
        cal.BusPoint(size_bytes=2**25, busbw_bytes_per_s=1e9)
    # 2 ranks: 16 KiB took 0.5 ms; its bytes at 1 GB/s take 16.4 us.
    assert cal.fit_latency(points=(small, large), num_ranks=2) == pytest.approx(0.5e-3 - 2**14 / 1e9)
    assert cal.fit_latency(points=(large,), num_ranks=2) is None
    assert cal.fit_latency(points=(small, large), num_ranks=1) is None
    fast = cal.BusPoint(size_bytes=2**14, busbw_bytes_per_s=10e9)  # faster than the large size: no latency
    assert cal.fit_latency(points=(fast, large), num_ranks=2) == 0.0
    # Two small sizes: the least excess (the one least disturbed by load) is the latency.
    mid = cal.BusPoint(size_bytes=2**18, busbw_bytes_per_s=2**18 / 0.5e-3)  # 0.5 ms, 0.26 ms of bytes
    slow = cal.BusPoint(size_bytes=2**14, busbw_bytes_per_s=2**14 / 4e-3)  # 4 ms under load
    assert cal.fit_latency(points=(slow, mid, large), num_ranks=2) == pytest.approx(0.5e-3 - 2**18 / 1e9)
    assert cal.fit_latency(points=(cal.BusPoint(size_bytes=2**22, busbw_bytes_per_s=1e9), large),
                           num_ranks=2) is None  # no size small enough to show the latency


def test_calibrated_profile_carries_the_latency(tmp_path):
    measured = cal.Measurements(
        precision="bf16", num_ranks=2, device="cpu", backend="gloo",
        gemm=(cal.GemmPoint(m=512, n=64, k=64, flops_per_s=50e9), cal.GemmPoint(m=512, n=512, k=512, flops_per_s=2e11)),
        allreduce=(cal.BusPoint(size_bytes=2**14, busbw_bytes_per_s=2**14 / 0.4e-3),
                   cal.BusPoint(size_bytes=2**25, busbw_bytes_per_s=1.5e9)))
    profile = cal.build_profile(base=get_gpu("cpu"), measured=measured)
    expected = 0.4e-3 - 2**14 / 1.5e9
    assert profile.gpu.collective_latency_seconds == pytest.approx(expected, rel=1e-2)
    fig = {f.key: f for f in profile.figures}["collective_latency_seconds"]
    assert fig.source == "measured" and "16 KiB 400 us" in fig.note
    path = tmp_path / "hw.yaml"
    path.write_text(cal.render_yaml(profile))
    gpus, _ = load_catalog(path)
    assert gpus["cpu"].collective_latency_seconds == pytest.approx(expected, rel=1e-2)
    one = cal.build_profile(base=get_gpu("cpu"), measured=cal.Measurements(
        precision="bf16", num_ranks=1, device="cpu", backend="gloo", gemm=measured.gemm))
    assert {f.key: f for f in one.figures}["collective_latency_seconds"].source == "catalog"
