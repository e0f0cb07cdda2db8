"""A calibrated profile of a GPU with ``num_sms`` prices each swept GEMM shape at its measured time.

The time model multiplies the ``gemm_efficiency`` curve by the wave quantization of each GEMM's
output (``steptime.wave_fraction``, A100: 108 SMs). A sweep's measured time already holds its own
shape's partial waves; ``calibrate.efficiency_curve`` divides them out so they are not counted twice.
The sweep below is what ``dstk doctor --calibrate --quick`` runs on a GPU (d = 512, 2048, 8192 over
8192 tokens, ``SweepSettings.for_device``), its times made from a full-wave rate per d and the waves
of each of the three GEMMs, as a GPU would show them (d = 512 and 2048 both fill 2 waves of 108 with
128 tiles: 59% busy).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dstk import calibrate as cal
from dstk.estimate.steptime import _gemm_seconds, wave_fraction
from dstk.hardware import get_gpu, load_catalog
from dstk.launch.doctor import SweepSettings

ROOT = Path(__file__).resolve().parents[1]
FULL_WAVE = {512: 0.55, 2048: 0.8, 8192: 0.85}
"""Share of the A100's bf16 peak each width reaches when its tiles fill their waves."""


def _three_gemms(m: int, n: int, k: int) -> tuple[tuple[int, int, int], ...]:
    """A ``(m x k) @ (k x n)`` forward's training GEMMs as ``steptime.layer_seconds`` prices them
    (``_gemm_seconds`` arguments): forward, weight gradient (``k x n`` over ``m``), input gradient."""
    return ((m, n, k), (k, n, m), (m, k, n))


def _a100_sweep() -> tuple[dict, list[dict]]:
    """The ranks' ``DSTK_MEASURE`` report of the GPU quick sweep on one A100 (``from_rank_reports`` input)."""
    a100 = get_gpu("a100-80gb")
    settings = SweepSettings.for_device(cpu=False, quick=True)
    gemm = []
    for d in settings.dims:
        m = max(settings.tokens, d)
        seconds = sum(2.0 * a * b * c / (a100.bf16_flops * FULL_WAVE[d] * wave_fraction(m=a, n=b, num_sms=a100.num_sms))
                      for a, b, c in _three_gemms(m, d, d))
        gemm.append({"m": m, "n": d, "k": d, "seconds": seconds, "flops_per_s": 3 * 2.0 * m * d * d / seconds})
    rank = {"gemm": gemm, "memory_bytes_per_s": 1.8e12, "op_seconds": 6e-6, "device": "cuda",
            "device_name": "NVIDIA A100-SXM4-80GB", "layer_steps": None, "layer_overhead_seconds": None}
    return {"precision": "bf16", "world_size": 1, "backend": "nccl", "ranks": [rank]}, gemm


def test_the_sweep_has_partial_waves_to_count_twice():
    """The case is real: the quick GPU sweep's d = 512 and 2048 shapes leave SMs idle on an A100."""
    a100 = get_gpu("a100-80gb")
    assert a100.num_sms == 108
    assert wave_fraction(m=8192, n=512, num_sms=108) == pytest.approx(128 / 216)
    assert wave_fraction(m=2048, n=2048, num_sms=108) == pytest.approx(128 / 216)
    shares = [cal.wave_share(point=cal.GemmPoint(m=8192, n=d, k=d, flops_per_s=1.0), num_sms=108) for d in (512, 2048)]
    assert all(s < 0.8 for s in shares)
    assert cal.wave_share(point=cal.GemmPoint(m=8192, n=512, k=512, flops_per_s=1.0), num_sms=None) == 1.0


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_calibrated_a100_prices_each_swept_shape_at_its_measured_time(tmp_path, suffix):
    report, gemm = _a100_sweep()
    measured = cal.from_rank_reports(measure=report, allreduce=[])
    profile = cal.build_profile(base=get_gpu("a100-80gb"), measured=measured)
    assert not profile.warnings
    path = tmp_path / f"hardware{suffix}"
    cal.write_profile(str(path), cal.render_json(profile) if suffix == ".json" else cal.render_yaml(profile))
    gpu = load_catalog(path)[0]["a100-80gb"]
    assert gpu.num_sms == 108 and gpu.bf16_flops == get_gpu("a100-80gb").bf16_flops
    for g in gemm:
        priced = sum(_gemm_seconds(m=a, n=b, k=c, gpu=gpu, peak_flops=gpu.bf16_flops)
                     for a, b, c in _three_gemms(g["m"], g["n"], g["k"]))
        assert priced == pytest.approx(g["seconds"], rel=2e-3), g
    # The curve holds the full-wave rates the times were made from, not the measured shares of peak.
    assert [f for _, f in gpu.gemm_efficiency] == pytest.approx([FULL_WAVE[d] for d in (512, 2048, 8192)], rel=2e-3)
    assert "divided out" in {f.key: f for f in profile.figures}["gemm_efficiency"].note
    # The planner reads the same file: the tiny intent planned on the calibrated A100 entry.
    intent = tmp_path / "intent.yaml"
    intent.write_text((ROOT / "examples" / "intents" / "tiny-llama-cpu.yaml").read_text().replace("gpu: cpu",
                                                                                                  "gpu: a100-80gb"))
    proc = subprocess.run([sys.executable, "-m", "dstk", "plan", str(intent), "--hardware", str(path), "--format",
                           "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plans"][0]["time"]["step_seconds"] > 0


def test_a_cpu_sweep_keeps_its_measured_shares():
    """No ``num_sms`` (the cpu entry): the curve is the measured share of the peak, as before."""
    points = (cal.GemmPoint(m=512, n=32, k=32, flops_per_s=2e10), cal.GemmPoint(m=512, n=512, k=512, flops_per_s=1e11))
    curve, beyond = cal.efficiency_curve(gemm=points, peak_flops=1e11, num_sms=None)
    assert curve == ((32.0, 0.2), (512.0, 1.0)) and not beyond


def test_a_gemm_faster_than_its_waves_allow_is_capped_and_said():
    """cuBLAS may pick other tiles or split K: a shape measured above full-wave speed is capped at 1."""
    a100 = get_gpu("a100-80gb")
    report, _ = _a100_sweep()
    report["ranks"][0]["gemm"][0]["flops_per_s"] = 0.9 * a100.bf16_flops  # d = 512 at 90% despite 59%-busy waves
    profile = cal.build_profile(base=a100, measured=cal.from_rank_reports(measure=report, allreduce=[]))
    assert profile.gpu.gemm_efficiency[0] == (512.0, 1.0)
    assert any("faster than full waves" in w and "8192 x 512 x 512" in w for w in profile.warnings)
