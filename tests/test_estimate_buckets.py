"""Generated ZeRO buckets and the per-call latency (``dstk.estimate.buckets``): a bucket's floor is
set by the larger of the ring's per-step latency and the collective's fixed cost per call
(``steptime.collective_latency``: 1 ms on gloo, 10-25 us for NCCL). On 2 CPU ranks one bucket now
holds every gradient of the tiny Llama (ZeRO-1/2 issue 1 reduction instead of 4; measured by
``benchmarks/zero_cpu_cost.py``), and ZeRO-2 turns ``overlap_comm`` off when one bucket holds them
all; the GPU presets' buckets stay as they were. Pure arithmetic, no torch."""

from __future__ import annotations

import dataclasses

import pytest

from dstk.estimate import _bandwidth, estimate, rank_params
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.estimate.buckets import choose_buffers, latency_bandwidth_elements
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module, get_model

TINY_HF = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096,
           "tie_word_embeddings": False}  # examples/intents/tiny-llama-cpu.yaml
TINY_PARAMS = 139_584
CPU2 = Cluster(num_nodes=1, gpus_per_node=2, gpu=get_gpu("cpu"))
TRAINING = Training(seq_len=64, global_batch=8, precision="bf16")


def _tiny():
    return family_module("llama").read(dict(TINY_HF), name="tiny")


def test_the_call_latency_raises_the_floor_only_where_it_exceeds_the_ring_steps():
    # 2 gloo ranks, 1 GB/s, bf16: 9 x 2 x (1 ms / 2 steps) x 1e9 / 2 B = 4.5e6 elements (5 us alone: 4.5e4)
    ring = latency_bandwidth_elements(ranks=2, latency_s=5e-6, bytes_per_s=1e9, element_bytes=2)
    assert ring == pytest.approx(4.5e4)
    assert latency_bandwidth_elements(ranks=2, latency_s=5e-6, bytes_per_s=1e9, element_bytes=2,
                                      call_latency_s=1e-3) == pytest.approx(4.5e6)
    # 8 GPUs on NVLink: a 10 us call is less than the ring's 14 steps of 5 us: no change
    nvlink = dict(ranks=8, latency_s=5e-6, bytes_per_s=360e9, element_bytes=2)
    assert latency_bandwidth_elements(**nvlink, call_latency_s=10e-6) == latency_bandwidth_elements(**nvlink)


@pytest.mark.parametrize("zero", [1, 2])
def test_tiny_cpu_gets_one_bucket_for_all_its_gradients(zero):
    layout = Layout(dp=2, zero_stage=zero, micro_batch=4)
    buffers, why = choose_buffers(model=_tiny(), layout=layout, training=TRAINING, cluster=CPU2)
    assert rank_params(_tiny(), layout) == TINY_PARAMS
    assert buffers.reduce_bucket_size == buffers.allgather_bucket_size == TINY_PARAMS  # exactly: one bucket
    assert not buffers.overlap_comm  # one bucket: nothing to overlap, no second buffer (ZeRO-2 too)
    assert "capped by all 1.4e5 parameters" in why[0] and "500 us a call" in why[0] and "2.3e6" in why[0]
    calls = st.collective_calls(zero_stage=zero, dp=2, tp=1, pp=1, grad_accum=1, stage_layers=2,
                                trainable_params=TINY_PARAMS, reduce_bucket_size=buffers.reduce_bucket_size)
    assert calls.dp_buckets == 1
    # the predicted step: 3 calls (0.5 ms each) fewer than with the 4.6e4-element buckets of the 5 us rule
    old = mem.ZeroBuffers(reduce_bucket_size=46_000, allgather_bucket_size=46_000, overlap_comm=zero == 2)

    def step(b):
        return estimate(model=_tiny(), layout=layout, training=TRAINING, cluster=CPU2, buffers=b).time.step_seconds

    assert step(old) - step(buffers) == pytest.approx(3 * CPU2.gpu.collective_latency_seconds, rel=0.05)


def test_zero3_reduce_bucket_follows_the_call_but_its_prefetch_the_ring():
    """ZeRO-3 on 2 CPU ranks: one reduce-scatter bucket; the prefetch and the live working set keep the
    ring's floor (a larger one measured fewer gathers but the memory estimate over-counts it)."""
    layout = Layout(dp=2, zero_stage=3, micro_batch=4)
    buffers, _ = choose_buffers(model=_tiny(), layout=layout, training=TRAINING, cluster=CPU2)
    assert buffers.reduce_bucket_size == TINY_PARAMS and buffers.overlap_comm
    assert buffers.prefetch_bucket_size == 46_000 and buffers.max_live_parameters == 55_000  # 8,192 + 46,000


@pytest.mark.parametrize("model_name, gpu, nodes, net, zero, dp, tp", [
    ("llama-3-8b", "h100-sxm", 1, "ib-ndr", 2, 8, 1), ("llama-3-8b", "h100-sxm", 1, "ib-ndr", 2, 2, 4),
    ("llama-3-70b", "h100-sxm", 8, "ib-ndr", 3, 64, 1), ("llama-2-7b", "a100-80gb", 2, "eth-25g", 2, 2, 8),
    ("llama-2-70b", "a100-80gb", 16, "ib-hdr", 1, 16, 1),
])
def test_gpu_buckets_keep_the_ring_floor(model_name, gpu, nodes, net, zero, dp, tp):
    """NCCL's 10-25 us a call never exceeds the ring's 2(n-1) steps of 5 us (NVLink, IB), and the
    Ethernet entries' call latency is twice their step latency: the GPU presets do not change."""
    cluster = Cluster(num_nodes=nodes, gpus_per_node=8, gpu=get_gpu(gpu), interconnect=get_interconnect(net))
    layout = Layout(dp=dp, tp=tp, pp=cluster.world_size // (dp * tp), zero_stage=zero)
    training = Training(seq_len=4096, global_batch=dp * 8)
    buffers, _ = choose_buffers(model=get_model(model_name), layout=layout, training=training, cluster=cluster)
    bw, lat = _bandwidth(group=dp, stride=tp, cluster=cluster)
    assert st.collective_latency(group=dp, stride=tp, cluster=cluster) <= 2 * (dp - 1) * lat
    # the same choice as with no per-call cost at all (the rule before the call latency was used)
    free = Cluster(num_nodes=nodes, gpus_per_node=8, gpu=cluster.gpu.replace(collective_latency_seconds=0.0),
                   interconnect=dataclasses.replace(get_interconnect(net), collective_latency_seconds=0.0))
    ring, _ = choose_buffers(model=get_model(model_name), layout=layout, training=training, cluster=free)
    assert buffers == ring
    floor = latency_bandwidth_elements(ranks=dp, latency_s=lat, bytes_per_s=bw, element_bytes=2)
    assert buffers.reduce_bucket_size <= 1.1 * floor
    assert buffers.overlaps(zero) == (zero >= 2)
