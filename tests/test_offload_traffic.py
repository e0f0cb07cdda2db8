"""CPU offload's host-link (PCIe) traffic as DeepSpeed 0.19.8 moves it (``steptime.offload_traffic``)
and what of it the step time exposes (``steptime.offload_link_seconds``). The per-element bytes are
checked against a real engine: ``tests/offload_traffic_ranks.py`` counts every ``copy_``/``.to``
DeepSpeed issues between its host buffers and the rest over one step of a tiny Llama on 2 gloo ranks."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

from dstk.estimate import estimate
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.hardware import Cluster, get_gpu
from dstk.layout import Layout, Training
from dstk.models import family_module

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
            "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


def _totals(*, m, **kw):
    t = st.offload_traffic(num_micro_batches=m, **kw)
    return t.down_bytes, t.up_bytes(num_micro_batches=m)


@pytest.mark.parametrize("kw, m, down, up", [
    # ZeRO-1: accumulates on the GPU, one fp32 copy down at the boundary, the bf16 partition up
    (dict(zero_stage=1, precision="bf16", offload_optimizer=True), 1, 4, 2),
    (dict(zero_stage=1, precision="bf16", offload_optimizer=True), 8, 4, 2),
    # ZeRO-2: the same at m = 1; with m > 1 the gradient round-trips in bf16 every micro-batch
    (dict(zero_stage=2, precision="bf16", offload_optimizer=True), 1, 4, 2),
    (dict(zero_stage=2, precision="bf16", offload_optimizer=True), 3, 4 + 3 * 2, 2 + 2 * 2),
    (dict(zero_stage=2, precision="fp16", offload_optimizer=True), 8, 4 + 8 * 2, 2 + 7 * 2),
    # ZeRO-2 accumulating in fp32 on the GPU: as ZeRO-1
    (dict(zero_stage=2, precision="bf16", offload_optimizer=True, grad_accum_bytes=4), 8, 4, 2),
    # ZeRO-3: down and straight back up every micro-batch, fp32 down, bf16 parameters up
    (dict(zero_stage=3, precision="bf16", offload_optimizer=True), 1, 6, 4),
    (dict(zero_stage=3, precision="bf16", offload_optimizer=True), 4, 4 + 4 * 2, 2 + 4 * 2),
    (dict(zero_stage=3, precision="bf16", offload_optimizer=True, grad_accum_bytes=4), 2, 4 + 2 * 4, 2 + 2 * 4),
    (dict(zero_stage=3, precision="fp32", offload_optimizer=True), 1, 8, 8),
    # ZeRO-3 with parameter offload: no upload at the step, the partition up at every gather pass
    (dict(zero_stage=3, precision="bf16", offload_optimizer=True, offload_params=True, gather_passes=2), 2,
     4 + 2 * 2, 2 * 2 + 2 * 2 * 2),
    (dict(zero_stage=3, precision="bf16", offload_optimizer=True, offload_params=True, gather_passes=3), 1,
     6, 2 + 3 * 2),
    # parameter offload alone: gradients stay on the GPU, the GPU's step result goes down
    (dict(zero_stage=3, precision="bf16", offload_optimizer=False, offload_params=True, gather_passes=2), 1, 2, 4),
])
def test_bytes_per_partition_element_and_step(kw, m, down, up):
    assert _totals(m=m, **kw) == (down, up)


def test_micro_batches_are_listed_in_order():
    """ZeRO-2's first micro-batch only copies down; the fp32 copy rides the last."""
    t = st.offload_traffic(zero_stage=2, precision="bf16", num_micro_batches=3, offload_optimizer=True)
    assert t.accumulate == ((2, 0), (2, 2), (2, 2)) and t.gradient_down == 4 and t.parameter_up == 2
    with pytest.raises(ValueError, match="num_micro_batches"):
        st.offload_traffic(zero_stage=2, precision="bf16", num_micro_batches=0, offload_optimizer=True)


def _seconds(traffic, **kw):
    base = dict(params=1e9, bucket_params=0.0, backward_seconds=0.0, forward_seconds=0.0, host_bytes_per_s=1e9)
    return st.offload_link_seconds(traffic=traffic, **{**base, **kw})


def test_gradient_copies_hide_behind_backward_and_the_upload_does_not():
    t = st.offload_traffic(zero_stage=3, precision="bf16", num_micro_batches=1, offload_optimizer=True)
    # nothing to hide behind: the larger direction (6 B down; up runs at the same time) + 2 B up at the step
    assert _seconds(t) == pytest.approx(6 + 2)
    # a long backward hides the gradient copies; the step's upload stays
    assert _seconds(t, backward_seconds=100) == pytest.approx(2)
    # the last bucket's share is copied after backward ends
    assert _seconds(t, backward_seconds=100, bucket_params=0.5e9) == pytest.approx(2 + 6 * 0.5)


def test_both_directions_run_at_once():
    """A micro-batch's copies take max(down, up) over the link, not their sum (PCIe is full duplex)."""
    t = st.OffloadTraffic(accumulate=((2.0, 2.0),), gradient_down=0.0)
    assert _seconds(t) == pytest.approx(2)


def test_parameter_offload_uploads_hide_in_forward_only():
    t = st.offload_traffic(zero_stage=3, precision="bf16", num_micro_batches=2, offload_optimizer=False,
                           offload_params=True, gather_passes=3)
    # 2 B a pass: forward's hidden by a long forward, the two backward passes exposed, per micro-batch;
    # and the GPU's step result copied down (2 B)
    assert _seconds(t, forward_seconds=100, backward_seconds=100) == pytest.approx(2 * 2 * 2 + 2)
    assert _seconds(t, backward_seconds=100) == pytest.approx(2 * 3 * 2 + 2)


def _llama8b(*, zero, offload_params="none", m=8, overlap_comm=None):
    spec = family_module("llama").read(LLAMA_8B, name="8b")
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("a100-80gb"))
    layout = Layout(dp=8, zero_stage=zero, offload_optimizer="cpu", offload_params=offload_params,
                    micro_batch=1, grad_accum=m)
    return estimate(model=spec, layout=layout, cluster=cluster, buffers=mem.ZeroBuffers(overlap_comm=overlap_comm),
                    training=Training(seq_len=4096, global_batch=8 * m, precision="bf16"))


def test_parameter_offload_moves_the_rank_s_partition_not_the_model():
    """Each gather copies up the rank's partition (``ds_tensor``), 1/dp of the stage: the old price
    (every micro-batch, 2 x the whole stage, all exposed) put llama-3-8b on 8 A100s at 9.7 s a step."""
    est = _llama8b(zero=3, offload_params="cpu")
    shard = est.model.num_params / 8
    extra = est.time.comm["offload"] - _llama8b(zero=3).time.comm["offload"]
    # at most 8 micro-batches x 3 passes of the partition (w = 2 B at 32 GB/s)
    assert 0 < extra < 8 * 3 * 2 * shard / 32e9
    assert extra < 0.1 * 8 * 2 * 2 * est.model.num_params / 32e9


def test_zero2_accumulation_hides_behind_backward():
    """llama-3-8b, 8 A100s: with 8 micro-batches ZeRO-2 moves 20 B down and 16 B up per element over
    the step (1 s of the link) against 4 and 2 with one, but a micro-batch's 6 B (0.19 s) hides behind
    its backward: only the last bucket's extra 2 B (its bf16 round-trip, 1/dp of a bucket) shows."""
    one, eight = _llama8b(zero=2, m=1, overlap_comm=True), _llama8b(zero=2, m=8, overlap_comm=True)
    bucket = 5e8 / 8  # DeepSpeed's default reduce_bucket_size, the rank's share
    assert eight.time.comm["offload"] - one.time.comm["offload"] == pytest.approx(2 * bucket / 32e9, rel=1e-6)
    # and the step's 2 B upload is priced: more than the CPU Adam alone
    assert one.time.comm["offload"] > 2 * one.model.num_params / 8 / 32e9


def test_without_overlap_comm_the_copies_run_on_the_compute_stream():
    """DeepSpeed's ZeRO-2 default (``overlap_comm`` off) copies on the compute stream: every
    micro-batch's larger direction is exposed, 7 x 2 B + (2 + 4) B over the 8 micro-batches."""
    shard = _llama8b(zero=2).model.num_params / 8
    off, on = _llama8b(zero=2).time.comm["offload"], _llama8b(zero=2, overlap_comm=True).time.comm["offload"]
    assert off - on == pytest.approx((7 * 2 + 6) * shard / 32e9, rel=1e-6)


@pytest.mark.distributed
def test_real_deepspeed_moves_the_bytes_the_formula_says():
    """2 gloo ranks (``tests/offload_traffic_ranks.py``), bf16, optimizer offload with pinned buffers:
    rank 0's bytes each way over one step equal the formula's per-element terms x its partition
    (ZeRO-1/2's round-trips: x the parameters touching the partition, whole)."""
    from dist import run_ranks

    cases = [{"zero": 2, "m": 3}, {"zero": 2, "m": 2, "grad_accum_dtype": "fp32"}, {"zero": 1, "m": 2},
             {"zero": 3, "m": 2}, {"zero": 3, "m": 2, "offload_param": True}]
    ranks = run_ranks(HERE / "offload_traffic_ranks.py", json.dumps(cases), world_size=2, timeout=800)
    line = next(x for x in ranks[0].output.splitlines() if x.startswith("TRAFFIC "))
    seen = json.loads(line[len("TRAFFIC "):])
    for case, got in zip(cases, seen):
        m = case["m"]
        t = st.offload_traffic(zero_stage=case["zero"], precision="bf16", num_micro_batches=m, offload_optimizer=True,
                               offload_params=bool(case.get("offload_param")), gather_passes=2,
                               grad_accum_bytes=4 if case.get("grad_accum_dtype") == "fp32" else None)
        whole = got.get("in_partition_numel", got["partition_numel"])
        down = sum(d for d, _ in t.accumulate) * whole + t.gradient_down * got["grad_numel"]
        up = (sum(u for _, u in t.accumulate) * whole + t.parameter_up * got["partition_numel"]
              + m * t.gather_passes * t.gather_up * got["partition_numel"])
        assert (got["down_bytes"], got["up_bytes"]) == (down, up), (case, got)


def test_the_estimate_reads_the_accumulation_dtype():
    """``data_types.grad_accum_dtype: fp32`` (``ZeroBuffers.grad_accum_dtype``): ZeRO-3 carries fp32
    gradients over the link, 4 B each way per micro-batch instead of 2."""
    import dataclasses

    spec = family_module("llama").read(LLAMA_8B, name="8b")
    cluster = Cluster(num_nodes=1, gpus_per_node=8, gpu=get_gpu("a100-80gb"))
    layout = Layout(dp=8, zero_stage=3, offload_optimizer="cpu", micro_batch=1, grad_accum=1)
    training = Training(seq_len=4096, global_batch=8, precision="bf16")

    def offload(buffers):
        return estimate(model=spec, layout=layout, training=training, cluster=cluster,
                        buffers=buffers).time.comm["offload"]

    default = mem.ZeroBuffers()
    fp32 = dataclasses.replace(default, grad_accum_dtype="fp32")
    # one micro-batch hides behind backward; the last bucket's share carries (4 + 4) B, not (2 + 4)
    bucket = default.reduce_bucket_size / 8
    assert offload(fp32) - offload(default) == pytest.approx(2 * bucket / 32e9, rel=1e-6)
