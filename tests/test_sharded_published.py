"""Sharded data parallelism (FSDP priced as ZeRO-3) against published runs (benchmarks/estimate_published.py,
the MosaicML llm-foundry and PyTorch FSDP blog tables): pure arithmetic, no torch.

Each table states its error (``MOSAIC_TOLERANCE``, ``FSDP_BLOG_TOLERANCE``); a change to the step-time model
that moves a row outside it fails here. The rows' specs are facts of the runs (the benchmark's comments
cite them); the tests below also pin those facts, so a spec quietly changed back fails too."""

import pytest

from dstk.hardware import attention_curve, get_gpu
from tests.bench import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("estimate_published")


@pytest.fixture(scope="module")
def mosaic(bench):
    return bench.mosaic_rows()


@pytest.fixture(scope="module")
def blog(bench):
    return bench.fsdp_blog_rows()


def test_fsdp_blog_rows_within_the_stated_error(bench, blog):
    """Llama 2 34B/70B, FULL_SHARD on 128 A100s (400 Gb/s a node) and 96 H100s (800 Gb/s a node):
    every row within ``FSDP_BLOG_TOLERANCE``; the rows err both ways (A100 slow, H100 fast), so no
    one-sided term explains them."""
    assert [r.label for r in blog] == ["34b a100-80gb 128 GPUs", "70b a100-80gb 128 GPUs", "34b h100-sxm 96 GPUs",
                                       "70b h100-sxm 96 GPUs"]
    assert [r.published for r in blog] == [700, 370, 1550, 800]
    for r in blog:
        assert abs(r.error) <= bench.FSDP_BLOG_TOLERANCE, (r.label, r.error)
    assert any(r.error < 0 for r in blog) and any(r.error > 0 for r in blog)


def test_mosaic_rows_within_the_stated_error(bench, mosaic):
    """MosaicML's nine 2023 rows: all but the documented one (``MOSAIC_UNEXPLAINED``) within
    ``MOSAIC_TOLERANCE``; that one stays outside it (a change that explains it must take it off the list
    and docs/estimate.md's account)."""
    assert len(mosaic) == len(bench.MOSAIC) == 9
    labels = {r.label for r in mosaic}
    assert set(bench.MOSAIC_UNEXPLAINED) <= labels
    for r in mosaic:
        if r.label in bench.MOSAIC_UNEXPLAINED:
            assert abs(r.error) > bench.MOSAIC_TOLERANCE, (r.label, r.error)
        else:
            assert abs(r.error) <= bench.MOSAIC_TOLERANCE, (r.label, r.error)


def test_mosaic_rows_price_the_triton_kernel_they_ran(bench, mosaic):
    """llm-foundry's 2023 runs used ``attn_impl: triton``: Dao 2023 Fig. 4d's "FlashAttention Triton"
    bars (68 TFLOP/s at 2k, causal, head dim 128) are what the rows price, and pricing them with the
    catalog's FlashAttention-2 curve (155 at 2k) instead makes every row faster, by 3-9%."""
    assert bench.MOSAIC_TRITON_TFLOPS == (50, 61, 68, 74, 78, 80)
    triton = dict(attention_curve(peak_tflops=312, forward_backward_causal=bench.MOSAIC_TRITON_TFLOPS))
    assert triton[2048.0] == pytest.approx(68 / 312, abs=1e-4)
    a100 = get_gpu("a100-80gb")
    assert a100.attention_fraction(kernel="flash", seq_len=2048) > 2 * triton[2048.0]
    fa2 = []
    for name, gpu, gpus, micro, accum, _ in bench.MOSAIC:
        priced = bench.mosaic_estimate(name, gpu, gpus, micro, accum).cluster.gpu
        assert priced.attention_fraction(kernel="flash", seq_len=2048) == pytest.approx(triton[2048.0])
        est = bench.mosaic_estimate(name, gpu, gpus, micro, accum, attention_tflops=None)
        fa2.append(est.time.tokens_per_second / gpus)
    gains = [f / r.predicted - 1 for f, r in zip(fa2, mosaic)]
    assert all(0.03 <= g <= 0.10 for g in gains), gains


def test_mpt_is_priced_as_mosaicgpt_ran(bench):
    """MosaicGPT's 2023 defaults: no dropout anywhere, exact GELU, learned positions, tied embedding;
    the rows price its eager modules (``fused_kernels=False``)."""
    from dstk.estimate import _model_facts

    facts = _model_facts(bench.mpt("7b"))
    assert facts.shape.dropout == 0
    assert facts.activation == "gelu"
    assert facts.tied
    assert facts.hidden == 4096 and facts.layers == 32


def test_fsdp_blog_interconnect_is_the_blogs_figure(bench):
    """The blog's "400Gbps" / "800Gbps inter-node interconnect" per node, at the catalog's RoCE efficiency."""
    a100, h100 = bench.fsdp_blog_interconnect(400), bench.fsdp_blog_interconnect(800)
    assert a100.node_bytes_per_s == 50e9 and h100.node_bytes_per_s == 100e9
    assert a100.efficiency == h100.efficiency == 0.7


def test_the_unexplained_row_is_not_nearer_the_card(bench):
    """``MOSAIC_UNEXPLAINED``'s account: dstk's peak for MPT-70b on 64 A100-40GB at micro-batch 2 is below
    the peak of the 128-GPU micro-batch-4 row that ran at 48.9% MFU, so memory pressure (allocator
    retries) does not single the slow row out."""
    slow = bench.mosaic_estimate("70b", "a100-40gb", 64, 2, 1).memory.per_gpu
    fast = bench.mosaic_estimate("70b", "a100-40gb", 128, 4, 1).memory.per_gpu
    card = get_gpu("a100-40gb").memory_bytes
    assert max(slow.phases.values()) < max(fast.phases.values()) < card
