"""Attention pricing where the published curves were thin: the A100 curve at every length
FlashAttention-2's Figure 4 prints, the head-dim-64 share (Dao 2023 Figs. 4c/4d and 7c/7d), and
Falcon's SDPA, which transformers hands an explicit mask: the kernel that runs then (memory-efficient
on A100, cuDNN on H100) computes every score block, and each layer saves K/V repeated to all heads
and its own copy of the mask (measured on real Falcon modules with ``saved_tensors_hooks``)."""

from __future__ import annotations

import dataclasses

import pytest

from dstk import hardware as hw
from dstk.estimate import _model_facts
from dstk.estimate import memory as mem
from dstk.estimate import steptime as st
from dstk.hardware import get_gpu
from dstk.models import family_module, get_model

A100 = get_gpu("a100-80gb")
H100 = get_gpu("h100-sxm")
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)

# Dao 2023 (FlashAttention-2) Fig. 4, A100 80GB, forward + backward TFLOP/s printed on the bars
# (flash-attention's assets/flash2_a100_fwd_bwd_benchmark.png): FlashAttention-2 causal, head dim
# 128 (4d) and 64 (4c); xformers (torch's memory-efficient kernel) without the mask, 128 (4b), 64 (4a).
FA2_A100_CAUSAL_128 = (99, 133, 155, 173, 182, 189)
FA2_A100_CAUSAL_64 = (88, 119, 140, 156, 165, 171)
XFORMERS_A100_128 = (83, 91, 95, 96, 97, 98)
XFORMERS_A100_64 = (68, 73, 76, 77, 75, 75)
# Dao 2023 Fig. 7, H100 SXM5, FlashAttention-2 causal, head dim 128 (7d) and 64 (7c).
FA2_H100_CAUSAL_128 = (163, 221, 265, 294, 308, 328)
FA2_H100_CAUSAL_64 = (141, 192, 232, 257, 273, 284)


# --- the curves ----------------------------------------------------------------------------------


def test_a100_curve_is_figure_4_at_every_length():
    """Every bar of Fig. 4d and 4c, not two ends joined by a line: at 4k the old two-point curve read
    153 TFLOP/s where the figure prints 173."""
    for s, r128, r64 in zip(SEQ_LENS, FA2_A100_CAUSAL_128, FA2_A100_CAUSAL_64):
        for kernel in ("flash", "sdpa"):  # torch's SDPA runs FlashAttention-2 on sm80
            assert A100.attention_fraction(kernel=kernel, seq_len=s) == pytest.approx(r128 / 312, abs=1e-4)
            assert A100.attention_fraction(kernel=kernel, seq_len=s, head_dim=64) == pytest.approx(r64 / 312,
                                                                                                  abs=1e-4)
    assert A100.attention_fraction(kernel="flash", seq_len=4096) > 170 / 312


def test_h100_head_dim_64_takes_figure_7s_share():
    """H100's head-dim-128 curves stay as they were (FlashAttention-3 paper); head dim 64 runs at the
    share FlashAttention-2 shows on the same GPU (Fig. 7c over 7d), for cuDNN too (assumed)."""
    for s, r128, r64 in zip(SEQ_LENS, FA2_H100_CAUSAL_128, FA2_H100_CAUSAL_64):
        for kernel in ("flash", "sdpa"):
            full = H100.attention_fraction(kernel=kernel, seq_len=s)
            assert H100.attention_fraction(kernel=kernel, seq_len=s, head_dim=64) == pytest.approx(
                full * r64 / r128, rel=2e-3)
    assert get_gpu("h200").attention_fraction(kernel="flash", seq_len=2048, head_dim=64) == \
        H100.attention_fraction(kernel="flash", seq_len=2048, head_dim=64)


@pytest.mark.parametrize("gpu", [A100, H100], ids=["a100", "h100"])
def test_head_dim_reads_between_64_and_128_and_clamps_outside(gpu):
    s = 2048
    f64 = gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=64)
    f128 = gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=128)
    assert 0.85 * f128 < f64 < 0.92 * f128  # 5-15% slower: the published pairs
    assert gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=96) == pytest.approx((f64 + f128) / 2)
    assert gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=80) == pytest.approx(0.75 * f64 + 0.25 * f128)
    assert gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=32) == f64
    assert gpu.attention_fraction(kernel="flash", seq_len=s, head_dim=256) == f128


def test_a_gpu_without_published_pairs_ignores_head_dim():
    b200 = get_gpu("b200")
    assert b200.attention_fraction(kernel="flash", seq_len=4096, head_dim=64) == \
        b200.attention_fraction(kernel="flash", seq_len=4096) == hw.FLASH_GEMM_SHARE * b200.gemm_fraction(4096)


def test_masked_sdpa_runs_at_the_unmasked_rates():
    """The kernel SDPA runs with an explicit mask computes every block: A100 xformers' bars without
    the mask (Fig. 4a/4b); H100 cuDNN's forward and backward without the mask (FlashAttention-3
    paper Figs. 5-6), scaled to head dim 64 by FlashAttention-2's unmasked share (Fig. 7a over 7b)."""
    for s, r128, r64 in zip(SEQ_LENS, XFORMERS_A100_128, XFORMERS_A100_64):
        assert A100.attention_fraction(kernel="sdpa_masked", seq_len=s) == pytest.approx(r128 / 312, abs=1e-4)
        assert A100.attention_fraction(kernel="sdpa_masked", seq_len=s, head_dim=64) == pytest.approx(r64 / 312,
                                                                                                     abs=1e-4)
    cudnn = hw.ATTENTION_BENCHMARKS["h100-cudnn"]
    f, b = cudnn["forward"][2], cudnn["backward"][2]  # 2k
    assert H100.attention_fraction(kernel="sdpa_masked", seq_len=2048) == pytest.approx(
        3.5 / (1 / f + 2.5 / b) / 989, abs=1e-4)
    assert H100.attention_fraction(kernel="sdpa_masked", seq_len=2048, head_dim=64) == pytest.approx(
        3.5 / (1 / f + 2.5 / b) / 989 * 274 / 320, rel=2e-3)


# --- the time model ------------------------------------------------------------------------------


def _layer(model: str, gpu, *, attention: str, seq_len: int = 2048, tokens: int = 8192):
    facts = _model_facts(get_model(model))
    return st.layer_seconds(facts=facts, tokens=tokens, seq_len=seq_len, tp=1, sp=1, act_bytes=2,
                            attention=attention, gpu=gpu, peak_flops=gpu.peak_flops("bf16"), fused=False)


def test_a_head_dim_64_model_pays_the_head_dim_64_rate():
    """GPT-2-XL (head dim 64) and Llama-3.2-3B (128) under flash on an A100 at 2k: each kernel's time
    is its causal FLOPs (``2 T s q`` forward) at its own head dim's published rate."""
    for model, d, rate in (("gpt2-xl", 64, FA2_A100_CAUSAL_64[2]), ("llama-3.2-3b", 128, FA2_A100_CAUSAL_128[2])):
        spec = get_model(model)
        assert spec.head_dim == d
        got = _layer(model, A100, attention="flash").attention
        assert got == pytest.approx(2 * 8192 * 2048 * spec.attention_width / (rate * 1e12), rel=2e-3)


def test_falcon_sdpa_runs_the_masked_kernel_on_every_block():
    """Falcon-7B (head dim 64) under sdpa: the full ``4 T s q`` forward at xformers' unmasked rate on
    A100 (76 TFLOP/s at 2k) and cuDNN's on H100; under flash FlashAttention-2's causal half at its
    head-dim-64 rate. Llama (no mask: ``is_causal``) is untouched."""
    q = get_model("falcon-7b").attention_width
    full = 4 * 8192 * 2048 * q
    sdpa = _layer("falcon-7b", A100, attention="sdpa")
    flash = _layer("falcon-7b", A100, attention="flash")
    assert sdpa.flash and flash.flash  # both kernels recompute the scores in backward (2.5x)
    assert sdpa.attention == pytest.approx(full / (XFORMERS_A100_64[2] * 1e12), rel=2e-3)
    assert flash.attention == pytest.approx(full / 2 / (FA2_A100_CAUSAL_64[2] * 1e12), rel=2e-3)
    assert sdpa.attention / flash.attention > 3.5
    h100 = _layer("falcon-7b", H100, attention="sdpa")
    assert h100.attention == pytest.approx(
        full / (989e12 * H100.attention_fraction(kernel="sdpa_masked", seq_len=2048, head_dim=64)), rel=1e-6)
    llama = _model_facts(get_model("llama-3-8b"))
    assert not st.sdpa_gets_mask(llama, seq_len=2048) and st.sdpa_gets_mask(_model_facts(get_model("falcon-40b")),
                                                                            seq_len=2048)
    assert _layer("llama-3-8b", A100, attention="sdpa") == _layer("llama-3-8b", A100, attention="flash")


def test_falcon_sdpa_on_cpu_ranks_stays_the_math_path():
    cpu = get_gpu("cpu")
    assert _layer("falcon-7b", cpu, attention="sdpa", seq_len=256, tokens=256) == \
        _layer("falcon-7b", cpu, attention="eager", seq_len=256, tokens=256)


# --- memory: what real Falcon layers save ----------------------------------------------------------

F7 = {"model_type": "falcon", "hidden_size": 128, "num_attention_heads": 8, "multi_query": True,
      "new_decoder_architecture": False, "parallel_attn": True, "vocab_size": 512, "bias": False, "alibi": False}
F40 = {"model_type": "falcon", "hidden_size": 128, "num_attention_heads": 8, "num_kv_heads": 2,
       "new_decoder_architecture": True, "parallel_attn": True, "vocab_size": 512, "bias": False, "alibi": False}
BATCH = 2


def _measured_layer_bytes(cfg: dict, *, seq_len: int) -> int:
    """Bytes one Falcon layer saves for backward under SDPA: a 2-layer model minus a 1-layer one
    (unique storages, parameters excluded), bf16, transformers' real modules on CPU."""
    import torch
    import transformers

    def saved(layers: int) -> int:
        keys = dict(cfg, num_hidden_layers=layers)
        config = transformers.AutoConfig.for_model(keys.pop("model_type"), **keys, attn_implementation="sdpa")
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        found: dict[int, int] = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                found[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, cfg["vocab_size"], (BATCH, seq_len))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=ids, labels=ids, use_cache=False)
        return sum(found.values())

    return saved(2) - saved(1)


def _predicted_layer_bytes(cfg: dict, *, seq_len: int) -> float:
    spec = family_module("falcon").read(dict(cfg, num_hidden_layers=2), name="falcon-test")
    facts = _model_facts(spec)
    return mem.layer_activation_bytes(shape=facts.shape, tokens=BATCH * seq_len, seq_len=seq_len, act_bytes=2,
                                      attention="sdpa", recompute="none")


def test_each_falcon_layer_saves_its_own_mask():
    """The quadratic term: per token, a layer's saved bytes grow by ``w`` per extra position (one
    bf16 ``[b, 1, s, s]`` mask per layer), measured between s = 64 and s = 256."""
    measured = [_measured_layer_bytes(F40, seq_len=s) / (BATCH * s) for s in (64, 256)]
    predicted = [_predicted_layer_bytes(F40, seq_len=s) / (BATCH * s) for s in (64, 256)]
    assert measured[1] - measured[0] == pytest.approx(2 * (256 - 64), rel=0.02)
    assert predicted[1] - predicted[0] == pytest.approx(measured[1] - measured[0], rel=0.02)


def test_falcon_saves_k_and_v_repeated_to_all_heads():
    """K/V go to SDPA repeated (``repeat_kv``), so a layer saves the same bytes whatever the number of
    KV heads (2 or 4 of 8 here), and the prediction does not move with it either."""
    seq = 128
    more_kv = dict(F40, num_kv_heads=4)
    assert _measured_layer_bytes(F40, seq_len=seq) == _measured_layer_bytes(more_kv, seq_len=seq)
    assert _predicted_layer_bytes(F40, seq_len=seq) == _predicted_layer_bytes(more_kv, seq_len=seq)


def test_falcon_layer_prediction_within_10_percent():
    """The whole layer of the new-decoder Falcon against the measurement (the rest of the formula is
    the HF one every family uses; Falcon-7B's single LayerNorm is counted as two, not attention)."""
    for seq in (64, 256):
        assert _predicted_layer_bytes(F40, seq_len=seq) == pytest.approx(_measured_layer_bytes(F40, seq_len=seq),
                                                                        rel=0.10)


def test_no_mask_keeps_the_fused_formula():
    shape = _model_facts(get_model("llama-3-8b")).shape
    assert not shape.sdpa_mask
    masked = dataclasses.replace(shape, sdpa_mask=True)
    kw = dict(tokens=4096, seq_len=4096, act_bytes=2, recompute="none")
    plain = mem.layer_activation_bytes(shape=shape, attention="sdpa", **kw)
    assert mem.layer_activation_bytes(shape=masked, attention="sdpa", **kw) - plain == pytest.approx(
        (2 * 2 * (shape.q_width - shape.kv_width) + 2 * 4096) * 4096)
    assert mem.layer_activation_bytes(shape=masked, attention="flash", **kw) == plain  # flash takes no mask


def test_flash_does_not_repeat_k_and_v():
    """HF's flash_attention_2 path hands FlashAttention-2 the grouped K/V as they are: Falcon's layer
    under flash has no ``repeat_kv`` copies in its memory-bound ops; under sdpa (and eager) it does."""
    for model in ("falcon-7b", "falcon-40b"):
        sdpa = _layer(model, A100, attention="sdpa")
        flash = _layer(model, A100, attention="flash")
        assert flash.backward_elementwise < sdpa.backward_elementwise
        # Falcon-7B's single KV head is repeated by a broadcast view in forward, Falcon-40B's 8 by a copy
        assert (flash.elementwise < sdpa.elementwise) == (model == "falcon-40b")
    llama = (_layer("llama-3-8b", A100, attention="sdpa"), _layer("llama-3-8b", A100, attention="flash"))
    assert llama[0].elementwise == llama[1].elementwise
