"""ZeRO's gradient reductions counted as DeepSpeed 0.19.8 issues them: bucket flushes over the
model's tensors in gradient-ready order (``dstk.estimate.steptime.grad_flushes``), one call per
tensor for the DeepSpeed of spring 2021 (``DEEPSPEED_2021``), each call priced at its own size.
Pure arithmetic, except the ``distributed`` test, which counts the calls real DeepSpeed issues
on 2 gloo ranks (``benchmarks/zero_cpu_cost.py --flush-calls`` prints the whole table)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from dstk.estimate import _model_facts, stage_params
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module, get_model

ROOT = Path(__file__).resolve().parent.parent

TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
           "tie_word_embeddings": False}


def _facts(hf=TINY_HF):
    return _model_facts(family_module("llama").read(dict(hf), name="t"))


def _tiny_tensors():
    return st.stage_grad_tensors(_facts(), layers=2, first=True, last=True)


def test_stage_tensors_are_the_models_in_parameter_order():
    t = _tiny_tensors()
    # embedding, 2 x (norm q k v o norm gate up down), final norm, head
    layer = (64.0, 4096.0, 2048.0, 2048.0, 4096.0, 64.0, 8192.0, 8192.0, 8192.0)
    assert t == (32768.0,) + layer * 2 + (64.0, 32768.0)
    assert sum(t) == 139_584
    f = _facts()
    # TP shards the matrices, keeps the norms whole; a middle stage has neither embedding nor head.
    mid = st.stage_grad_tensors(f, layers=1, first=False, last=False, tp=2)
    assert mid == (64.0, 2048.0, 1024.0, 1024.0, 2048.0, 64.0, 4096.0, 4096.0, 4096.0)
    assert sum(mid) == pytest.approx(stage_params(f, layers=1, first=False, last=False, tp=2, pp=3))
    # Tied: the head is the embedding, except on a pipeline's last stage, which holds a copy.
    tied = _facts({**TINY_HF, "tie_word_embeddings": True})
    assert st.stage_grad_tensors(tied, layers=2, first=True, last=True)[-1] == 64.0
    assert st.stage_grad_tensors(tied, layers=1, first=False, last=True, tp=2, pp=2)[-1] == 16384.0
    assert st.stage_grad_tensors(_model_facts(7_000_000_000), layers=2, first=True, last=True) is None


def test_flushes_pack_the_gradients_in_backward_order():
    t = _tiny_tensors()
    # head + final norm + last down_proj (41,024); the next up_proj would overflow 46,000.
    assert st.grad_flushes(tensors=t, reduce_bucket_size=46000, zero_stage=3, dp=2) == (41024.0, 45184.0, 20608.0,
                                                                                  32768.0)
    assert st.grad_flushes(tensors=t, reduce_bucket_size=46000, zero_stage=2, dp=2) == (41024.0, 45184.0, 20608.0,
                                                                                  32768.0)
    # A bucket under the MLP matrices: each matrix goes alone, the small tensors between them
    # together: 15 calls, where ceil(P / B) says 24.
    small = st.grad_flushes(tensors=t, reduce_bucket_size=6000, zero_stage=3, dp=2)
    assert len(small) == 15 and -(-sum(t) // 6000) == 24
    assert small[:5] == (32768.0, 64.0, 8192.0, 8192.0, 8192.0)  # head, final norm, down, up, gate
    assert small[5] == 64 + 4096 and sum(small) == sum(t)  # norm + o_proj; v, k, q, norm next
    # A bucket over the model: one call.
    assert st.grad_flushes(tensors=t, reduce_bucket_size=5e8, zero_stage=1, dp=2) == (139584.0,)
    # ZeRO-1 without overlap_comm reduces at the boundary in parameter order.
    assert st.grad_flushes(tensors=t, reduce_bucket_size=46000, zero_stage=1, dp=2, ready_order=False) == (
        45184.0, 45184.0, 16448.0, 32768.0)


def test_oversized_gradient_splits_at_partition_boundaries_under_zero_1_2_only():
    # 10 | 100 | 10 elements over 2 ranks: partitions of 60; the 100-element gradient spans both,
    # slices of 50 and 50, each over the 40-element bucket: ZeRO-2's allreduce_and_scatter issues a
    # call per slice; ZeRO-3 reduce-scatters the whole tensor in one call.
    t = (10.0, 100.0, 10.0)
    assert st.grad_flushes(tensors=t, reduce_bucket_size=40, zero_stage=2, dp=2) == (10.0, 50.0, 50.0, 10.0)
    assert st.grad_flushes(tensors=t, reduce_bucket_size=40, zero_stage=3, dp=2) == (10.0, 100.0, 10.0)
    # Within one partition (or a first slice under the bucket): one call.
    assert st.grad_flushes(tensors=t, reduce_bucket_size=40, zero_stage=2, dp=1) == (10.0, 100.0, 10.0)
    assert st.grad_flushes(tensors=(40.0, 100.0, 10.0), reduce_bucket_size=45, zero_stage=2, dp=2) == (
        10.0, 100.0, 40.0)
    # A tiny GPT-2 at 6,000 (measured on 2 ranks: 15 and 14 calls): the flat group's midpoint
    # (68,480 of 136,960) cuts its first layer's MLP input matrix (16,384 at 53,760) into 14,720 +
    # 1,664 elements; the first slice passes the bucket, so ZeRO-2 issues two calls.
    gpt2 = _model_facts(family_module("gpt2").read({"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512,
                                                    "n_positions": 64}, name="g"))
    g = st.stage_grad_tensors(gpt2, layers=2, first=True, last=True)
    two = st.grad_flushes(tensors=g, reduce_bucket_size=6000, zero_stage=2, dp=2)
    three = st.grad_flushes(tensors=g, reduce_bucket_size=6000, zero_stage=3, dp=2)
    assert (len(two), len(three)) == (15, 14)
    assert set(two) - set(three) == {14720.0, 1664.0}
    # DeepSpeed v0.3.13: one reduce-scatter per tensor.
    assert st.grad_flushes(tensors=t, reduce_bucket_size=40, zero_stage=3, dp=2, per_param=True) == t


def test_collective_calls_count_flushes_and_fall_back_to_ceil():
    t = _tiny_tensors()
    base = dict(dp=2, tp=1, pp=1, grad_accum=3, stage_layers=2, trainable_params=sum(t), reduce_bucket_size=6000)
    assert st.collective_calls(zero_stage=3, grad_tensors=t, **base).dp_buckets == 3 * 15
    assert st.collective_calls(zero_stage=2, grad_tensors=t, **base).dp_buckets == 3 * 15
    assert st.collective_calls(zero_stage=1, grad_tensors=t, **base).dp_buckets == 15  # at the boundary only
    assert st.collective_calls(zero_stage=3, **base).dp_buckets == 3 * 24  # tensors unknown
    assert st.collective_calls(zero_stage=3, grad_tensors=t, per_param_reduce=True, **base).dp_buckets == 3 * 21
    assert st.collective_calls(zero_stage=2, grad_tensors=t, per_param_reduce=True, **base).dp_buckets == 3 * 15
    assert st.collective_calls(zero_stage=3, grad_tensors=t, **base).dp_bucket_elements == st.grad_flushes(
        tensors=t, reduce_bucket_size=6000, zero_stage=3, dp=2)


def _step(zero_kernels, *, zero_stage=3):
    cluster = Cluster(num_nodes=64, gpus_per_node=8, gpu=get_gpu("h100-sxm"), interconnect=get_interconnect("ib-ndr"))
    f = _model_facts(get_model("llama-2-7b"))
    layout = Layout(dp=512, micro_batch=1, grad_accum=1, recompute="full", zero_stage=zero_stage)
    training = Training(seq_len=2048, global_batch=512, precision="bf16")
    return st.step_time(facts=f, layout=layout, training=training, cluster=cluster, buffers=mem.ZeroBuffers(),
                        zero_kernels=zero_kernels), f, cluster


def test_each_call_is_priced_at_its_own_size():
    """ZeRO-3 on 512 GPUs: the reduce-scatters' fixed cost is the sum of each call's NCCL latency
    at its own size (``collective_latency(nbytes=)``), beyond the ring alpha already priced; one
    call per tensor (spring 2021) adds the difference to the step."""
    bucketed, f, cluster = _step(st.ZeroKernels())
    per_param, _, _ = _step(dataclasses.replace(st.ZeroKernels(), per_param_reduce=True))
    t = st.stage_grad_tensors(f, layers=f.layers, first=True, last=True)

    def calls_seconds(sizes):
        return sum(st.collective_latency(group=512, stride=1, cluster=cluster, kind="reduce_scatter", nbytes=2 * e)
                   for e in sizes)

    flushes = st.grad_flushes(tensors=t, reduce_bucket_size=5e8, zero_stage=3, dp=512)
    assert len(flushes) == 14 and len(t) == 291
    from dstk.estimate import _bandwidth
    _, lat = _bandwidth(group=512, stride=1, cluster=cluster)
    alpha = 511 * lat
    want = max(0.0, calls_seconds(t) - alpha) - max(0.0, calls_seconds(flushes) - alpha)
    assert want > 0.1  # 263 more calls, ~1 ms each over 64 nodes
    assert per_param.comm["dp"] - bucketed.comm["dp"] == pytest.approx(want, rel=1e-9)
    # A norm's call is cheaper than a full bucket's: pricing every call at the bucket's size would
    # overstate the per-tensor reduce-scatters.
    full = st.collective_latency(group=512, stride=1, cluster=cluster, kind="reduce_scatter", nbytes=2 * 5e8)
    assert calls_seconds(t) < len(t) * full


@pytest.mark.distributed
def test_flush_counts_on_real_deepspeed():
    """ZeRO-1 (with ``overlap_comm``), 2 and 3 on 2 gloo ranks with buckets smaller than the
    largest matrices (about 30 s): the reductions each micro-batch issues, steps 1-3, equal
    ``grad_flushes``' count exactly, and each call's elements its flush's, in order, where
    ``ceil(P / bucket)`` is off by 8-61 calls. The tiny
    GPT-2 (biases after their matrices, tied head) issues 15 under ZeRO-2 and 14 under ZeRO-3: an
    MLP matrix over the bucket straddles the ranks' partition boundary, and ZeRO-2 all-reduces
    its two slices in two calls."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import zero_cpu_cost as bench

    specs = [s for s in bench.flush_specs() if s["name"].startswith(("tiny bucket=6000", "larger bucket=50000",
                                                                       "gpt2 bucket=6000"))]
    specs = [s for s in specs if s["config"]["zero_optimization"]["stage"] > 1
             or s["config"]["zero_optimization"].get("overlap_comm")]
    assert len(specs) == 9
    measured, _ = bench.count_on_ranks(specs, timeout=300)
    assert len(measured) == len(specs)
    for spec in specs:
        zero = spec["config"]["zero_optimization"]["stage"]
        want = bench.predicted_flushes(spec)
        got = [bench.measured_flushes(phases, zero=zero) for phases in measured[spec["name"]]]
        assert got == [want["flushes"]] * 3, (spec["name"], got, want)
        assert want["ceil"] != want["flushes"]
        # Call by call: each call's elements, in issue order (the backward order of the gradients).
        for phases in measured[spec["name"]]:
            assert bench.measured_flush_sizes(phases, zero=zero) == want["sizes"], spec["name"]
