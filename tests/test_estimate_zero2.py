"""ZeRO-2's gradient reduction priced as DeepSpeed 0.19.8 runs it: each bucket all-reduced whole in
every micro-step (``stage_1_and_2.py`` ``average_tensor`` -> ``allreduce_and_scatter`` under the
default ``use_multi_rank_bucket_allreduce=True``), not reduce-scattered; one ``reduce`` per owning
rank, about a reduce-scatter's traffic, when that option is off. The calls themselves are counted
on real DeepSpeed by ``tests/test_estimate_flushes.py`` (ZeRO-2 issues ``all_reduce``)."""

from __future__ import annotations

import json

import pytest

from dstk.estimate import estimate, timing as tm
from dstk.estimate import _bandwidth
from dstk.estimate import memory as mem
from dstk.estimate.dsconfig import read_settings
from dstk.hardware import Cluster, get_gpu, get_interconnect
from dstk.layout import Layout, Training
from dstk.models import family_module

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def _zero2(buffers: mem.ZeroBuffers):
    """An 8B Llama, ZeRO-2 over 4 nodes x 8 H100 (dp = 32 across InfiniBand), 4 micro-steps, no
    overlap_comm (DeepSpeed's default for ZeRO-2): every reduction is on the step's critical path."""
    model = family_module("llama").read(LLAMA_8B, name="8b")
    cluster = Cluster(num_nodes=4, gpus_per_node=8, gpu=get_gpu("h100-sxm"), interconnect=get_interconnect("ib-ndr"))
    layout = Layout(dp=32, zero_stage=2, micro_batch=1, grad_accum=4)
    training = Training(seq_len=4096, global_batch=128, precision="bf16")
    return estimate(model=model, layout=layout, training=training, cluster=cluster, buffers=buffers), cluster


def test_zero2_moves_an_all_reduce_of_the_gradients_every_micro_step():
    default, cluster = _zero2(mem.ZeroBuffers())
    reduce, _ = _zero2(mem.ZeroBuffers(use_multi_rank_bucket_allreduce=False))
    assert mem.ZeroBuffers().bucket_all_reduces()
    bw, lat = _bandwidth(group=32, stride=1, cluster=cluster)
    grad_bytes = 2 * default.model.num_params
    half = tm.ring_gather_seconds(nbytes=grad_bytes, ranks=32, bandwidth=bw, latency=lat)
    # The all-reduce moves twice a reduce-scatter's bytes in each of the 4 micro-steps: 4 more
    # reduce-scatters' worth, and each of its calls a ring twice as long (2 (n - 1) steps: tens of
    # microseconds a call over 32 GPUs on 4 nodes, a few percent here).
    extra = default.time.comm["dp"] - reduce.time.comm["dp"]
    assert 4 * half <= extra <= 1.08 * 4 * half
    assert default.time.step_seconds - reduce.time.step_seconds == pytest.approx(extra, rel=1e-6)
    # ZeRO-1 reduces once, at the boundary, also by all-reduce: ZeRO-2's default costs m - 1 more.
    model = family_module("llama").read(LLAMA_8B, name="8b")
    z1 = estimate(model=model, layout=Layout(dp=32, zero_stage=1, micro_batch=1, grad_accum=4),
                  training=Training(seq_len=4096, global_batch=128, precision="bf16"), cluster=cluster)
    assert default.time.step_seconds > z1.time.step_seconds + 2 * half


@pytest.mark.parametrize("zero", [{"stage": 2}, {"stage": 2, "use_multi_rank_bucket_allreduce": True}])
def test_a_config_as_users_write_it_all_reduces(zero):
    assert read_settings({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}).buffers.bucket_all_reduces()


@pytest.mark.parametrize("zero", [{"stage": 2, "use_multi_rank_bucket_allreduce": False}])
def test_turning_multi_rank_all_reduce_off_is_read(zero):
    settings = read_settings(json.loads(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero})))
    assert not settings.buffers.bucket_all_reduces()
    # reduce_scatter: false all-reduces each bucket whole (gradient_reduction_w_predivide)
    off = read_settings({"train_micro_batch_size_per_gpu": 1,
                         "zero_optimization": {**zero, "reduce_scatter": False}})
    assert off.buffers.bucket_all_reduces()
