"""The fused attention kernel's speed by GPU (``GPU.flash_attention_efficiency`` /
``sdpa_attention_efficiency``): the published FlashAttention-2 and cuDNN figures, how the time
model uses them, and the hardware file that overrides them. Pure arithmetic, no torch."""

from __future__ import annotations

import json
import math

import pytest

from dstk import hardware as hw
from dstk.errors import DstkError
from dstk.estimate import _model_facts
from dstk.estimate import steptime as st
from dstk.hardware import get_gpu, load_catalog
from dstk.models import get_model
from tests.bench import load_benchmark

H100 = get_gpu("h100-sxm")
A100 = get_gpu("a100-80gb")


def _fwd_bwd_causal(*, forward_causal: float, forward: float, backward: float) -> float:
    """TFLOP/s of a causal forward + backward from the published bars (FlashAttention-3 Figs. 5-6
    give the backward without the mask only): causal backward = backward x causal/plain forward."""
    backward_causal = backward * forward_causal / forward
    return 3.5 / (1 / forward_causal + 2.5 / backward_causal)


# FlashAttention-3 (Shah et al. 2024) Fig. 5/6, H100 SXM5, head dim 128, sequence length 8k.
FA2_H100_8K = _fwd_bwd_causal(forward_causal=333, forward=370, backward=318)
CUDNN_H100_8K = _fwd_bwd_causal(forward_causal=529, forward=600, backward=518)


def _layer(gpu, *, attention: str, seq_len: int = 8192, tokens: int = 8192):
    facts = _model_facts(get_model("llama-3-8b"))
    return st.layer_seconds(facts=facts, tokens=tokens, seq_len=seq_len, tp=1, sp=1, act_bytes=2,
                            attention=attention, gpu=gpu, peak_flops=gpu.peak_flops("bf16"), fused=False)


def _without_curves(gpu):
    return gpu.replace(flash_attention_efficiency=None, sdpa_attention_efficiency=None)


# --- the catalog's figures -----------------------------------------------------------------------


def test_catalog_curves_are_the_published_bars():
    """H100's points are the FlashAttention-3 paper's bars combined as documented; the plain
    (no mask) FlashAttention-2 forward + backward they imply at 16k is the FlashAttention-2 paper's
    "up to 335 TFLOPs/s" on H100 (Dao 2023 §4.1), an independent check of the transcription."""
    assert H100.attention_fraction(kernel="flash", seq_len=8192) == pytest.approx(FA2_H100_8K / 989, abs=1e-4)
    assert H100.attention_fraction(kernel="sdpa", seq_len=8192) == pytest.approx(CUDNN_H100_8K / 989, abs=1e-4)
    assert 3.5 / (1 / 370 + 2.5 / 322) == pytest.approx(335, rel=0.01)
    # A100: Dao 2023 Fig. 4d, causal forward + backward, 99 TFLOP/s at 512 and 189 at 16k (the
    # lengths between and head dim 64: tests/test_attention_headdim.py).
    assert [s for s, _ in A100.flash_attention_efficiency] == list(hw.ATTENTION_SEQ_LENS)
    assert A100.attention_fraction(kernel="flash", seq_len=512) == pytest.approx(99 / 312, abs=1e-4)
    assert A100.attention_fraction(kernel="flash", seq_len=16384) == pytest.approx(189 / 312, abs=1e-4)
    # torch's SDPA runs FlashAttention-2 on sm80: the A100 has no sdpa curve of its own.
    assert A100.sdpa_attention_efficiency is None
    assert A100.attention_fraction(kernel="sdpa", seq_len=4096) == A100.attention_fraction(kernel="flash",
                                                                                          seq_len=4096)
    # same die: H200 and the 40 GB A100 take the curves of the H100 and the 80 GB A100
    assert get_gpu("h200").flash_attention_efficiency == H100.flash_attention_efficiency
    assert get_gpu("a100-40gb").flash_attention_efficiency == A100.flash_attention_efficiency


def test_short_sequences_run_far_below_the_peak_figure():
    """Efficiency rises with the sequence length and is read log-linearly between the benchmark's
    lengths: FlashAttention-2 causal on H100 is 0.15 of peak at 512, 0.31 at 16k."""
    f = [H100.attention_fraction(kernel="flash", seq_len=s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384, 65536)]
    assert f == sorted(f) and f[0] == f[1] and f[-1] == f[-2]  # clamped outside the measured lengths
    assert f[1] < 0.5 * f[-1]
    mid = H100.attention_fraction(kernel="flash", seq_len=math.sqrt(4096 * 8192))
    assert mid == pytest.approx((f[4] + f[5]) / 2)


def test_gpu_without_a_published_curve_keeps_the_gemm_rule():
    b200 = get_gpu("b200")
    assert b200.flash_attention_efficiency is None and b200.sdpa_attention_efficiency is None
    assert b200.attention_fraction(kernel="flash", seq_len=4096) == hw.FLASH_GEMM_SHARE * b200.gemm_fraction(4096)


# --- the time model ------------------------------------------------------------------------------


def test_h100_flash_attention_is_slower_by_the_sourced_ratio():
    """One Llama-3-8B layer, 8192 tokens of 8192, on an H100: the kernel's forward + backward takes
    its FLOPs as FlashAttention counts them (``4 s^2 q / 2`` forward, 2.5x backward) at the
    published rate, 298 TFLOP/s for FlashAttention-2, and is slower than the old rule (0.75 x the
    GEMM curve at 8192, ~0.58 of peak) by exactly that ratio."""
    s, q = 8192, 4096
    fa_flops = 3.5 * 4 * s * s * q / 2
    new = _layer(H100, attention="flash")
    old = _layer(_without_curves(H100), attention="flash")
    assert new.flash and old.flash
    assert 3.5 * new.attention == pytest.approx(fa_flops / (FA2_H100_8K * 1e12), rel=1e-3)
    ratio = (hw.FLASH_GEMM_SHARE * H100.gemm_fraction(s)) / (FA2_H100_8K / 989)
    assert new.attention / old.attention == pytest.approx(ratio, rel=1e-3)
    assert ratio > 1.9
    # the backward carries 2.5x the kernel's forward; nothing else in the layer moved
    assert new.backward - old.backward == pytest.approx(2.5 * (new.attention - old.attention))
    assert new.forward - old.forward == pytest.approx(new.attention - old.attention)
    # sdpa on H100 runs cuDNN's kernel (torch 2.11+): faster than FlashAttention-2, slower than the old rule
    sdpa = _layer(H100, attention="sdpa")
    assert 3.5 * sdpa.attention == pytest.approx(fa_flops / (CUDNN_H100_8K * 1e12), rel=1e-3)
    assert new.attention > sdpa.attention > old.attention


def test_eager_attention_is_unchanged():
    """Eager attention runs the score GEMMs at the GEMM curve of head_dim and the softmax at HBM
    bandwidth; the attention curves do not touch it, nor SDPA's math path on CPU ranks."""
    for gpu in (H100, A100):
        new = _layer(gpu, attention="eager")
        old = _layer(_without_curves(gpu), attention="eager")
        assert not new.flash and new == old
        score_flops = 4 * 8192 * 8192 * 4096
        assert new.attention == pytest.approx(score_flops / (gpu.peak_flops("bf16") * gpu.gemm_fraction(128)))
    cpu = get_gpu("cpu")
    assert _layer(cpu, attention="sdpa", seq_len=256, tokens=256) == _layer(cpu, attention="eager", seq_len=256,
                                                                            tokens=256)


def _bench():
    return load_benchmark("estimate_published")


def test_published_megatron_rows_do_not_move_and_fsdp_rows_slow(monkeypatch):
    """Korthikanti's and Narayanan's rows ran Megatron's fused softmax (eager attention): the same
    figures with and without the curves. MosaicML's 2023 rows ran the Triton kernel at its own
    published rate (``MOSAIC_TRITON_TFLOPS``, which they carry): unmoved too. The PyTorch FSDP blog's
    ran SDPA's FlashAttention-2 on A100 and H100: slower with the curves."""
    bench = _bench()
    tables = (bench.korthikanti_rows, bench.korthikanti_layer_rows, bench.narayanan_rows, bench.mosaic_rows,
              bench.fsdp_blog_rows)
    with_curves = [[r.predicted for r in rows()] for rows in tables]
    for slug, gpu in list(hw.GPUS.items()):
        monkeypatch.setitem(hw.GPUS, slug, _without_curves(gpu))
    without = [[r.predicted for r in rows()] for rows in tables]
    assert with_curves[:4] == without[:4]
    assert all(a < b for a, b in zip(with_curves[4], without[4]))  # tokens/s per GPU


# --- the hardware file ---------------------------------------------------------------------------


def test_curves_round_trip_through_a_hardware_file(tmp_path):
    """A profile's curves, written as JSON lists (what YAML reads too) and read back by
    ``--hardware``, give the same entry; a new entry based on another keeps its base's curves."""
    flash = [[1024, 0.2], [8192, 0.35]]
    path = tmp_path / "hw.yaml"
    path.write_text("gpus:\n"
                    f"  h100-sxm:\n    flash_attention_efficiency: {json.dumps(flash)}\n"
                    "    sdpa_attention_efficiency: [[2048, 0.5]]\n"
                    "  my-a100:\n    base: a100-80gb\n    memory_gib: 64\n")
    gpus, _ = load_catalog(path)
    h = gpus["h100-sxm"]
    assert h.flash_attention_efficiency == ((1024.0, 0.2), (8192.0, 0.35))
    assert h.attention_fraction(kernel="flash", seq_len=512) == 0.2
    assert h.attention_fraction(kernel="flash", seq_len=math.sqrt(1024 * 8192)) == pytest.approx(0.275)
    assert h.attention_fraction(kernel="sdpa", seq_len=16384) == 0.5
    assert gpus["my-a100"].flash_attention_efficiency == A100.flash_attention_efficiency
    # the catalog's own curves survive being written out and read back
    back = tmp_path / "back.json"
    back.write_text(json.dumps({"gpus": {"x": {"base": "h100-sxm", "flash_attention_efficiency":
                                               [list(p) for p in H100.flash_attention_efficiency]}}}))
    assert load_catalog(back)[0]["x"].flash_attention_efficiency == H100.flash_attention_efficiency
    # and the time model uses the file's figure
    slow = _layer(h, attention="flash")
    assert 3.5 * slow.attention == pytest.approx(3.5 * 4 * 8192**2 * 4096 / 2 / (989e12 * 0.35), rel=1e-6)


@pytest.mark.parametrize("value", ["[[8192, 0.3], [1024, 0.2]]", "[[1024, 1.5]]", "[[0, 0.3]]", "[]",
                                   "[[1024]]", "fast", "[[1024, .nan]]"])
def test_a_bad_curve_in_a_hardware_file_names_the_field(tmp_path, value):
    path = tmp_path / "hw.yaml"
    path.write_text(f"gpus:\n  h100-sxm:\n    flash_attention_efficiency: {value}\n")
    with pytest.raises(DstkError) as err:
        load_catalog(path)
    assert "gpus.h100-sxm.flash_attention_efficiency" in str(err.value)
